//! The results: a markdown table on stdout, JSON, and SVG charts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::scenarios::{Contention, Held, Latency, Paired, Throughput};
use crate::target::Result;

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct BackendReport {
    pub backend: String,
    /// One bare round trip (PING, SELECT 1, exists /).
    pub round_trip: Option<Latency>,
    /// dlock try_acquire + release on distinct names.
    pub cycle: Option<Throughput>,
    /// The same server operations sent bare with the client library.
    pub raw_floor: Option<Throughput>,
    /// cycle / raw floor: the median of the turns' ratios (older reports:
    /// none, the ratio of the totals).
    #[serde(default)]
    pub cycle_ratio: Option<f64>,
    /// The cycle and its raw floor with one client: `a` is dlock, `b` raw.
    #[serde(default)]
    pub one_client: Option<Paired>,
    /// MySQL only: SELECT, UPDATE … WHERE version = ?, release UPDATE.
    pub classic_cas: Option<Throughput>,
    pub contended: Option<Contention>,
    /// One run per lease count (a single object in older reports).
    #[serde(default, deserialize_with = "one_or_many")]
    pub held: Vec<Held>,
    pub scaling: Vec<Throughput>,
}

/// Reads `null`, one value, or a list.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<Held>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(Held),
        Many(Vec<Held>),
    }
    Ok(match Option::<OneOrMany>::deserialize(d)? {
        None => Vec::new(),
        Some(OneOrMany::One(h)) => vec![h],
        Some(OneOrMany::Many(v)) => v,
    })
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub machine: String,
    pub clients: usize,
    pub duration_s: f64,
    pub quick: bool,
    pub backends: Vec<BackendReport>,
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

fn opt<T>(v: Option<T>, f: impl FnOnce(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "–".to_owned())
}

