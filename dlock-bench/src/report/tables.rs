//! The markdown tables of a run, and the comparison with a saved one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::palette::ordered;
use super::{BackendReport, Report};
use crate::scenarios::Throughput;
use crate::shared::SharedReport;
use crate::target::Result;

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

/// The tables of a run, backends in the charts' order.
pub fn markdown(r: &Report) -> String {
    let backends = ordered(&r.backends, |b| b.backend.as_str());
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
        "| backend | round trip p50 | cycles/s | p50 | p99 | p999 | raw floor cycles/s | dlock / raw | 1 client: cycles/s | raw floor | dlock / raw | classic cycles/s | dlock / classic |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for b in &backends {
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
        "| backend | grants/s | hand-off p50 | p99 | p50 in round trips | taken back by the releaser | server requests per grant | load per waiter during hand-offs (requests/s) | load per waiter while the lock is held (requests/s) | grants per client min–max | Jain | classic hand-off p50 | hand-off / classic |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for b in &backends {
        let Some(c) = &b.contended else { continue };
        let rtts = opt(b.round_trip.as_ref(), |l| {
            format!("{:.1}", c.handoff.p50_us as f64 / l.p50_us.max(1) as f64)
        });
        let taken_back = if c.grants > 0 {
            format!("{:.0} %", 100.0 * c.regrants as f64 / c.grants as f64)
        } else {
            "–".to_owned()
        };
        let classic = c.classic.as_ref().map(|k| k.handoff.p50_us);
        let _ = writeln!(
            s,
            "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {}–{} | {:.3} | {} | {} |",
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
            c.jain,
            opt(classic, ms),
            opt(classic, |k| format!(
                "{:.2}",
                c.handoff.p50_us as f64 / k.max(1) as f64
            )),
        );
    }
    if r.backends.iter().any(|b| !b.held.is_empty()) {
        let _ = writeln!(s, "\n**Held leases** (renewed by their guards)\n");
        let _ = writeln!(
            s,
            "| backend | leases | TTL | server requests per renewal tick | server memory per lock (bytes) | client heap per lease (bytes) | lost |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for b in &backends {
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
        for b in &backends {
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
    shared_table(&mut s, &backends);
    s
}

/// The reader-writer lock and semaphore table, when any backend ran them.
fn shared_table(s: &mut String, backends: &[&BackendReport]) {
    use crate::shared::{PERMITS, WORK};
    let runs: Vec<(&str, &SharedReport)> = backends
        .iter()
        .filter_map(|b| Some((b.backend.as_str(), b.shared.as_ref()?)))
        .filter(|(_, r)| r.read_mostly.is_some() || r.semaphore.is_some())
        .collect();
    if runs.is_empty() {
        return;
    }
    let work_ms = WORK.as_secs_f64() * 1000.0;
    let ceiling = f64::from(PERMITS) / WORK.as_secs_f64();
    let _ = writeln!(
        s,
        "\n**Reader-writer lock and semaphore** (every client on one name, each hold {work_ms:.0} ms of work; \
         read-mostly: one write in 20, against the same work under a mutex; semaphore of {PERMITS}, \
         whose ceiling is {ceiling:.0} grants/s; wait from asking to the grant, ms)\n"
    );
    let _ = writeln!(
        s,
        "| backend | read-mostly grants/s | as a mutex | rw / mutex | most holders at once | wait p50 | p99 | semaphore grants/s | of the ceiling | most holders at once | wait p50 | p99 |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (backend, r) in runs {
        let (rw, mutex, sem) = (
            r.read_mostly.as_ref(),
            r.read_mostly_as_mutex.as_ref(),
            r.semaphore.as_ref(),
        );
        let ratio = match (rw, mutex) {
            (Some(a), Some(b)) if b.grants_per_s > 0.0 => {
                format!("{:.1}", a.grants_per_s / b.grants_per_s)
            }
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            s,
            "| {backend} | {} | {} | {ratio} | {} | {} | {} | {} | {} | {} | {} | {} |",
            opt(rw, |l| format!("{:.0}", l.grants_per_s)),
            opt(mutex, |l| format!("{:.0}", l.grants_per_s)),
            opt(rw, |l| l.most_at_once.to_string()),
            opt(rw, |l| ms(l.wait.p50_us)),
            opt(rw, |l| ms(l.wait.p99_us)),
            opt(sem, |l| format!("{:.0}", l.grants_per_s)),
            opt(sem, |l| format!("{:.2}", l.grants_per_s / ceiling)),
            opt(sem, |l| l.most_at_once.to_string()),
            opt(sem, |l| ms(l.wait.p50_us)),
            opt(sem, |l| ms(l.wait.p99_us)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Report;

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
