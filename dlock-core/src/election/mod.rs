//! Leader election on any backend: one lock per election, held by the
//! leader, whose holder description is the leader's identity.

use std::future::Future;
use std::time::Duration;

use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use crate::driver::wait::Backoff;
use crate::{Error, Finished, Guard, LockInfo, LockOptions, Locker, Mode, Result};

mod observer;

pub use observer::Observer;

/// One leader at a time among the processes that campaign for `name`, on
/// any backend: the leader holds the election's lock (a mutex, renewed by
/// its guard), and its identity is the lock's holder description, so that
/// anyone can read who leads without campaigning.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use dlock_core::{Election, Locker, MemoryBackend};
/// let locker = Locker::new(MemoryBackend::new());
/// let election = Election::new(locker, "billing-controller", "node-a:8080");
/// let leadership = election.campaign().await?;
/// let leader = election.leader().await?.expect("someone leads");
/// assert_eq!(leader.identity.as_deref(), Some("node-a:8080"));
/// assert_eq!(leader.fencing_token, leadership.fencing_token());
/// leadership.resign().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    locker: Locker,
    name: String,
    opts: LockOptions,
    poll: Duration,
}

/// Who leads an election, as [`Election::leader`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's identity; `None` when the lock's holder stored none
    /// (a holder that is not a campaign of this election).
    pub identity: Option<String>,
    /// The fencing token of the leader's term: greater for every later
    /// term, so it tells terms apart and fences the leader's writes.
    pub fencing_token: u64,
    /// How long the term lasts without a renewal; `None` on session
    /// backends (ZooKeeper).
    pub expires_in: Option<Duration>,
}

impl From<LockInfo> for Leader {
    fn from(info: LockInfo) -> Self {
        Leader {
            identity: info.holder,
            fencing_token: info.fencing_token,
            expires_in: info.expires_in,
        }
    }
}

/// A term as leader: the election's lock, renewed in the background until
/// it is resigned, dropped, or lost.
#[derive(Debug)]
#[must_use = "leadership ends when dropped: bind it for the whole term"]
pub struct Leadership {
    guard: Guard,
}

impl Leadership {
    /// The term's fencing token: pass it with every write the leader
    /// makes, so that a resource can refuse a deposed leader's.
    pub fn fencing_token(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// Whether we still lead: the lease is valid and was not lost.
    pub fn is_valid(&self) -> bool {
        self.guard.is_valid()
    }

    /// Resolves when the term is lost (its lease ended or its session
    /// went): stop acting as the leader at once.
    pub async fn lost(&self) {
        self.guard.lost().await;
    }

    /// The lock that makes us the leader.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Ends the term now: the next campaigner is granted at once, without
    /// waiting for a TTL.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the term had been lost already; the lock
    /// service's errors (the term then ends with its lease).
    pub async fn resign(self) -> Result<()> {
        self.guard.release().await
    }
}

impl Election {
    /// The election `name` on `locker`, where we campaign as `identity`
    /// (a host name and port, a pod name: what operators and followers
    /// should read; validated as [`LockOptions::holder`]). Terms last 15 s
    /// without a renewal; see [`Election::options`].
    pub fn new(locker: Locker, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Election {
            locker,
            name: name.into(),
            opts: LockOptions::new()
                .ttl(Duration::from_secs(15))
                .holder(identity),
            poll: Duration::from_millis(250),
        }
    }

    /// Campaigns with these options (the TTL of a term, how long
    /// [`campaign`](Election::campaign) waits); the identity and the mutex
    /// mode stay the election's.
    pub fn options(mut self, opts: LockOptions) -> Self {
        let identity = self.identity().to_owned();
        self.opts = opts.mode(Mode::Exclusive).holder(identity);
        self
    }

    /// How often [`Observer::changed`] reads who leads on a backend that
    /// cannot tell of changes (default 250 ms); where it can (etcd,
    /// ZooKeeper), a change wakes the observer and this only bounds a
    /// missed notification, four times over.
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// The election's name (its lock's).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The identity we campaign as.
    pub fn identity(&self) -> &str {
        self.opts.get_holder()
    }

    /// Waits until we lead (up to the options' wait bound; none by
    /// default).
    ///
    /// # Errors
    /// [`Error::Timeout`] when the wait bound passes; invalid options,
    /// name or identity; the lock service's errors.
    pub async fn campaign(&self) -> Result<Leadership> {
        let guard = self.locker.acquire(&self.name, &self.opts).await?;
        Ok(Leadership { guard })
    }

    /// Leads if nobody does now; `None` otherwise.
    ///
    /// # Errors
    /// As [`Election::campaign`].
    #[must_use = "a guard releases its lock when dropped"]
    pub async fn try_campaign(&self) -> Result<Option<Leadership>> {
        let guard = self.locker.try_acquire(&self.name, &self.opts).await?;
        Ok(guard.map(|guard| Leadership { guard }))
    }

    /// Who leads now, without campaigning; `None` when nobody does.
    ///
    /// # Errors
    /// The lock service's errors.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.locker.inspect(&self.name).await?.map(Leader::from))
    }

