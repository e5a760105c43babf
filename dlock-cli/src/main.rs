//! `dlock`: run a command under a distributed lock, like flock(1) across
//! machines, and look after locks. See the crate README for the exit
//! statuses.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use dlock::{Error, Locker};

mod lead;
mod run;
mod watch;

/// Exit statuses besides the command's own (sysexits.h values).
pub(crate) mod status {
    /// Bad arguments: a lock name, duration or URL that cannot work.
    pub const USAGE: u8 = 64;
    /// The lock service could not be reached, or failed.
    pub const UNAVAILABLE: u8 = 69;
    /// The lock is held by another (and `--wait` passed).
    pub const HELD: u8 = 75;
    /// The lease was lost while the command ran; the command was stopped.
    pub const LOST: u8 = 76;
    /// The command could not be started.
    pub const CANNOT_RUN: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
}

/// Run commands under distributed locks on Redis, MySQL/MariaDB or
/// ZooKeeper, and look after the locks.
///
/// Exit statuses of `run`: the command's own; 75 when the lock is held by
/// another; 69 when the lock service cannot be reached; 76 when the lease
/// was lost and the command was stopped; 64 for bad arguments; 126/127
/// when the command cannot be started or is not found.
#[derive(Debug, Parser)]
#[command(name = "dlock", version)]
struct Cli {
    /// Log what dlock does to stderr (twice for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding a lock.
    Run(run::RunArgs),
    /// Run a command only while this machine leads an election.
    Lead(lead::LeadArgs),
    /// Show the held locks, live: `dlock watch [URL] [PREFIX]`.
    Watch(watch::WatchArgs),
    /// Show who holds a lock: `dlock inspect [URL] NAME`.
    Inspect(InspectArgs),
    /// Free a lock whoever holds it (dangerous: see --help).
    Release(ReleaseArgs),
    /// Create the MySQL/MariaDB or PostgreSQL lock table: `dlock migrate [URL]`.
    Migrate(MigrateArgs),
}

/// Where the lock service is.
#[derive(Debug, Args)]
struct UrlArg {
    /// The lock service, as `dlock::connect` takes it: redis://, rediss://, redis+unix://,
    /// redis+sentinel://, redis+cluster://, mysql://, mariadb://, postgres://, postgresql://,
    /// zk://, zookeeper://, etcd://, etcds://, memory://.
    #[arg(long, env = "DLOCK_URL", hide_env_values = true)]
    url: Option<String>,
}

#[derive(Debug, Args)]
struct InspectArgs {
    #[command(flatten)]
    url: UrlArg,
    /// Print JSON: {"name", "held", "holder", "owner", "fencing_token", "expires_in_ms"}
    /// (with --all: {"name", "held", "holds": [{"holder", "owner", ...}]}).
    #[arg(long)]
    json: bool,
    /// Every hold: each reader of a reader-writer lock, each permit of a
    /// semaphore (one line each), not only the one that lasts longest.
    #[arg(long)]
    all: bool,
    /// `[URL] NAME`: the URL may also come from --url or DLOCK_URL.
    #[arg(num_args = 1..=2, required = true, value_names = ["URL", "NAME"])]
    args: Vec<String>,
}

/// Deletes the lock whoever holds it. The holder is not told until its next
/// renewal fails (dlock run then stops its command), and until then two
/// holders may run at once: use it only on a lock whose holder is known to
/// be gone, or to be stuck. The next holder's fencing token is still
/// greater, so fenced resources stay safe.
#[derive(Debug, Args)]
struct ReleaseArgs {
    #[command(flatten)]
    url: UrlArg,
    /// Required: says you know the above.
    #[arg(long, required = true)]
    force: bool,
    /// `[URL] NAME`: the URL may also come from --url or DLOCK_URL.
    #[arg(num_args = 1..=2, required = true, value_names = ["URL", "NAME"])]
    args: Vec<String>,
}

#[derive(Debug, Args)]
struct MigrateArgs {
    /// The MySQL/MariaDB or PostgreSQL URL (or DLOCK_URL).
    #[arg(env = "DLOCK_URL", hide_env_values = true)]
    url: String,
    /// The lock table (default: the URL's `table` parameter, else
    /// `dlock_locks`).
    #[arg(long)]
    table: Option<String>,
}

/// A failure, with the exit status it maps to.
pub(crate) struct Failure {
    pub status: u8,
    pub message: String,
}

impl Failure {
    pub fn new(status: u8, message: impl Into<String>) -> Self {
        Failure {
            status,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let status = match e {
            Error::InvalidName { .. }
            | Error::InvalidOption { .. }
            | Error::ModeConflict { .. }
            | Error::Upgrade { .. }
            | Error::Reentrant { .. } => status::USAGE,
            Error::Timeout { .. } => status::HELD,
            Error::NotHeld { .. } => status::LOST,
            _ => status::UNAVAILABLE,
        };
        // The chain of causes, so that "connection refused" is not hidden.
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Failure { status, message }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => tracing::Level::WARN,
        1 => tracing::Level::INFO,
        _ => tracing::Level::DEBUG,
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock: cannot start: {e}");
            return ExitCode::from(status::UNAVAILABLE);
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Lead(args) => lead::lead(args).await,
            Command::Watch(args) => watch::watch(args).await,
            Command::Inspect(args) => inspect(args).await,
            Command::Release(args) => release(args).await,
            Command::Migrate(args) => migrate(args).await,
        }
    });
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("dlock: {}", failure.message);
            ExitCode::from(failure.status)
        }
    }
}

