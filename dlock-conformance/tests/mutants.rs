//! The suite catches broken drivers. A small driver simulated in memory
//! (a lock server, and a link to it that the fault cases can delay, stall
//! or cut) is run with one bug at a time, each one that real lock
//! libraries have shipped; the whole suite, link fault cases included, must
//! fail the cases that guard against that bug. The driver without a bug
//! is the control: it must pass everything.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_conformance::faults::{FaultyClient, FaultyFactory};
use dlock_conformance::proxy::{Fault, Link};
use dlock_conformance::{Factory, fault_suite, suite};
use dlock_core::wait::{Attempt, Backoff, Deadline, Wakeups, on_arrival, wait_for_lock};
use dlock_core::{
    Backend, Capabilities, Error, HeldLock, Lease, LeaseKind, LockInfo, LockOptions, LockPage,
    OwnerToken, Result, async_trait, validate_name,
};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    /// Release deletes whoever holds the name (`DELETE … WHERE name = ?`).
    ReleaseWithoutOwnerCheck,
    /// The client counts the lease from a clock running ahead of the server's.
    SkewedClock,
    /// The fencing counter starts over (Redis restarted without persistence).
    ResettingFence,
    /// Extend reports success and does nothing.
    ExtendDoesNothing,
    /// The server treats an expired holder as alive.
    TryIgnoresExpiry,
    /// Waiters poll slowly instead of being woken on release.
    NoWakeup,
    /// Acquire reads the lock, then writes it in a second request: two
    /// clients can both see it free and both take it. Declares no fencing,
    /// so only the checker's overlap test can catch it.
    RacyCheckThenSet,
    /// The lease is counted from when the reply arrived, not from before
    /// the request was sent.
    ValidityFromReply,
    /// A grant whose reply arrived after its validity deadline is returned
    /// as a success.
    ExpiredOnArrival,
    /// Requests have no timeout and acquire no overall bound: a stalled
    /// server holds the caller forever.
    IgnoresWaitBound,
    /// An acquire dropped or timed out while its request is in flight is
    /// not undone: the name stays locked for the whole TTL.
    NoCleanup,
    /// `list` shows every row, released and expired ones too (a `SELECT`
    /// without the expiry condition).
    ListShowsFreeLocks,
    /// `release_after` releases at once (the hold is ignored).
    ReleaseAfterFreesAtOnce,
    /// `release_after` keeps the lease's own TTL instead of the hold.
    ReleaseAfterKeepsTheLeaseTtl,
    /// `release_after` sets the hold on whoever holds the name.
    ReleaseAfterWithoutOwnerCheck,
    /// The hold is kept by the client (as a session's ephemeral node
    /// would be): it ends when the client goes away.
    HoldEndsWithClient,
    /// `release_after` leaves the lease's owner on the hold, so the
    /// released lease (or a renewal still in flight) can still release or
    /// extend it.
    ReleaseAfterKeepsOwner,
    /// `force_release` reports the holder but removes nothing (a delete
    /// keyed on the wrong row).
    ForceReleaseOnlyReports,
    /// `extend_many` checks ownership by name: a lease counts as extended
    /// when any lease of the batch holds its name (a stale lease next to
    /// the name's new holder, say).
    BatchOwnerByName,
    /// `extend_many` fails the whole batch as not held when one lease is.
    BatchFailsAsAWhole,
    /// `extend_many` extends every named lock, owner or not (`UPDATE …
    /// WHERE name IN (…)`), and reports the owner check's result.
    BatchExtendsWithoutOwnerCheck,
}

/// The lock server: TTLs, fencing, release notifications.
#[derive(Debug, Default)]
struct Server {
    slots: Mutex<HashMap<String, Slot>>,
    wakeups: Wakeups,
    /// Off for [`Bug::TryIgnoresExpiry`].
    ignores_expiry: bool,
}

#[derive(Debug, Default)]
struct Slot {
    version: u64,
    holder: Option<(OwnerToken, Instant)>,
}

impl Server {
    fn live(&self, slot: &Slot, now: Instant) -> Option<(OwnerToken, Instant)> {
        slot.holder
            .filter(|&(_, expires)| self.ignores_expiry || expires > now)
    }

    /// `SET NX PX`: the new version, or the holder's remaining lease.
    fn acquire(&self, name: &str, owner: OwnerToken, ttl: Duration) -> Result<u64, Duration> {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(name.to_owned()).or_default();
        let now = Instant::now();
        if let Some((_, expires)) = self.live(slot, now) {
            return Err(expires.saturating_duration_since(now));
        }
        slot.version += 1;
        slot.holder = Some((owner, now + ttl));
        Ok(slot.version)
    }

