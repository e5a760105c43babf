//! The results: markdown tables on stdout, JSON, and SVG charts.
//!
//! The JSON is [`Report`] as serde writes it; fields added since the first
//! saved runs have defaults, so that every older `results.json` still
//! renders and compares.

mod charts;
mod palette;
mod plot;
mod svg;
mod tables;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::scenarios::{Contention, Held, Latency, Paired, Throughput};
use crate::shared::SharedReport;
use crate::target::Result;

pub use tables::{compare, markdown};

/// Every figure of one backend; a scenario not run leaves its `None` or
/// empty list.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct BackendReport {
    /// The backend's key (`Target::label`: `memory`, `redis`, …), which
    /// also picks its colour and place in the charts.
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
    /// Many clients on one name: hand-off latency and fairness.
    pub contended: Option<Contention>,
    /// One run per lease count (a single object in older reports).
    #[serde(default, deserialize_with = "one_or_many")]
    pub held: Vec<Held>,
    /// Uncontended cycles as clients double, from 1.
    pub scaling: Vec<Throughput>,
    /// Reader-writer lock and semaphore under load (older reports: none).
    #[serde(default)]
    pub shared: Option<SharedReport>,
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

/// One run of the bench, as `--json` saves it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    /// Cores, CPU and how the servers were reached.
    pub machine: String,
    /// Concurrent clients in the cycle and contended scenarios.
    pub clients: usize,
    /// Seconds per measurement.
    pub duration_s: f64,
    /// Whether it was a `--quick` smoke run.
    pub quick: bool,
    /// The backends in the order they ran.
    pub backends: Vec<BackendReport>,
}

/// Draws the charts of `r` into `dir`: `overhead.svg` (each backend's cycle
/// against its raw floor), `handoff.svg`, `scaling.svg` and `latency.svg`.
pub fn charts(r: &Report, dir: &Path) -> Result<()> {
    charts::write(r, dir)
}
