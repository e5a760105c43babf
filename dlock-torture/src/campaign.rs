//! One run against one target: its server, the fenced resource, the client
//! processes, the nemesis; then the leftovers and the checker's verdict.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dlock::Locker;
use dlock_conformance::harness::{self, Server, ServerOptions};
use serde::Serialize;
use tokio::time::sleep;

use crate::check::{Findings, Seen, check};
use crate::client::{connect, lock_name};
use crate::clients::{Clients, Workload};
use crate::history::now_ns;
use crate::nemesis::{self, Record, ServerHandle};
use crate::resource::Resource;
use crate::target::{Expect, FaultKind, Target};

/// How every run of a campaign is shaped.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Length of each run's workload.
    pub duration: Duration,
    /// Client processes.
    pub processes: u32,
    /// Tasks per process.
    pub tasks: u32,
    /// Names contended on.
    pub names: u32,
    /// Lease TTL.
    pub ttl: Duration,
    /// Where histories, the JSON and the timelines go.
    pub out: PathBuf,
}

/// A run's result.
#[derive(Debug, Serialize)]
pub struct Outcome {
    /// The target.
    pub target: Target,
    /// The run's seed.
    pub seed: u64,
    /// The workload's length (s).
    pub seconds: f64,
    /// When the workload started (ns), the origin of the timeline.
    pub started_ns: u64,
    /// What the nemesis did.
    pub nemesis: Record,
    /// Faults thrown, by kind.
    pub faults: BTreeMap<FaultKind, usize>,
    /// The checker's findings.
    pub findings: Findings,
    /// Names still held once every lease should have ended.
    pub leftovers: Vec<String>,
    /// Violations the Safety model does not predict (or call bounds and
    /// liveness missed, or leftovers).
    pub unpredicted: usize,
    /// For a control, whether it showed the violation it must.
    pub control_showed: Option<bool>,
    /// Grant times (ns), for the timeline.
    #[serde(skip)]
    pub grant_times: Vec<u64>,
}

impl Outcome {
    /// Whether the run passes: nothing unpredicted, and a control showed
    /// its violation.
    pub fn passed(&self) -> bool {
        self.unpredicted == 0 && self.control_showed != Some(false)
    }
}

/// Runs `target` once.
pub async fn run(target: &Target, settings: &Settings, seed: u64) -> Result<Outcome, String> {
    let dir = settings.out.join(slug(target.label));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let server = match target.service {
        Some(service) => Some(start_server(service, target.server_args).await?),
        None => None,
    };
    let upstream = match &server {
        Some(s) => Some(SocketAddr::from((
            [127, 0, 0, 1],
            s.port().ok_or("the server has no port")?,
        ))),
        None => None,
    };
    let url = server.as_ref().map_or("memory://".to_owned(), |s| s.url().to_owned());
    let resource = Resource::start()
        .await
        .map_err(|e| format!("the fenced resource: {e}"))?;
    let started_ns = now_ns();
    let until_ns = started_ns + nanos(settings.duration);
    // The last stretch is quiet: the last heal is measured, and the
    // clients release before the leftovers are listed.
    let quiet = (settings.duration / 5).clamp(Duration::from_secs(5), Duration::from_secs(30));
    let workload = Workload {
        driver: target.driver,
        url: url.clone(),
        upstream,
        resource: resource.addr(),
        tasks: settings.tasks,
        names: settings.names,
        ttl: settings.ttl,
        until_ns,
        seed,
        dir: dir.clone(),
        long_holds: target.long_holds,
    };
    let processes = target.processes.unwrap_or(settings.processes);
    let clients = Arc::new(Clients::start(workload, processes).await?);
    let handle = server.as_ref().map(|s| ServerHandle {
        service: s.service(),
        url: url.clone(),
        container: s.container().map(|c| c.id().to_owned()).unwrap_or_default(),
    });
    let record = nemesis::run(
        target.faults,
        clients.clone(),
        handle,
        settings.ttl,
        seed,
        until_ns.saturating_sub(nanos(quiet)),
    )
    .await?;
    sleep(Duration::from_nanos(until_ns.saturating_sub(now_ns()))).await;
    // A client ends its hold in progress: at most a wait and a hold.
    let mut kills = clients.finish(until_ns + nanos(Duration::from_secs(30))).await;
    kills.extend(
        record
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::ClientKill)
            .filter_map(|f| Some((f.client?, f.start))),
    );
    let leftovers = match &server {
        Some(_) => {
            sleep(target.lease_bound(settings.ttl) + Duration::from_secs(2)).await;
            leftovers(target.driver, &url, settings.names).await?
        }
        // An in-process lock space ended with its process.
        None => Vec::new(),
    };
    let mut events = Vec::new();
    for (_, path) in clients.histories() {
        // A client killed before it created its file wrote nothing.
        events.extend(crate::history::read(&path).unwrap_or_default());
    }
    let grant_times = events
        .iter()
        .filter(|e| matches!(e.what, crate::history::What::Granted { .. }))
        .map(|e| e.t)
        .collect();
    let writes = resource.log();
    let findings = check(
        events,
        &Seen {
            target,
            ttl: settings.ttl,
            nemesis: &record,
            kills: &kills,
            writes: &writes,
            until_ns,
        },
    );
    let unpredicted = findings
        .exclusion
        .iter()
        .filter(|o| o.explained_by.is_none())
        .count()
        + findings
            .fencing
            .iter()
            .filter(|s| s.explained_by.is_none())
            .count()
        + findings.unavailable.len()
        + findings.slow_calls.len()
        + leftovers.len();
    let control_showed = target.expect.map(|e| match e {
        Expect::Exclusion => !findings.exclusion.is_empty(),
        Expect::Fencing => !findings.fencing.is_empty(),
    });
    let mut faults = BTreeMap::new();
    for f in &record.faults {
        *faults.entry(f.kind).or_default() += 1;
    }
    drop(server);
    Ok(Outcome {
        target: target.clone(),
        seed,
        seconds: settings.duration.as_secs_f64(),
        started_ns,
        nemesis: record,
        faults,
        findings,
        leftovers,
        unpredicted,
        control_showed,
        grant_times,
    })
}

/// The file-name form of a target's label.
pub fn slug(label: &str) -> String {
    let mut slug = String::new();
    for c in label.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.trim_matches('-').to_owned()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

async fn start_server(
    service: harness::Service,
    args: &'static [&'static str],
) -> Result<Server, String> {
    let options = ServerOptions {
        // A killed server comes back where the proxies forward.
        fixed_port: true,
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..ServerOptions::default()
    };
    // The harness panics with its message when Docker or the image fails.
    tokio::spawn(harness::start(service, options))
        .await
        .map_err(|e| match e.try_into_panic() {
            Ok(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "the server did not start".to_owned()),
            Err(e) => e.to_string(),
        })
}

/// The run's names still held.
async fn leftovers(driver: &str, url: &str, names: u32) -> Result<Vec<String>, String> {
    let backend = connect(driver, url, 0)
        .await
        .map_err(|e| format!("connecting to list leftovers: {e}"))?;
    let locker = Locker::from_arc(backend);
    let mut held = Vec::new();
    for i in 0..names {
        let name = lock_name(i);
        let holders = locker
            .holders(&name)
            .await
            .map_err(|e| format!("listing the holders of {name}: {e}"))?;
        held.extend(
            holders
                .into_iter()
                .map(|h| format!("{name} (token {})", h.fencing_token)),
        );
    }
    Ok(held)
}
