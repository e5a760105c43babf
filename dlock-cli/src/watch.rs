//! `dlock watch`: the held locks, seen live.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::time::Duration;

use clap::Args;
use dlock::{Error, HeldLock, Locker, Mode};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::{Instant, sleep_until};

use crate::{Failure, UrlArg, connect, round_ms, status};

/// The most locks one view shows; the view says when there were more.
const MAX_LOCKS: usize = 10_000;

/// Shows the held locks whose names start with PREFIX (all without one),
/// refreshed every --interval: name, kind, holder, fencing token and time
/// left ("session" for a ZooKeeper session lease), soonest to end first.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    #[command(flatten)]
    url: UrlArg,
    /// Print one view and exit.
    #[arg(long)]
    once: bool,
    /// Print each view as a JSON array of {"name", "kind", "holder",
    /// "owner", "fencing_token", "expires_in_ms"}, one per line.
    #[arg(long)]
    json: bool,
    /// How often the view is read again.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// `[URL] [PREFIX]`: the URL may also come from --url or DLOCK_URL; a
    /// single argument is the URL if it has `://`, else the prefix.
    #[arg(num_args = 0..=2, value_names = ["URL", "PREFIX"])]
    args: Vec<String>,
}

pub(crate) async fn watch(args: WatchArgs) -> Result<u8, Failure> {
    let (url, prefix) = url_and_prefix(args.url, args.args)?;
    if args.interval < Duration::from_millis(100) {
        return Err(Failure::new(
            status::USAGE,
            "--interval must be at least 100ms",
        ));
    }
    // Caught from the start: Ctrl-C during a slow read ends the view too.
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| Failure::new(status::UNAVAILABLE, format!("cannot catch SIGINT: {e}")))?;
    let locker = connect(&url, None).await?;
    let terminal = std::io::stdout().is_terminal() && !args.json;
    loop {
        let started = Instant::now();
        let view = tokio::select! {
            view = view(&locker, &prefix, args.json, terminal) => view,
            _ = interrupt.recv() => return Ok(0),
        };
        let view = match view {
            Ok(view) => view,
            Err(failure) if args.once || failure.status == status::USAGE => return Err(failure),
            // A live view rides out a lock service that is briefly away.
            Err(failure) => format!("dlock: {}\n", failure.message),
        };
        let mut out = std::io::stdout().lock();
        let mut written = Ok(());
        if terminal && !args.once {
            // Home and clear: the view replaces the last one.
            written = out.write_all(b"\x1b[H\x1b[2J");
        }
        let written = written
            .and_then(|()| out.write_all(view.as_bytes()))
            .and_then(|()| out.flush());
        match written {
            Ok(()) => {}
            // The reader went (`dlock watch | head`): done.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(0),
            Err(e) => return Err(Failure::new(status::UNAVAILABLE, format!("stdout: {e}"))),
        }
        drop(out);
        if args.once {
            return Ok(0);
        }
        // The next view an interval after this one started, or at once
        // after a read that took longer (never a burst to catch up).
        tokio::select! {
            () = sleep_until(started + args.interval) => {}
            _ = interrupt.recv() => return Ok(0),
        }
    }
}

/// One view: the held locks, soonest to end first (session leases, which
/// do not end by time, last), as a table or as JSON.
async fn view(
    locker: &Locker,
    prefix: &str,
    json: bool,
    terminal: bool,
) -> Result<String, Failure> {
    let (mut locks, more) = held(locker, prefix).await?;
    locks.sort_by_key(|l| (l.info.expires_in.unwrap_or(Duration::MAX), l.name.clone()));
    Ok(if json {
        self::json(&locks)
    } else {
        table(&locks, more, prefix, terminal)
    })
}

fn url_and_prefix(url: UrlArg, mut args: Vec<String>) -> Result<(String, String), Failure> {
    let (url, prefix) = match (args.len(), url.url) {
        (2, _) => {
            let prefix = args.pop().unwrap_or_default();
            (args.pop(), prefix)
        }
        (1, _) if args[0].contains("://") => (args.pop(), String::new()),
        (1, from_env) => (from_env, args.pop().unwrap_or_default()),
        (_, from_env) => (from_env, String::new()),
    };
    match url.filter(|u| !u.is_empty()) {
        Some(url) => Ok((url, prefix)),
        None => Err(Failure::new(
            status::USAGE,
            "no lock service: give a URL, --url or DLOCK_URL",
        )),
    }
}