/// Every number of a report, by where it is: `<backend>.<figure>…`, with
/// the scaling sweep keyed by client count (`scaling.16.ops_per_s`).
fn figures(report: &Report) -> Result<BTreeMap<String, f64>> {
    fn walk(path: &str, value: &serde_json::Value, out: &mut BTreeMap<String, f64>) {
        let join = |key: &str| {
            if path.is_empty() {
                key.to_owned()
            } else {
                format!("{path}.{key}")
            }
        };
        match value {
            serde_json::Value::Number(n) => {
                if let Some(n) = n.as_f64() {
                    out.insert(path.to_owned(), n);
                }
            }
            serde_json::Value::Object(fields) => {
                for (key, value) in fields {
                    walk(&join(key), value, out);
                }
            }
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    // Rows of a sweep are matched by their client count,
                    // held-lease runs by their lease count.
                    let count = item.get("clients").or_else(|| item.get("leases"));
                    let key = match count.and_then(|c| c.as_u64()) {
                        Some(clients) => clients.to_string(),
                        None => i.to_string(),
                    };
                    walk(&join(&key), item, out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    for backend in &report.backends {
        walk(&backend.backend, &serde_json::to_value(backend)?, &mut out);
    }
    Ok(out)
}

/// Each figure of `new` beside the same figure of `old`, and new / old.
/// Figures in one run only are listed with a dash.
pub fn compare(old: &Report, new: &Report) -> Result<String> {
    let (old_figures, new_figures) = (figures(old)?, figures(new)?);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "**Compared with a saved run** ({}; {} clients, {:.1} s per measurement{})\n",
        old.machine,
        old.clients,
        old.duration_s,
        if old.quick { ", --quick" } else { "" }
    );
    let _ = writeln!(s, "| figure | saved | now | now / saved |");
    let _ = writeln!(s, "|---|---|---|---|");
    let keys: BTreeSet<&String> = old_figures.keys().chain(new_figures.keys()).collect();
    for key in keys {
        let (was, is) = (old_figures.get(key), new_figures.get(key));
        let ratio = match (was, is) {
            (Some(&was), Some(&is)) if was != 0.0 => format!("{:.2}", is / was),
            _ => "–".to_owned(),
        };
        let show = |v: Option<&f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.4}"));
        let _ = writeln!(s, "| {key} | {} | {} | {ratio} |", show(was), show(is));
    }
    Ok(s)
}

pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Machine: {}. {} clients, {:.1} s per measurement{}.\n",
        r.machine,
        r.clients,
        r.duration_s,
        if r.quick { " (--quick)" } else { "" }
    );
    let _ = writeln!(
        s,
        "**Uncontended cycles** (acquire + release, distinct names; latency in ms)\n"
    );
    let _ = writeln!(
        s,
        "| backend | round trip p50 | cycles/s | p50 | p99 | p999 | raw floor cycles/s | dlock / raw | 1 client: cycles/s | raw floor | dlock / raw | classic CAS cycles/s | dlock / CAS |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for b in &r.backends {
        let (cycle, single) = (b.cycle.as_ref(), b.one_client.as_ref());
        let ratio = |base: Option<&Throughput>| match (cycle, base) {
            (Some(c), Some(b)) if b.ops_per_s > 0.0 => format!("{:.2}", c.ops_per_s / b.ops_per_s),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            b.backend,
            opt(b.round_trip.as_ref(), |l| ms(l.p50_us)),
            opt(cycle, |c| format!("{:.0}", c.ops_per_s)),
            opt(cycle, |c| ms(c.latency.p50_us)),
            opt(cycle, |c| ms(c.latency.p99_us)),
            opt(cycle, |c| ms(c.latency.p999_us)),
            opt(b.raw_floor.as_ref(), |c| format!("{:.0}", c.ops_per_s)),
            b.cycle_ratio
                .map_or_else(|| ratio(b.raw_floor.as_ref()), |r| format!("{r:.2}")),
            opt(single, |p| format!("{:.0}", p.a.ops_per_s)),
            opt(single, |p| format!("{:.0}", p.b.ops_per_s)),
            opt(single, |p| format!("{:.2}", p.ratio)),
            opt(b.classic_cas.as_ref(), |c| format!("{:.0}", c.ops_per_s)),
            ratio(b.classic_cas.as_ref()),
        );
    }
    let _ = writeln!(
        s,
        "\n**Contention on one name** (hand-off: release to the next grant to another client, ms; every client has its own backend instance and connections)\n"
    );
    let _ = writeln!(
        s,
        "| backend | grants/s | hand-off p50 | p99 | p50 in round trips | taken back by the releaser | server requests per grant | load per waiter during hand-offs (requests/s) | load per waiter while the lock is held (requests/s) | grants per client min–max | Jain |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for b in &r.backends {
        let Some(c) = &b.contended else { continue };
        let rtts = opt(b.round_trip.as_ref(), |l| {
            format!("{:.1}", c.handoff.p50_us as f64 / l.p50_us.max(1) as f64)
        });
        let taken_back = if c.grants > 0 {
            format!("{:.0} %", 100.0 * c.regrants as f64 / c.grants as f64)
        } else {
            "–".to_owned()
        };
        let _ = writeln!(
            s,
            "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {}–{} | {:.3} |",
            b.backend,
            c.grants_per_s,
            ms(c.handoff.p50_us),
            ms(c.handoff.p99_us),
            rtts,
            taken_back,
            opt(c.requests_per_grant, |r| format!("{r:.1}")),
            opt(c.waiting_requests_per_s, |r| format!("{r:.1}")),
            opt(c.idle_waiting_requests_per_s, |r| format!("{r:.1}")),
            c.min_grants_per_client,
            c.max_grants_per_client,
            c.jain
        );
    }
    if r.backends.iter().any(|b| !b.held.is_empty()) {
        let _ = writeln!(s, "\n**Held leases** (renewed by their guards)\n");
        let _ = writeln!(
            s,
            "| backend | leases | TTL | server requests per renewal tick | server memory per lock (bytes) | client heap per lease (bytes) | lost |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for b in &r.backends {
            for h in &b.held {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} s | {:.0} | {:.0} | {} | {} |",
                    b.backend,
                    h.leases,
                    h.ttl_ms / 1000,
                    h.requests_per_tick,
                    h.memory_per_lock_bytes,
                    opt(h.client_memory_per_lease_bytes, |m| format!("{m:.0}")),
                    h.lost
                );
            }
        }
    }
    if r.backends.iter().any(|b| !b.scaling.is_empty()) {
        let clients: Vec<usize> = r
            .backends
            .iter()
            .flat_map(|b| b.scaling.iter().map(|t| t.clients))
            .fold(Vec::new(), |mut v, c| {
                if !v.contains(&c) {
                    v.push(c);
                }
                v
            });
        let _ = writeln!(
            s,
            "\n**Scaling** (uncontended cycles/s by number of clients)\n"
        );
        let header: Vec<String> = clients.iter().map(|c| c.to_string()).collect();
        let _ = writeln!(s, "| backend | {} |", header.join(" | "));
        let _ = writeln!(s, "|---|{}", "---|".repeat(clients.len()));
        for b in &r.backends {
            let row: Vec<String> = clients
                .iter()
                .map(|c| {
                    opt(b.scaling.iter().find(|t| t.clients == *c), |t| {
                        format!("{:.0}", t.ops_per_s)
                    })
                })
                .collect();
            let _ = writeln!(s, "| {} | {} |", b.backend, row.join(" | "));
        }
    }
    s
}

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

