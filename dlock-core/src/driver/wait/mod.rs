//! Building blocks for drivers' wait loops: deadlines, jittered backoff,
//! in-process wake-ups, and the loop itself.

use std::future::{Future, pending, ready};
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::sleep;

use crate::driver::undo::release_in_background;
use crate::{Backend, Lease, Result};

mod backoff;
mod deadline;
mod wakeups;

pub use backoff::{Backoff, MIN_BACKOFF, jitter};
pub use deadline::Deadline;
pub use wakeups::{Waiter, Wakeups};

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

/// How many failed attempts in a row (connection lost, server briefly
/// unavailable) the wait loop rides out before it reports the error.
pub const RETRIES: u32 = 3;

/// The wait loop every driver shares: attempt, and while the lock is held,
/// sleep until a wake-up, the holder's expiry, or the next jittered backoff
/// step, whichever is first, never past the wait bound.
///
/// The wake-up future is created before each attempt, so a release that
/// lands between a failed attempt and the sleep is not missed. The deadline
/// is the caller's, usually `Deadline::after(opts.get_wait())` taken
/// before any request of the acquire. A retryable error (a dropped
/// connection the client library is re-opening, a server that is loading)
/// is tried again after a backoff step, a few times in a row at most and
/// never past the deadline; then it is returned.
pub async fn wait_for_lock<F, Fut>(
    name: &str,
    deadline: Deadline,
    wakeups: Option<&Wakeups>,
    backoff: Backoff,
    attempt: F,
) -> Result<Lease>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt>>,
{
    wait_for_lock_with_pause(name, deadline, wakeups, backoff, attempt, |_| ready(false)).await
}

/// [`wait_for_lock`], woken through `wakeups` by `key` instead of by the
/// name: for a driver whose release says which queued waiters it may have
/// let in, so that only they look again (PostgreSQL's shared kinds wake
/// their waiters by waiter token, not the name's whole crowd).
pub async fn wait_for_lock_as<F, Fut>(
    name: &str,
    key: &str,
    deadline: Deadline,
    wakeups: &Wakeups,
    backoff: Backoff,
    attempt: F,
) -> Result<Lease>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt>>,
{
    let waiter = wakeups.register(key);
    waiting(name, deadline, Some(waiter), backoff, attempt, |_| {
        ready(false)
    })
    .await
}

/// [`wait_for_lock`] for a driver that can pause somewhere better than in
/// a local sleep: MySQL's registered waiters sleep in the server, where a
/// release from any process ends the first one's sleep.
///
/// After every attempt that did not get the lock, while the deadline has
/// not passed, `pause(deadline)` runs first. `true`: it has paused, or wants the next
/// attempt at once (it just registered for wake-ups, say), and the loop
/// attempts again; it must not return `true` at once every time, or the
/// loop spins. `false`: the loop sleeps as [`wait_for_lock`] does. Only
/// those local sleeps advance `backoff`, and only they listen to
/// `wakeups`. A `pause` dropped midway (the wait ends or is dropped) must
/// leave nothing behind that the driver cannot clean up.
pub async fn wait_for_lock_with_pause<F, Fut, P, PFut>(
    name: &str,
    deadline: Deadline,
    wakeups: Option<&Wakeups>,
    backoff: Backoff,
    attempt: F,
    pause: P,
) -> Result<Lease>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt>>,
    P: FnMut(Deadline) -> PFut,
    PFut: Future<Output = bool>,
{
    let waiter = wakeups.map(|w| w.register(name));
    waiting(name, deadline, waiter, backoff, attempt, pause).await
}

/// The loop of [`wait_for_lock_with_pause`], woken by `waiter`.
async fn waiting<F, Fut, P, PFut>(
    name: &str,
    deadline: Deadline,
    waiter: Option<Waiter<'_>>,
    mut backoff: Backoff,
    mut attempt: F,
    mut pause: P,
) -> Result<Lease>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Attempt>>,
    P: FnMut(Deadline) -> PFut,
    PFut: Future<Output = bool>,
{
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
        if pause(deadline).await {
            continue;
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
