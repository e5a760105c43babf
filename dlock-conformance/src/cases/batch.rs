//! Batch renewal: `extend_many` judges each lease by its own owner token,
//! so one lease that lost its lock neither fails the batch nor is kept
//! alive by the others.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, LockOptions, Locker};
use tokio::time::{Instant, sleep, sleep_until};

use super::{assert_held, foreign_lease, needs_ttl};
use crate::support::{long, must_acquire, must_lock, unique_name};

/// `extend_many` judges each lease by its own owner token: it extends the
/// leases that still hold their names and reports the others not held, a
/// stale lease next to the new holder of its name among them, and it never
/// touches a lock that a lease of the batch no longer holds.
pub async fn extend_many_acts_per_lease(backend: &Arc<dyn Backend>) {
    let case = "extend_many_acts_per_lease";
    if !needs_ttl(backend.as_ref(), case) {
        return;
    }
    // Longer than the suite's short TTL: four round trips fit before the
    // batch with room to spare on a loaded server.
    let ttl = Duration::from_millis(1200);
    let opts = LockOptions::new().ttl(ttl);
    let names: Vec<String> = (0..4).map(|_| unique_name(case)).collect();
    let [kept, taken, never, elsewhere] = names.as_slice() else {
        unreachable!("four names")
    };
    let stale = must_acquire(backend.as_ref(), taken, &opts).await;
    backend.release(&stale).await.expect("release");
    let gone = must_acquire(backend.as_ref(), elsewhere, &opts).await;
    backend.release(&gone).await.expect("release");
    // Its new holder is not in the batch: only an owner check keeps the
    // batch from moving its expiry.
    let outsider = must_acquire(backend.as_ref(), elsewhere, &long()).await;
    let foreign = foreign_lease(never, &opts);
    // The two leases to extend come last, so that the TTL's budget holds
    // their acquires and the batch, not the setup's other round trips (on
    // a loaded server a semaphore's acquire is several of them).
    // Both at once: the batch must reach the server before the earlier
    // grant's TTL ends, so only the gap between the two grants counts
    // against it, not their sum (a semaphore's last permit on a loaded
    // PostgreSQL took over half the TTL).
    let asked = Instant::now();
    let (holder, current) = tokio::join!(
        must_acquire(backend.as_ref(), kept, &opts),
        must_acquire(backend.as_ref(), taken, &opts)
    );
    let granted = Instant::now();
    // Late in the first TTL, so that the leases outlive it only if extended.
    sleep_until(asked + ttl * 5 / 8).await;
    let mut batch = vec![stale, holder, foreign, current, gone];
    let extended = Instant::now();
    let held = backend.extend_many(&mut batch).await.expect("extend_many");
    assert_eq!(
        held,
        [false, true, false, true, false],
        "extend_many must judge each lease by its own owner token: [a stale \
         lease, its holder, a lease never granted, the name's new holder, a \
         stale lease whose name another holds]"
    );
    let left = backend
        .inspect(elsewhere)
        .await
        .expect("inspect")
        .and_then(|info| info.expires_in);
    assert!(
        left.is_none_or(|left| left > Duration::from_secs(30)),
        "extend_many moved the expiry of a lock its lease no longer holds ({left:?} left)"
    );
    // Past the first TTL of both (counted from their grants' replies, later
    // than the server counts it), within the one the batch gave them
    // (counted from before it was sent): halfway between the two.
    sleep_until(granted + ttl + (extended - granted) / 2).await;
    for (lease, name) in [(&batch[1], kept), (&batch[3], taken)] {
        assert!(
            lease.is_valid(),
            "an extended lease's deadline did not move"
        );
        assert_held(
            backend.as_ref(),
            name,
            "extend_many did not extend the lock",
        )
        .await;
    }
    assert!(
        backend.inspect(never).await.expect("inspect").is_none(),
        "extend_many created a lock for a lease never granted"
    );
    for lease in [&batch[1], &batch[3], &outsider] {
        backend.release(lease).await.expect("release");
    }
}

/// Renewing many guards together, the renewal that finds a lock taken
/// over tells that guard `lost()` well before its lease would have run out,
/// and the guards renewed with it keep their locks.
pub async fn batch_renewal_loses_only_the_taken_over_guard(backend: &Arc<dyn Backend>) {
    let case = "batch_renewal_loses_only_the_taken_over_guard";
    if !needs_ttl(backend.as_ref(), case) {
        return;
    }
    let ttl = Duration::from_millis(1200);
    let opts = LockOptions::new().ttl(ttl);
    let locker = Locker::from_arc(backend.clone());
    let mut guards = Vec::new();
    for _ in 0..8 {
        let name = unique_name(case);
        guards.push(must_lock(&locker, &name, &opts).await);
    }
    let victim = guards.remove(3);
    backend.release(victim.lease()).await.expect("release");
    let thief = must_acquire(backend.as_ref(), victim.name(), &long()).await;
    let deadline = victim.valid_until().expect("a TTL lease");
    // The first renewal, at a third of the TTL, finds the lock taken.
    tokio::time::timeout_at(deadline - ttl / 4, victim.lost())
        .await
        .expect("the guard whose lock was taken over is told lost() at its next renewal");
    sleep(ttl * 2).await;
    for guard in &guards {
        assert!(
            guard.is_valid(),
            "a guard renewed with a lost one was lost too"
        );
        assert_held(
            backend.as_ref(),
            guard.name(),
            "a renewed guard's lock expired",
        )
        .await;
    }
    for guard in guards {
        guard.release().await.expect("release");
    }
    backend.release(&thief).await.expect("release");
}