    /// The holder's remaining lease, if the lock is held.
    fn check(&self, name: &str) -> Option<Duration> {
        let slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let slot = slots.get(name)?;
        self.live(slot, now)
            .map(|(_, expires)| expires.saturating_duration_since(now))
    }

    /// An unconditional write.
    fn set(&self, name: &str, owner: OwnerToken, ttl: Duration) -> u64 {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(name.to_owned()).or_default();
        slot.version += 1;
        slot.holder = Some((owner, Instant::now() + ttl));
        slot.version
    }

    fn release(&self, name: &str, owner: Option<OwnerToken>) -> bool {
        let mut slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        let mine = self
            .live(slot, now)
            .is_some_and(|(holder, _)| owner.is_none_or(|o| o == holder));
        if mine {
            // The row stays with its holder's expiry set to now, as the
            // MySQL driver keeps it.
            slot.holder = slot.holder.map(|(o, _)| (o, now));
            self.wakeups.wake(name);
        }
        mine
    }

    /// Keeps the lock until `hold` from now for `new_owner` (the holder's
    /// own when `None`); `owner: None` for any holder.
    fn hold(
        &self,
        name: &str,
        owner: Option<OwnerToken>,
        new_owner: Option<OwnerToken>,
        hold: Duration,
    ) -> bool {
        let mut slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        match self.live(slot, now) {
            Some((holder, _)) if owner.is_none_or(|o| o == holder) => {
                slot.holder = Some((new_owner.unwrap_or(holder), now + hold));
                true
            }
            _ => false,
        }
    }

    fn extend(&self, name: &str, owner: OwnerToken, ttl: Duration) -> bool {
        let mut slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        if self.live(slot, now).is_some_and(|(o, _)| o == owner) {
            slot.holder = Some((owner, now + ttl));
            return true;
        }
        false
    }

    /// Extends each `(name, owner, ttl)` its owner holds; with `by_name`,
    /// answers for a name as a whole instead.
    fn extend_many(
        &self,
        batch: &[(String, OwnerToken, Duration)],
        by_name: bool,
        unchecked: bool,
    ) -> Vec<bool> {
        let done: Vec<bool> = batch
            .iter()
            .map(|(n, o, t)| self.extend(n, *o, *t))
            .collect();
        if unchecked {
            let mut slots = self.slots.lock().unwrap();
            let now = Instant::now();
            for (name, _, ttl) in batch {
                if let Some(slot) = slots.get_mut(name)
                    && let Some((owner, _)) = self.live(slot, now)
                {
                    slot.holder = Some((owner, now + *ttl));
                }
            }
        }
        if !by_name {
            return done;
        }
        batch
            .iter()
            .map(|(name, ..)| batch.iter().zip(&done).any(|((n, ..), &d)| d && n == name))
            .collect()
    }

    /// Held locks under `prefix` after `cursor`, sorted; with `all`, free
    /// ones too.
    fn list(&self, prefix: &str, cursor: Option<&str>, all: bool) -> Vec<HeldLock> {
        let slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let mut locks: Vec<HeldLock> = slots
            .iter()
            .filter(|(name, _)| {
                name.starts_with(prefix) && cursor.is_none_or(|c| name.as_str() > c)
            })
            .filter_map(|(name, slot)| {
                let (owner, expires) = if all {
                    slot.holder?
                } else {
                    self.live(slot, now)?
                };
                let left = expires.saturating_duration_since(now);
                Some(HeldLock::new(
                    name.clone(),
                    LockInfo::new(owner, slot.version, Some(left)),
                ))
            })
            .collect();
        locks.sort_by(|a, b| a.name.cmp(&b.name));
        locks
    }

    fn inspect(&self, name: &str) -> Option<LockInfo> {
        let slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let slot = slots.get(name)?;
        let (owner, expires) = self.live(slot, now)?;
        Some(LockInfo::new(
            owner,
            slot.version,
            Some(expires.saturating_duration_since(now)),
        ))
    }
}

/// A client's link to the server: each request and each reply crosses it.
#[derive(Debug)]
struct SimLink {
    fault: watch::Sender<Fault>,
}

impl SimLink {
    fn new() -> Arc<Self> {
        Arc::new(SimLink {
            fault: watch::channel(Fault::Pass).0,
        })
    }

