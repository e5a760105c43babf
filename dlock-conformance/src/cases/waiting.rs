//! Waiting: `acquire` returns within its wait bound, a waiter is woken by
//! a release instead of waiting out the holder's lease, and an acquire
//! dropped at any point leaves no lock behind.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, Error, Lease, LockOptions};
use tokio::time::{Instant, sleep};

use crate::support::{long, must_acquire, unique_name};

/// `acquire` on a held lock gives `Error::Timeout` once the wait bound has
/// passed, and not long after; a zero bound makes one attempt.
pub async fn acquire_times_out_within_wait_bound(backend: &Arc<dyn Backend>) {
    let name = unique_name("acquire_times_out_within_wait_bound");
    let holder = must_acquire(backend.as_ref(), &name, &long()).await;
    for wait in [Duration::ZERO, Duration::from_millis(300)] {
        let started = Instant::now();
        let result = backend.acquire(&name, &long().wait(wait)).await;
        let took = started.elapsed();
        assert!(
            matches!(result, Err(Error::Timeout { .. })),
            "acquire with wait {wait:?} on a held lock: expected Timeout, got {result:?}"
        );
        assert!(
            took >= wait,
            "gave up after {took:?}, before the {wait:?} bound"
        );
        // The bound plus one round trip; generous for a loaded CI machine.
        assert!(
            took < wait + Duration::from_secs(2),
            "acquire with wait {wait:?} took {took:?}"
        );
    }
    backend.release(&holder).await.expect("release");
}

/// A waiter gets the lock soon after the holder releases it, long before
/// the holder's TTL would have freed it.
pub async fn waiter_acquires_after_release(backend: &Arc<dyn Backend>) {
    let name = unique_name("waiter_acquires_after_release");
    let holder = must_acquire(backend.as_ref(), &name, &long()).await;
    let waiter = {
        let backend = backend.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let lease = backend
                .acquire(&name, &long().wait(Duration::from_secs(30)))
                .await;
            (lease, Instant::now())
        })
    };
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released = Instant::now();
    backend.release(&holder).await.expect("release");
    let (lease, granted) = waiter.await.expect("waiter task");
    let lease = lease.expect("the waiter acquires after release");
    let after = granted - released;
    assert!(
        after < Duration::from_secs(5),
        "the waiter took {after:?} after the release"
    );
    backend.release(&lease).await.expect("release");
}

/// An acquire future dropped at any point (before its request is sent,
/// mid-flight, while waiting in a queue) leaves no lock behind beyond the
/// TTL: once the holder releases, another client gets the name within a
/// TTL plus a second.
pub async fn dropped_acquire_leaves_no_lock(backend: &Arc<dyn Backend>) {
    let ttl = Duration::from_millis(500);
    let opts = LockOptions::new().ttl(ttl);
    for step in 0..16u64 {
        // Uncontended: dropped somewhere between sending and the reply.
        let name = unique_name("dropped_acquire_leaves_no_lock");
        let cut = Duration::from_micros(step * 200);
        if let Ok(done) = tokio::time::timeout(cut, backend.acquire(&name, &opts)).await {
            // Not dropped after all: the grant is the caller's to release.
            let lease = done.expect("acquire");
            release_short(backend.as_ref(), &lease).await;
        }
        let lease = backend
            .acquire(&name, &opts.clone().wait(ttl + Duration::from_secs(1)))
            .await
            .unwrap_or_else(|e| panic!("dropped after {cut:?}: the name stayed locked: {e}"));
        release_short(backend.as_ref(), &lease).await;
    }
    // Contended: dropped while waiting behind a holder.
    let name = unique_name("dropped_acquire_leaves_no_lock");
    let holder = must_acquire(backend.as_ref(), &name, &long()).await;
    let patient = opts.clone().wait(Duration::from_secs(30));
    for step in 0..5u64 {
        let cut = Duration::from_millis(step * 20);
        let waiting = backend.acquire(&name, &patient);
        assert!(
            tokio::time::timeout(cut, waiting).await.is_err(),
            "a waiter got a held lock"
        );
    }
    backend.release(&holder).await.expect("release");
    let lease = backend
        .acquire(&name, &opts.clone().wait(ttl + Duration::from_secs(1)))
        .await
        .expect("dropped waiters left the name locked");
    release_short(backend.as_ref(), &lease).await;
}

/// Releases a lease of a short TTL. `NotHeld` is a right answer only when
/// the lease's validity had ended before the release was sent: a loaded
/// machine can take longer than the TTL between a grant and its release
/// (the flake hunt saw it once, on PostgreSQL with 500 ms). Any other
/// failure, or `NotHeld` for a lease still valid, fails the case.
async fn release_short(backend: &dyn Backend, lease: &Lease) {
    let sent = Instant::now();
    match backend.release(lease).await {
        Ok(()) => {}
        Err(Error::NotHeld { .. }) if lease.valid_until().is_some_and(|until| until <= sent) => {}
        Err(e) => panic!("release: {e:?}"),
    }
}
