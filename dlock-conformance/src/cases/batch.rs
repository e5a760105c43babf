//! Batch renewal: `extend_many` judges each lease by its own owner token,
//! so one lease that lost its lock neither fails the batch nor is kept
//! alive by the others.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, Lease, LockOptions, Locker};
use tokio::time::{Instant, sleep, sleep_until};

use super::{Judged, assert_held_by, foreign_lease, judged_with_doubling_ttl, needs_ttl};
use crate::support::{long, must_acquire, must_lock, unique_name};

/// `extend_many` judges each lease by its own owner token: it extends the
/// leases that still hold their names and reports the others not held, a
/// stale lease next to the new holder of its name among them, and it never
/// touches a lock that a lease of the batch no longer holds.
///
/// Decided on order: the leases to extend must be held when the batch
/// reaches the server, which is certain only if its reply came back
/// before their deadlines; a round whose setup or batch was slower than
/// that (a loaded server) cannot judge, and runs again with twice the TTL.
pub async fn extend_many_acts_per_lease(backend: &Arc<dyn Backend>) {
    let case = "extend_many_acts_per_lease";
    if !needs_ttl(backend.as_ref(), case) {
        return;
    }
    judged_with_doubling_ttl(case, Duration::from_millis(1200), |ttl| {
        extend_many_round(backend.as_ref(), case, ttl)
    })
    .await;
}

/// One round of [`extend_many_acts_per_lease`] with leases of `ttl`.
async fn extend_many_round(backend: &dyn Backend, case: &str, ttl: Duration) -> Judged {
    let opts = LockOptions::new().ttl(ttl);
    let names: Vec<String> = (0..4).map(|_| unique_name(case)).collect();
    let [kept, taken, never, elsewhere] = names.as_slice() else {
        unreachable!("four names")
    };
    let stale = must_acquire(backend, taken, &opts).await;
    backend.release(&stale).await.expect("release");
    let gone = must_acquire(backend, elsewhere, &opts).await;
    backend.release(&gone).await.expect("release");
    // Its new holder is not in the batch: only an owner check keeps the
    // batch from moving its expiry.
    let outsider = must_acquire(backend, elsewhere, &long()).await;
    let foreign = foreign_lease(never, &opts);
    // The two leases to extend come last and at once, so that their TTL
    // has to hold only their grants and the batch.
    let asked = Instant::now();
    let (holder, current) = tokio::join!(
        must_acquire(backend, kept, &opts),
        must_acquire(backend, taken, &opts)
    );
    let granted = Instant::now();
    let deadline = |lease: &Lease| lease.valid_until().expect("TTL leases have a deadline");
    let first_deadline = deadline(&holder).min(deadline(&current));
    // Late in the first TTL, so that the leases outlive it only if
    // extended, and a quarter TTL after the grants, so that the new
    // deadlines end well past the old.
    sleep_until((asked + ttl * 5 / 8).max(granted + ttl / 4)).await;
    let mut batch = vec![stale, holder, foreign, current, gone];
    let extended = Instant::now();
    let held = backend.extend_many(&mut batch).await.expect("extend_many");
    let answered = Instant::now();
    let left = backend
        .inspect(elsewhere)
        .await
        .expect("inspect")
        .and_then(|info| info.expires_in);
    assert!(
        left.is_none_or(|left| left > Duration::from_secs(30)),
        "extend_many moved the expiry of a lock its lease no longer holds ({left:?} left)"
    );
    assert!(
        backend.inspect(never).await.expect("inspect").is_none(),
        "extend_many created a lock for a lease never granted"
    );
    let judged = async {
        assert_eq!(
            [held[0], held[2], held[4]],
            [false; 3],
            "extend_many must judge each lease by its own owner token: [a stale lease, \
             a lease never granted, a stale lease whose name another holds] are not held"
        );
        if answered >= first_deadline {
            return Judged::No(format!(
                "its reply came {:?} after the grants, past their deadlines",
                answered - granted
            ));
        }
        assert_eq!(
            held,
            [false, true, false, true, false],
            "extend_many must judge each lease by its own owner token: [a stale \
             lease, its holder, a lease never granted, the name's new holder, a \
             stale lease whose name another holds]"
        );
        for lease in [&batch[1], &batch[3]] {
            assert!(
                deadline(lease) >= extended + ttl - opts.get_drift(),
                "an extended lease's deadline did not move to a TTL after the batch"
            );
        }
        // The server counted the first TTL from before the grants' replies:
        // a look sent after it finds the names held only if extended.
        sleep_until(granted + ttl).await;
        for (lease, name) in [(&batch[1], kept), (&batch[3], taken)] {
            let look = backend
                .try_acquire(name, &long())
                .await
                .unwrap_or_else(|e| panic!("try_acquire({name:?}) failed: {e}"));
            let replied = Instant::now();
            if let Some(other) = look {
                backend.release(&other).await.expect("release");
                assert!(
                    replied >= deadline(lease),
                    "extend_many did not extend the lock: {name:?} was granted to another \
                     {:?} before the extended lease's deadline",
                    deadline(lease) - replied
                );
                return Judged::No(format!(
                    "the look at {name:?} came back after the extended lease's deadline"
                ));
            }
        }
        Judged::Yes
    }
    .await;
    for lease in [&batch[1], &batch[3], &outsider] {
        // A round that could not judge may hold nothing any more.
        let _ = backend.release(lease).await;
    }
    judged
}

/// Renewing many guards together, the renewal that finds a lock taken
/// over tells that guard `lost()` well before its lease would have run out,
/// and the guards renewed with it keep their locks. A round whose renewals
/// came too late for its TTL (a loaded server) runs again with twice it.
pub async fn batch_renewal_loses_only_the_taken_over_guard(backend: &Arc<dyn Backend>) {
    let case = "batch_renewal_loses_only_the_taken_over_guard";
    if !needs_ttl(backend.as_ref(), case) {
        return;
    }
    judged_with_doubling_ttl(case, Duration::from_millis(1200), |ttl| {
        batch_renewal_round(backend, case, ttl)
    })
    .await;
}

/// One round of [`batch_renewal_loses_only_the_taken_over_guard`] with
/// leases of `ttl`.
async fn batch_renewal_round(backend: &Arc<dyn Backend>, case: &str, ttl: Duration) -> Judged {
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
    // Its next renewal, a third of the TTL after the last, finds the lock
    // taken; without it, lost() would fire only at the deadline.
    let told = tokio::time::timeout_at(deadline - ttl / 4, victim.lost()).await;
    sleep(ttl * 2).await;
    let mut judged = match told {
        Ok(()) => Judged::Yes,
        Err(_) => Judged::No(
            "the guard whose lock was taken over was not told lost() by a quarter TTL \
             before its deadline"
                .to_owned(),
        ),
    };
    for guard in &guards {
        if !guard.is_valid() {
            // The mutant that fails a batch as a whole loses them all, in
            // every round; a correct driver only when a renewal came late.
            judged = Judged::No(format!(
                "{:?}, renewed with the lost guard, was lost too",
                guard.name()
            ));
            continue;
        }
        if let Err(late) =
            assert_held_by(backend.as_ref(), guard, "a renewed guard's lock expired").await
        {
            judged = late;
        }
    }
    for guard in guards {
        // A guard lost in a round that could not judge holds nothing.
        let _ = guard.release().await;
    }
    backend.release(&thief).await.expect("release");
    judged
}
