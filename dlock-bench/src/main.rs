//! `cargo run --release -p dlock-bench`: compares the dlock backends side by
//! side. Starts Redis, MariaDB, PostgreSQL, ZooKeeper and etcd from the project's test image
//! (the same harness as the tests), on a Docker network of its own, unless
//! given running servers.

mod floors;
mod heap;
mod report;
mod scenarios;
mod servers;
mod shared;
mod target;
mod turns;

/// Counts heap bytes, for the client memory per held lease.
#[global_allocator]
static GLOBAL: heap::Counting = heap::Counting;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use dlock::MemoryBackend;
use dlock_conformance::harness::Service;
use indicatif::{ProgressBar, ProgressStyle};

use report::{BackendReport, Report};
use servers::Servers;
use target::{Op, Result, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    Memory,
    Redis,
    Mysql,
    Postgres,
    /// PostgreSQL's session mode (advisory locks).
    PostgresSession,
    Zookeeper,
    Etcd,
}

impl Which {
    /// The server this backend runs on, and the URL its flag gave for it
    /// (`None`: the memory backend, which has none).
    fn server(self, args: &Args) -> Option<(Service, Option<String>)> {
        let (service, flag) = match self {
            Which::Memory => return None,
            Which::Redis => (Service::Redis, &args.redis_url),
            Which::Mysql => (Service::MariaDb, &args.mysql_url),
            Which::Postgres | Which::PostgresSession => (Service::Postgres, &args.postgres_url),
            Which::Zookeeper => (Service::ZooKeeper, &args.zk_connect),
            Which::Etcd => (Service::Etcd, &args.etcd_url),
        };
        Some((service, flag.clone()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// Uncontended acquire+release, with bare-client floors.
    Cycle,
    /// Many clients on one name: hand-off latency and fairness.
    Contended,
    /// Many leases held and renewed: requests per tick, memory per lock.
    Held,
    /// Uncontended throughput as clients double.
    Scaling,
    /// A read-mostly reader-writer lock against a mutex on the same work,
    /// and a semaphore, each with every client on one name.
    Shared,
}

/// Compare the dlock backends: throughput, hand-off latency, fairness,
/// held leases and scaling, against the bare client library.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Backends to measure.
    #[arg(long, value_delimiter = ',', default_values = ["memory", "redis", "mysql", "postgres", "postgres-session", "zookeeper", "etcd"])]
    backends: Vec<Which>,
    /// Scenarios to run.
    #[arg(long, value_delimiter = ',', default_values = ["cycle", "contended", "held", "scaling", "shared"])]
    scenarios: Vec<Scenario>,
    /// Concurrent clients (each with its own connections) in the cycle and
    /// contended scenarios.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// The most clients in the scaling scenario (it doubles from 1).
    #[arg(long, default_value_t = 64)]
    max_clients: usize,
    /// Leases held at once in the held scenario, one run per count.
    #[arg(long, value_delimiter = ',', default_values_t = [10_000, 100_000])]
    held: Vec<usize>,
    /// A smoke run in well under two minutes: 4 clients, 0.3 s per
    /// measurement, scaling to 16, 200 held leases.
    #[arg(long)]
    quick: bool,
    /// Write every figure as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Print the table and draw the charts from a JSON file written by
    /// `--json`, without measuring anything.
    #[arg(long)]
    render: Option<PathBuf>,
    /// After the tables, print every figure beside the same figure of a
    /// run saved with `--json`, and their ratio (with `--render`, compares
    /// two saved runs without measuring).
    #[arg(long, value_name = "OLD.json")]
    compare: Option<PathBuf>,
    /// Where the charts go (overhead.svg, handoff.svg, scaling.svg,
    /// latency.svg).
    #[arg(long, default_value = "target/dlock-bench")]
    charts: PathBuf,
    /// A running Redis instead of a container (also DLOCK_REDIS_URL).
    #[arg(long)]
    redis_url: Option<String>,
    /// A running MySQL/MariaDB instead of a container (also DLOCK_MYSQL_URL).
    #[arg(long)]
    mysql_url: Option<String>,
    /// A running PostgreSQL instead of a container (also DLOCK_POSTGRES_URL).
    #[arg(long)]
    postgres_url: Option<String>,
    /// A running ZooKeeper instead of a container (also DLOCK_ZK_CONNECT).
    #[arg(long)]
    zk_connect: Option<String>,
    /// A running etcd instead of a container (also DLOCK_ETCD_URL).
    #[arg(long)]
    etcd_url: Option<String>,
}

/// Prints a failure as one readable line (with its causes), never a
/// `Debug` struct or a backtrace, and exits non-zero.
fn main() -> std::process::ExitCode {
    match bench() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let mut line = format!("dlock-bench: {e}");
            let mut cause = e.source();
            while let Some(c) = cause {
                // Client libraries often repeat their cause in their own text.
                let text = c.to_string();
                if !line.contains(&text) {
                    line.push_str(": ");
                    line.push_str(&text);
                }
                cause = c.source();
            }
            eprintln!("{line}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn bench() -> Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.clients = args.clients.min(4);
        args.duration = args.duration.min(0.3);
        args.max_clients = args.max_clients.min(16);
        args.held = vec![200];
    }
    if let Some(path) = &args.render {
        let report: Report = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        return publish(&report, &args);
    }
    if args.clients == 0 || args.max_clients == 0 || args.duration <= 0.0 {
        return Err("--clients, --max-clients and --duration must be positive".into());
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let duration = Duration::from_secs_f64(args.duration);
    let wanted: Vec<_> = args
        .backends
        .iter()
        .filter_map(|w| w.server(&args))
        .collect();
    let servers = Servers::start(&wanted).await?;
    let url = |which: Which| match which.server(&args) {
        Some((service, _)) => servers.url(service),
        None => Err(format!("{which:?} has no server").into()),
    };
    let mut targets = Vec::new();
    for &which in &args.backends {
        targets.push(match which {
            Which::Memory => Target::Memory(MemoryBackend::new()),
            Which::Redis => Target::Redis(url(which)?),
            Which::Mysql => Target::MySql(url(which)?),
            Which::Postgres => Target::Postgres(url(which)?),
            Which::PostgresSession => Target::PgSession(url(which)?),
            Which::Zookeeper => Target::ZooKeeper(url(which)?),
            Which::Etcd => Target::Etcd(url(which)?),
        });
    }
    let scaling_points: Vec<usize> = std::iter::successors(Some(1usize), |c| Some(c * 2))
        .take_while(|&c| c <= args.max_clients)
        .collect();
    let has = |s| args.scenarios.contains(&s);
    let steps = targets.len()
        * (usize::from(has(Scenario::Cycle)) * 4
            + usize::from(has(Scenario::Contended))
            + usize::from(has(Scenario::Held))
            + usize::from(has(Scenario::Shared))
            + usize::from(has(Scenario::Scaling)) * scaling_points.len());
    let bar = ProgressBar::new(u64::try_from(steps).unwrap_or(0));
    bar.set_style(ProgressStyle::with_template(
        "{bar:30} {pos}/{len} {elapsed} {msg}",
    )?);

    let mut report = Report {
        machine: machine(servers.place()),
        clients: args.clients,
        duration_s: args.duration,
        quick: args.quick,
        backends: Vec::new(),
    };
    for target in &targets {
        let name = target.label();
        target.prepare().await?;
        let mut r = BackendReport {
            backend: name.to_owned(),
            ..BackendReport::default()
        };
        if has(Scenario::Held) && target.holds_many() {
            for &leases in &args.held {
                bar.set_message(format!("{name}: {leases} held leases"));
                // One process holding many leases, as a busy node would,
                // before the other clients connect: their sessions' pings
                // (ZooKeeper) and keep-alives (etcd) would count as its
                // renewals.
                let client = target.client(16).await?;
                r.held
                    .extend(scenarios::held(target, client, leases).await?);
            }
            bar.inc(1);
        }
        let need = if has(Scenario::Scaling) {
            args.clients.max(args.max_clients)
        } else {
            args.clients
        };
        let mut clients = Vec::with_capacity(need);
        for _ in 0..need {
            // One connection each: a client is one node's worth of traffic.
            clients.push(target.client(1).await?);
        }
        let cycles = |n: usize| -> Vec<Arc<dyn Op>> {
            clients[..n]
                .iter()
                .map(|b| {
                    Arc::new(target::Cycle {
                        backend: b.clone(),
                        opts: dlock::LockOptions::new().ttl(Duration::from_secs(30)),
                    }) as Arc<dyn Op>
                })
                .collect()
        };
        if has(Scenario::Cycle) {
            bar.set_message(format!("{name}: round trip"));
            if let Some(op) = target.round_trip().await? {
                r.round_trip = Some(
                    scenarios::throughput(&[Arc::from(op)], "rtt", duration)
                        .await?
                        .latency,
                );
            }
            bar.inc(1);
            bar.set_message(format!("{name}: cycles and raw floor, in turns"));
            let raw = ops(args.clients, async || target.raw_floor().await).await?;
            if let Some(raw) = raw {
                let p =
                    scenarios::paired(&cycles(args.clients), &raw, "cycle", duration * 2).await?;
                (r.cycle, r.raw_floor, r.cycle_ratio) = (Some(p.a), Some(p.b), Some(p.ratio));
                // Latency alone, without the clients competing for the cores.
                r.one_client =
                    Some(scenarios::paired(&cycles(1), &raw[..1], "single", duration * 2).await?);
            } else {
                r.cycle =
                    Some(scenarios::throughput(&cycles(args.clients), "cycle", duration).await?);
            }
            bar.inc(2);
            bar.set_message(format!("{name}: classic lock"));
            r.classic_cas = floor(args.clients, "cas", duration, async || {
                target.classic_cas().await
            })
            .await?;
            bar.inc(1);
        }
        if has(Scenario::Contended) {
            bar.set_message(format!("{name}: contended"));
            r.contended =
                Some(scenarios::contended(target, &clients[..args.clients], name, duration).await?);
            bar.inc(1);
        }
        if has(Scenario::Shared) && target.has_semaphores() {
            bar.set_message(format!("{name}: reader-writer lock and semaphore"));
            r.shared = Some(shared::shared(&clients[..args.clients], name, duration).await?);
            bar.inc(1);
        }
        if has(Scenario::Scaling) {
            for &n in &scaling_points {
                bar.set_message(format!("{name}: scaling, {n} clients"));
                r.scaling
                    .push(scenarios::throughput(&cycles(n), &format!("scale{n}"), duration).await?);
                bar.inc(1);
            }
        }
        report.backends.push(r);
    }
    bar.finish_and_clear();
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        eprintln!("figures: {}", path.display());
    }
    publish(&report, &args)
}

fn publish(report: &Report, args: &Args) -> Result<()> {
    println!("{}", report::markdown(report));
    if let Some(path) = &args.compare {
        let old: Report = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        println!("{}", report::compare(&old, report)?);
    }
    report::charts(report, &args.charts)?;
    eprintln!("charts: {}", args.charts.display());
    Ok(())
}

/// Runs a bare-client baseline with `n` clients, each with its own
/// connection from `make`, if the backend has one.
async fn floor(
    n: usize,
    run: &str,
    duration: Duration,
    make: impl AsyncFnMut() -> Result<Option<Box<dyn Op>>>,
) -> Result<Option<scenarios::Throughput>> {
    match ops(n, make).await? {
        Some(ops) => Ok(Some(scenarios::throughput(&ops, run, duration).await?)),
        None => Ok(None),
    }
}

/// `n` ops from `make`, or `None` when the target has no such op.
async fn ops(
    n: usize,
    mut make: impl AsyncFnMut() -> Result<Option<Box<dyn Op>>>,
) -> Result<Option<Vec<Arc<dyn Op>>>> {
    let mut ops: Vec<Arc<dyn Op>> = Vec::with_capacity(n);
    while ops.len() < n {
        match make().await? {
            Some(op) => ops.push(Arc::from(op)),
            None => return Ok(None),
        }
    }
    Ok(Some(ops))
}

/// The machine, and where its servers were.
fn machine(servers: &str) -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")?
                    .split(':')
                    .nth(1)
                    .map(|m| m.trim().to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    format!("{cores} cores, {cpu}, {servers}")
}
