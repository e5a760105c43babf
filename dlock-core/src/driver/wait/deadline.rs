use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use crate::settings::deadline_after;
use crate::{Error, Result};

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

    /// When an acquire under this deadline must have returned: one request
    /// timeout after the deadline. A wait's loop looks one last time when
    /// its deadline comes (its sleeps end there), and that look is a
    /// request like any other: cut off at the deadline itself, it could
    /// never be answered, so a lock freed between the wait's last poll and
    /// its deadline (up to a poll interval, a second by default) would be
    /// reported as a timeout, and the look, sent and then dropped, would
    /// leave a grant for the driver to undo. A zero wait bound gets its one
    /// attempt the same way. `None` for an unbounded wait.
    pub fn cut_off(&self, request_timeout: Duration) -> Option<Instant> {
        let end = self.end?;
        Some(deadline_after(end, request_timeout))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::wait::Backoff;

    /// A wait whose lock frees after its last poll but before its deadline
    /// gets it: the look the loop makes at the deadline is answered, not
    /// cut off. The lock here frees just before the deadline, long after
    /// the last poll (the poll interval is longer than the wait), and each
    /// look takes a round trip.
    #[tokio::test(start_paused = true)]
    async fn the_look_at_the_deadline_is_answered() {
        let wait = Duration::from_secs(1);
        let round_trip = Duration::from_millis(100);
        let deadline = Deadline::after(Some(wait));
        let freed_at = Instant::now() + wait - Duration::from_millis(10);
        let looks = std::sync::atomic::AtomicU32::new(0);
        let waited = deadline.bound(
            "job",
            round_trip * 3,
            crate::driver::wait::wait_for_lock_with_pause(
                "job",
                deadline,
                None,
                Backoff::new(Duration::from_secs(5), Duration::from_secs(5)),
                || async {
                    looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let asked = Instant::now();
                    tokio::time::sleep(round_trip).await;
                    if asked >= freed_at {
                        let opts = crate::LockOptions::new();
                        let owner = crate::OwnerToken::random()?;
                        Ok(crate::driver::wait::Attempt::Acquired(
                            crate::Lease::with_ttl("job", owner, 1, &opts, asked),
                        ))
                    } else {
                        Ok(crate::driver::wait::Attempt::Held { expires_in: None })
                    }
                },
                |_| async { false },
            ),
        );
        let lease = waited.await.expect("the lock was free at the deadline");
        assert_eq!(lease.fencing_token(), 1);
        // The first look, then the one at the deadline.
        assert_eq!(looks.load(std::sync::atomic::Ordering::Relaxed), 2);
        assert!(Instant::now() <= deadline.cut_off(round_trip * 3).expect("bounded"));
    }

    /// The hard bound is the deadline plus one request: never sooner, so a
    /// zero wait still gets its attempt, and never later.
    #[tokio::test(start_paused = true)]
    async fn the_cut_off_is_one_request_after_the_deadline() {
        let request = Duration::from_millis(300);
        for wait in [
            Duration::ZERO,
            Duration::from_millis(100),
            Duration::from_secs(2),
        ] {
            let deadline = Deadline::after(Some(wait));
            let cut = deadline.cut_off(request).expect("bounded");
            assert_eq!(cut - deadline.start, wait + request, "wait {wait:?}");
        }
        assert_eq!(Deadline::after(None).cut_off(request), None);
    }
}
