//! Building blocks for drivers' wait loops: deadlines, jittered backoff,
//! in-process wake-ups, and the loop itself.

use std::collections::HashMap;
use std::future::{Future, pending};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::{Instant, sleep, timeout_at};

use crate::options::deadline_after;
use crate::{Backend, Error, Lease, Result};

/// The end of a wait bound.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    start: Instant,
    end: Option<Instant>,
}

impl Deadline {
    /// A deadline `wait` from now; `None` never passes.
    pub fn after(wait: Option<Duration>) -> Self {
        let start = Instant::now();
        Deadline {
            start,
            end: wait.map(|w| deadline_after(start, w)),
        }
    }

    /// Whether the deadline has passed.
    pub fn is_past(&self) -> bool {
        self.end.is_some_and(|end| Instant::now() >= end)
    }

    /// Time since the wait began.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// `delay`, shortened so that a sleep of it ends by the deadline.
    pub fn cap(&self, delay: Duration) -> Duration {
        match self.end {
            Some(end) => delay.min(end.saturating_duration_since(Instant::now())),
            None => delay,
        }
    }

    /// The [`Error::Timeout`] for a wait on `name` that ends now.
    pub fn timeout_error(&self, name: &str) -> Error {
        Error::Timeout {
            name: name.to_owned(),
            waited: self.elapsed(),
        }
    }

    /// When an acquire under this deadline must have returned: the deadline
    /// itself, but never sooner than one request timeout after the wait
    /// began, so that a zero or tiny wait bound still gets its one attempt.
    /// `None` for an unbounded wait.
    pub fn cut_off(&self, request_timeout: Duration) -> Option<Instant> {
        let end = self.end?;
        Some(end.max(deadline_after(self.start, request_timeout)))
    }

    /// Runs a whole acquire of `name`, cut off at [`Deadline::cut_off`]
    /// with [`Error::Timeout`]: the hard bound on a call whose requests
    /// hang (a stalled server, a lost reply the client library does not
    /// time out). The cut drops `acquire` wherever it is waiting, so the
    /// driver's cancellation handling (cleanup by owner token) applies.
    pub async fn bound<T>(
        &self,
        name: &str,
        request_timeout: Duration,
        acquire: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let Some(cut) = self.cut_off(request_timeout) else {
            return acquire.await;
        };
        match timeout_at(cut, acquire).await {
            Ok(done) => done,
            Err(_) => Err(self.timeout_error(name)),
        }
    }
}

/// Judges a grant the moment its reply arrives: a lease already past its
/// validity deadline (the reply was slower than the lease) is no grant.
/// It is released, owner-checked, in the background, and the attempt
/// counts as "held", so the caller waits on or reports the lock as taken.
pub fn on_arrival<B>(backend: &B, lease: Lease) -> Attempt
where
    B: Backend + Clone + 'static,
{
    if lease.is_valid() {
        return Attempt::Acquired(lease);
    }
    tracing::debug!(
        name = lease.name(),
        "grant arrived after its validity deadline; releasing it"
    );
    release_in_background(Arc::new(backend.clone()), lease);
    Attempt::Held { expires_in: None }
}

/// Releases `lease` on a spawned task, if there is a runtime to spawn on,
/// retrying while the server is out of reach until the lease's TTL would
/// have freed it anyway; the TTL or session frees it otherwise.
pub fn release_in_background(backend: Arc<dyn Backend>, lease: Lease) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(name = lease.name(), "no runtime: lock left to expire");
        return;
    };
    rt.spawn(async move {
        let within = lease.ttl().unwrap_or_default();
        let released = retry_for(within, || async {
            match backend.release(&lease).await {
                // Gone already: nothing left to release.
                Err(Error::NotHeld { .. }) => Ok(()),
                done => done,
            }
        })
        .await;
        if released.is_none() {
            tracing::debug!(
                name = lease.name(),
                "background release gave up: left to its TTL"
            );
        }
    });
}

/// `d` scaled by a random factor in `[0.5, 1.0]`, so that clients that
/// collided once do not collide again on every retry.
pub fn jitter(d: Duration) -> Duration {
    let factor = 0.5 + fastrand::f64() / 2.0;
    // Through f64 the largest durations round up past `Duration::MAX`.
    Duration::try_from_secs_f64(d.as_secs_f64() * factor)
        .unwrap_or(d)
        .min(d)
}

