//! What each client process did, and when: one JSON line per event, on
//! `CLOCK_MONOTONIC` (one host, so times compare across processes).

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use nix::time::{ClockId, clock_gettime};
use serde::{Deserialize, Serialize};

/// Now, in nanoseconds of `CLOCK_MONOTONIC` (the clock `Instant` reads on
/// Linux, so the two convert by an offset).
pub fn now_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        let secs = u64::try_from(t.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec()).unwrap_or(0);
        secs * 1_000_000_000 + nanos
    })
}

/// `at` in nanoseconds of `CLOCK_MONOTONIC`.
pub fn instant_ns(at: Instant) -> u64 {
    let (then, ns) = *ANCHOR.get_or_init(anchor);
    match at.checked_duration_since(then) {
        Some(after) => ns + nanos(after),
        None => ns.saturating_sub(nanos(then - at)),
    }
}

/// One `Instant` and its `CLOCK_MONOTONIC` reading, taken once per process.
static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();

/// The tightest of several paired readings: a preemption between the two
/// reads would shift every converted deadline by its length, and the
/// drift margin that keeps a believed hold inside the server's lease is
/// only a few milliseconds.
fn anchor() -> (Instant, u64) {
    let mut best = (Instant::now(), now_ns(), u64::MAX);
    for _ in 0..64 {
        let before = now_ns();
        let at = Instant::now();
        let after = now_ns();
        let spread = after.saturating_sub(before);
        if spread < best.2 {
            best = (at, before + spread / 2, spread);
        }
    }
    (best.0, best.1)
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The kind of hold a task asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A mutex.
    Mutex,
    /// A reader of a reader-writer lock.
    Read,
    /// The writer of a reader-writer lock.
    Write,
    /// One permit of a semaphore of [`PERMITS`].
    Permit,
}

/// Permits of every semaphore in the workload.
pub const PERMITS: u32 = 2;

impl Kind {
    /// Whether the hold excludes every other.
    pub fn exclusive(self) -> bool {
        matches!(self, Kind::Mutex | Kind::Write)
    }
}

/// One event of one task's history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// When, in nanoseconds of `CLOCK_MONOTONIC`.
    pub t: u64,
    /// The client process (unique over the run, a respawn included).
    pub client: u32,
    /// The task within it.
    pub task: u32,
    /// The name's index.
    pub name: u32,
    /// What happened.
    #[serde(flatten)]
    pub what: What,
}

/// What happened to a task's hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum What {
    /// An acquire is sent.
    Invoke {
        /// The kind asked for.
        kind: Kind,
    },
    /// The acquire returned a grant.
    Granted {
        /// The kind granted.
        kind: Kind,
        /// Its fencing token.
        token: u64,
        /// Its validity deadline (ns), `None` for a session lease.
        valid_until: Option<u64>,
    },
    /// The acquire returned an error.
    Failed {
        /// The error, as displayed.
        error: String,
        /// Whether it is one a fault does not explain: neither a timeout
        /// nor a connection or availability error.
        unexpected: bool,
    },
    /// The task looked before writing: it believes it holds (`valid`), until
    /// `valid_until` as of now.
    Checked {
        /// Whether `is_valid()` said yes.
        valid: bool,
        /// The renewed deadline, `None` for a session lease.
        valid_until: Option<u64>,
    },
    /// `lost()` fired.
    Lost,
    /// The release is sent.
    Release,
    /// The release returned.
    Released {
        /// Whether it succeeded.
        ok: bool,
    },
    /// The guard was dropped (released in the background).
    Dropped,
    /// The lease was left to expire.
    Abandoned,
}

/// A history file being written.
#[derive(Debug)]
pub struct Recorder {
    client: u32,
    file: Mutex<File>,
}

impl Recorder {
    /// Writes `client`'s events to a new file at `path`.
    pub fn create(path: &Path, client: u32) -> io::Result<Self> {
        Ok(Recorder {
            client,
            file: Mutex::new(File::create(path)?),
        })
    }

    /// Records `what` now. One `write` per event, so a SIGKILL loses at
    /// most the line being written, which the reader skips.
    pub fn record(&self, task: u32, name: u32, what: What) {
        let event = Event {
            t: now_ns(),
            client: self.client,
            task,
            name,
            what,
        };
        let Ok(mut line) = serde_json::to_vec(&event) else {
            return;
        };
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        // A full disk must not stop the workload; the checker would then
        // see fewer events, never wrong ones.
        let _ = file.write_all(&line);
    }
}

/// Reads a history file. Only the last line may be torn (the process was
/// killed while writing it), and it is skipped; any other bad line is an
/// error, since the checker must not judge a history with holes. A file
/// never created (the process was killed before it started) is empty.
pub fn read(path: &Path) -> io::Result<Vec<Event>> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    let mut events = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_slice(line) {
            Ok(event) => events.push(event),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} line {}: {e}", path.display(), i + 1),
                ));
            }
        }
    }
    Ok(events)
}
