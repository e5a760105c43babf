//! The charts of a report, each from the figures of the tables: dlock's
//! overhead over the bare server operations, hand-off latency, throughput
//! as clients are added, and cycle latency by percentile.

use std::path::Path;

use super::palette::{self, ordered};
use super::plot::{self, Scale, Titles, Track, XAxis};
use super::svg::Key;
use super::{BackendReport, Report};
use crate::target::Result;

/// The neutral grey of legend samples that stand for every backend's
/// colour (solid or pale).
const ANY: &str = "#777777";

/// The backends the charts draw, in the common order.
fn charted(r: &Report) -> Vec<&BackendReport> {
    let all = ordered(&r.backends, |b| b.backend.as_str());
    all.into_iter()
        .filter(|b| palette::charted(&b.backend))
        .collect()
}

/// dlock's cycle rate over the raw floor's, with all the clients: the
/// median of the turns' ratios, or (older reports) the ratio of the totals.
fn all_clients(b: &BackendReport) -> Option<(f64, f64, f64)> {
    let (cycle, raw) = (b.cycle.as_ref()?, b.raw_floor.as_ref()?);
    let ratio = match b.cycle_ratio {
        Some(r) => r,
        None if raw.ops_per_s > 0.0 => cycle.ops_per_s / raw.ops_per_s,
        None => return None,
    };
    Some((ratio, cycle.ops_per_s, raw.ops_per_s))
}

/// `0.76  (12.0k vs 16.3k cycles/s)`.
fn ratio_label((ratio, dlock, raw): (f64, f64, f64)) -> String {
    let rate = |v: f64| {
        if v >= 1000.0 {
            format!("{:.1}k", v / 1000.0)
        } else {
            format!("{v:.0}")
        }
    };
    format!("{ratio:.2}  ({} vs {} cycles/s)", rate(dlock), rate(raw))
}

/// `overhead.svg`: each backend's cycle as a share of its raw floor, with
/// all the clients and with one.
fn overhead(r: &Report) -> String {
    let rows: Vec<(&str, Vec<Track>)> = charted(r)
        .into_iter()
        .filter_map(|b| {
            let mut tracks = Vec::new();
            if let Some(all) = all_clients(b) {
                tracks.push(Track {
                    bars: vec![(all.0, false)],
                    label: ratio_label(all),
                    ..Track::default()
                });
            }
            if let Some(p) = &b.one_client {
                let one = (p.ratio, p.a.ops_per_s, p.b.ops_per_s);
                tracks.push(Track {
                    bars: vec![(p.ratio, true)],
                    label: ratio_label(one),
                    ..Track::default()
                });
            }
            (!tracks.is_empty()).then_some((b.backend.as_str(), tracks))
        })
        .collect();
    let clients = r.backends.iter().find_map(|b| b.cycle.as_ref());
    let clients = clients.map_or(r.clients, |c| c.clients);
    // Older reports have no one-client pair: no key for bars not drawn.
    let (mut all, mut one) = (false, false);
    for b in charted(r) {
        all |= all_clients(b).is_some();
        one |= b.one_client.is_some();
    }
    let mut legend = Vec::new();
    if all {
        legend.push((Key::Bar(ANY, false), format!("{clients} clients")));
    }
    if one {
        legend.push((Key::Bar(ANY, true), "1 client".to_owned()));
    }
    legend.push((Key::Dash, "raw floor".to_owned()));
    let titles = Titles {
        title: "dlock's lock cycle against the bare server operations",
        subtitle: "acquire + release on distinct names; the raw floor sends the same server operations without dlock; higher is better",
        legend,
    };
    if rows.is_empty() {
        return plot::empty(&titles);
    }
    let x_title = "dlock cycles/s ÷ raw floor cycles/s  (1 = as fast as the bare operations)";
    plot::bars(&titles, x_title, Some(1.0), &rows)
}

/// `handoff.svg`: release to the next grant to another client, p50 over
/// p99, with the bare round trip marked.
fn handoff(r: &Report) -> String {
    let ms = |us: u64| us as f64 / 1000.0;
    let rows: Vec<(&str, Vec<Track>)> = charted(r)
        .into_iter()
        .filter_map(|b| {
            let h = &b.contended.as_ref()?.handoff;
            let track = Track {
                bars: vec![(ms(h.p99_us), true), (ms(h.p50_us), false)],
                tick: b.round_trip.as_ref().map(|l| ms(l.p50_us)),
                label: format!("p50 {:.2} · p99 {:.2} ms", ms(h.p50_us), ms(h.p99_us)),
            };
            Some((b.backend.as_str(), vec![track]))
        })
        .collect();
    let clients = r.backends.iter().find_map(|b| b.contended.as_ref());
    let clients = clients.map_or(r.clients, |c| c.clients);
    let subtitle = format!(
        "{clients} clients on one name; from a release to the grant to another client; lower is better"
    );
    let titles = Titles {
        title: "Hand-off latency",
        subtitle: &subtitle,
        legend: vec![
            (Key::Bar(ANY, false), "p50".to_owned()),
            (Key::Bar(ANY, true), "p99".to_owned()),
            (Key::Tick, "bare round trip (p50)".to_owned()),
        ],
    };
    if rows.is_empty() {
        return plot::empty(&titles);
    }
    plot::bars(&titles, "ms", None, &rows)
}

