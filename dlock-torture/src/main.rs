//! `cargo run --release -p dlock-torture -- --minutes 10`: a randomized
//! fault campaign against every backend. Many client processes contend on
//! a few names with every kind of hold and write to a fenced resource; a
//! seeded nemesis delays, stalls and cuts their links, pauses and kills the
//! server, stops and kills clients; a checker judges every grant against
//! the README's Safety model. Exits 1 on any violation the model does not
//! predict, or a control that shows nothing.
//!
//! | file | what |
//! |---|---|
//! | `target.rs` | the backends and controls, their faults and predicted hazards |
//! | `campaign.rs` | one run: server, resource, clients, nemesis, verdict |
//! | `clients.rs` | the client processes, each behind its own fault proxy |
//! | `client.rs` | the workload inside a client process |
//! | `nemesis.rs` | the faults |
//! | `clock.rs` | steps of the machine's wall clock, seen (not thrown) |
//! | `resource.rs` | the fenced resource |
//! | `history.rs` | what clients record, on `CLOCK_MONOTONIC` |
//! | `check.rs` | the checker |
//! | `mutant.rs` | wrong drivers for the controls |
//! | `report.rs` | table, JSON, timelines |

mod campaign;
mod check;
mod client;
mod clients;
mod clock;
mod failover;
mod history;
mod mutant;
mod nemesis;
mod report;
mod resource;
mod target;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use campaign::Settings;
use target::{BACKENDS, CONTROLS, TOPOLOGIES, Target};

