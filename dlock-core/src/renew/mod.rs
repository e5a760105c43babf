//! The renewal scheduler behind guards: one task per [`Locker`](crate::Locker)
//! renews all its leases, a batch per request ([`Backend::extend_many`]), and
//! tells each guard when its lease can no longer be trusted.
//!
//! Leases whose renewals fall due close together are renewed together (a
//! little early rather than each on its own), so that however the grants
//! were spread, a renewal period costs a handful of batches. Loss is judged
//! per lease, at its own deadline, by the scheduler's clock: a slow batch
//! never delays another lease's lost signal.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::time::{Instant, sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;

use crate::backend::MAX_BATCH;
use crate::metrics as metric;
use crate::settings::deadline_after;
use crate::{Backend, Error, Lease};

/// Renews the leases registered with it. Cheap to clone; clones share the
/// schedule.
#[derive(Clone)]
pub(crate) struct Renewer {
    shared: Arc<Shared>,
}

impl fmt::Debug for Renewer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Renewer")
            .field("leases", &self.shared.lock().entries.len())
            .finish()
    }
}

struct Shared {
    backend: Arc<dyn Backend>,
    state: Mutex<State>,
    wake: Notify,
    /// Batches in flight at once: a burst of due leases is sent a few
    /// batches at a time, and a waiting batch holds only its lease ids.
    permits: Semaphore,
}

/// Batches of [`MAX_BATCH`] in flight at once; a driver without batches
/// sends one request per lease, so it gets more.
const BATCHES_IN_FLIGHT: usize = 16;
const SINGLES_IN_FLIGHT: usize = 1024;

#[derive(Default)]
struct State {
    next_id: u64,
    entries: HashMap<u64, Entry>,
    /// When each entry next needs the scheduler: its renewal, or its
    /// deadline while a renewal is in flight or when it is not renewed.
    timers: BTreeSet<(Instant, u64)>,
    /// Whether the scheduler task is alive; it ends when no lease is left.
    running: bool,
    /// The largest [`slack`] of any lease registered so far.
    max_slack: Duration,
}

/// Whether a lease is renewed, and until when at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal {
    pub on: bool,
    /// No renewal is sent from then on ([`crate::LockOptions::max_hold`]).
    pub until: Option<Instant>,
}

struct Entry {
    lease: Lease,
    renew: bool,
    renew_until: Option<Instant>,
    lost: CancellationToken,
    timer: Instant,
    in_flight: bool,
    /// The timer is a retry after a failed renewal: due at that time, not
    /// within the slack before it (a retry sooner than the slack would
    /// otherwise be taken again at once, and again, without pause).
    retry: bool,
}

/// A lease's place in its renewer; dropping it takes the lease out.
pub(crate) struct Registration {
    shared: Arc<Shared>,
    id: u64,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.id)
            .finish()
    }
}

impl Registration {
    /// The lease's deadline as of its last renewal.
    pub(crate) fn valid_until(&self) -> Option<Instant> {
        let state = self.shared.lock();
        state.entries.get(&self.id)?.lease.valid_until()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        if let Some(entry) = state.entries.remove(&self.id) {
            state.timers.remove(&(entry.timer, self.id));
        }
        if state.entries.is_empty() {
            drop(state);
            // Let an idle scheduler end now rather than at its next timer.
            self.shared.wake.notify_one();
        }
    }
}

/// How early a renewal may be sent so that it rides with others: half the
/// renewal period. Renewals then come at a sixth to a third of the TTL, so
/// that however the grants were spread, a period holds two batches of
/// renewals, and the lease always keeps two thirds of its TTL as margin.
fn slack(ttl: Duration) -> Duration {
    ttl / 6
}

impl Renewer {
    pub(crate) fn new(backend: Arc<dyn Backend>) -> Self {
        Renewer {
            shared: Arc::new(Shared {
                permits: Semaphore::new(if backend.capabilities().batch_extend {
                    BATCHES_IN_FLIGHT
                } else {
                    SINGLES_IN_FLIGHT
                }),
                backend,
                state: Mutex::new(State::default()),
                wake: Notify::new(),
            }),
        }
    }