/// Exponential backoff with jitter ("equal jitter"): each delay is drawn from
/// the upper half of a range that doubles up to a cap.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

/// The shortest delay a [`Backoff`] gives: a zero delay would be a busy loop.
pub const MIN_BACKOFF: Duration = Duration::from_millis(1);

impl Backoff {
    /// Delays start near `min` and double up to `max`; both are raised to
    /// at least [`MIN_BACKOFF`].
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(MIN_BACKOFF);
        let max = max.max(min);
        Backoff {
            min,
            max,
            current: min,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let d = jitter(self.current);
        self.current = self.current.saturating_mul(2).min(self.max);
        d
    }

    /// Start again from the smallest delay.
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

/// In-process wake-ups per lock name: drivers call [`Wakeups::wake`] when
/// they release a lock or hear of a release (a pub/sub message, a watch),
/// and their wait loops sleep on a [`Waiter`].
#[derive(Debug, Default)]
pub struct Wakeups {
    names: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
}

impl Wakeups {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers interest in `name` until the returned waiter is dropped.
    pub fn register(&self, name: &str) -> Waiter<'_> {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = names
            .entry(name.to_owned())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Waiter {
            hub: self,
            name: name.to_owned(),
            notify: entry.0.clone(),
            first: entry.1 == 1,
        }
    }

    /// Wakes every waiter of `name` in this process.
    pub fn wake(&self, name: &str) {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((notify, _)) = names.get(name) {
            notify.notify_waiters();
        }
    }

    /// Wakes every waiter of every name: for drivers that lost their
    /// notification channel and cannot tell which releases they missed.
    pub fn wake_all(&self) {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        for (notify, _) in names.values() {
            notify.notify_waiters();
        }
    }

    /// The names that have waiters now.
    pub fn names(&self) -> Vec<String> {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        names.keys().cloned().collect()
    }
}

/// Interest in one name's wake-ups; see [`Wakeups::register`].
#[derive(Debug)]
pub struct Waiter<'a> {
    hub: &'a Wakeups,
    name: String,
    notify: Arc<Notify>,
    first: bool,
}

impl Waiter<'_> {
    /// A future that completes on the next wake-up of this name. It hears
    /// every wake-up from the moment it is created, before it is polled, so
    /// create it *before* the attempt whose failure makes you wait.
    pub fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }

    /// Whether this was the only waiter of its name when it registered:
    /// drivers subscribe to a server-side channel then.
    pub fn is_first(&self) -> bool {
        self.first
    }

    /// The name waited for.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut names = self
            .hub
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = names.get_mut(&self.name) {
            entry.1 -= 1;
            if entry.1 == 0 {
                names.remove(&self.name);
            }
        }
    }
}

/// What one acquire attempt found.
#[derive(Debug)]
pub enum Attempt {
    /// The lock was granted.
    Acquired(Lease),
    /// The lock is held; `expires_in` is the holder's remaining lease when
    /// the backend knows it, so the waiter can look again when it ends.
    Held {
        /// The holder's remaining lease.
        expires_in: Option<Duration>,
    },
}

impl Attempt {
    /// The lease, if the attempt got one: what `try_acquire` returns.
    pub fn into_lease(self) -> Option<Lease> {
        match self {
            Attempt::Acquired(lease) => Some(lease),
            Attempt::Held { .. } => None,
        }
    }
}

/// Undoes an acquire whose outcome is unknown: armed while its request
/// may be in flight, it runs the undo on a spawned task if dropped armed (a
/// request that failed, a future that was dropped midway).
pub struct UndoOnDrop(Option<Pin<Box<dyn Future<Output = ()> + Send>>>);

impl UndoOnDrop {
    /// Armed with `undo`, which runs only if this is dropped armed.
    pub fn new(undo: impl Future<Output = ()> + Send + 'static) -> Self {
        UndoOnDrop(Some(Box::pin(undo)))
    }

    /// The outcome is known: nothing to undo.
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl std::fmt::Debug for UndoOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("UndoOnDrop")
            .field(&self.0.is_some())
            .finish()
    }
}

