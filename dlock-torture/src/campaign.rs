//! One run against one target: its server, the fenced resource, the client
//! processes, the nemesis; then the leftovers and the checker's verdict.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dlock::Locker;
use dlock_conformance::harness::{self, Server, ServerOptions, Service};
use dlock_conformance::topology::{self, Topology};
use serde::Serialize;
use tokio::time::sleep;

use crate::check::{Findings, Seen, check};
use crate::client::{connect, lock_name};
use crate::clients::{Clients, Workload};
use crate::history::now_ns;
use crate::nemesis::{self, FaultRecord, Record, Servers};
use crate::resource::Resource;
use crate::target::{Expect, FaultKind, Target, Topo};

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
    /// Lock-delay on the TTL backends (zero: none).
    pub lock_delay: Duration,
    /// Where histories, the JSON and the timelines go.
    pub out: PathBuf,
}

impl Settings {
    /// How long the server keeps a lease its holder stopped renewing: the
    /// TTL, and the lock-delay after it.
    pub fn server_ttl(&self) -> Duration {
        self.ttl + self.lock_delay
    }
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
    /// Client processes that exited with an error of their own.
    pub crashed: Vec<String>,
    /// The lease TTL it ran with (ms).
    pub ttl_ms: u64,
    /// The lock-delay it ran with (ms; 0: none).
    pub lock_delay_ms: u64,
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
    let cluster = match target.topology {
        Some(topo) => Some(start_cluster(topo).await?),
        None => None,
    };
    let upstream = match &server {
        Some(s) => Some(SocketAddr::from((
            [127, 0, 0, 1],
            s.port().ok_or("the server has no port")?,
        ))),
        None => None,
    };
    let url = match (&server, &cluster, target.topology) {
        (Some(s), _, _) => s.url().to_owned(),
        (_, Some(c), Some(Topo::EtcdCluster)) => c.etcd_url(&all(c)),
        (_, Some(c), Some(Topo::RedisSentinel)) => c.sentinel_url(),
        (_, Some(c), Some(Topo::RedisCluster)) => c.cluster_url(),
        (_, Some(c), _) => c.connect_string(&all(c)),
        _ => "memory://".to_owned(),
    };
    let resource = Resource::start()
        .await
        .map_err(|e| format!("the fenced resource: {e}"))?;
    let started_ns = now_ns();
    let until_ns = started_ns + nanos(settings.duration);
    // The last stretch is quiet: the last heal is measured, and the
    // clients release before the leftovers are listed. The last batch may
    // run 6 s past the nemesis's end, and then its heal is judged like any
    // other. A control is judged by the violations it must show, not by
    // its recovery: its faults come as often as they can.
    let (judged_quiet, quiet) = if target.expect.is_none() {
        let judged_quiet = target.liveness_bound(settings.server_ttl()) + Duration::from_secs(1);
        let tail = (settings.duration / 5).clamp(
            judged_quiet + Duration::from_secs(6),
            Duration::from_secs(60),
        );
        (judged_quiet, tail)
    } else {
        (Duration::from_secs(3), Duration::from_secs(5))
    };
    let workload = Workload {
        driver: target.driver,
        url: url.clone(),
        upstream,
        resource: resource.addr(),
        tasks: settings.tasks,
        names: settings.names,
        ttl: settings.ttl,
        lock_delay: settings.lock_delay,
        until_ns,
        seed,
        dir: dir.clone(),
        long_holds: target.long_holds,
    };
    let clock = crate::clock::Watcher::start().map_err(|e| format!("the clock watcher: {e}"))?;
    let processes = target.processes.unwrap_or(settings.processes);
    let clients = Arc::new(Clients::start(workload, processes).await?);
    let servers = match (&server, &cluster) {
        (Some(s), _) => Some(Servers::One {
            service: s.service(),
            url: url.clone(),
            container: s.container().map(|c| c.id().to_owned()).unwrap_or_default(),
        }),
        (_, Some(c)) => Some(Servers::Cluster {
            topo: target.topology.ok_or("a cluster without a topology")?,
            members: c
                .nodes()
                .iter()
                .map(|n| match n.addr().parse() {
                    Ok(addr) => Ok((n.name().to_owned(), addr)),
                    Err(e) => Err(format!("member {}: {e}", n.addr())),
                })
                .collect::<Result<_, String>>()?,
        }),
        _ => None,
    };
    let mut record = nemesis::run(
        target.faults,
        clients.clone(),
        servers,
        settings.ttl,
        seed,
        until_ns.saturating_sub(nanos(quiet)),
        judged_quiet,
    )
    .await?;
    sleep(Duration::from_nanos(until_ns.saturating_sub(now_ns()))).await;
    // A client ends its hold in progress: at most a wait and a hold.
    let (mut kills, crashed) = clients
        .finish(until_ns + nanos(Duration::from_secs(30)))
        .await;
    kills.extend(
        record
            .faults
            .iter()
            .filter(|f| f.kind == FaultKind::ClientKill)
            .filter_map(|f| Some((f.client?, f.start))),
    );
    // An in-process lock space ends with its process: nothing to list.
    let leftovers = if target.service.is_some() || target.topology.is_some() {
        // Every lease ends within its bound; a ZooKeeper session's nodes go
        // at the server's next tick after it; a loaded machine adds more.
        let settle = target.lease_bound(settings.server_ttl()) + Duration::from_secs(8);
        leftovers(target.driver, &url, settings.names, settle).await?
    } else {
        Vec::new()
    };
    record
        .faults
        .extend(clock.stop()?.into_iter().map(|step| FaultRecord {
            kind: FaultKind::ClockStep,
            client: None,
            node: None,
            failed_over: false,
            settled: None,
            start: step.before,
            end: step.after,
            step_ns: Some(step.by),
            slots: None,
        }));
    let mut events = Vec::new();
    for (_, path) in clients.histories() {
        events.extend(crate::history::read(&path).map_err(|e| format!("a history: {e}"))?);
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
            lock_delay: settings.lock_delay,
            nemesis: &record,
            kills: &kills,
            writes: &writes,
            until_ns,
            names: settings.names,
        },
    );
    let unpredicted = findings.unpredicted() + leftovers.len() + crashed.len();
    let control_showed = target.expect.map(|e| match e {
        Expect::Exclusion => !findings.exclusion.is_empty(),
        Expect::Fencing => !findings.fencing.is_empty(),
    });
    let mut faults = BTreeMap::new();
    for f in &record.faults {
        *faults.entry(f.kind).or_default() += 1;
    }
    drop(server);
    if let Some(cluster) = cluster {
        // Removing containers blocks on Docker.
        let _ = tokio::task::spawn_blocking(move || drop(cluster)).await;
    }
    Ok(Outcome {
        target: *target,
        seed,
        seconds: settings.duration.as_secs_f64(),
        started_ns,
        nemesis: record,
        faults,
        findings,
        leftovers,
        crashed,
        ttl_ms: settings.ttl.as_millis() as u64,
        lock_delay_ms: settings.lock_delay.as_millis() as u64,
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

async fn start_server(service: Service, args: &'static [&'static str]) -> Result<Server, String> {
    let options = ServerOptions {
        // A killed server comes back where the proxies forward.
        fixed_port: true,
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..ServerOptions::default()
    };
    caught(tokio::spawn(harness::start(service, options))).await
}

async fn start_cluster(topo: Topo) -> Result<Topology, String> {
    match topo {
        Topo::ZooKeeperEnsemble => caught(tokio::spawn(topology::zookeeper_ensemble(3))).await,
        Topo::EtcdCluster => caught(tokio::spawn(topology::etcd_cluster_on_disk(3))).await,
        Topo::RedisSentinel => caught(tokio::spawn(topology::redis_sentinel())).await,
        Topo::RedisCluster => caught(tokio::spawn(topology::redis_cluster())).await,
    }
}

fn all(cluster: &Topology) -> Vec<usize> {
    (0..cluster.nodes().len()).collect()
}

/// The harness panics with its message when Docker or the image fails: the
/// message, as an error.
async fn caught<T>(task: tokio::task::JoinHandle<T>) -> Result<T, String> {
    task.await.map_err(|e| match e.try_into_panic() {
        Ok(panic) => panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "the servers did not start".to_owned()),
        Err(e) => e.to_string(),
    })
}

/// The run's names still held once `settle` has passed (asked again
/// every half second until then, so a clean run ends early).
async fn leftovers(
    driver: &str,
    url: &str,
    names: u32,
    settle: Duration,
) -> Result<Vec<String>, String> {
    let deadline = tokio::time::Instant::now() + settle;
    let backend = connect(driver, url, 0)
        .await
        .map_err(|e| format!("connecting to list leftovers: {e}"))?;
    let locker = Locker::from_arc(backend);
    loop {
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
        if held.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(held);
        }
        sleep(Duration::from_millis(500)).await;
    }
}
