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
//! | `resource.rs` | the fenced resource |
//! | `history.rs` | what clients record, on `CLOCK_MONOTONIC` |
//! | `check.rs` | the checker |
//! | `mutant.rs` | wrong drivers for the controls |
//! | `report.rs` | table, JSON, timelines |

mod campaign;
mod check;
mod client;
mod clients;
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
use target::{BACKENDS, CONTROLS, Target};

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
    /// Skip the controls (runs that must show violations).
    #[arg(long, conflicts_with = "controls_only")]
    no_controls: bool,
    /// Run the controls only.
    #[arg(long)]
    controls_only: bool,
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
    for (i, (target, control)) in targets.iter().enumerate() {
        let mut s = settings.clone();
        if *control {
            s.duration = Duration::from_secs(args.control_seconds);
        }
        s.ttl = target.ttl.unwrap_or(s.ttl);
        // Each run's own seed: a run replays alone with the same campaign seed.
        let run_seed = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        eprintln!("dlock-torture: {} …", target.label);
        let outcome = campaign::run(target, &s, run_seed).await?;
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
    Ok(outcomes.iter().all(campaign::Outcome::passed))
}

/// The targets to run, each marked whether it is a control.
fn pick(args: &Args) -> Result<Vec<(Target, bool)>, String> {
    let mut targets: Vec<(Target, bool)> = match &args.backends {
        _ if args.controls_only => Vec::new(),
        None => BACKENDS.iter().map(|t| (t.clone(), false)).collect(),
        Some(names) => names
            .iter()
            .map(|n| {
                BACKENDS
                    .iter()
                    .find(|t| t.label == n.as_str())
                    .map(|t| (t.clone(), false))
                    .ok_or_else(|| {
                        format!("unknown backend {n}: redis, mariadb, postgres, zookeeper or etcd")
                    })
            })
            .collect::<Result<_, _>>()?,
    };
    if !args.no_controls {
        targets.extend(CONTROLS.iter().map(|t| (t.clone(), true)));
    }
    Ok(targets)
}
