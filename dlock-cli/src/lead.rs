//! `dlock lead`: a command that runs only while this machine leads.

use std::time::Duration;

use clap::Args;
use dlock::{Election, Error, LockOptions};
use tokio::time::sleep;

use crate::run::{catch_signals, ends, exit_code, signalled, supervise};
use crate::{Failure, UrlArg, connect, status};

/// Runs CMD only while this machine leads the election NAME: campaigns
/// (waiting as long as it takes), runs CMD while it leads, stops CMD
/// (SIGTERM, then SIGKILL after --grace) when leadership is lost, and
/// campaigns again to run it anew. When CMD exits on its own, dlock
/// resigns (the next campaigner leads at once) and exits with CMD's status.
/// CMD sees DLOCK_LOCK_NAME and DLOCK_FENCING_TOKEN (its term's token).
/// A lost term's CMD may run on for up to --grace while a successor
/// already leads: keep --grace short, and fence CMD's writes with the
/// token.
#[derive(Debug, Args)]
pub(crate) struct LeadArgs {
    #[command(flatten)]
    url: UrlArg,
    /// The election's name.
    #[arg(long)]
    name: String,
    /// Who leads, as `dlock inspect` and followers read it (default: this
    /// machine's host name and dlock's process id).
    #[arg(long)]
    holder: Option<String>,
    /// A term's lease: a crashed leader's successor leads after this (on
    /// ZooKeeper, the session timeout).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// End a term once it has lasted this long (renewal stops; the term
    /// ends with its lease, within this plus --ttl): CMD is stopped as for
    /// a lost term and dlock campaigns again, so a hung CMD is restarted,
    /// here or wherever another candidate wins.
    #[arg(long, value_parser = humantime::parse_duration)]
    max_hold: Option<Duration>,
    /// How long CMD has to exit after SIGTERM before SIGKILL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    grace: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

pub(crate) async fn lead(args: LeadArgs) -> Result<u8, Failure> {
    let Some(url) = args.url.url else {
        return Err(Failure::new(
            status::USAGE,
            "no lock service: give --url or DLOCK_URL",
        ));
    };
    let mut opts = LockOptions::new().ttl(args.ttl);
    if let Some(max_hold) = args.max_hold {
        opts = opts.max_hold(max_hold);
    }
    let identity = args.holder.unwrap_or_else(dlock_core::driver::host_and_pid);
    // Bad options are refused before connecting.
    opts.clone().holder(identity.as_str()).validate()?;
    dlock::validate_name(&args.name)?;
    let mut signals = catch_signals()?;
    let locker = connect(&url, Some(args.ttl)).await?;
    let election = Election::new(locker, &args.name, identity).options(opts);
    loop {
        let campaigned = campaign(&election);
        tokio::pin!(campaigned);
        let term = loop {
            tokio::select! {
                term = &mut campaigned => break term?,
                Some(sig) = signals.recv() => {
                    // A reload signal (HUP, USR1, USR2) is for the command:
                    // a follower has none to pass it to, and keeps waiting.
                    if ends(sig) {
                        return Ok(signalled(sig));
                    }
                }
            }
        };
        tracing::info!(
            name = args.name,
            fencing_token = term.fencing_token(),
            "leading; starting the command"
        );
        let supervised = supervise(
            &args.command,
            &args.name,
            term.guard(),
            &mut signals,
            args.grace,
        )
        .await;
        let (exit, lost, asked_to_end) = match supervised {
            Ok(supervised) => supervised,
            Err(failure) => {
                // CMD could not start: the next campaigner's turn now,
                // not at the end of the term.
                let _ = term.resign().await;
                return Err(failure);
            }
        };
        if lost && asked_to_end {
            return Ok(exit_code(exit));
        }
        if lost {
            eprintln!("dlock: campaigning again for {}", args.name);
            continue;
        }
        if let Err(e) = term.resign().await {
            // The command ran; the term ends with its lease.
            eprintln!("dlock: could not resign {}: {e}", args.name);
        }
        return Ok(exit_code(exit));
    }
}

/// Campaigns until we lead, again after a lock service out of reach.
async fn campaign(election: &Election) -> Result<dlock::Leadership, Error> {
    let mut pause = Duration::from_millis(200);
    loop {
        match election.campaign().await {
            Err(e) if e.is_retryable() => {
                eprintln!("dlock: campaigning for {} again: {e}", election.name());
                sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            other => return other,
        }
    }
}
