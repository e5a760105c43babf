//! The simulated driver: a client of the [`Server`], each request and reply
//! crossing a link the fault cases can delay, stall or cut, with at most
//! one [`Bug`].

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::Factory;
use dlock_conformance::faults::{FaultyClient, FaultyFactory};
use dlock_conformance::proxy::{Fault, Link};
use dlock_core::driver::async_trait;
use dlock_core::driver::undo::{UndoOnDrop, retry_for};
use dlock_core::driver::wait::{Attempt, Backoff, Deadline, on_arrival, wait_for_lock};
use dlock_core::{
    Backend, Capabilities, Error, Lease, LeaseKind, LockInfo, LockOptions, LockPage, Mode,
    OwnerToken, Result, validate_name,
};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};

use crate::mutants::Bug;
use crate::mutants::server::Server;

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

    /// One crossing, in one direction: the server's reply when `reply`.
    async fn cross(&self, reply: bool) -> Result<()> {
        let mut fault = self.fault.subscribe();
        loop {
            let now = *fault.borrow_and_update();
            match now {
                Fault::Pass => return Ok(()),
                Fault::Delay(d) => {
                    sleep(d).await;
                    return Ok(());
                }
                Fault::CutOnReply if !reply => return Ok(()),
                Fault::Cut | Fault::CutOnReply => {
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

    /// The TTL an extend gives the server for a lease of `ttl`.
    fn extended_ttl(&self, ttl: Duration) -> Duration {
        if self.has(Bug::ExtendInSeconds) {
            ttl * 1000
        } else {
            ttl
        }
    }

    /// What core does for a [`dlock_core::driver::Driver`]; this driver is
    /// a bare `Backend`, as a mutant must be to get past core.
    fn check_name(&self, name: &str) -> Result<()> {
        if self.has(Bug::NoValidation) {
            return Ok(());
        }
        validate_name(name)
    }

    fn check_request(&self, name: &str, opts: &LockOptions) -> Result<()> {
        self.check_name(name)?;
        if self.has(Bug::NoValidation) {
            return Ok(());
        }
        opts.validate()
    }

    /// One round trip: the request crosses the link, the server runs `op`,
    /// the reply crosses back; bounded by the request timeout.
    async fn call<T>(&self, op: impl FnOnce(&Server) -> T) -> Result<T> {
        let trip = async {
            self.link.cross(false).await?;
            let out = op(&self.server);
            self.link.cross(true).await?;
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

    /// The holder description a grant with `opts` stores.
    fn holder(&self, opts: &LockOptions) -> Option<String> {
        match self.bug {
            Some(Bug::HolderNotStored) => None,
            Some(Bug::HolderOfTheClient) => Some(dlock_core::driver::host_and_pid()),
            _ => Some(opts.get_holder().to_owned()),
        }
    }

    /// An attempt at a shared kind of lock, by the waiter with `ticket`.
    async fn attempt_shared(
        &self,
        name: &str,
        opts: &LockOptions,
        ticket: Option<u64>,
    ) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        let (mode, ttl, bug) = (opts.get_mode(), opts.get_ttl(), self.bug);
        let holder = self.holder(opts);
        // Armed until the reply is in, retrying until the server answers
        // or the TTL has freed the hold anyway: a grant whose reply was
        // lost would otherwise hold the name for its whole TTL, and keep
        // its waiter's place in the queue as a holder's.
        let mut undo = {
            let (sim, name) = (self.clone(), name.to_owned());
            UndoOnDrop::new(async move {
                let name = name.as_str();
                retry_for(ttl, || {
                    sim.call(move |s| s.undo_shared(name, owner, ticket))
                })
                .await;
            })
        };
        if self.has(Bug::NoCleanup) {
            undo.disarm();
        }
        let granted = self
            .call(|s| {
                s.describe(owner, holder);
                s.acquire_shared(name, owner, mode, ttl, ticket, bug)
            })
            .await?;
        undo.disarm();
        match granted {
            Err(held) => Err(Error::ModeConflict {
                name: name.to_owned(),
                held,
                asked: mode,
            }),
            Ok(Err(expires_in)) => Ok(Attempt::Held { expires_in }),
            Ok(Ok(token)) => Ok(on_arrival(
                self,
                Lease::with_ttl(name, owner, token, opts, sent),
            )),
        }
    }

    /// Acquire's wait for a shared kind of lock, in the server's queue.
    async fn wait_shared(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Lease> {
        if let Attempt::Acquired(lease) = self.attempt_shared(name, opts, None).await? {
            return Ok(lease);
        }
        let place = Place {
            server: self.server.clone(),
            name: name.to_owned(),
            ticket: fastrand::u64(..),
        };
        self.server
            .enqueue(name, place.ticket, opts.get_mode(), self.bug);
        let backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(200));
        wait_for_lock(name, deadline, Some(&self.server.wakeups), backoff, || {
            self.attempt_shared(name, opts, Some(place.ticket))
        })
        .await
    }

    async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt> {
        if opts.get_mode() != Mode::Exclusive {
            return self.attempt_shared(name, opts, None).await;
        }
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        let ttl = opts.get_ttl();
        let ttl = if self.has(Bug::TruncatedTtl) {
            Duration::from_millis(u64::try_from(ttl.as_millis()).unwrap())
        } else if self.has(Bug::ServerTtlFromValidity) {
            opts.valid_until(sent) - sent
        } else {
            ttl
        };
        let mut cleanup = Cleanup {
            sim: (!self.has(Bug::NoCleanup)).then(|| self.clone()),
            name: name.to_owned(),
            owner,
        };
        let holder = self.holder(opts);
        let granted = if self.has(Bug::RacyCheckThenSet) {
            self.call(|s| s.describe(owner, holder)).await?;
            match self.call(|s| s.check(name)).await? {
                Some(left) => Err(left),
                None => {
                    // Two requests are two round trips: over any network
                    // the client waits between them, and others run. The
                    // link here may pass at once, and without this the race
                    // showed only when two worker threads ran the clients
                    // at the same instant: never, on a busy machine.
                    tokio::task::yield_now().await;
                    Ok(self.call(|s| s.set(name, owner, ttl)).await?)
                }
            }
        } else {
            // The kind check and the grant in one request, as a driver's
            // script would do them.
            let granted = self
                .call(|s| match s.shared_conflict(name) {
                    Some(held) => Err(held),
                    None => {
                        s.describe(owner, holder);
                        Ok(s.acquire(name, owner, ttl))
                    }
                })
                .await?;
            match granted {
                Ok(granted) => granted,
                Err(held) => {
                    cleanup.sim = None;
                    return Err(Error::ModeConflict {
                        name: name.to_owned(),
                        held,
                        asked: Mode::Exclusive,
                    });
                }
            }
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

/// A waiter's place in the server's queue, given up when dropped.
struct Place {
    server: Arc<Server>,
    name: String,
    ticket: u64,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.server.dequeue(&self.name, self.ticket);
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
        // The shared kinds queue their waiters (the mutex cases judge no
        // order).
        caps.fifo = true;
        caps.rwlock = true;
        caps.semaphore = true;
        caps
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        self.check_request(name, opts)?;
        let opts = &*opts.for_server();
        Ok(self.attempt(name, opts).await?.into_lease())
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        self.check_request(name, opts)?;
        let opts = &*opts.for_server();
        let deadline = Deadline::after(opts.get_wait());
        if opts.get_mode() != Mode::Exclusive {
            let wait = self.wait_shared(name, opts, deadline);
            return deadline.bound(name, REQUEST_TIMEOUT, wait).await;
        }
        let (wakeups, backoff) = if self.has(Bug::NoWakeup) {
            // No poll of its own either: `wait_for_lock` cuts each sleep
            // at the holder's expiry and at the wait bound, so a release
            // mid-lease goes unseen until one of those, however the
            // scheduler runs. A jittered slow poll would land soon after a
            // release in some runs and let the bug pass.
            (None, Backoff::new(Duration::MAX, Duration::MAX))
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
        if self.has(Bug::ReleaseDoesNothing) {
            return Ok(());
        }
        let owner = (!self.has(Bug::ReleaseWithoutOwnerCheck)).then_some(lease.owner());
        let name = lease.name();
        let released = if lease.mode() == Mode::Exclusive {
            self.call(|s| s.release(name, owner)).await?
        } else {
            self.call(|s| s.release_shared(name, owner)).await?
        };
        if released || owner.is_none() {
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
        let exclusive = self.has(Bug::ReadHoldIsExclusive);
        let held = self.call(|s| s.hold(&name, owner, new_owner, hold, exclusive));
        if !held.await? && owner.is_some() {
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
            let ttl = self.extended_ttl(lease.ttl().unwrap_or_default());
            let (mode, bug) = (lease.mode(), self.bug);
            let extended = if mode == Mode::Exclusive {
                self.call(|s| s.extend(name, owner, ttl)).await?
            } else {
                self.call(|s| s.extend_shared(name, owner, ttl, bug))
                    .await?
            };
            if !extended {
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
            .map(|l| {
                let ttl = self.extended_ttl(l.ttl().unwrap_or_default());
                (l.name().to_owned(), l.owner(), ttl)
            })
            .collect();
        let by_name = self.has(Bug::BatchOwnerByName);
        let mut held = if self.has(Bug::ExtendDoesNothing) {
            vec![true; batch.len()]
        } else {
            let unchecked = self.has(Bug::BatchExtendsWithoutOwnerCheck);
            self.call(|s| s.extend_many(&batch, by_name, unchecked))
                .await?
        };
        // The shared kinds' holds are renewed on their own, unless the
        // bug renews the whole batch as mutexes.
        if !self.has(Bug::BatchIgnoresKinds) {
            for (i, lease) in leases.iter().enumerate() {
                if lease.mode() != Mode::Exclusive {
                    let (name, owner, ttl) = (lease.name(), lease.owner(), batch[i].2);
                    let bug = self.bug;
                    held[i] = self
                        .call(|s| s.extend_shared(name, owner, ttl, bug))
                        .await?;
                }
            }
        }
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

    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        let opts = opts.for_server().into_owned().read();
        let not_held = || Error::NotHeld {
            name: write.name().to_owned(),
        };
        if self.has(Bug::DowngradeReleasesFirst) {
            self.release(write).await?;
            return self
                .try_acquire(write.name(), &opts)
                .await?
                .ok_or_else(not_held);
        }
        let (reader, sent, bug) = (OwnerToken::random()?, Instant::now(), self.bug);
        let (name, owner, ttl) = (write.name(), write.owner(), opts.get_ttl());
        let token = self
            .call(|s| s.downgrade(name, owner, reader, ttl, bug))
            .await?
            .ok_or_else(not_held)?;
        Ok(Lease::with_ttl(name, reader, token, &opts, sent))
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.check_name(name)?;
        self.call(|s| s.inspect(name)).await
    }

    async fn holders(&self, name: &str) -> Result<Vec<LockInfo>> {
        if self.has(Bug::HoldersShowOne) {
            return Ok(self.inspect(name).await?.into_iter().collect());
        }
        self.check_name(name)?;
        self.call(|s| s.holders(name)).await
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        if self.has(Bug::ForceReleaseOnlyReports) {
            return self.inspect(name).await;
        }
        let owner = self.inspect(name).await?;
        match &owner {
            Some(info) if self.has(Bug::ForceReleaseEndsOneHold) => {
                self.call(|s| s.release_shared(name, Some(info.owner)))
                    .await?;
                self.call(|s| s.release(name, Some(info.owner))).await?;
            }
            Some(_) => self.call(|s| s.clear(name)).await?,
            None => {}
        }
        Ok(owner)
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        let all = self.has(Bug::ListShowsFreeLocks);
        let mut listed = self.call(|s| s.list(prefix, cursor, all)).await;
        if self.has(Bug::BoundPerRequest) {
            for _ in 0..2 {
                if listed.is_ok() {
                    break;
                }
                listed = self.call(|s| s.list(prefix, cursor, all)).await;
            }
        }
        let mut locks = listed?;
        let limit = limit.max(1);
        let next = (locks.len() > limit).then(|| locks[limit - 1].name.clone());
        locks.truncate(limit);
        Ok(LockPage::new(locks, next))
    }
}

/// The two factories of a run against one server: faulty clients (each
/// with a link of its own) for the link cases, healthy ones for the rest;
/// every client has `bug`.
pub(crate) fn factories(bug: Option<Bug>) -> (FaultyFactory, Factory) {
    let server = Arc::new(Server::new(bug == Some(Bug::TryIgnoresExpiry)));
    let client = move || Sim {
        server: server.clone(),
        link: SimLink::new(),
        bug,
        alive: Arc::new(()),
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
    (faulty, factory)
}
