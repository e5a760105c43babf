//! Undoing what may have happened: an acquire of unknown outcome, a
//! release that could not be sent at once.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::driver::wait::Backoff;
use crate::{Backend, Error, Lease, Result};
use std::sync::Arc;

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
        let until = Instant::now() + within;
        let released = retry_for(within, || async {
            match backend.release_detached(&lease, until).await {
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
