//! Semaphores: exactly N holders, a dead holder's permit frees at its TTL
//! and cannot be renewed back, release frees only one's own permit,
//! waiters are served in order.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, LockOptions};
use tokio::time::sleep;

use super::{
    Judged, SHORT_TTL, acquire_after_expiry, assert_not_held, foreign_lease, fresh_lease,
    judged_with_doubling_ttl, needs, needs_ttl, server_ttl,
};
use crate::support::{long, must_acquire, unique_name};

fn needs_semaphore(backend: &dyn Backend, case: &str) -> bool {
    let semaphore = backend.capabilities().semaphore;
    needs(case, semaphore, "the backend has no semaphores")
}

/// Takes `count` permits, each of which must be granted.
async fn take(
    backend: &dyn Backend,
    name: &str,
    opts: &LockOptions,
    count: u32,
) -> Vec<dlock_core::Lease> {
    let mut leases = Vec::new();
    for i in 0..count {
        match backend.try_acquire(name, opts).await {
            Ok(Some(lease)) => leases.push(lease),
            other => panic!(
                "permit {} of a {} was not granted: {other:?}",
                i + 1,
                opts.get_mode()
            ),
        }
    }
    leases
}

async fn assert_full(backend: &dyn Backend, name: &str, opts: &LockOptions, why: &str) {
    match backend.try_acquire(name, opts).await {
        Ok(None) => {}
        Ok(Some(lease)) => {
            backend.release(&lease).await.ok();
            panic!("a permit beyond a {} was granted: {why}", opts.get_mode());
        }
        Err(e) => panic!("try_acquire({name:?}): {e}"),
    }
}

async fn release_all(backend: &dyn Backend, leases: Vec<dlock_core::Lease>) {
    for lease in leases {
        backend.release(&lease).await.expect("release a permit");
    }
}

/// A semaphore of 3 admits 3 holders, not 2 and not 4; a released permit
/// is granted again.
pub async fn a_semaphore_admits_exactly_its_permits(backend: &Arc<dyn Backend>) {
    let case = "a_semaphore_admits_exactly_its_permits";
    if !needs_semaphore(backend.as_ref(), case) {
        return;
    }
    let name = unique_name(case);
    let b = backend.as_ref();
    let opts = long().permits(3);
    let mut leases = take(b, &name, &opts, 3).await;
    assert_full(b, &name, &opts, "3 were already held").await;
    b.release(&leases.remove(0))
        .await
        .expect("release a permit");
    leases.extend(take(b, &name, &opts, 1).await);
    assert_full(b, &name, &opts, "3 were held again").await;
    release_all(b, leases).await;
}

/// A permit whose holder stopped renewing frees its place at its TTL, and
/// renewing it afterwards fails and does not bring it back (else a
/// semaphore would fill up with the dead, or over-admit when they return).
pub async fn an_expired_permit_frees_its_place_for_good(backend: &Arc<dyn Backend>) {
    let case = "an_expired_permit_frees_its_place_for_good";
    if !needs_semaphore(backend.as_ref(), case) || !needs_ttl(backend.as_ref(), case) {
        return;
    }
    judged_with_doubling_ttl(case, SHORT_TTL, |ttl| async move {
        let name = unique_name(case);
        let b = backend.as_ref();
        let short = LockOptions::new().ttl(ttl).permits(2);
        let mut dead = Vec::new();
        for _ in 0..2 {
            match fresh_lease(b, &name, &short).await {
                Ok(lease) => dead.push(lease),
                Err(late) => return late,
            }
        }
        sleep(server_ttl(b, ttl) * 2).await;
        let opts = long().permits(2);
        let mut living = Vec::new();
        for i in 0..2 {
            match acquire_after_expiry(b, &name, &opts, ttl).await {
                Ok(Some(lease)) => living.push(lease),
                other => panic!(
                    "permit {} of a {} was not granted after the expired ones' TTL: {other:?}",
                    i + 1,
                    opts.get_mode()
                ),
            }
        }
        for lease in &mut dead {
            assert_not_held(b.extend(lease).await, "extend of an expired permit");
        }
        assert_full(
            b,
            &name,
            &opts,
            "2 are held, the expired ones renewed in between",
        )
        .await;
        // A renewal that brought its permit back while saying "not held"
        // would keep the place just freed.
        b.release(&living.remove(0))
            .await
            .expect("release a permit");
        living.extend(take(b, &name, &opts, 1).await);
        release_all(b, living).await;
        Judged::Yes
    })
    .await;
}

