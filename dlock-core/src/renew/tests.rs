use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;

use super::*;
use crate::{Capabilities, Guard, LockInfo, LockOptions, Locker, MemoryBackend, Result};

/// Counts batches, and reports leases named `doomed…` as taken over;
/// answers each batch after `delay`, and up to six times that again, by
/// turns.
#[derive(Debug, Default)]
struct Batches {
    inner: MemoryBackend,
    calls: AtomicUsize,
    largest: AtomicUsize,
    delay: Duration,
}

#[async_trait]
impl Backend for Batches {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        self.inner.try_acquire(name, opts).await
    }
    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        self.inner.acquire(name, opts).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        self.inner.extend(lease).await
    }
    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        self.largest.fetch_max(leases.len(), Ordering::SeqCst);
        let turn = u32::try_from(call % 7).unwrap_or_default();
        tokio::time::sleep(self.delay * (1 + turn)).await;
        // A shard down: the other leases are extended, the batch fails.
        if leases.iter().any(|l| l.name().starts_with("shard-down")) {
            for lease in leases.iter_mut() {
                if !lease.name().starts_with("shard-down") {
                    self.inner.extend(lease).await?;
                }
            }
            return Err(crate::Error::connection("test", "extend", "one shard down"));
        }
        let mut held = self.inner.extend_many(leases).await?;
        for (lease, held) in leases.iter().zip(&mut held) {
            *held &= !lease.name().starts_with("doomed");
        }
        Ok(held)
    }
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_batch_that_fails_in_part_keeps_what_it_extended() {
    let locker = Locker::from_arc(Arc::new(Batches::default()));
    let opts = LockOptions::new().ttl(Duration::from_secs(3));
    let kept = locker.try_acquire("kept", &opts).await.unwrap().unwrap();
    let down = locker
        .try_acquire("shard-down", &opts)
        .await
        .unwrap()
        .unwrap();
    tokio::select! {
        () = kept.lost() => panic!("an extended lease was lost with its batch"),
        () = down.lost() => {}
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(kept.is_valid(), "still renewed, batch after failing batch");
    assert!(!down.is_valid());
}

#[tokio::test(start_paused = true)]
async fn many_leases_cost_a_few_batches_per_period_and_a_failed_one_is_lost_alone() {
    let backend = Arc::new(Batches::default());
    let locker = Locker::from_arc(backend.clone());
    let ttl = Duration::from_secs(3);
    let opts = LockOptions::new().ttl(ttl);
    let mut guards = Vec::new();
    for i in 0..2500 {
        // Grants spread over a whole period, as a busy service's are.
        if i % 100 == 0 {
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        let name = if i == 1234 {
            "doomed".to_owned()
        } else {
            format!("held:{i}")
        };
        guards.push(locker.try_acquire(&name, &opts).await.unwrap().unwrap());
    }
    let doomed = guards.remove(1234);
    let before = backend.calls.load(Ordering::SeqCst);
    let periods = 6;
    tokio::select! {
        () = doomed.lost() => {}
        () = tokio::time::sleep(ttl) => panic!("the taken-over lease was not told lost"),
    }
    tokio::time::sleep(ttl / 3 * periods - ttl).await;
    let calls = backend.calls.load(Ordering::SeqCst) - before;
    assert!(
        guards.iter().all(Guard::is_valid),
        "a renewed lease was lost"
    );
    assert!(backend.largest.load(Ordering::SeqCst) <= MAX_BATCH);
    // Three batches of 1,000 at most, in at most three groups a period.
    let limit = periods as usize * (3 + 3);
    assert!(
        (periods as usize..=limit).contains(&calls),
        "{calls} batches in {periods} periods"
    );
}

/// Answers that come one after another (a server that takes its time with
/// each batch, 16 in flight) do not cut a period's renewals into slivers:
/// each answer wakes the scheduler, which takes leases out only once one
/// is due.
#[tokio::test(start_paused = true)]
async fn slow_answers_do_not_cut_a_period_into_small_batches() {
    let backend = Arc::new(Batches {
        delay: Duration::from_millis(60),
        ..Batches::default()
    });
    let locker = Locker::from_arc(backend.clone());
    let ttl = Duration::from_secs(6);
    let opts = LockOptions::new().ttl(ttl);
    let mut guards = Vec::new();
    for i in 0..40_000 {
        if i % 1000 == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let name = format!("held:{i}");
        guards.push(locker.try_acquire(&name, &opts).await.unwrap().unwrap());
    }
    tokio::time::sleep(ttl).await;
    let before = backend.calls.load(Ordering::SeqCst);
    let periods = 6;
    tokio::time::sleep(ttl / 3 * periods).await;
    let calls = backend.calls.load(Ordering::SeqCst) - before;
    assert!(guards.iter().all(Guard::is_valid), "a lease was lost");
    // Forty full batches a period, and a partial one per group.
    let limit = periods as usize * (40 + 3);
    assert!(calls <= limit, "{calls} batches in {periods} periods");
}

#[tokio::test(start_paused = true)]
async fn the_scheduler_ends_with_its_last_lease() {
    let locker = Locker::new(MemoryBackend::new());
    let guard = locker.acquire("one", &LockOptions::new()).await.unwrap();
    assert!(locker.renewer.shared.lock().running);
    guard.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(!locker.renewer.shared.lock().running);
}

/// Renewal stops once the hold has lasted `max_hold`: the guard is renewed
/// until then, lost at the lease's end after it, and the name is free on
/// the server from then on; without `max_hold` it is still held.
#[tokio::test(start_paused = true)]
async fn max_hold_stops_renewal_and_the_lease_ends_at_its_ttl() {
    let locker = crate::Locker::new(crate::MemoryBackend::new());
    let ttl = Duration::from_secs(3);
    let bounded = LockOptions::new()
        .ttl(ttl)
        .max_hold(Duration::from_secs(10));
    let start = tokio::time::Instant::now();
    let guard = locker.acquire("bounded", &bounded).await.unwrap();
    let unbounded = locker
        .acquire("unbounded", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), guard.lost())
        .await
        .expect("renewed past max_hold");
    let held = start.elapsed();
    // Renewed past the bound (each lease lasts one TTL), never a TTL more.
    assert!(
        held >= Duration::from_secs(10) && held <= Duration::from_secs(13),
        "{held:?}"
    );
    assert!(unbounded.is_valid());
    // The guard gives its lease up a drift allowance before the server.
    tokio::time::sleep(bounded.get_drift() + Duration::from_millis(1)).await;
    let other = crate::Locker::from_arc(locker.backend().clone());
    let next = other
        .try_acquire("bounded", &LockOptions::new())
        .await
        .unwrap();
    assert!(next.is_some(), "the bounded name is still held");
    assert!(
        other
            .try_acquire("unbounded", &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        LockOptions::new().max_hold(Duration::ZERO).validate(),
        Err(Error::InvalidOption {
            option: "max_hold",
            ..
        })
    ));
}

/// With a lock-delay, a lease that ends without a release (its holder
/// stopped renewing) keeps the name from everyone for the delay more, by
/// the server's clock, while its guard is lost at the TTL as before; a
/// released name is free at once.
#[tokio::test(start_paused = true)]
async fn a_lock_delay_keeps_an_unreleased_name_and_not_a_released_one() {
    let backend = Arc::new(MemoryBackend::new());
    let (mine, other) = (Locker::from_arc(backend.clone()), Locker::from_arc(backend));
    let ttl = Duration::from_secs(1);
    let delayed = LockOptions::new()
        .ttl(ttl)
        .lock_delay(Duration::from_secs(2))
        .renew(false);
    let start = tokio::time::Instant::now();
    let guard = mine.acquire("paused", &delayed).await.unwrap();
    assert!(guard.valid_until().unwrap() <= start + ttl);
    guard.lost().await;
    assert!(start.elapsed() <= ttl, "trusted for the TTL asked for");
    tokio::time::sleep_until(start + Duration::from_millis(2900)).await;
    let during = other
        .try_acquire("paused", &LockOptions::new())
        .await
        .unwrap();
    assert!(during.is_none(), "granted within the lock-delay");
    tokio::time::sleep_until(start + Duration::from_millis(3100)).await;
    let after = other
        .try_acquire("paused", &LockOptions::new())
        .await
        .unwrap();
    assert!(after.is_some(), "still held after TTL plus lock-delay");
    let released = mine.acquire("released", &delayed).await.unwrap();
    released.release().await.unwrap();
    let next = other
        .try_acquire("released", &LockOptions::new())
        .await
        .unwrap();
    assert!(next.is_some(), "a released name was delayed");
    drop(guard);
}