/// `scaling.svg`: cycles/s as clients double.
fn scaling(r: &Report) -> String {
    let series: Vec<(&str, Vec<(f64, f64)>)> = charted(r)
        .into_iter()
        .filter(|b| !b.scaling.is_empty())
        .map(|b| {
            let points = b.scaling.iter();
            let points = points.map(|t| ((t.clients.max(1) as f64).log2(), t.ops_per_s));
            (b.backend.as_str(), points.collect())
        })
        .collect();
    let titles = Titles {
        title: "Throughput as clients are added",
        subtitle: "acquire + release on distinct names, each client with its own connection; higher is better",
        legend: Vec::new(),
    };
    let sweeps = charted(r).into_iter().flat_map(|b| &b.scaling);
    let mut counts: Vec<usize> = sweeps.map(|t| t.clients.max(1)).collect();
    counts.sort_unstable();
    counts.dedup();
    let (Some(&low), Some(&high)) = (counts.first(), counts.last()) else {
        return plot::empty(&titles);
    };
    let log = |c: usize| (c as f64).log2();
    let x_axis = XAxis {
        title: "clients (log scale)",
        ticks: counts.iter().map(|&c| (log(c), c.to_string())).collect(),
        range: (log(low) - 0.3, log(high) + 0.3),
    };
    plot::lines(&titles, &x_axis, ("cycles/s", Scale::Linear), &series)
}

/// `latency.svg`: the cycle's latency percentiles with all the clients.
fn latency(r: &Report) -> String {
    const PERCENTILES: [&str; 4] = ["p50", "p90", "p99", "p99.9"];
    let series: Vec<(&str, Vec<(f64, f64)>)> = charted(r)
        .into_iter()
        .filter_map(|b| {
            let l = &b.cycle.as_ref()?.latency;
            let values = [l.p50_us, l.p90_us, l.p99_us, l.p999_us];
            let points = values.iter().enumerate();
            let points = points.map(|(i, &us)| (i as f64, us as f64 / 1000.0));
            Some((b.backend.as_str(), points.collect()))
        })
        .collect();
    let clients = r.backends.iter().find_map(|b| b.cycle.as_ref());
    let clients = clients.map_or(r.clients, |c| c.clients);
    let subtitle =
        format!("{clients} clients, acquire + release on distinct names; lower is better");
    let titles = Titles {
        title: "Lock cycle latency by percentile",
        subtitle: &subtitle,
        legend: Vec::new(),
    };
    if series.is_empty() {
        return plot::empty(&titles);
    }
    let x_axis = XAxis {
        title: "percentile",
        ticks: PERCENTILES
            .iter()
            .enumerate()
            .map(|(i, p)| (i as f64, (*p).to_owned()))
            .collect(),
        range: (-0.3, PERCENTILES.len() as f64 - 0.7),
    };
    plot::lines(&titles, &x_axis, ("ms (log scale)", Scale::Log), &series)
}

/// The chart files, in the order docs/benchmark.md shows them.
pub const FILES: [&str; 4] = ["overhead.svg", "handoff.svg", "scaling.svg", "latency.svg"];

/// Draws every chart of `r` into `dir` (see [`FILES`]).
pub fn write(r: &Report, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let drawn = [overhead(r), handoff(r), scaling(r), latency(r)];
    for (file, svg) in FILES.iter().zip(drawn) {
        std::fs::write(dir.join(file), svg)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved_run() -> Report {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/bench/results.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn every_chart_colours_a_backend_alike_and_leaves_out_memory() {
        let r = saved_run();
        for svg in [overhead(&r), handoff(&r), scaling(&r), latency(&r)] {
            for key in ["redis", "mysql", "zookeeper"] {
                assert!(svg.contains(palette::color(key)), "{key} in\n{svg}");
                assert!(svg.contains(&format!(">{}<", palette::name(key))));
            }
            assert!(!svg.contains(palette::color("memory")));
            assert!(!svg.contains(palette::name("memory")));
        }
    }

    /// The first saved runs: one held run as an object, no cycle ratio, no
    /// one-client pair.
    #[test]
    fn an_older_report_still_draws() {
        let latency = r#"{"count": 10, "mean_us": 900.0, "p50_us": 800, "p90_us": 1200, "p99_us": 2000, "p999_us": 3000}"#;
        let rate =
            |ops: f64| format!(r#"{{"clients": 16, "ops_per_s": {ops}, "latency": {latency}}}"#);
        let text = format!(
            r#"{{"machine": "m", "clients": 16, "duration_s": 1.0, "quick": true, "backends": [{{
                "backend": "redis", "round_trip": {latency}, "cycle": {}, "raw_floor": {},
                "classic_cas": null, "contended": null,
                "held": {{"leases": 10, "ttl_ms": 6000, "requests_per_tick": 1.0, "memory_per_lock_bytes": 1.0, "lost": 0}},
                "scaling": [{}]
            }}]}}"#,
            rate(900.0),
            rate(1000.0),
            rate(900.0)
        );
        let r: Report = serde_json::from_str(&text).unwrap();
        let svg = overhead(&r);
        assert!(svg.contains("0.90  (900 vs 1.0k cycles/s)"), "{svg}");
        assert!(!svg.contains("1 client"));
        assert!(handoff(&r).contains("Nothing to draw"));
        assert!(scaling(&r).contains(palette::color("redis")));
    }
}