/// Release frees only the caller's own permit: a forged lease and a
/// released one free nothing.
pub async fn a_permit_release_frees_only_its_own(backend: &Arc<dyn Backend>) {
    let case = "a_permit_release_frees_only_its_own";
    if !needs_semaphore(backend.as_ref(), case) {
        return;
    }
    let name = unique_name(case);
    let b = backend.as_ref();
    let opts = long().permits(2);
    let mut leases = take(b, &name, &opts, 2).await;
    assert_not_held(
        b.release(&foreign_lease(&name, &opts)).await,
        "release of a permit never granted",
    );
    assert_full(b, &name, &opts, "a forged release freed a holder's permit").await;
    let first = leases.remove(0);
    b.release(&first).await.expect("release a permit");
    leases.extend(take(b, &name, &opts, 1).await);
    assert_not_held(b.release(&first).await, "a second release of a permit");
    assert_full(
        b,
        &name,
        &opts,
        "a second release freed another holder's permit",
    )
    .await;
    release_all(b, leases).await;
}

/// Waiters for a permit are served in arrival order: the first to wait
/// gets the permit freed, and a newcomer does not jump the queue.
pub async fn permit_waiters_are_served_in_order(backend: &Arc<dyn Backend>) {
    let case = "permit_waiters_are_served_in_order";
    let caps = backend.capabilities();
    if !needs_semaphore(backend.as_ref(), case)
        || !needs(case, caps.fifo, "the backend does not queue waiters")
    {
        return;
    }
    let name = unique_name(case);
    let b = backend.as_ref();
    let opts = long().permits(1);
    let holder = must_acquire(b, &name, &opts).await;
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let (backend, name, opts) = (backend.clone(), name.clone(), opts.clone());
        waiters.push(tokio::spawn(async move {
            backend
                .acquire(&name, &opts.wait(Duration::from_secs(30)))
                .await
        }));
        sleep(Duration::from_millis(300)).await;
    }
    assert_full(b, &name, &opts, "waiters were queued for it").await;
    b.release(&holder).await.expect("release");
    assert_full(b, &name, &opts, "a newcomer jumped the queue").await;
    let second = waiters.remove(1);
    let first = waiters
        .remove(0)
        .await
        .expect("the first waiter's task")
        .expect("the first waiter was not granted");
    sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second waiter was granted beside the first"
    );
    b.release(&first).await.expect("release");
    let second = second
        .await
        .expect("the second waiter's task")
        .expect("the second waiter was not granted");
    b.release(&second).await.expect("release");
}

/// A renewal batch that mixes every kind (the renewal scheduler sends
/// them together): each lease is judged on its own, by its kind's holds,
/// so a permit released beside a live one of the same name is reported
/// lost, and the others are renewed.
pub async fn a_renewal_batch_of_every_kind_judges_each_lease(backend: &Arc<dyn Backend>) {
    let case = "a_renewal_batch_of_every_kind_judges_each_lease";
    let caps = backend.capabilities();
    if !needs_semaphore(backend.as_ref(), case)
        || !needs(case, caps.rwlock, "the backend has no reader-writer locks")
    {
        return;
    }
    let name = unique_name(case);
    let b = backend.as_ref();
    let opts = long();
    let mut batch = vec![
        must_acquire(b, &format!("{name}-m"), &opts).await,
        must_acquire(b, &format!("{name}-rw"), &opts.clone().read()).await,
        must_acquire(b, &format!("{name}-s"), &opts.clone().permits(2)).await,
        must_acquire(b, &format!("{name}-s"), &opts.clone().permits(2)).await,
    ];
    b.release(&batch[2]).await.expect("release a permit");
    let before: Vec<_> = batch.iter().map(dlock_core::Lease::valid_until).collect();
    sleep(Duration::from_millis(20)).await;
    assert_eq!(
        b.extend_many(&mut batch).await.expect("extend_many"),
        [true, true, false, true],
        "a batch of a mutex, a reader, a released permit and a live one"
    );
    if caps.lease == dlock_core::LeaseKind::Ttl {
        for (i, lease) in batch.iter().enumerate() {
            assert_eq!(
                lease.valid_until() > before[i],
                i != 2,
                "lease {i}'s validity moved only if it was renewed"
            );
        }
    }
    for lease in [&batch[0], &batch[1], &batch[3]] {
        b.release(lease).await.expect("release");
    }
}
