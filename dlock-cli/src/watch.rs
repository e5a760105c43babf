//! `dlock watch`: the held locks, seen live.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::time::Duration;

use clap::Args;
use dlock::{Error, HeldLock, Locker, Mode};
use tokio::time::{Instant, sleep_until};

use crate::{Failure, UrlArg, connect, round_ms, status};

/// The most locks one view reads: a bound on the work a refresh costs the
/// server (the rest are counted, not shown).
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
    /// `[URL] [PREFIX]`: the URL may also come from --url or DLOCK_URL
    /// (a single argument with `://` is the URL).
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
    let locker = connect(&url, None).await?;
    let terminal = std::io::stdout().is_terminal() && !args.json;
    let mut next = Instant::now();
    loop {
        let (mut locks, more) = held(&locker, &prefix).await?;
        // Soonest to end first; session leases, which do not end by time,
        // last.
        locks.sort_by_key(|l| (l.info.expires_in.unwrap_or(Duration::MAX), l.name.clone()));
        let view = if args.json {
            json(&locks)
        } else {
            table(&locks, more, &prefix, terminal)
        };
        let mut out = std::io::stdout().lock();
        if terminal {
            // Home and clear: the view replaces the last one.
            let _ = out.write_all(b"\x1b[H\x1b[2J");
        }
        let _ = out.write_all(view.as_bytes());
        let _ = out.flush();
        drop(out);
        if args.once {
            return Ok(0);
        }
        next += args.interval;
        tokio::select! {
            () = sleep_until(next) => {}
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
    }
}

fn url_and_prefix(url: UrlArg, mut args: Vec<String>) -> Result<(String, String), Failure> {
    let (url, prefix) = match (args.len(), url.url) {
        (2, _) => {
            let prefix = args.pop().unwrap_or_default();
            (args.pop(), prefix)
        }
        (1, from_env) if args[0].contains("://") => (args.pop(), from_env.unwrap_or_default()),
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
                l.name.clone(),
                kind(l.info.mode),
                l.info.holder.clone().unwrap_or_else(|| "-".to_owned()),
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