/// The held locks under `prefix`, up to [`MAX_LOCKS`], and whether there
/// were more.
async fn held(locker: &Locker, prefix: &str) -> Result<(Vec<HeldLock>, bool), Failure> {
    let mut locks = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = match locker.list(prefix, cursor.as_deref(), 500).await {
            Ok(page) => page,
            Err(Error::Unsupported { operation, .. }) => {
                return Err(Failure::new(
                    status::USAGE,
                    format!("this lock service cannot list its locks ({operation})"),
                ));
            }
            Err(e) => return Err(e.into()),
        };
        locks.extend(page.locks);
        match page.next {
            Some(next) if locks.len() < MAX_LOCKS => cursor = Some(next),
            Some(_) => return Ok((locks, true)),
            None => return Ok((locks, false)),
        }
    }
}

/// `s` with its control characters escaped: a lock name may hold any
/// (an escape sequence would reach the operator's terminal), and a holder
/// written by another library was not checked.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The kind of hold, short: `mutex`, `read`, `write`, `permit/N`.
fn kind(mode: Option<Mode>) -> String {
    match mode {
        Some(Mode::Exclusive) => "mutex".to_owned(),
        Some(Mode::Read) => "read".to_owned(),
        Some(Mode::Write) => "write".to_owned(),
        Some(Mode::Permit(n)) => format!("permit/{n}"),
        // A kind a later release adds, or one the driver cannot tell.
        Some(_) | None => "-".to_owned(),
    }
}

fn left(lock: &HeldLock) -> String {
    match lock.info.expires_in {
        Some(d) => humantime::format_duration(round_ms(d)).to_string(),
        None => "session".to_owned(),
    }
}

fn json(locks: &[HeldLock]) -> String {
    let rows: Vec<serde_json::Value> = locks
        .iter()
        .map(|l| {
            serde_json::json!({
                "name": l.name,
                "kind": kind(l.info.mode),
                "holder": l.info.holder,
                "owner": l.info.owner.to_string(),
                "fencing_token": l.info.fencing_token,
                "expires_in_ms": l.info.expires_in.map(|d| d.as_millis()),
            })
        })
        .collect();
    format!("{}\n", serde_json::Value::Array(rows))
}

fn table(locks: &[HeldLock], more: bool, prefix: &str, terminal: bool) -> String {
    let header = ["NAME", "KIND", "HOLDER", "TOKEN", "LEFT"];
    let rows: Vec<[String; 5]> = locks
        .iter()
        .map(|l| {
            [
                printable(&l.name),
                kind(l.info.mode),
                l.info
                    .holder
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), printable),
                l.info.fencing_token.to_string(),
                left(l),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let (bold, dim, reset) = if terminal {
        ("\x1b[1m", "\x1b[2m", "\x1b[0m")
    } else {
        ("", "", "")
    };
    let mut out = String::new();
    let under = if prefix.is_empty() {
        String::new()
    } else {
        format!(" under {prefix:?}")
    };
    let _ = writeln!(
        out,
        "{dim}{} held lock{}{under}{}{reset}",
        locks.len(),
        if locks.len() == 1 { "" } else { "s" },
        if more { " (more not shown)" } else { "" }
    );
    let line = |cells: [&str; 5]| {
        let mut line = String::new();
        for (cell, w) in cells.iter().zip(widths) {
            let pad = w.saturating_sub(cell.chars().count());
            let _ = write!(line, "{cell}{}  ", " ".repeat(pad));
        }
        line.trim_end().to_owned()
    };
    let _ = writeln!(out, "{bold}{}{reset}", line(header));
    for row in &rows {
        let _ = writeln!(out, "{}", line(row.each_ref().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: Option<&str>, args: &[&str]) -> Option<(String, String)> {
        let url = UrlArg {
            url: url.map(str::to_owned),
        };
        url_and_prefix(url, args.iter().map(|a| (*a).to_owned()).collect()).ok()
    }

    #[test]
    fn a_lone_argument_is_the_url_only_with_a_scheme() {
        let both = |u: &str, p: &str| Some((u.to_owned(), p.to_owned()));
        assert_eq!(
            parsed(None, &["redis://a", "jobs/"]),
            both("redis://a", "jobs/")
        );
        assert_eq!(
            parsed(Some("redis://env"), &["redis://b"]),
            both("redis://b", "")
        );
        assert_eq!(
            parsed(Some("redis://env"), &["jobs/"]),
            both("redis://env", "jobs/")
        );
        assert_eq!(parsed(Some("redis://env"), &[]), both("redis://env", ""));
        assert_eq!(parsed(None, &["jobs/"]), None);
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
    }
}
