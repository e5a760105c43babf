//! Following an election's leader: reads woken by the backend's watch
//! where it has one, on a timer elsewhere.

use std::time::Duration;

use futures_util::Stream;
use tokio::time::sleep;

use super::{Election, Leader};
use crate::driver::wait::Backoff;
use crate::{NameWatch, Result};

/// The least time between an observer's reads when a watch wakes it.
const MIN_READ_GAP: Duration = Duration::from_millis(10);

/// Follows the leader of an election (see [`Election::observe`]).
#[derive(Debug)]
#[must_use = "an observer does nothing until `changed()` is awaited"]
pub struct Observer<'a> {
    election: &'a Election,
    /// The last leader returned (`Some(None)`: nobody led).
    seen: Option<Option<Leader>>,
    /// The greatest fencing token seen.
    highest: u64,
    /// After a failed read: the pause before the next, growing while they
    /// fail.
    failing: Option<Backoff>,
    /// The backend's watch on the election's lock, where it has one.
    watch: Option<Box<dyn NameWatch>>,
    /// Whether the backend can watch (until it says it cannot).
    watchable: bool,
}

impl<'a> Observer<'a> {
    pub(super) fn new(election: &'a Election) -> Self {
        Observer {
            election,
            seen: None,
            highest: 0,
            failing: None,
            watch: None,
            watchable: true,
        }
    }

    /// Waits for the next change of leader and returns the new one (`None`
    /// when nobody leads); the first call returns the leader as it is.
    /// Changes come in order: a term replaces another only with a greater
    /// fencing token (the backend must declare
    /// [`fencing`](crate::Capabilities::fencing)). Where the backend
    /// watches ([`Backend::watch`](crate::Backend::watch): etcd,
    /// ZooKeeper), a change wakes the observer, which reads at once, so
    /// that a term is seen when it lasts longer than a read; the poll
    /// interval then only bounds a missed notification (four of them).
    /// Elsewhere (Redis, MySQL, PostgreSQL) the observer reads every poll
    /// interval, and a shorter term may pass unseen between two reads: a
    /// Redis release messages the next waiter's client only, not whoever
    /// reads the name.
    ///
    /// # Errors
    /// The lock service's errors; the next call reads again, after a pause
    /// (from the poll interval, doubling up to 5 s while reads fail), so
    /// that a loop calling again on an error does not spin on a service
    /// that fails at once.
    pub async fn changed(&mut self) -> Result<Option<Leader>> {
        if let Some(backoff) = &mut self.failing {
            sleep(backoff.next_delay()).await;
        }
        loop {
            // Watch first, then read: a change after the read wakes it.
            self.start_watch().await;
            let now = match self.election.leader().await {
                Ok(now) => now,
                Err(e) => {
                    let poll = self.election.poll;
                    self.failing.get_or_insert_with(|| {
                        Backoff::new(poll, Duration::from_secs(5).max(poll))
                    });
                    return Err(e);
                }
            };
            self.failing = None;
            let changed = match (&self.seen, &now) {
                (None, _) | (Some(None), Some(_)) | (Some(Some(_)), None) => true,
                (Some(None), None) => false,
                // A later term has a greater token; an earlier one is a
                // stale read, not a change.
                (Some(Some(_)), Some(now)) => now.fencing_token > self.highest,
            };
            if let Some(now) = &now {
                self.highest = self.highest.max(now.fencing_token);
            }
            if changed {
                self.seen = Some(now.clone());
                return Ok(now);
            }
            self.next_change().await;
        }
    }