    /// One crossing, in one direction.
    async fn cross(&self) -> Result<()> {
        let mut fault = self.fault.subscribe();
        loop {
            let now = *fault.borrow_and_update();
            match now {
                Fault::Pass => return Ok(()),
                Fault::Delay(d) => {
                    sleep(d).await;
                    return Ok(());
                }
                Fault::Cut => {
                    return Err(Error::connection(
                        "sim",
                        "link cut",
                        std::io::Error::from(std::io::ErrorKind::ConnectionReset),
                    ));
                }
                Fault::Stall => {
                    let _ = fault.changed().await;
                }
            }
        }
    }
}

impl Link for SimLink {
    fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }
}

const REQUEST_TIMEOUT: Duration = dlock_conformance::faults::REQUEST_TIMEOUT;

/// The driver under test.
#[derive(Debug, Clone)]
struct Sim {
    server: Arc<Server>,
    link: Arc<SimLink>,
    bug: Option<Bug>,
    /// Shared by this client's clones: gone when the client is.
    alive: Arc<()>,
}

impl Sim {
    fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }

    /// One round trip: the request crosses the link, the server runs `op`,
    /// the reply crosses back; bounded by the request timeout.
    async fn call<T>(&self, op: impl FnOnce(&Server) -> T) -> Result<T> {
        let trip = async {
            self.link.cross().await?;
            let out = op(&self.server);
            self.link.cross().await?;
            Ok(out)
        };
        if self.has(Bug::IgnoresWaitBound) {
            return trip.await;
        }
        timeout(REQUEST_TIMEOUT, trip).await.unwrap_or_else(|_| {
            Err(Error::connection(
                "sim",
                "request timed out",
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            ))
        })
    }

    async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        let ttl = opts.ttl_value();
        let mut cleanup = Cleanup {
            sim: (!self.has(Bug::NoCleanup)).then(|| self.clone()),
            name: name.to_owned(),
            owner,
        };
        let granted = if self.has(Bug::RacyCheckThenSet) {
            match self.call(|s| s.check(name)).await? {
                Some(left) => Err(left),
                None => Ok(self.call(|s| s.set(name, owner, ttl)).await?),
            }
        } else {
            self.call(|s| s.acquire(name, owner, ttl)).await?
        };
        cleanup.sim = None;
        let version = match granted {
            Ok(version) => version,
            Err(left) => {
                return Ok(Attempt::Held {
                    expires_in: Some(left),
                });
            }
        };
        let counted_from = match self.bug {
            Some(Bug::ValidityFromReply) => Instant::now(),
            Some(Bug::SkewedClock) => sent + ttl,
            _ => sent,
        };
        let token = if self.has(Bug::ResettingFence) {
            1
        } else {
            version
        };
        let lease = Lease::with_ttl(name, owner, token, opts, counted_from);
        if self.has(Bug::ExpiredOnArrival) {
            return Ok(Attempt::Acquired(lease));
        }
        Ok(on_arrival(self, lease))
    }
}

/// Undoes an acquire whose outcome is unknown.
struct Cleanup {
    sim: Option<Sim>,
    name: String,
    owner: OwnerToken,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(sim) = self.sim.take() {
            let (name, owner) = (std::mem::take(&mut self.name), self.owner);
            tokio::spawn(async move { sim.call(|s| s.release(&name, Some(owner))).await });
        }
    }
}

