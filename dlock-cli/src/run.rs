//! `dlock run`: a command under a lock.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use clap::Args;
use dlock::LockOptions;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep};

use crate::{Failure, UrlArg, connect, status};

/// Runs CMD while holding the lock NAME (a mutex, or with --permits,
/// --read or --write a semaphore's permit or a reader-writer lock's side):
/// the lease is renewed while CMD runs and released when it exits. CMD runs in its own process group,
/// which gets the signals dlock gets (INT, TERM, HUP, QUIT, USR1, USR2),
/// and SIGTERM, then SIGKILL after --grace, when the lease is lost. CMD
/// sees DLOCK_LOCK_NAME and DLOCK_FENCING_TOKEN in its environment.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    url: UrlArg,
    /// The lock name.
    #[arg(long)]
    name: String,
    /// Take one of N permits of the name's semaphore: at most N commands
    /// run at once across machines (every run of the name must give the
    /// same N).
    #[arg(long, value_name = "N", conflicts_with_all = ["read", "write"])]
    permits: Option<u32>,
    /// Take the name's reader-writer lock for reading: runs alongside other
    /// readers, never alongside a writer.
    #[arg(long, conflicts_with = "write")]
    read: bool,
    /// Take the name's reader-writer lock for writing: runs alone.
    #[arg(long)]
    write: bool,
    /// Who holds the lock, as `dlock inspect` shows it (default: this
    /// machine's host name and dlock's process id).
    #[arg(long)]
    holder: Option<String>,
    /// The lease: a crashed dlock's lock frees itself after this (on
    /// ZooKeeper, the session timeout).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Stop renewing the lease once the lock has been held this long: a
    /// CMD that hangs loses the lock (and gets SIGTERM) within this plus
    /// --ttl, instead of holding it for as long as it runs.
    #[arg(long, value_parser = humantime::parse_duration)]
    max_hold: Option<Duration>,
    /// How long to wait for a held lock; 0s makes one attempt.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    wait: Duration,
    /// Keep the lock until this long after CMD started, even if CMD ends
    /// sooner (for cron lines on several machines whose clocks differ a
    /// little).
    #[arg(long, value_parser = humantime::parse_duration)]
    at_least: Option<Duration>,
    /// How long CMD has to exit after SIGTERM before SIGKILL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Signals passed on to the command.
const FORWARDED: [(SignalKind, Signal); 6] = [
    (SignalKind::interrupt(), Signal::SIGINT),
    (SignalKind::terminate(), Signal::SIGTERM),
    (SignalKind::hangup(), Signal::SIGHUP),
    (SignalKind::quit(), Signal::SIGQUIT),
    (SignalKind::user_defined1(), Signal::SIGUSR1),
    (SignalKind::user_defined2(), Signal::SIGUSR2),
];

pub(crate) async fn run(args: RunArgs) -> Result<u8, Failure> {
    let Some(url) = args.url.url else {
        return Err(Failure::new(
            status::USAGE,
            "no lock service: give --url or DLOCK_URL",
        ));
    };
    let mut opts = LockOptions::new().ttl(args.ttl).wait(args.wait);
    if let Some(permits) = args.permits {
        opts = opts.permits(permits);
    } else if args.read {
        opts = opts.read();
    } else if args.write {
        opts = opts.write();
    }
    if let Some(holder) = &args.holder {
        opts = opts.holder(holder.as_str());
    }
    if let Some(max_hold) = args.max_hold {
        opts = opts.max_hold(max_hold);
    }
    opts.validate()?;
    let mut signals = catch_signals()?;
    let locker = connect(&url, Some(args.ttl)).await?;
    let guard = tokio::select! {
        lock = acquire(&locker, &args.name, &opts) => lock?,
        Some(sig) = signals.recv() => return Ok(signalled(sig)),
    };
    tracing::info!(
        name = args.name,
        fencing_token = guard.fencing_token(),
        "lock acquired; starting the command"
    );
    let started = Instant::now();
    let (exit, lost, _) =
        supervise(&args.command, &args.name, &guard, &mut signals, args.grace).await?;
    if lost {
        return Ok(status::LOST);
    }
    let hold = args
        .at_least
        .map(|at_least| at_least.saturating_sub(started.elapsed()))
        .unwrap_or_default();
    let released = if hold.is_zero() {
        guard.release().await
    } else {
        tracing::info!(?hold, "keeping the lock for --at-least");
        guard.release_after(hold).await
    };
    if let Err(e) = released {
        // The command ran; the lock ends with its TTL.
        eprintln!("dlock: could not release {}: {e}", args.name);
    }
    Ok(exit_code(exit))
}

/// Catches the forwarded signals from the start, so that one that comes
/// while the lock is awaited ends dlock cleanly rather than killing it.
pub(crate) fn catch_signals() -> Result<mpsc::UnboundedReceiver<Signal>, Failure> {
    let (tx, signals) = mpsc::unbounded_channel();
    for (kind, sig) in FORWARDED {
        let mut stream = signal(kind)
            .map_err(|e| Failure::new(status::UNAVAILABLE, format!("cannot catch {sig}: {e}")))?;
        let tx = tx.clone();
        tokio::spawn(async move { while stream.recv().await.is_some() && tx.send(sig).is_ok() {} });
    }
    Ok(signals)
}