/// `[URL] NAME` with the URL from the option or the environment when only
/// the name is given.
fn url_and_name(url: UrlArg, mut args: Vec<String>) -> Result<(String, String), Failure> {
    let name = args.pop().unwrap_or_default();
    match (args.pop(), url.url) {
        (Some(url), _) | (None, Some(url)) => Ok((url, name)),
        (None, None) => Err(Failure::new(
            status::USAGE,
            "no lock service: give a URL, --url or DLOCK_URL",
        )),
    }
}

/// Connects to `url`; `session` is the ZooKeeper session timeout (the
/// lease of a session backend), if one is wanted.
pub(crate) async fn connect(url: &str, session: Option<Duration>) -> Result<Locker, Failure> {
    let lower = url.to_ascii_lowercase();
    let zookeeper = lower.starts_with("zk://") || lower.starts_with("zookeeper://");
    if let (Some(session), true) = (session, zookeeper) {
        let backend = dlock::zk::ZkBackend::builder(url)
            .session_timeout(session)
            .connect()
            .await?;
        return Ok(Locker::new(backend));
    }
    Ok(dlock::connect(url).await?)
}

async fn inspect(args: InspectArgs) -> Result<u8, Failure> {
    let (url, name) = url_and_name(args.url, args.args)?;
    let locker = connect(&url, None).await?;
    let holds: Vec<dlock::LockInfo> = if args.all {
        locker.holders(&name).await?
    } else {
        locker.inspect(&name).await?.into_iter().collect()
    };
    if args.json {
        let json = |info: &dlock::LockInfo| {
            serde_json::json!({
                "holder": info.holder,
                "owner": info.owner.to_string(),
                "fencing_token": info.fencing_token,
                "expires_in_ms": info.expires_in.map(|d| d.as_millis()),
            })
        };
        let value = match holds.first() {
            _ if args.all => serde_json::json!({
                "name": name,
                "held": !holds.is_empty(),
                "holds": holds.iter().map(json).collect::<Vec<_>>(),
            }),
            Some(info) => {
                let mut value = json(info);
                value["name"] = name.into();
                value["held"] = true.into();
                value
            }
            None => serde_json::json!({ "name": name, "held": false }),
        };
        println!("{value}");
    } else if holds.is_empty() {
        println!("{name}: free");
    } else {
        for info in &holds {
            let expiry = match info.expires_in {
                Some(d) => format!("expires in {}", humantime::format_duration(round_ms(d))),
                None => "held for its session".to_owned(),
            };
            println!(
                "{name}: held by {} with fencing token {}, {expiry}",
                who(info),
                info.fencing_token
            );
        }
    }
    Ok(0)
}

/// The holder as an operator reads it: its description, and the owner
/// token that tells its grants apart.
fn who(info: &dlock::LockInfo) -> String {
    match &info.holder {
        Some(holder) => format!("{holder} (owner {})", info.owner),
        None => format!("owner {}", info.owner),
    }
}

pub(crate) fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

async fn release(args: ReleaseArgs) -> Result<u8, Failure> {
    let (url, name) = url_and_name(args.url, args.args)?;
    let locker = connect(&url, None).await?;
    match locker.backend().force_release(&name).await? {
        Some(info) => eprintln!(
            "dlock: released {name} (was held by {} with fencing token {})",
            who(&info),
            info.fencing_token
        ),
        None => eprintln!("dlock: {name} was not held"),
    }
    Ok(0)
}

async fn migrate(args: MigrateArgs) -> Result<u8, Failure> {
    let lower = args.url.to_ascii_lowercase();
    if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
        let mut builder = dlock::postgres::PgBackend::builder(args.url.as_str());
        if let Some(table) = &args.table {
            builder = builder.table(table.as_str());
        }
        builder
            .create_table(false)
            .connect()
            .await?
            .migrate()
            .await?;
    } else if lower.starts_with("mysql://") || lower.starts_with("mariadb://") {
        let mut builder = dlock::mysql::MySqlBackend::builder(args.url.as_str());
        if let Some(table) = &args.table {
            builder = builder.table(table.as_str());
        }
        builder
            .create_table(false)
            .connect()
            .await?
            .migrate()
            .await?;
    } else {
        return Err(Failure::new(
            status::USAGE,
            "migrate is for mysql://, mariadb:// and postgres:// URLs; the other backends need \
             no schema",
        ));
    }
    match &args.table {
        Some(table) => eprintln!("dlock: table {table} is ready"),
        None => eprintln!("dlock: the lock table is ready"),
    }
    Ok(0)
}