#[async_trait]
impl Backend for Sim {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Ttl);
        caps.fencing = !self.has(Bug::RacyCheckThenSet);
        caps.notify = true;
        caps.distributed = true;
        caps.cleanup = true;
        caps.delayed_release = true;
        caps.batch_extend = true;
        caps
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        validate_name(name)?;
        opts.validate()?;
        Ok(self.attempt(name, opts).await?.into_lease())
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        validate_name(name)?;
        opts.validate()?;
        let deadline = Deadline::after(opts.wait_value());
        let (wakeups, backoff) = if self.has(Bug::NoWakeup) {
            let poll = Duration::from_secs(10);
            (None, Backoff::new(poll, poll))
        } else {
            let backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
            (Some(&self.server.wakeups), backoff)
        };
        let wait = wait_for_lock(name, deadline, wakeups, backoff, || {
            self.attempt(name, opts)
        });
        if self.has(Bug::IgnoresWaitBound) {
            return wait.await;
        }
        deadline.bound(name, REQUEST_TIMEOUT, wait).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let owner = (!self.has(Bug::ReleaseWithoutOwnerCheck)).then_some(lease.owner());
        let name = lease.name();
        if self.call(|s| s.release(name, owner)).await? || owner.is_none() {
            Ok(())
        } else {
            Err(Error::NotHeld {
                name: name.to_owned(),
            })
        }
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        if self.has(Bug::ReleaseAfterFreesAtOnce) {
            return self.release(lease).await;
        }
        let hold = if self.has(Bug::ReleaseAfterKeepsTheLeaseTtl) {
            lease.ttl().unwrap_or_default()
        } else {
            hold
        };
        let owner = (!self.has(Bug::ReleaseAfterWithoutOwnerCheck)).then_some(lease.owner());
        let new_owner = (!self.has(Bug::ReleaseAfterKeepsOwner)).then(|| lease.owner().for_hold());
        let name = lease.name().to_owned();
        if !self.call(|s| s.hold(&name, owner, new_owner, hold)).await? && owner.is_some() {
            return Err(Error::NotHeld { name });
        }
        if self.has(Bug::HoldEndsWithClient) {
            let (server, alive, owner) = (
                self.server.clone(),
                Arc::downgrade(&self.alive),
                lease.owner().for_hold(),
            );
            tokio::spawn(async move {
                let end = Instant::now() + hold;
                while Instant::now() < end {
                    if alive.strong_count() == 0 {
                        server.release(&name, Some(owner));
                        return;
                    }
                    sleep(Duration::from_millis(10)).await;
                }
            });
        }
        Ok(())
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        let sent = Instant::now();
        if !self.has(Bug::ExtendDoesNothing) {
            let (name, owner) = (lease.name(), lease.owner());
            let ttl = lease.ttl().unwrap_or_default();
            if !self.call(|s| s.extend(name, owner, ttl)).await? {
                return Err(Error::NotHeld {
                    name: name.to_owned(),
                });
            }
        }
        lease.extended(sent);
        Ok(())
    }

    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let sent = Instant::now();
        let batch: Vec<_> = leases
            .iter()
            .map(|l| (l.name().to_owned(), l.owner(), l.ttl().unwrap_or_default()))
            .collect();
        let by_name = self.has(Bug::BatchOwnerByName);
        let mut held = if self.has(Bug::ExtendDoesNothing) {
            vec![true; batch.len()]
        } else {
            let unchecked = self.has(Bug::BatchExtendsWithoutOwnerCheck);
            self.call(|s| s.extend_many(&batch, by_name, unchecked))
                .await?
        };
        if self.has(Bug::BatchFailsAsAWhole) && held.contains(&false) {
            held = vec![false; held.len()];
        }
        for (lease, &held) in leases.iter_mut().zip(&held) {
            if held {
                lease.extended(sent);
            }
        }
        Ok(held)
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        validate_name(name)?;
        self.call(|s| s.inspect(name)).await
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        if self.has(Bug::ForceReleaseOnlyReports) {
            return self.inspect(name).await;
        }
        let owner = self.inspect(name).await?;
        if let Some(info) = &owner {
            self.call(|s| s.release(name, Some(info.owner))).await?;
        }
        Ok(owner)
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        let all = self.has(Bug::ListShowsFreeLocks);
        let mut locks = self.call(|s| s.list(prefix, cursor, all)).await?;
        let limit = limit.max(1);
        let next = (locks.len() > limit).then(|| locks[limit - 1].name.clone());
        locks.truncate(limit);
        Ok(LockPage::new(locks, next))
    }
}

/// Runs every case of the suite, link fault cases included, against the
/// driver with `bug`, all at once, and returns the names of the cases
/// that failed.
async fn failing_cases(bug: Option<Bug>) -> Vec<&'static str> {
    let server = Arc::new(Server {
        ignores_expiry: bug == Some(Bug::TryIgnoresExpiry),
        ..Server::default()
    });
    let client = {
        let server = server.clone();
        move || Sim {
            server: server.clone(),
            link: SimLink::new(),
            bug,
            alive: Arc::new(()),
        }
    };
    let healthy = client.clone();
    let factory: Factory = Arc::new(move || {
        let backend: Arc<dyn Backend> = Arc::new(healthy());
        Box::pin(async move { backend })
    });
    let faulty: FaultyFactory = Arc::new(move || {
        let sim = client();
        let link: Arc<dyn Link> = sim.link.clone();
        let backend: Arc<dyn Backend> = Arc::new(sim);
        Box::pin(async move { FaultyClient { backend, link } })
    });
    let mut runs = Vec::new();
    for case in suite() {
        runs.push((case.name, (case.run)(factory.clone())));
    }
    for case in fault_suite() {
        runs.push((case.name, (case.run)(faulty.clone(), factory.clone())));
    }
    let runs: Vec<_> = runs
        .into_iter()
        .map(|(name, run)| (name, tokio::spawn(timeout(Duration::from_secs(40), run))))
        .collect();
    let mut failed = Vec::new();
    for (name, run) in runs {
        match run.await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => failed.push(name),
        }
    }
    failed.sort_unstable();
    failed
}