    /// Watches `lease`: renews it when `renew` is set (the registration
    /// tells the new deadline), and cancels `lost` when the lease can no
    /// longer be trusted. `None` for session leases (nothing to do) and
    /// outside a tokio runtime (the lease then runs out at its TTL).
    pub(crate) fn register(
        &self,
        lease: &Lease,
        renew: Renewal,
        lost: CancellationToken,
    ) -> Option<Registration> {
        let Renewal {
            on: renew,
            until: renew_until,
        } = renew;
        let (ttl, deadline) = (lease.trusted_ttl()?, lease.valid_until()?);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(name = lease.name(), "no tokio runtime: lease not renewed");
            return None;
        };
        let timer = if renew {
            deadline_after(Instant::now(), ttl / 3).min(deadline)
        } else {
            deadline
        };
        let mut state = self.shared.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.max_slack = state.max_slack.max(slack(ttl));
        let earliest = state.timers.first().is_none_or(|&(at, _)| timer < at);
        state.timers.insert((timer, id));
        state.entries.insert(
            id,
            Entry {
                lease: lease.clone(),
                renew,
                renew_until,
                lost,
                timer,
                in_flight: false,
                retry: false,
            },
        );
        let start = !state.running;
        state.running = true;
        drop(state);
        if start {
            runtime.spawn(self.shared.clone().run());
        } else if earliest {
            self.shared.wake.notify_one();
        }
        Some(Registration {
            shared: self.shared.clone(),
            id,
        })
    }
}

