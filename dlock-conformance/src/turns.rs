//! Turns on the machine among the tests of one process (see
//! [`crate::support`], which re-exports them): which tests may run beside
//! which, so that no test judges the machine instead of the lock.

use std::io::Write;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// How many stress cases of one process run at once: they run beside
/// nothing else, and two of a driver that polls (MySQL) overlap well.
pub const STRESS_AT_ONCE: usize = 2;

/// How many [`in_turn`] tests of one process run at once. Each judges
/// its bounds in round trips of its own link and restarts or pauses only
/// its own server, so a second one beside it is one more waiting test to
/// the machine (a test that keeps the CPU busy runs [`alone`] or as a
/// [`stress`] case instead); one at a time made them the longest path of
/// every driver's binary.
pub const IN_TURN_AT_ONCE: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Beside,
    InTurn,
    Stress,
    Alone,
}

#[derive(Debug)]
struct State {
    /// Running beside others, [`in_turn`] ones included.
    beside: usize,
    in_turn: usize,
    stress: usize,
    alone: bool,
    /// Stress or alone tests waiting for the others to end: while any
    /// waits, no new test starts beside others, so they are never starved.
    waiting: usize,
}

impl State {
    fn admits(&self, kind: Kind) -> bool {
        let shared = !self.alone && self.stress == 0 && self.waiting == 0;
        match kind {
            Kind::Beside => shared,
            Kind::InTurn => shared && self.in_turn < IN_TURN_AT_ONCE,
            Kind::Stress => !self.alone && self.beside == 0 && self.stress < STRESS_AT_ONCE,
            Kind::Alone => !self.alone && self.beside == 0 && self.stress == 0,
        }
    }

    fn count(&mut self, kind: Kind, entering: bool) {
        let step = |n: &mut usize| {
            if entering {
                *n += 1;
            } else {
                *n -= 1;
            }
        };
        match kind {
            Kind::Beside => step(&mut self.beside),
            Kind::InTurn => {
                step(&mut self.beside);
                step(&mut self.in_turn);
            }
            Kind::Stress => step(&mut self.stress),
            Kind::Alone => self.alone = entering,
        }
    }
}

static STATE: Mutex<State> = Mutex::new(State {
    beside: 0,
    in_turn: 0,
    stress: 0,
    alone: false,
    waiting: 0,
});
static CHANGED: Condvar = Condvar::new();

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A test's turn on the machine, from [`alone`], [`in_turn`], [`stress`]
/// or [`beside_others`]: held for the test's whole run, across its awaits.
#[must_use = "the turn ends when this is dropped"]
#[derive(Debug)]
pub struct Turn {
    kind: Kind,
    test: Option<String>,
    asked: Instant,
    waited: Duration,
}

fn take(kind: Kind) -> Turn {
    let asked = Instant::now();
    let mut state = state();
    let exclusive = matches!(kind, Kind::Stress | Kind::Alone);
    if exclusive {
        state.waiting += 1;
    }
    while !state.admits(kind) {
        state = CHANGED.wait(state).unwrap_or_else(PoisonError::into_inner);
    }
    if exclusive {
        state.waiting -= 1;
    }
    state.count(kind, true);
    Turn {
        kind,
        test: std::thread::current().name().map(str::to_owned),
        asked,
        waited: asked.elapsed(),
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        state().count(self.kind, false);
        CHANGED.notify_all();
        log(self);
    }
}

/// With `DLOCK_TURN_LOG` set to a file, each turn appends a line to it:
/// test binary, process, kind, test, seconds waited for the turn,
/// seconds held. Which tests
/// make a binary's critical path shows there (`cargo test` reports only
/// the whole binary's time).
fn log(turn: &Turn) {
    let Some(path) = std::env::var_os("DLOCK_TURN_LOG") else {
        return;
    };
    let exe = std::env::current_exe().ok();
    let binary = exe
        .as_deref()
        .and_then(std::path::Path::file_name)
        .map(|n| n.to_string_lossy().into_owned());
    let line = format!(
        "{}\t{}\t{:?}\t{}\t{:.2}\t{:.2}\n",
        binary.as_deref().unwrap_or("?"),
        std::process::id(),
        turn.kind,
        turn.test.as_deref().unwrap_or("?"),
        turn.waited.as_secs_f64(),
        (turn.asked.elapsed() - turn.waited).as_secs_f64()
    );
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        // One write per line: lines of concurrent tests do not interleave.
        let _ = file.write_all(line.as_bytes());
    }
}

/// For a test that loads the whole machine or shares what others use (a
/// topology of many containers, a JVM or Python client): while it holds
/// this, no other test of its process that took a turn runs. Tests that
/// ask for a turn beside others after it wait for it, so it is never
/// starved.
pub fn alone() -> Turn {
    take(Kind::Alone)
}

/// For a stress case, which keeps its client and server as busy as they
/// can be for seconds to tens of seconds: beside at most
/// [`STRESS_AT_ONCE`]` - 1` other stress cases and nothing else (beside
/// them two cores stay saturated, and a case judging within a short TTL
/// would judge the machine).
pub fn stress() -> Turn {
    take(Kind::Stress)
}

/// For a test that judges time against a budget (a fault case's bound, a
/// hand-over time, a restart of its own server): at most
/// [`IN_TURN_AT_ONCE`] such tests at a time in its process, beside tests
/// that only wait, which take little of the machine; never beside one that
/// runs [`alone`] or a [`stress`] case.
pub fn in_turn() -> Turn {
    take(Kind::InTurn)
}

/// For a test that only waits (on TTLs, timeouts, other clients): it runs
/// beside any number of others like it and the [`in_turn`] ones, never beside
/// one that runs [`alone`] or a [`stress`] case. `cargo test` runs such
/// tests many at a time (`RUST_TEST_THREADS` in the workspace's
/// `.cargo/config.toml`).
pub fn beside_others() -> Turn {
    take(Kind::Beside)
}
