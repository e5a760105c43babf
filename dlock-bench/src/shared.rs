//! Reader-writer locks and semaphores under load: many clients on one name,
//! each hold a short piece of work, against the mutex on the same work.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock::{Backend, LockOptions};
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, sleep};

use crate::scenarios::{Latency, histogram, micros};
use crate::target::{GRANT_TIMEOUT, Result};

/// The work done under each hold: long against a round trip, so that what
/// sharing allows shows.
pub const WORK: Duration = Duration::from_millis(2);

/// The permits of the semaphore scenario.
pub const PERMITS: u32 = 4;

/// In the read-mostly scenario, one acquire in this many is a write.
const ONE_WRITE_IN: u64 = 20;

/// Many clients on one name, each hold [`WORK`] long.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SharedLoad {
    pub clients: usize,
    pub grants_per_s: f64,
    /// The most holds seen at once: a semaphore of N must reach N, a write
    /// or a mutex must stay at 1.
    pub most_at_once: usize,
    /// From asking to being granted.
    pub wait: Latency,
}

/// The scenarios of the shared kinds, for a backend that has them.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct SharedReport {
    /// Reader-writer lock, one write in [`ONE_WRITE_IN`].
    pub read_mostly: Option<SharedLoad>,
    /// The same work and clients, every hold a mutex.
    pub read_mostly_as_mutex: Option<SharedLoad>,
    /// A semaphore of [`PERMITS`].
    pub semaphore: Option<SharedLoad>,
}

/// Which kind of hold a client asks for, by its count of acquires so far.
type Pick = fn(u64) -> LockOptions;

fn read_mostly(i: u64) -> LockOptions {
    // Spread the writes over the clients: each client's turn to write comes
    // at a different count.
    if i.is_multiple_of(ONE_WRITE_IN) {
        LockOptions::new().write()
    } else {
        LockOptions::new().read()
    }
}

fn mutex(_: u64) -> LockOptions {
    LockOptions::new()
}

fn permit(_: u64) -> LockOptions {
    LockOptions::new().permits(PERMITS)
}

/// Runs the scenarios a backend's capabilities allow.
pub async fn shared(
    clients: &[Arc<dyn Backend>],
    run: &str,
    duration: Duration,
) -> Result<SharedReport> {
    let Some(caps) = clients.first().map(|c| c.capabilities()) else {
        return Ok(SharedReport::default());
    };
    let mut report = SharedReport::default();
    if caps.rwlock {
        report.read_mostly =
            Some(load(clients, &format!("{run}:rw"), duration, read_mostly).await?);
        report.read_mostly_as_mutex =
            Some(load(clients, &format!("{run}:rw-mutex"), duration, mutex).await?);
    }
    if caps.semaphore {
        report.semaphore = Some(load(clients, &format!("{run}:sem"), duration, permit).await?);
    }
    Ok(report)
}

async fn load(
    clients: &[Arc<dyn Backend>],
    run: &str,
    duration: Duration,
    pick: Pick,
) -> Result<SharedLoad> {
    let name = format!("bench:{run}:{:x}", std::process::id());
    let (holding, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let started = Instant::now();
    let end = started + duration;
    let mut tasks = Vec::new();
    for (me, backend) in clients.iter().enumerate() {
        let (backend, name) = (backend.clone(), name.clone());
        let (holding, most) = (holding.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = histogram()?;
            let mut i = me as u64;
            while Instant::now() < end {
                let opts = pick(i).ttl(Duration::from_secs(10)).wait(GRANT_TIMEOUT);
                let asked = Instant::now();
                let lease = backend.acquire(&name, &opts).await?;
                h.record(micros(asked.elapsed()))?;
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                sleep(WORK).await;
                holding.fetch_sub(1, Ordering::SeqCst);
                backend.release(&lease).await?;
                i += 1;
            }
            Ok::<_, crate::target::BoxError>(h)
        }));
    }
    let mut all = histogram()?;
    for task in tasks {
        all.add(task.await??)?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(SharedLoad {
        clients: clients.len(),
        grants_per_s: all.len() as f64 / elapsed,
        most_at_once: most.load(Ordering::SeqCst),
        wait: Latency::from(&all),
    })
}