    /// The changes of leader as a stream: each item is what
    /// [`changed`](Self::changed) returns, for ever (an error is an item,
    /// and the next read follows after a pause).
    #[must_use = "a stream does nothing unless polled"]
    pub fn into_stream(self) -> impl Stream<Item = Result<Option<Leader>>> + Send + use<'a> {
        futures_util::stream::unfold(self, |mut observer| async move {
            let next = observer.changed().await;
            Some((next, observer))
        })
    }

    async fn start_watch(&mut self) {
        if self.watch.is_some() || !self.watchable {
            return;
        }
        match self
            .election
            .locker
            .backend()
            .watch(&self.election.name)
            .await
        {
            Ok(Some(watch)) => self.watch = Some(watch),
            Ok(None) => self.watchable = false,
            Err(e) => {
                tracing::debug!(election = self.election.name, error = %e, "not watching; reading on a timer")
            }
        }
    }

    /// Until the lock may have changed: its watch fires, or the timer
    /// (the poll interval; four of them while a watch stands in).
    async fn next_change(&mut self) {
        let poll = self.election.poll;
        let Some(watch) = &mut self.watch else {
            return sleep(poll).await;
        };
        tokio::select! {
            fired = watch.changed() => match fired {
                // A burst of changes (a busy queue) makes one read per
                // few milliseconds, not one per change.
                Ok(()) => sleep(MIN_READ_GAP).await,
                Err(e) => {
                    tracing::debug!(election = self.election.name, error = %e, "the watch broke");
                    self.watch = None;
                    // Not at once: a watch that breaks as soon as it
                    // starts would make a busy loop.
                    sleep(poll).await;
                }
            },
            () = sleep(poll.saturating_mul(4)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, LockInfo, LockOptions, Locker, MemoryBackend};

    fn election(locker: &Locker, identity: &str) -> Election {
        Election::new(locker.clone(), "election", identity)
    }

    #[tokio::test(start_paused = true)]
    async fn an_observer_sees_each_term_in_order() {
        let locker = Locker::new(MemoryBackend::new());
        let (a, b) = (election(&locker, "a"), election(&locker, "b"));
        let mut observer = a.observe();
        assert_eq!(observer.changed().await.unwrap(), None);
        let mut seen = Vec::new();
        for who in [&a, &b, &a] {
            let term = who.campaign().await.unwrap();
            let leader = observer.changed().await.unwrap().unwrap();
            assert_eq!(leader.fencing_token, term.fencing_token());
            let unchanged = tokio::time::timeout(Duration::from_secs(5), observer.changed());
            assert!(unchanged.await.is_err(), "a change reported with none");
            seen.push(leader.identity.unwrap());
            term.resign().await.unwrap();
            assert_eq!(observer.changed().await.unwrap(), None);
        }
        assert_eq!(seen, ["a", "b", "a"]);
    }

    /// A lock service that refuses every call at once, as one whose port
    /// is closed does.
    #[derive(Debug)]
    struct Down;

    #[async_trait::async_trait]
    impl crate::Backend for Down {
        fn capabilities(&self) -> crate::Capabilities {
            MemoryBackend::new().capabilities()
        }
        async fn try_acquire(&self, _: &str, _: &LockOptions) -> Result<Option<crate::Lease>> {
            Err(refused())
        }
        async fn acquire(&self, _: &str, _: &LockOptions) -> Result<crate::Lease> {
            Err(refused())
        }
        async fn release(&self, _: &crate::Lease) -> Result<()> {
            Err(refused())
        }
        async fn extend(&self, _: &mut crate::Lease) -> Result<()> {
            Err(refused())
        }
        async fn inspect(&self, _: &str) -> Result<Option<LockInfo>> {
            Err(refused())
        }
    }

    fn refused() -> Error {
        Error::Connection {
            backend: "down",
            message: "connection refused".into(),
            source: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_observer_pauses_between_failed_reads() {
        let poll = Duration::from_millis(250);
        let election = Election::new(Locker::new(Down), "e", "me").poll_interval(poll);
        let mut observer = election.observe();
        let start = tokio::time::Instant::now();
        for _ in 0..4 {
            let read = observer.changed().await;
            assert!(read.as_ref().is_err_and(Error::is_retryable), "{read:?}");
        }
        // Three pauses (the first read is at once): a loop that reads
        // again on an error does not spin.
        assert!(start.elapsed() >= poll * 3 / 2, "{:?}", start.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn an_observer_is_a_stream_of_changes() {
        use futures_util::StreamExt;

        let locker = Locker::new(MemoryBackend::new());
        let (a, b) = (election(&locker, "a"), election(&locker, "b"));
        let mut changes = std::pin::pin!(a.observe().into_stream());
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        let term = b.campaign().await.unwrap();
        let leader = changes.next().await.unwrap().unwrap().unwrap();
        assert_eq!(leader.fencing_token, term.fencing_token());
        term.resign().await.unwrap();
    }
}
