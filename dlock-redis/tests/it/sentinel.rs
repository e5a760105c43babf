//! A Redis primary with one replica and three Sentinels, failed over with
//! a lock held. Each case has its own servers on a network of its own.
//!
//! The hazard of asynchronous replication, shown rather than described: a
//! replica that missed a grant is promoted, and a second client is granted
//! the name while the first still holds it. Fencing tokens still increase,
//! which is what protects the resource. With durable grants, a grant the
//! replica never acknowledged is never believed held.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock_conformance::support::{long, must_acquire, unique_name};
use dlock_conformance::topology::{Topology, redis_sentinel};
use dlock_core::{Backend, Error, LockOptions, Locker};
use dlock_redis::RedisBackend;
use tokio::time::{Instant, sleep};

/// Connects, trying again while a failover is under way: the Sentinels
/// may name a primary that does not yet confirm its role.
async fn client(sentinel: &Topology) -> RedisBackend {
    let started = Instant::now();
    loop {
        match RedisBackend::connect(&sentinel.sentinel_url()).await {
            Ok(backend) => return backend,
            Err(e) if e.is_retryable() && started.elapsed() < Duration::from_secs(30) => {
                sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e:?}"),
        }
    }
}

async fn durable_client(sentinel: &Topology) -> RedisBackend {
    RedisBackend::builder(sentinel.sentinel_url())
        .durable_grants(1, Duration::from_millis(300))
        .connect()
        .await
        .unwrap()
}

