//! A slow link: a grant is valid only until the server frees it, counted
//! from before the request, and a grant slower than its lease is no grant.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::{Backend, Lease, LockOptions, Locker};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::{FaultyClient, FaultyFactory, bounded, warm_up};
use crate::Factory;
use crate::cases::needs_ttl;
use crate::proxy::Fault;
use crate::support::{long, unique_name};

/// Waits for the faulty client's grant of `name` to land on the server,
/// then polls `try_acquire` until the server frees it; the lease and when
/// its reply arrived.
async fn take_after_grant(client: &dyn Backend, name: &str, within: Duration) -> (Lease, Instant) {
    let started = Instant::now();
    while client.inspect(name).await.expect("inspect").is_none() {
        assert!(
            started.elapsed() < within,
            "the faulty client's grant of {name:?} never landed"
        );
        sleep(Duration::from_millis(2)).await;
    }
    loop {
        match client.try_acquire(name, &long()).await {
            Ok(Some(lease)) => return (lease, Instant::now()),
            Ok(None) => {}
            Err(e) => panic!("a healthy client's try_acquire({name:?}) failed: {e}"),
        }
        assert!(
            started.elapsed() < within,
            "{name:?} was not free after {within:?}"
        );
        sleep(Duration::from_millis(5)).await;
    }
}

/// The start of both slow-link cases: the faulty client, warmed up and
/// then slowed to `delay` each way, and a task in which `other` takes
/// `name` as soon as the server frees the faulty client's grant of it.
async fn slowed_with_taker(
    faulty: FaultyFactory,
    other: &Arc<dyn Backend>,
    name: &str,
    delay: Duration,
) -> (FaultyClient, JoinHandle<(Lease, Instant)>) {
    let f = faulty().await;
    warm_up(f.backend.as_ref()).await;
    f.link.set(Fault::Delay(delay));
    let taker = {
        let other = other.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            take_after_grant(other.as_ref(), &name, Duration::from_secs(10)).await
        })
    };
    (f, taker)
}

/// What the taker of [`slowed_with_taker`] took, and when; its panic, if
/// it failed.
async fn taken(taker: JoinHandle<(Lease, Instant)>) -> (Lease, Instant) {
    match taker.await {
        Ok(taken) => taken,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// The faulty client's replies take longer than the lease it asks for
/// (300 ms each way, TTL 400 ms). Whatever the server granted has expired
/// before the reply arrives, so `try_acquire` must not return a lease (it
/// says "held" or fails), `with_lock` must not run its closure, and the
/// grant must be released without touching the client that takes the lock
/// meanwhile.
pub async fn grant_slower_than_its_lease_is_no_grant(faulty: FaultyFactory, client: Factory) {
    bounded("grant_slower_than_its_lease_is_no_grant", async move {
        let other = client().await;
        if !needs_ttl(other.as_ref(), "grant_slower_than_its_lease_is_no_grant") {
            return;
        }
        let ttl = Duration::from_millis(400);
        let opts = LockOptions::new().ttl(ttl);
        let name = unique_name("slow_grant");
        let (f, taker) = slowed_with_taker(faulty, &other, &name, Duration::from_millis(300)).await;
        match f.backend.try_acquire(&name, &opts).await {
            Ok(Some(lease)) => panic!(
                "a grant whose reply took longer than its {ttl:?} lease reached the caller \
                 (is_valid: {}): the reply arrived after the validity deadline",
                lease.is_valid()
            ),
            Ok(None) => {}
            Err(e) => panic!(
                "try_acquire over a link with a 600 ms round trip failed ({e}); the case needs \
                 the reply, so the client's request timeout must be at least 1 s"
            ),
        }

        let ran = Arc::new(AtomicBool::new(false));
        let locker = Locker::from_arc(f.backend.clone());
        let flag = ran.clone();
        let result = locker
            .with_lock(
                &unique_name("slow_grant_with_lock"),
                &opts.clone().wait(Duration::from_secs(1)),
                async move |_| flag.store(true, Ordering::SeqCst),
            )
            .await;
        assert!(
            !ran.load(Ordering::SeqCst),
            "with_lock ran its closure under a grant that expired on arrival ({result:?})"
        );

        let (lease, _) = taken(taker).await;
        // The discarded grant's release crosses the slow link too.
        sleep(Duration::from_millis(1500)).await;
        f.link.set(Fault::Pass);
        let info = other
            .inspect(&name)
            .await
            .expect("inspect")
            .expect("the client that took the lock still holds it");
        assert_eq!(
            info.owner,
            lease.owner(),
            "releasing the slow grant touched the new holder's lock"
        );
        other.release(&lease).await.expect("release");
    })
    .await;
}

/// The faulty client's link is slow (150 ms each way) but faster than its
/// lease (TTL 1 s): it gets the lock, and its lease's validity must end no
/// later than the moment another client is granted the lock after the
/// server frees it. A driver that counts the lease from the reply instead
/// of from before the request believes it holds the lock 300 ms too long.
pub async fn delayed_grant_is_valid_only_until_the_server_frees_it(
    faulty: FaultyFactory,
    client: Factory,
) {
    bounded(
        "delayed_grant_is_valid_only_until_the_server_frees_it",
        async move {
            let other = client().await;
            if !needs_ttl(
                other.as_ref(),
                "delayed_grant_is_valid_only_until_the_server_frees_it",
            ) {
                return;
            }
            let name = unique_name("delayed_grant");
            let (f, taker) =
                slowed_with_taker(faulty, &other, &name, Duration::from_millis(150)).await;
            let sent = Instant::now();
            let lease = f
                .backend
                .try_acquire(&name, &LockOptions::new().ttl(Duration::from_secs(1)))
                .await
                .expect("try_acquire over a slow link")
                .expect("the lock is free");
            let valid_until = lease.valid_until().expect("TTL leases have a deadline");
            let (taken, taken_at) = taken(taker).await;
            assert!(
                valid_until <= taken_at,
                "the lease was valid until {:?} after its request, but another client held \
                 the lock {:?} after it: validity must be counted from before the request",
                valid_until - sent,
                taken_at - sent
            );
            f.link.set(Fault::Pass);
            other.release(&taken).await.expect("release");
        },
    )
    .await;
}
