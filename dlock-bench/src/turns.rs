//! Clients taking one name in turn, each as soon as it can: the contended
//! scenario's loop, for dlock's backends and for a bare lock the server
//! queues.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock::{Backend, LockOptions};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::scenarios::{Latency, histogram, micros};
use crate::target::{GRANT_TIMEOUT, Result};

/// A lock that clients take in turn on one name, each its own way of
/// waiting: dlock's, or a bare lock the server queues.
#[async_trait::async_trait]
pub trait Turns: Send + Sync + 'static {
    type Held: Send;
    /// Waits for the lock.
    async fn take(&self, name: &str) -> Result<Self::Held>;
    /// Gives it up.
    async fn give(&self, held: Self::Held) -> Result<()>;
}

/// A dlock backend's turns.
pub(crate) struct DlockTurns(pub(crate) Arc<dyn Backend>);

#[async_trait::async_trait]
impl Turns for DlockTurns {
    type Held = dlock::Lease;

    async fn take(&self, name: &str) -> Result<dlock::Lease> {
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(10))
            .wait(GRANT_TIMEOUT);
        Ok(self.0.acquire(name, &opts).await?)
    }

    async fn give(&self, lease: dlock::Lease) -> Result<()> {
        Ok(self.0.release(&lease).await?)
    }
}

/// What clients taking turns on one name saw.
pub(crate) struct Turned {
    pub handoff: Histogram<u64>,
    pub per_client: Vec<u64>,
    pub regrants: u64,
    pub elapsed: f64,
}

/// Clients take `name` in turn for `duration`, each as soon as it can.
pub(crate) async fn take_turns<T: Turns>(
    clients: Vec<T>,
    name: &str,
    duration: Duration,
) -> Result<Turned> {
    // When, and by which client, the lock was last released.
    let released: Arc<Mutex<Option<(Instant, usize)>>> = Arc::default();
    let started = Instant::now();
    let end = started + duration;
    let mut tasks = Vec::new();
    for (me, client) in clients.into_iter().enumerate() {
        let (name, released) = (name.to_owned(), released.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = histogram()?;
            let (mut grants, mut regrants) = (0u64, 0u64);
            while Instant::now() < end {
                let held = client.take(&name).await?;
                let previous = released
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take();
                match previous {
                    Some((_, by)) if by == me => regrants += 1,
                    Some((at, _)) => h.record(micros(at.elapsed()))?,
                    None => {}
                }
                grants += 1;
                *released.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((Instant::now(), me));
                client.give(held).await?;
            }
            Ok::<_, crate::target::BoxError>((h, grants, regrants))
        }));
    }
    let mut turned = Turned {
        handoff: histogram()?,
        per_client: Vec::new(),
        regrants: 0,
        elapsed: 0.0,
    };
    for task in tasks {
        let (h, grants, again) = task.await??;
        turned.handoff.add(h)?;
        turned.per_client.push(grants);
        turned.regrants += again;
    }
    turned.elapsed = started.elapsed().as_secs_f64();
    Ok(turned)
}

/// The contended scenario of the lock users of the server would write
/// without dlock, where it has one whose waiters the server queues.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClassicContention {
    pub grants_per_s: f64,
    /// From the holder's release to the next grant to another client.
    pub handoff: Latency,
}
