//! Steps of the machine's wall clock, seen while a run goes on.
//!
//! Redis, MySQL and PostgreSQL end leases on their wall clock; the clients
//! (and the histories) count on `CLOCK_MONOTONIC`. When the wall clock
//! steps forward against it, every lease those servers hold ends early by
//! the step, while each holder still believes its own deadline: the Safety
//! model's "the server's clock runs faster than the client's by more than
//! the drift", which nothing in a lock library can cover. A VM that is
//! paused and set right on resume does exactly this (its monotonic clock
//! stands still through the pause; measured: a 1.7 s step on this project's
//! machines, with every such server of a run granting early at once). The
//! campaign does not throw these steps; it watches for them, so that the
//! checker can tell the hazard from a driver's bug.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

use crate::history::now_ns;

/// How often the clocks are compared.
const EVERY: Duration = Duration::from_millis(10);

/// A step smaller than this (beyond the drift allowance's 1 % of the time
/// since the last look) is not recorded: a slewing clock or a late look.
const FLOOR_NS: i64 = 2_000_000;

/// One step of the wall clock against `CLOCK_MONOTONIC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The last look before it (ns of `CLOCK_MONOTONIC`).
    pub before: u64,
    /// The first look after it.
    pub after: u64,
    /// How far the wall clock jumped (ns): ahead, or back when negative,
    /// which lengthens leases and so takes from the steps ahead around it.
    pub by: i64,
}

/// Watches the clocks until [`Watcher::stop`] (or until dropped, when a
/// run ends early).
#[derive(Debug)]
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Step>>>,
}

impl Watcher {
    /// Starts watching, on a thread of its own so that a busy runtime
    /// cannot make its looks late.
    pub fn start() -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("clock-watcher".to_owned())
            .spawn(move || watch(&stopped))?;
        Ok(Watcher {
            stop,
            thread: Some(thread),
        })
    }

    /// The steps seen since the start.
    pub fn stop(mut self) -> Result<Vec<Step>, String> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(thread) => thread
                .join()
                .map_err(|_| "the clock watcher panicked".to_owned()),
            None => Ok(Vec::new()),
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn watch(stop: &AtomicBool) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut last = offset();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(EVERY);
        let now = offset();
        let (Some((t0, o0)), Some((t1, o1))) = (last, now) else {
            last = now;
            continue;
        };
        let gained = o1 - o0;
        let allowed = FLOOR_NS.saturating_add(i64::try_from((t1 - t0) / 100).unwrap_or(i64::MAX));
        if gained.abs() > allowed {
            steps.push(Step {
                before: t0,
                after: t1,
                by: gained,
            });
        }
        last = now;
    }
    steps
}

/// `CLOCK_REALTIME` minus `CLOCK_MONOTONIC` (ns), with the monotonic time
/// it was read at: the tightest of a few paired readings, so that a
/// preemption between the reads is not taken for a step.
fn offset() -> Option<(u64, i64)> {
    let mut best: Option<(u64, u64, i64)> = None;
    for _ in 0..5 {
        let before = now_ns();
        let wall = clock_gettime(ClockId::CLOCK_REALTIME).ok()?;
        let after = now_ns();
        // time_t and the nanoseconds' c_long are i64 on the 64-bit Linux
        // the campaign runs on.
        let wall = wall
            .tv_sec()
            .checked_mul(1_000_000_000)?
            .checked_add(wall.tv_nsec())?;
        let spread = after.saturating_sub(before);
        let mid = before + spread / 2;
        let offset = wall - i64::try_from(mid).ok()?;
        if best.is_none_or(|b| spread < b.1) {
            best = Some((mid, spread, offset));
        }
    }
    best.map(|(at, _, offset)| (at, offset))
}