/// A randomized fault campaign against every dlock backend, judged against
/// the README's Safety model.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Minutes per backend (default 10); `--seconds` overrides.
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// Seconds per backend.
    #[arg(long)]
    seconds: Option<u64>,
    /// Backends to run: redis, mariadb, postgres, zookeeper, etcd.
    #[arg(long, value_delimiter = ',')]
    backends: Option<Vec<String>>,
    /// Clusters to run: zookeeper-ensemble, etcd-cluster, redis-sentinel,
    /// redis-cluster, or none (default:
    /// all, unless `--backends` is given).
    #[arg(long, value_delimiter = ',')]
    topologies: Option<Vec<String>>,
    /// Skip the controls (runs that must show violations).
    #[arg(long, conflicts_with = "controls_only")]
    no_controls: bool,
    /// Run the controls only.
    #[arg(long)]
    controls_only: bool,
    /// Controls to run: control-redis-without-persistence-killed,
    /// control-simulated-split-brain, control-simulated-stale-tokens
    /// (default: all).
    #[arg(long, value_delimiter = ',', conflicts_with = "no_controls")]
    controls: Option<Vec<String>>,
    /// Seconds per control.
    #[arg(long, default_value_t = 30)]
    control_seconds: u64,
    /// The seed; the same seed replays the same nemesis and choices.
    #[arg(long)]
    seed: Option<u64>,
    /// Client processes.
    #[arg(long, default_value_t = 4)]
    processes: u32,
    /// Tasks per client process.
    #[arg(long, default_value_t = 4)]
    tasks: u32,
    /// Names contended on (mutexes, reader-writer locks and semaphores in turn).
    #[arg(long, default_value_t = 6)]
    names: u32,
    /// Lease TTL in milliseconds.
    #[arg(long, default_value_t = 2000)]
    ttl_ms: u64,
    /// Lock-delay in milliseconds (`LockOptions::lock_delay`; 0: none) on
    /// the TTL backends: a name whose lease ended without a release is
    /// granted to nobody for this long more.
    #[arg(long, default_value_t = 0)]
    lock_delay_ms: u64,
    /// Where histories, `report.json` and the timelines go.
    #[arg(long, default_value = "target/dlock-torture")]
    out: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// One client process of a run (started by the campaign itself).
    #[command(hide = true)]
    Client(client::ClientArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("dlock-torture: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(Command::Client(client)) = args.command {
        return match runtime.block_on(client::run(client)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dlock-torture client: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match runtime.block_on(campaign(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("dlock-torture: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn campaign(args: Args) -> Result<bool, String> {
    let targets = pick(&args)?;
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let duration = match args.seconds {
        Some(s) => Duration::from_secs(s),
        None => Duration::from_secs_f64((args.minutes * 60.0).max(1.0)),
    };
    let settings = Settings {
        duration,
        processes: args.processes.max(1),
        tasks: args.tasks.max(1),
        names: args.names.max(1),
        ttl: Duration::from_millis(args.ttl_ms.max(100)),
        lock_delay: Duration::from_millis(args.lock_delay_ms),
        out: args.out.clone(),
    };
    println!(
        "dlock-torture: seed {seed} (replay: --seed {seed}); {} s per backend, {} processes × {} tasks on {} names",
        duration.as_secs(),
        settings.processes,
        settings.tasks,
        settings.names
    );
    let mut outcomes = Vec::new();
    let mut errors = Vec::new();
    for (target, control) in &targets {
        let mut s = settings.clone();
        if *control {
            s.duration = Duration::from_secs(args.control_seconds);
        }
        s.ttl = target.ttl.unwrap_or(s.ttl);
        // Each run's seed comes from the campaign's and the target's label:
        // a run replays alone (`--backends etcd --seed S`) as it ran among
        // the others.
        let run_seed = seed ^ label_hash(target.label);
        eprintln!("dlock-torture: {} …", target.label);
        let outcome = match campaign::run(target, &s, run_seed).await {
            Ok(outcome) => outcome,
            // A run that could not be carried out fails; the others still run.
            Err(e) => {
                eprintln!("  {}: {e}", target.label);
                errors.push(format!("{}: {e}", target.label));
                continue;
            }
        };
        for line in report::failures(&outcome) {
            eprintln!("  {line}");
        }
        let svg = args
            .out
            .join(format!("{}.svg", campaign::slug(target.label)));
        std::fs::write(&svg, report::svg(&outcome))
            .map_err(|e| format!("{}: {e}", svg.display()))?;
        outcomes.push(outcome);
    }
    let table = report::table(&outcomes);
    println!("\n{table}");
    let json = serde_json::to_string_pretty(&outcomes).map_err(|e| e.to_string())?;
    let path = args.out.join("report.json");
    std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("report: {} (timelines beside it)", path.display());
    for e in &errors {
        println!("not run to the end: {e}");
    }
    Ok(errors.is_empty() && outcomes.iter().all(campaign::Outcome::passed))
}

/// FNV-1a of a target's label.
fn label_hash(label: &str) -> u64 {
    label.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The targets to run, each marked whether it is a control.
fn pick(args: &Args) -> Result<Vec<(Target, bool)>, String> {
    let mut targets = Vec::new();
    if !args.controls_only {
        targets.extend(chosen(&BACKENDS, args.backends.as_deref(), true)?);
        let topologies = args.topologies.as_deref();
        let all = args.backends.is_none();
        targets.extend(chosen(&TOPOLOGIES, topologies, all)?);
    }
    if !args.no_controls {
        targets.extend(chosen(&CONTROLS, args.controls.as_deref(), true)?);
    }
    let controls = CONTROLS.map(|c| c.label);
    Ok(targets
        .into_iter()
        .map(|t| {
            let control = controls.contains(&t.label);
            (t, control)
        })
        .collect())
}

/// The targets of `from` named in `names` (`none` for none); all of them,
/// or none, when no names are given.
fn chosen(from: &[Target], names: Option<&[String]>, all: bool) -> Result<Vec<Target>, String> {
    let Some(names) = names else {
        return Ok(if all { from.to_vec() } else { Vec::new() });
    };
    let known = || {
        from.iter()
            .map(|t| campaign::slug(t.label))
            .collect::<Vec<_>>()
            .join(", ")
    };
    names
        .iter()
        .filter(|n| n.as_str() != "none")
        .map(|n| {
            from.iter()
                .find(|t| campaign::slug(t.label) == n.as_str())
                .cloned()
                .ok_or_else(|| format!("unknown name {n}; expected one of {}", known()))
        })
        .collect()
}