/// Kills the primary and waits until the Sentinels name the replica.
async fn fail_over(sentinel: &Topology) -> Duration {
    let replica = sentinel.node(1).addr();
    let killed = Instant::now();
    sentinel.node(0).kill().await;
    loop {
        if sentinel.sentinel_primary().await.as_deref() == Some(replica.as_str()) {
            return killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no failover to the replica"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// Tries until the client, following the Sentinels, reaches the new
/// primary: `Some` once a try got an answer.
async fn until_answered<T>(
    started: Instant,
    mut attempt: impl AsyncFnMut() -> dlock_core::Result<T>,
) -> (T, Duration) {
    loop {
        match attempt().await {
            Ok(value) => return (value, started.elapsed()),
            Err(e) => {
                assert!(e.is_retryable(), "{e:?}");
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "never reached the new primary: {e:?}"
                );
                sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn stored_fence(backend: &RedisBackend, name: &str) -> Option<u64> {
    let key = format!("dlock:{{{name}}}:fence");
    let mut conn = backend.connection();
    redis::cmd("GET")
        .arg(key)
        .query_async::<Option<u64>>(&mut conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_durable_grants_a_promoted_replica_grants_twice_but_fences_higher() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let sentinel = redis_sentinel().await;
    let first = client(&sentinel).await;
    let name = unique_name("hazard");
    // An earlier holder leaves a fencing counter that the replica has.
    let earlier = must_acquire(&first, &name, &long()).await;
    first.release(&earlier).await.unwrap();
    sentinel.wait_replicated().await;

    // The replica misses the next grant: the primary's replication stream
    // to it goes nowhere (a paused replica would still find the grant in
    // its socket buffer when thawed).
    sentinel.node(0).stop_sending_to(sentinel.node(1)).await;
    let held = must_acquire(&first, &name, &long()).await;
    assert!(held.fencing_token() > earlier.fencing_token());
    // A renewed guard, granted the same way, to see when its holder hears
    // of the loss: its first renewal on the new primary finds no lock.
    let locker = Locker::new(first.clone());
    let guarded = locker
        .try_acquire(
            &unique_name("hazard-guard"),
            &LockOptions::new().ttl(Duration::from_secs(20)),
        )
        .await
        .unwrap()
        .unwrap();
    let started = Instant::now();
    let failover = fail_over(&sentinel).await;

    let second = client(&sentinel).await;
    assert_eq!(
        second.sentinel_primary().as_deref(),
        Some(sentinel.node(1).addr().as_str())
    );
    // The promoted replica never saw the grant nor its fencing token: a
    // plain counter would now go backwards.
    let counter = stored_fence(&second, &name).await;
    if counter != Some(earlier.fencing_token()) {
        panic!(
            "the promoted replica's fencing counter is {counter:?}, not the earlier grant's {}:{}",
            earlier.fencing_token(),
            sentinel.sentinel_report().await
        );
    }
    let (granted, after) =
        until_answered(started, async || second.try_acquire(&name, &long()).await).await;
    let granted = granted.expect("the hazard: the new primary grants the name again");
    assert!(
        held.is_valid(),
        "the first holder still believes it holds the lock"
    );
    assert!(
        granted.fencing_token() > held.fencing_token(),
        "fencing must still increase: {} after {}",
        granted.fencing_token(),
        held.fencing_token()
    );
    // The first client follows the failover too.
    let (_, followed) = until_answered(started, async || {
        first.try_acquire(&unique_name("after"), &long()).await
    })
    .await;
    // Well before its TTL (20 s) could run out: the loss is reported by a
    // renewal that finds no lock, not by the lease expiring unrenewed.
    tokio::time::timeout(Duration::from_secs(15), guarded.lost())
        .await
        .expect("the guard's renewal on the new primary reports the loss");
    let lost = started.elapsed();
    eprintln!(
        "sentinel, no durable grants: the Sentinels named the replica {failover:?} after the \
         kill; the second grant came {after:?} after it, the first client's next grant \
         {followed:?}; a renewed guard's lost() fired after {lost:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_durable_grants_no_believed_grant_is_lost_in_a_failover() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let sentinel = redis_sentinel().await;
    let replica = sentinel.node(1).addr();
    let first = durable_client(&sentinel).await;
    let (kept, refused) = (unique_name("durable-kept"), unique_name("durable-refused"));
    // Confirmed by the replica, which is all this test waits for. A grant
    // whose acknowledgement missed the 300 ms window (a loaded machine) is
    // refused and given back, as it must be: ask again.
    let (held, _) = until_answered(Instant::now(), async || {
        first.try_acquire(&kept, &long()).await
    })
    .await;
    let held = held.expect("the name is free");

    // From here on the replica hears nothing from the primary: a grant it
    // cannot acknowledge is refused (and given back).
    sentinel.node(0).stop_sending_to(sentinel.node(1)).await;
    let refusal = first.try_acquire(&refused, &long()).await;
    assert!(
        matches!(refusal, Err(Error::Unavailable { .. })),
        "{refusal:?}"
    );
    let started = Instant::now();
    let failover = fail_over(&sentinel).await;

    let second = client(&sentinel).await;
    let (taken, after) =
        until_answered(started, async || second.try_acquire(&kept, &long()).await).await;
    assert!(
        taken.is_none(),
        "the confirmed grant survived the failover: no second holder"
    );
    assert!(held.is_valid());
    let holder = second.inspect(&kept).await.unwrap().unwrap();
    assert_eq!(holder.owner, held.owner());
    // Nobody believed they held the refused name: granting it is fine.
    let _granted = must_acquire(&second, &refused, &long()).await;

    // The durable client follows the failover too (its scripts are loaded
    // again on the new primary), and with no replica left it grants
    // nothing: every grant is refused and given back.
    let fresh = unique_name("durable-after");
    loop {
        let attempt = first.try_acquire(&fresh, &long()).await;
        if first.sentinel_primary().as_deref() == Some(replica.as_str())
            && matches!(attempt, Err(Error::Unavailable { .. }))
        {
            break;
        }
        assert!(
            matches!(&attempt, Err(e) if e.is_retryable()),
            "{attempt:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(60), "{attempt:?}");
        sleep(Duration::from_millis(50)).await;
    }
    let started_check = Instant::now();
    while second.inspect(&fresh).await.unwrap().is_some() {
        assert!(
            started_check.elapsed() < Duration::from_secs(5),
            "an unconfirmed grant was left held"
        );
        sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "sentinel, durable grants: the Sentinels named the replica {failover:?} after the kill; \
         the new primary answered {after:?} after it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_grants_without_replicas_grant_nothing() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let server =
        dlock_conformance::harness::shared(dlock_conformance::harness::Service::Redis).await;
    let durable = RedisBackend::builder(server.url())
        .durable_grants(1, Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let name = unique_name("durable-alone");
    let e = durable.try_acquire(&name, &long()).await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    let plain = RedisBackend::connect(server.url()).await.unwrap();
    let started = Instant::now();
    // The unconfirmed grant is given back at once, not left to its TTL.
    while plain.inspect(&name).await.unwrap().is_some() {
        assert!(started.elapsed() < Duration::from_secs(5), "left held");
        sleep(Duration::from_millis(20)).await;
    }
    let e = durable
        .acquire(&name, &long().wait(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "a waiting acquire keeps trying: {e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_urls_that_cannot_work_are_typed_errors() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    for url in [
        "redis+sentinel://127.0.0.1:1/",
        "redis+sentinel://127.0.0.1:x/svc",
    ] {
        let e = RedisBackend::connect(url).await.unwrap_err();
        assert!(matches!(e, Error::InvalidOption { .. }), "{url}: {e:?}");
    }
    let port = dlock_conformance::harness::unused_port();
    let e = RedisBackend::connect(&format!("redis+sentinel://127.0.0.1:{port}/svc"))
        .await
        .unwrap_err();
    assert!(e.is_retryable(), "no Sentinel answers: {e:?}");
    let e = RedisBackend::builder("redis://127.0.0.1:1")
        .durable_grants(0, Duration::from_millis(100))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidOption { .. }), "{e:?}");
}

/// Waits until the Sentinels name the replica; when they did, as seen.
async fn promoted(sentinel: &Topology, since: Instant) -> Instant {
    let replica = sentinel.node(1).addr();
    while sentinel.sentinel_primary().await.as_deref() != Some(replica.as_str()) {
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "no failover to the replica:{}",
            sentinel.sentinel_report().await
        );
        sleep(Duration::from_millis(20)).await;
    }
    Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_leave_a_primary_cut_off_from_its_sentinels_that_still_answers_them() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let sentinel = redis_sentinel().await;
    let (old, new) = (sentinel.node(0).addr(), sentinel.node(1).addr());
    let backend = client(&sentinel).await;
    assert_eq!(backend.sentinel_primary().as_deref(), Some(old.as_str()));
    // A second client that hears the Sentinels' announcements and would
    // otherwise ask them only once an hour.
    let hearing = RedisBackend::builder(sentinel.sentinel_url())
        .sentinel_poll_interval(Duration::from_secs(3600))
        .connect()
        .await
        .unwrap();
    // Nothing the primary sends reaches the Sentinels or the replica; the
    // clients (on the host) still reach it, and it still answers them as
    // a primary: no request of theirs fails, so a client that looked for
    // a new primary only when a request failed would stay on it, granting
    // locks the new primary knows nothing of, until the heal.
    for i in 1..5 {
        sentinel.node(0).stop_sending_to(sentinel.node(i)).await;
    }
    let named = promoted(&sentinel, Instant::now()).await;
    let name = unique_name("cut-off");
    let mut moved = [None, None];
    while moved.iter().any(Option::is_none) {
        for (client, at) in [&backend, &hearing].into_iter().zip(&mut moved) {
            if at.is_none() && client.sentinel_primary().as_deref() == Some(new.as_str()) {
                *at = Some(named.elapsed());
            }
        }
        // Judged on order, not on time: the partition never heals here.
        assert!(
            named.elapsed() < Duration::from_secs(20),
            "still on the cut-off primary 20 s after the Sentinels named the replica: {moved:?}"
        );
        sleep(Duration::from_millis(5)).await;
    }
    let lease = must_acquire(&backend, &name, &long()).await;
    let fence = format!("dlock:{{{name}}}:fence");
    let stored = async |addr: &str| {
        let mut conn = dlock_conformance::topology::node_connection(addr)
            .await
            .unwrap();
        redis::cmd("GET")
            .arg(&fence)
            .query_async::<Option<u64>>(&mut conn)
            .await
            .unwrap()
    };
    assert_eq!(stored(&new).await, Some(lease.fencing_token()));
    assert_eq!(stored(&old).await, None, "granted on the cut-off primary");
    backend.release(&lease).await.unwrap();
    eprintln!(
        "sentinel, primary cut off from its Sentinels: the clients were on the new primary \
         {:?} (polling and hearing) and {:?} (hearing only) after the test saw the Sentinels \
         name it",
        moved[0], moved[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_primary_that_may_evict_is_refused_until_it_may_not() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let sentinel = redis_sentinel().await;
    let new = sentinel.node(1).addr();
    let backend = client(&sentinel).await;
    let policy = async |value: &str| {
        let mut conn = dlock_conformance::topology::node_connection(&new)
            .await
            .unwrap();
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(value)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
    };
    policy("allkeys-lru").await;
    let started = Instant::now();
    fail_over(&sentinel).await;
    let name = unique_name("evicting");
    loop {
        match backend.try_acquire(&name, &long()).await {
            Err(Error::UnsafeServer { message, .. }) => {
                assert!(message.contains(&new), "{message}");
                break;
            }
            Err(e) if e.is_retryable() => {}
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the evicting primary was never refused"
        );
        sleep(Duration::from_millis(50)).await;
    }
    // Remembered: every call says why, without connecting again.
    for _ in 0..3 {
        let e = backend.try_acquire(&name, &long()).await.unwrap_err();
        assert!(matches!(e, Error::UnsafeServer { .. }), "{e:?}");
    }
    assert_ne!(backend.sentinel_primary().as_deref(), Some(new.as_str()));
    policy("noeviction").await;
    let fixed = Instant::now();
    let (lease, _) = until_answered(fixed, async || {
        match backend.try_acquire(&name, &long()).await {
            Err(Error::UnsafeServer { .. }) => Err(Error::timed_out("test", "still refused")),
            other => other,
        }
    })
    .await;
    let lease = lease.expect("the name is free on the new primary");
    assert_eq!(backend.sentinel_primary().as_deref(), Some(new.as_str()));
    backend.release(&lease).await.unwrap();
}