impl Drop for UndoOnDrop {
    fn drop(&mut self) {
        if let (Some(undo), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(undo);
        }
    }
}

/// Runs `op` until it succeeds, with jittered backoff, for at most
/// `within`: how drivers undo an acquire of unknown outcome while the
/// server is out of reach (past the lease's TTL the server has freed the
/// lock anyway). `None` when it gave up.
pub async fn retry_for<T, F, Fut>(within: Duration, mut op: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let started = Instant::now();
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500));
    loop {
        match op().await {
            Ok(value) => return Some(value),
            Err(e) if started.elapsed() < within => {
                tracing::debug!(error = %e, "failed; retrying");
                sleep(backoff.next_delay()).await;
            }
            Err(e) => {
                tracing::debug!(error = %e, "failed; giving up");
                return None;
            }
        }
    }
}

/// How many failed attempts in a row (connection lost, server briefly
/// unavailable) the wait loop rides out before it reports the error.
const RETRIES: u32 = 3;

/// The wait loop every driver shares: attempt, and while the lock is held,
/// sleep until a wake-up, the holder's expiry, or the next jittered backoff
/// step, whichever is first, never past the wait bound.
///
/// The wake-up future is created before each attempt, so a release that
/// lands between a failed attempt and the sleep is not missed. The deadline
/// is the caller's, usually `Deadline::after(opts.wait_value())` taken
/// before any request of the acquire. A retryable error (a dropped
/// connection the client library is re-opening, a server that is loading)
/// is tried again after a backoff step, a few times in a row at most and
/// never past the deadline; then it is returned.
pub async fn wait_for_lock<F, Fut>(
    name: &str,
    deadline: Deadline,
    wakeups: Option<&Wakeups>,
    mut backoff: Backoff,
    mut attempt: F,
) -> Result<Lease>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt>>,
{
    let waiter = wakeups.map(|w| w.register(name));
    let mut failures = 0;
    loop {
        let mut notified = pin!(waiter.as_ref().map(Waiter::notified));
        let expires_in = match attempt().await {
            Ok(Attempt::Acquired(lease)) => return Ok(lease),
            Ok(Attempt::Held { expires_in }) => {
                failures = 0;
                expires_in
            }
            Err(e) if e.is_retryable() && failures < RETRIES && !deadline.is_past() => {
                failures += 1;
                tracing::debug!(name, error = %e, "attempt failed; trying again");
                None
            }
            Err(e) => return Err(e),
        };
        if deadline.is_past() {
            return Err(deadline.timeout_error(name));
        }
        let mut delay = backoff.next_delay();
        if let Some(left) = expires_in {
            // Expiry notifies nobody: look again just after it, with a little
            // jitter so that a crowd of waiters does not arrive at once.
            delay = delay.min(left + jitter(Duration::from_millis(4)));
        }
        let woken = async {
            match notified.as_mut().as_pin_mut() {
                Some(n) => n.await,
                None => pending().await,
            }
        };
        tokio::select! {
            () = sleep(deadline.cap(delay)) => {}
            () = woken => backoff.reset(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(40));
        let d: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        let within = |d: Duration, hi: u64| {
            d >= Duration::from_millis(hi) / 2 && d <= Duration::from_millis(hi)
        };
        assert!(within(d[0], 10) && within(d[1], 20) && within(d[2], 40));
        assert!(within(d[3], 40) && within(d[4], 40));
        b.reset();
        assert!(within(b.next_delay(), 10));
    }

    #[test]
    fn extreme_durations_do_not_panic() {
        for d in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
            assert!(jitter(d) <= d);
            let mut b = Backoff::new(d, d);
            for _ in 0..70 {
                assert!(b.next_delay() <= d.max(MIN_BACKOFF));
            }
        }
        assert!(Backoff::new(Duration::ZERO, Duration::ZERO).next_delay() > Duration::ZERO);
    }

    #[tokio::test]
    async fn a_wakeup_before_the_wait_is_not_missed() {
        let hub = Wakeups::new();
        let waiter = hub.register("x");
        assert!(waiter.is_first());
        let notified = waiter.notified();
        hub.wake("x");
        tokio::time::timeout(Duration::from_secs(1), notified)
            .await
            .expect("the wake-up was lost");
        drop(waiter);
        assert!(hub.names().is_empty());
    }
}
