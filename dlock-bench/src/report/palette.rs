//! One colour and one place in line per backend, for every table and chart.

/// How a backend is shown: its name in charts, its colour, its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// The backend's key in the report (`Target::label`, e.g. `redis`).
    pub key: &'static str,
    /// Its name in chart labels and legends.
    pub name: &'static str,
    /// Its colour, `#rrggbb`.
    pub color: &'static str,
    /// Whether the charts draw it at all.
    pub charted: bool,
}

/// Every backend the bench knows, in the order every table and chart lists
/// them. The colours are Okabe and Ito's, chosen to stay apart for readers
/// with any common colour-vision deficiency; PostgreSQL and etcd have theirs
/// before their drivers exist so that adding them never recolours a chart
/// someone has already learnt to read.
pub const PALETTE: [Look; 6] = [
    // The in-process driver is about a thousand times faster than any
    // server: a line at 0 that flattens the others. Its figures stay in the
    // tables and the JSON.
    Look {
        key: "memory",
        name: "in-memory",
        color: "#999999",
        charted: false,
    },
    Look {
        key: "redis",
        name: "Redis",
        color: "#D55E00",
        charted: true,
    },
    Look {
        key: "mysql",
        name: "MySQL",
        color: "#0072B2",
        charted: true,
    },
    Look {
        key: "zookeeper",
        name: "ZooKeeper",
        color: "#009E73",
        charted: true,
    },
    Look {
        key: "postgres",
        name: "PostgreSQL",
        color: "#CC79A7",
        charted: true,
    },
    Look {
        key: "etcd",
        name: "etcd",
        color: "#E69F00",
        charted: true,
    },
];

/// Drawn for a backend missing from [`PALETTE`]: dark enough to read,
/// plainly not one of the palette's colours.
const UNKNOWN_COLOR: &str = "#555555";

/// Where `key` comes in the common order: its place in [`PALETTE`], and
/// after all of them for a backend the palette does not know.
pub fn rank(key: &str) -> usize {
    PALETTE
        .iter()
        .position(|l| l.key == key)
        .unwrap_or(PALETTE.len())
}

fn find(key: &str) -> Option<&'static Look> {
    PALETTE.iter().find(|l| l.key == key)
}

/// The name `key` is drawn under (a backend not in [`PALETTE`] yet keeps
/// its key: still drawn, rather than dropped from the charts).
pub fn name(key: &str) -> &str {
    find(key).map_or(key, |l| l.name)
}

/// The colour `key` is drawn in.
pub fn color(key: &str) -> &'static str {
    find(key).map_or(UNKNOWN_COLOR, |l| l.color)
}

/// Whether the charts draw `key`.
pub fn charted(key: &str) -> bool {
    find(key).is_none_or(|l| l.charted)
}

/// The items sorted into the common order by their backend key (stable, so
/// unknown backends keep the order of the run).
pub fn ordered<T>(items: &[T], key: impl Fn(&T) -> &str) -> Vec<&T> {
    let mut v: Vec<&T> = items.iter().collect();
    v.sort_by_key(|t| rank(key(t)));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_backend_has_its_own_colour() {
        for (i, a) in PALETTE.iter().enumerate() {
            for b in &PALETTE[i + 1..] {
                assert_ne!(a.color, b.color, "{} and {}", a.key, b.key);
                assert_ne!(a.key, b.key);
            }
        }
    }

    #[test]
    fn unknown_backends_come_last_in_run_order() {
        let keys = ["zeta", "zookeeper", "alpha", "redis", "memory"];
        let sorted: Vec<&&str> = ordered(&keys, |k| k);
        assert_eq!(
            sorted,
            [&"memory", &"redis", &"zookeeper", &"zeta", &"alpha"]
        );
    }
}