async fn assert_caught(bug: Bug, by: &[&str]) {
    let failed = failing_cases(Some(bug)).await;
    for case in by {
        assert!(
            failed.contains(case),
            "{bug:?} got past {case}; failed: {failed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_correct_driver_passes_the_suite() {
    assert_eq!(failing_cases(None).await, Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_without_owner_check_is_caught() {
    assert_caught(
        Bug::ReleaseWithoutOwnerCheck,
        &[
            "foreign_lease_is_not_held",
            "release_twice_is_not_held",
            "stale_lease_cannot_touch_new_holder",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_client_clock_is_caught() {
    assert_caught(
        Bug::SkewedClock,
        &[
            "expiry_then_takeover",
            "delayed_grant_is_valid_only_until_the_server_frees_it",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resetting_fencing_counter_is_caught() {
    assert_caught(
        Bug::ResettingFence,
        &[
            "fencing_increases_across_grants",
            "stress_contended_grants_are_exclusive",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_that_does_nothing_is_caught() {
    assert_caught(
        Bug::ExtendDoesNothing,
        &["extend_keeps_the_lock", "guard_renews_past_ttl"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_acquire_that_ignores_expiry_is_caught() {
    assert_caught(Bug::TryIgnoresExpiry, &["expiry_then_takeover"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wakeup_on_release_is_caught() {
    assert_caught(Bug::NoWakeup, &["waiter_acquires_after_release"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_racy_check_then_set_is_caught_by_the_checker() {
    assert_caught(
        Bug::RacyCheckThenSet,
        &["stress_contended_grants_are_exclusive"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validity_counted_from_the_reply_is_caught() {
    assert_caught(
        Bug::ValidityFromReply,
        &[
            "delayed_grant_is_valid_only_until_the_server_frees_it",
            "grant_slower_than_its_lease_is_no_grant",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_on_arrival_grant_is_caught() {
    assert_caught(
        Bug::ExpiredOnArrival,
        &["grant_slower_than_its_lease_is_no_grant"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignoring_the_wait_bound_on_a_stalled_server_is_caught() {
    assert_caught(
        Bug::IgnoresWaitBound,
        &["calls_on_a_stalled_server_return_within_their_bound"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cleanup_of_a_dropped_acquire_is_caught() {
    assert_caught(
        Bug::NoCleanup,
        &["acquire_dropped_in_flight_frees_the_name_at_once"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_shows_free_locks_is_caught() {
    assert_caught(Bug::ListShowsFreeLocks, &["list_pages_through_held_locks"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_that_frees_at_once_is_caught() {
    assert_caught(
        Bug::ReleaseAfterFreesAtOnce,
        &[
            "release_after_holds_the_name_until_then",
            "release_after_outlives_its_client",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_that_ignores_the_hold_is_caught() {
    assert_caught(
        Bug::ReleaseAfterKeepsTheLeaseTtl,
        &["release_after_holds_the_name_until_then"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_without_owner_check_is_caught() {
    assert_caught(
        Bug::ReleaseAfterWithoutOwnerCheck,
        &["release_after_acts_only_on_its_own_lease"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_that_ends_with_its_client_is_caught() {
    assert_caught(
        Bug::HoldEndsWithClient,
        &["release_after_outlives_its_client"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_that_removes_nothing_is_caught() {
    assert_caught(
        Bug::ForceReleaseOnlyReports,
        &["force_release_frees_the_name_for_the_next_holder"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_the_released_lease_can_still_touch_is_caught() {
    assert_caught(
        Bug::ReleaseAfterKeepsOwner,
        &["release_after_holds_the_name_until_then"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renewal_that_checks_owners_by_name_is_caught() {
    assert_caught(Bug::BatchOwnerByName, &["extend_many_acts_per_lease"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renewal_that_fails_as_a_whole_is_caught() {
    assert_caught(
        Bug::BatchFailsAsAWhole,
        &[
            "extend_many_acts_per_lease",
            "batch_renewal_loses_only_the_taken_over_guard",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_renewal_without_owner_check_is_caught() {
    assert_caught(
        Bug::BatchExtendsWithoutOwnerCheck,
        &["extend_many_acts_per_lease"],
    )
    .await;
}