/// dlock's exit status when `sig` ended it before the command started.
pub(crate) fn signalled(sig: Signal) -> u8 {
    128u8.saturating_add(u8::try_from(sig as i32).unwrap_or(0))
}

/// Runs `command` while `guard` holds: passes signals on, and stops the
/// command (SIGTERM, then SIGKILL after `grace`) when the lease is lost.
/// Returns the command's exit, whether the lease was lost, and whether a
/// signal asking it to end (INT, TERM, QUIT) was passed on.
pub(crate) async fn supervise(
    command: &[String],
    name: &str,
    guard: &dlock::Guard,
    signals: &mut mpsc::UnboundedReceiver<Signal>,
    grace: Duration,
) -> Result<(ExitStatus, bool, bool), Failure> {
    let mut child = spawn(command, name, guard.fencing_token())?;
    // The command leads its own process group, so that signals and a stop
    // reach what it started too (`sh -c`, a wrapper script), not the shell
    // alone: the group's id is the command's pid, negated for kill(2).
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(|id| Pid::from_raw(-id));
    let (mut lost, mut ended) = (false, false);
    let exit = loop {
        tokio::select! {
            exit = child.wait() => break exit,
            Some(sig) = signals.recv() => {
                tracing::info!(%sig, "passing the signal on to the command");
                ended |= ends(sig);
                send(group, sig);
            }
            () = guard.lost(), if !lost => {
                lost = true;
                eprintln!("dlock: the lease of {name} was lost; stopping the command");
                stop(&mut child, group, grace).await;
            }
        }
    };
    let exit = exit
        .map_err(|e| Failure::new(status::UNAVAILABLE, format!("waiting for the command: {e}")))?;
    Ok((exit, lost, ended))
}

/// Whether `sig` asks to end (rather than to reload, say).
pub(crate) fn ends(sig: Signal) -> bool {
    matches!(sig, Signal::SIGINT | Signal::SIGTERM | Signal::SIGQUIT)
}

async fn acquire(
    locker: &dlock::Locker,
    name: &str,
    opts: &LockOptions,
) -> Result<dlock::Guard, Failure> {
    let held = || Failure::new(status::HELD, format!("{name} is held by another"));
    if opts.get_wait().is_some_and(|w| w.is_zero()) {
        return locker.try_acquire(name, opts).await?.ok_or_else(held);
    }
    match locker.acquire(name, opts).await {
        Ok(guard) => Ok(guard),
        Err(dlock::Error::Timeout { .. }) => Err(held()),
        Err(e) => Err(e.into()),
    }
}

fn spawn(command: &[String], name: &str, fencing_token: u64) -> Result<Child, Failure> {
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| Failure::new(status::USAGE, "no command given"))?;
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("DLOCK_LOCK_NAME", name)
        .env("DLOCK_FENCING_TOKEN", fencing_token.to_string())
        .stdin(Stdio::inherit())
        .process_group(0);
    stop_with_parent(&mut command);
    command.spawn().map_err(|e| {
        let status = if e.kind() == std::io::ErrorKind::NotFound {
            status::NOT_FOUND
        } else {
            status::CANNOT_RUN
        };
        Failure::new(status, format!("cannot run {program}: {e}"))
    })
}

/// The command gets SIGTERM if dlock dies (killed with SIGKILL, say), as
/// when the lease is lost: without dlock nobody renews the lock, so the
/// command must not go on as if it held it.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn stop_with_parent(command: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the child between fork and exec, where
    // only async-signal-safe calls are allowed: prctl(2) and getppid(2) are
    // plain system calls that neither allocate nor take locks.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)?;
            // dlock may have died before the signal was set.
            if nix::unistd::getppid() != parent {
                // No allocation here: ESRCH, "no such process".
                return Err(std::io::Error::from_raw_os_error(
                    nix::errno::Errno::ESRCH as i32,
                ));
            }
            Ok(())
        });
    }
}

/// Elsewhere there is no parent-death signal: a killed dlock leaves its
/// command running.
#[cfg(not(target_os = "linux"))]
fn stop_with_parent(_: &mut Command) {}

fn send(group: Option<Pid>, sig: Signal) {
    if let Some(group) = group
        && let Err(e) = kill(group, sig)
    {
        tracing::debug!(%sig, error = %e, "could not signal the command (it may have exited)");
    }
}

/// SIGTERM to the command's group, then SIGKILL if the command is still
/// there after `grace`; and SIGKILL to what is left of the group once the
/// command has exited, so that nothing it started (a background job that
/// ignores SIGTERM) runs on without the lock.
async fn stop(child: &mut Child, group: Option<Pid>, grace: Duration) {
    send(group, Signal::SIGTERM);
    tokio::select! {
        _ = child.wait() => {}
        () = sleep(grace) => {
            eprintln!("dlock: the command did not exit within {grace:?} of SIGTERM; killing it");
        }
    }
    send(group, Signal::SIGKILL);
}

/// The command's status as a shell reports it: its exit code, or 128 plus
/// the signal that ended it.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => 128u8.saturating_add(u8::try_from(sig).unwrap_or(0)),
        (None, None) => 1,
    }
}
