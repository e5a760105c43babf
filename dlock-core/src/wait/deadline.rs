use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use crate::options::deadline_after;
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