type Series<'a> = (&'a str, Vec<(f64, f64)>);

/// One SVG line chart with a line and dots per backend.
fn line_chart(
    path: &Path,
    caption: &str,
    (x_desc, y_desc): (&str, &str),
    x_label: &dyn Fn(&f64) -> String,
    series: &[Series<'_>],
) -> Result<()> {
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (x_max, y_max) = points.fold((0.0f64, 0.0f64), |(x, y), &(px, py)| (x.max(px), y.max(py)));
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.2f64..x_max + 0.2, 0f64..(y_max * 1.1).max(0.001))?;
    let y_label = |y: &f64| {
        if y_max >= 100.0 {
            format!("{y:.0}")
        } else {
            format!("{y:.1}")
        }
    };
    chart
        .configure_mesh()
        .x_labels(x_max as usize + 1)
        .x_label_formatter(x_label)
        .y_label_formatter(&y_label)
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// `scaling.svg`: cycles/s by clients; `latency.svg`: cycle latency by
/// percentile.
pub fn charts(r: &Report, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    // The in-process driver is a thousand times faster than any server and
    // would flatten the others; its figures are in the table.
    let scaling: Vec<Series<'_>> = r
        .backends
        .iter()
        .filter(|b| !b.scaling.is_empty() && b.backend != "memory")
        .map(|b| {
            let points = b
                .scaling
                .iter()
                .map(|t| ((t.clients as f64).log2(), t.ops_per_s));
            (b.backend.as_str(), points.collect())
        })
        .collect();
    line_chart(
        &dir.join("scaling.svg"),
        "Uncontended acquire+release cycles/s by clients (server backends)",
        ("clients", "cycles/s"),
        &|x| format!("{}", 2f64.powf(x.round())),
        &scaling,
    )?;
    const PERCENTILES: [&str; 4] = ["p50", "p90", "p99", "p99.9"];
    let latency: Vec<Series<'_>> = r
        .backends
        .iter()
        .filter_map(|b| {
            let l = &b.cycle.as_ref()?.latency;
            let values = [l.p50_us, l.p90_us, l.p99_us, l.p999_us];
            let points = values
                .iter()
                .enumerate()
                .map(|(i, &us)| (i as f64, us as f64 / 1000.0));
            Some((b.backend.as_str(), points.collect()))
        })
        .collect();
    line_chart(
        &dir.join("latency.svg"),
        "Cycle latency (ms) by percentile",
        ("percentile", "ms"),
        &|x| {
            let i = x.round();
            let known = i >= 0.0 && (x - i).abs() < 0.01;
            let label = known.then(|| PERCENTILES.get(i as usize)).flatten();
            label.copied().unwrap_or("").to_owned()
        },
        &latency,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(cycles_per_s: f64) -> Report {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/bench/results.json"
        ))
        .unwrap();
        let mut report: Report = serde_json::from_str(&text).unwrap();
        for b in &mut report.backends {
            if let Some(c) = &mut b.cycle {
                c.ops_per_s = cycles_per_s;
            }
        }
        report
    }

    #[test]
    fn compare_gives_each_figure_its_ratio() {
        let table = compare(&report(1000.0), &report(1500.0)).unwrap();
        let cycle = table
            .lines()
            .find(|l| l.starts_with("| redis.cycle.ops_per_s |"))
            .unwrap();
        assert!(cycle.ends_with("| 1.50 |"), "{cycle}");
        let sweep = table
            .lines()
            .find(|l| l.starts_with("| redis.scaling.16.ops_per_s |"))
            .unwrap();
        assert!(sweep.ends_with("| 1.00 |"), "{sweep}");
    }
}