    /// Follows who leads: each [`Observer::changed`] returns the next
    /// change of leader.
    pub fn observe(&self) -> Observer<'_> {
        Observer::new(self)
    }

    /// Runs `work` whenever we lead, until it returns: campaigns, then runs
    /// `work` for the term, cancelled (dropped) the moment the term is lost
    /// (the rule of every body under a lock: see [`Finished`]); after a
    /// lost term, [`OnLost`] says whether to campaign again. When `work`
    /// returns, we resign, and its value comes back beside the
    /// resignation's outcome. A campaign that fails on a lock service out
    /// of reach is tried again after a pause, and so is one after a lost
    /// term (a term lost at once, again and again, does not make a busy
    /// loop).
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the term was lost with [`OnLost::Fail`];
    /// [`Error::Timeout`] when the options' wait bound passed; the
    /// campaign's errors that trying again cannot mend.
    ///
    /// `work` gets a [`Term`] it owns, so that `lead` can run in a spawned
    /// task: `election.lead(OnLost::Rejoin, |term| async move { … })`.
    pub async fn lead<F, Fut>(&self, on_lost: OnLost, mut work: F) -> Result<Finished<Fut::Output>>
    where
        F: FnMut(Term) -> Fut,
        Fut: Future,
    {
        // The pause before campaigning again.
        let pause = || Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut backoff = pause();
        loop {
            let term = match self.campaign().await {
                Ok(term) => term,
                Err(e) if e.is_retryable() && !matches!(e, Error::Timeout { .. }) => {
                    tracing::debug!(election = self.name, error = %e, "campaigning again");
                    sleep(backoff.next_delay()).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let began = tokio::time::Instant::now();
            let view = Term {
                fencing_token: term.fencing_token(),
                lost: term.guard.lost_token(),
            };
            match term.guard.while_held(work(view)).await {
                Ok(value) => return Ok(term.guard.finish(value).await),
                Err(e) if on_lost == OnLost::Fail => return Err(e),
                Err(_) => {
                    tracing::warn!(election = self.name, "leadership lost: campaigning again");
                    // The pause grows while terms are lost as soon as
                    // they begin, and starts over after one that lasted.
                    if began.elapsed() >= self.opts.get_ttl() {
                        backoff = pause();
                    }
                    sleep(backoff.next_delay()).await;
                }
            }
        }
    }
}

/// A term as [`Election::lead`]'s work sees it: owned, so that the work's
/// future may be sent to another thread.
#[derive(Debug, Clone)]
pub struct Term {
    fencing_token: u64,
    lost: CancellationToken,
}

impl Term {
    /// The term's fencing token: pass it with every write the leader
    /// makes.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// Resolves when the term ends: lost (the work is cancelled then
    /// anyway; this is for a task the work spawned), or resigned after the
    /// work returned.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Whether the term has ended (see [`Term::lost`]).
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }
}

/// What [`Election::lead`] does when a term is lost before its work
/// returns (the work has been cancelled by then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnLost {
    /// Campaign again, and run the work anew in the next term.
    Rejoin,
    /// Return [`Error::NotHeld`].
    Fail,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::MemoryBackend;

    fn election(locker: &Locker, identity: &str) -> Election {
        Election::new(locker.clone(), "election", identity)
    }

    #[tokio::test(start_paused = true)]
    async fn a_resigned_leaders_successor_leads_at_once() {
        let locker = Locker::new(MemoryBackend::new());
        // Two nodes: a task asking for what its own locker holds is refused.
        let other = Locker::from_arc(locker.backend().clone());
        let (a, b) = (election(&locker, "a"), election(&other, "b"));
        let term = a.campaign().await.unwrap();
        assert!(b.try_campaign().await.unwrap().is_none());
        let waiting = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let term = b.campaign().await.unwrap();
            (started.elapsed(), term, b)
        });
        tokio::task::yield_now().await;
        let first = term.fencing_token();
        term.resign().await.unwrap();
        let (waited, term, b) = waiting.await.unwrap();
        assert!(waited < Duration::from_secs(1), "waited {waited:?}");
        assert!(term.fencing_token() > first);
        let leader = b.leader().await.unwrap().unwrap();
        assert_eq!(leader.identity.as_deref(), Some("b"));
        assert_eq!(leader.fencing_token, term.fencing_token());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_term_cancels_the_work_and_campaigns_again() {
        let locker = Locker::new(MemoryBackend::new());
        // Unrenewed terms of 1 s: each is lost at its TTL.
        let opts = LockOptions::new().ttl(Duration::from_secs(1)).renew(false);
        let a = election(&locker, "a").options(opts);
        let (started, finished) = (AtomicU32::new(0), AtomicU32::new(0));
        let (started, finished) = (&started, &finished);
        let value = a
            .lead(OnLost::Rejoin, |term| async move {
                if started.fetch_add(1, Ordering::SeqCst) < 2 {
                    // Outlives the term: cancelled when it is lost.
                    sleep(Duration::from_secs(60)).await;
                    finished.fetch_add(1, Ordering::SeqCst);
                }
                term.fencing_token()
            })
            .await
            .unwrap()
            .into_result()
            .unwrap();
        assert_eq!(started.load(Ordering::SeqCst), 3);
        assert_eq!(
            finished.load(Ordering::SeqCst),
            0,
            "lost terms' work ran on"
        );
        assert_eq!(value, 3, "the third term's token");
        assert!(
            a.leader().await.unwrap().is_none(),
            "the last term resigned"
        );
        let lost = a.lead(OnLost::Fail, |_| sleep(Duration::from_secs(60)));
        assert!(matches!(lost.await, Err(Error::NotHeld { .. })));
    }
}