/// Marks the scheduler stopped when its task goes away unfinished.
struct Running(Option<Arc<Shared>>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            shared.lock().running = false;
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent at every unlock, so a panic elsewhere
        // while it was held leaves nothing half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn run(self: Arc<Self>) {
        // Dropped with the task, also when its runtime shuts down first (a
        // locker shared by several runtimes): the next lease starts a new one.
        let mut alive = Running(Some(self.clone()));
        let batch = if self.backend.capabilities().batch_extend {
            MAX_BATCH
        } else {
            1
        };
        loop {
            let (due, next) = {
                let mut state = self.lock();
                if state.entries.is_empty() {
                    state.running = false;
                    alive.0 = None;
                    return;
                }
                let due = state.take_due(Instant::now(), self.backend.driver());
                (due, state.timers.first().map(|&(at, _)| at))
            };
            let mut due = due.into_iter().peekable();
            while due.peek().is_some() {
                let chunk: Vec<_> = due.by_ref().take(batch).collect();
                tokio::spawn(self.clone().renew(chunk));
            }
            match next {
                Some(at) => {
                    tokio::select! {
                        () = sleep_until(at) => {}
                        () = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }

    /// One batch's request, and what its answer means for each lease.
    async fn renew(self: Arc<Self>, ids: Vec<u64>) {
        let Ok(_permit) = self.permits.acquire().await else {
            return;
        };
        // Taken only now: the leases may have been released, dropped or
        // lost (at their deadline) while the batch waited for its turn.
        let (ids, mut leases): (Vec<u64>, Vec<Lease>) = {
            let state = self.lock();
            ids.into_iter()
                .filter_map(|id| {
                    let entry = state.entries.get(&id)?;
                    (entry.in_flight && !entry.lost.is_cancelled())
                        .then(|| (id, entry.lease.clone()))
                })
                .unzip()
        };
        let Some(first_deadline) = leases.iter().filter_map(Lease::valid_until).min() else {
            return;
        };
        // An answer after the first deadline is no answer: that lease is
        // already lost, and the others retry.
        let outcome = match timeout_at(first_deadline, self.backend.extend_many(&mut leases)).await
        {
            Ok(Ok(held)) if held.len() == leases.len() => Ok(held),
            Ok(Ok(held)) => Err(format!(
                "the driver answered for {} of {} leases",
                held.len(),
                leases.len()
            )),
            Ok(Err(Error::NotHeld { .. })) => Ok(vec![false; leases.len()]),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer before the first lease of the batch ran out".to_owned()),
        };
        let driver = self.backend.driver();
        let now = Instant::now();
        let mut state = self.lock();
        for (i, (id, lease)) in ids.into_iter().zip(leases).enumerate() {
            let Some(entry) = state.entries.get_mut(&id) else {
                continue; // dropped meanwhile
            };
            if entry.lost.is_cancelled() {
                continue; // released or lost meanwhile
            }
            entry.in_flight = false;
            entry.retry = false;
            let ttl = lease.trusted_ttl().unwrap_or_default();
            let next = match &outcome {
                Ok(held) if held[i] => {
                    metric::count(metric::RENEWALS, driver);
                    entry.lease = lease;
                    deadline_after(now, ttl / 3)
                }
                Ok(_) => {
                    metric::count(metric::RENEWAL_FAILURES, driver);
                    tracing::warn!(lock = lease.name(), backend = driver, "lock was taken over");
                    state.lose(id, driver);
                    continue;
                }
                // A driver may extend part of a batch before another part
                // fails (a cluster shard down): keep what it did extend.
                Err(_) if lease.valid_until() > entry.lease.valid_until() => {
                    metric::count(metric::RENEWALS, driver);
                    entry.lease = lease;
                    deadline_after(now, ttl / 3)
                }
                Err(error) => {
                    metric::count(metric::RENEWAL_FAILURES, driver);
                    tracing::warn!(
                        lock = lease.name(),
                        backend = driver,
                        %error,
                        "renewal failed; retrying before the lease ends"
                    );
                    entry.retry = true;
                    deadline_after(now, (ttl / 10).max(Duration::from_millis(5)))
                }
            };
            state.reschedule(id, next);
        }
        drop(state);
        self.wake.notify_one();
    }
}

impl State {
    /// Once a timer is due: ends the leases past their deadline and takes
    /// out those whose renewal is due (or nearly: within their slack),
    /// marking them in flight; their timer becomes their deadline.
    ///
    /// Nothing before that: the scheduler also wakes at every batch's
    /// answer, and a look then would take the few leases whose renewal just
    /// came within their slack, a batch of a handful each time (at 100,000
    /// leases, ~85 such batches a renewal period beside the 100 full ones).
    fn take_due(&mut self, now: Instant, driver: &'static str) -> Vec<u64> {
        if self.timers.first().is_none_or(|&(at, _)| at > now) {
            return Vec::new();
        }
        let horizon = deadline_after(now, self.max_slack);
        let near: Vec<(Instant, u64)> =
            self.timers.range(..=(horizon, u64::MAX)).copied().collect();
        let mut due = Vec::new();
        for (at, id) in near {
            let Some(entry) = self.entries.get_mut(&id) else {
                self.timers.remove(&(at, id));
                continue;
            };
            let deadline = entry.lease.valid_until().unwrap_or(now);
            if entry.lost.is_cancelled() {
                // Released, or ended by the driver: nothing more to watch.
                self.timers.remove(&(at, id));
                continue;
            }
            if now >= deadline {
                if entry.renew {
                    tracing::warn!(
                        lock = entry.lease.name(),
                        backend = driver,
                        "lease expired before it could be renewed"
                    );
                } else {
                    tracing::info!(
                        lock = entry.lease.name(),
                        "lease ended at its TTL, not renewed"
                    );
                }
                self.lose(id, driver);
                continue;
            }
            let held_long_enough = entry.renew_until.is_some_and(|until| now >= until);
            if entry.renew && held_long_enough && !entry.in_flight {
                // Held as long as allowed: the lease runs out at its deadline.
                tracing::info!(
                    lock = entry.lease.name(),
                    "held for max_hold: renewal stops"
                );
                entry.renew = false;
            }
            if !entry.renew && at < deadline {
                // Not renewed: nothing to do before its deadline (a timer
                // left earlier, by a renewal that came back after renewal
                // stopped, would fire again and again until then).
                entry.timer = deadline;
                self.timers.remove(&(at, id));
                self.timers.insert((deadline, id));
                continue;
            }
            let ttl = entry.lease.trusted_ttl().unwrap_or_default();
            let early = if entry.retry {
                Duration::ZERO
            } else {
                slack(ttl)
            };
            if entry.in_flight || !entry.renew || at > deadline_after(now, early) {
                continue;
            }
            entry.in_flight = true;
            entry.timer = deadline;
            due.push(id);
            self.timers.remove(&(at, id));
            self.timers.insert((deadline, id));
        }
        due
    }

    /// Moves an entry's renewal to `at`, never past its deadline.
    fn reschedule(&mut self, id: u64, at: Instant) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        let at = entry.lease.valid_until().map_or(at, |d| at.min(d));
        self.timers.remove(&(entry.timer, id));
        entry.timer = at;
        self.timers.insert((at, id));
    }

    /// The lease can no longer be trusted: tell its holder, stop watching.
    /// The entry stays (untimed) until its guard goes, for its deadline.
    fn lose(&mut self, id: u64, driver: &'static str) {
        if let Some(entry) = self.entries.get(&id) {
            self.timers.remove(&(entry.timer, id));
            metric::count(metric::LOST, driver);
            entry.lost.cancel();
        }
    }
}

#[cfg(test)]
mod tests;
