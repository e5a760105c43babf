//! A three-node ensemble losing its leader, its quorum, and one node to a
//! partition, with locks held. Each case has an ensemble of its own, on a
//! network of its own; the cases run one at a time (three JVMs each).
//!
//! Sessions are 6 s and connect timeouts 1 s (ticks of 125 ms), so a
//! client notices a silent server after about 1.1 s and, with
//! `keep_leases_while_reconnecting`, keeps its leases for 6 − 13 × 0.125 −
//! 0.6 ≈ 3.8 s more.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock_conformance::support::{must_acquire, unique_name};
use dlock_conformance::topology::{Topology, zookeeper_ensemble};
use dlock_core::{Backend, Lease, LockOptions};
use dlock_zk::ZkBackend;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

const SESSION: Duration = Duration::from_secs(6);

/// One ensemble at a time: three JVMs per case on two cores are enough.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

async fn client(ensemble: &Topology, nodes: &[usize], keep: bool) -> ZkBackend {
    client_with(ensemble, nodes, keep, SESSION).await
}

async fn client_with(
    ensemble: &Topology,
    nodes: &[usize],
    keep: bool,
    session: Duration,
) -> ZkBackend {
    ZkBackend::builder(ensemble.connect_string(nodes))
        .session_timeout(session)
        .connect_timeout(Duration::from_secs(1))
        .keep_leases_while_reconnecting(keep)
        .connect()
        .await
        .unwrap()
}

/// A lock held under each policy by clients given `nodes`: the default
/// policy's client, name and lease, then the session policy's.
async fn held_under_both(
    ensemble: &Topology,
    nodes: &[usize],
    case: &str,
    session: Duration,
) -> [(ZkBackend, String, Lease); 2] {
    let mut held = Vec::new();
    for keep in [false, true] {
        let backend = client_with(ensemble, nodes, keep, session).await;
        let name = unique_name(&format!("{case}-{keep}"));
        let lease = must_acquire(&backend, &name, &LockOptions::new()).await;
        held.push((backend, name, lease));
    }
    held.try_into().unwrap()
}

/// When the lease's `lost` signal fires.
fn lost_at(lease: &Lease) -> JoinHandle<Instant> {
    let lost = lease.lost_token().clone();
    tokio::spawn(async move {
        lost.cancelled().await;
        Instant::now()
    })
}

async fn leader(ensemble: &Topology) -> usize {
    let started = Instant::now();
    loop {
        if let Some(leader) = ensemble.zookeeper_leader().await {
            return leader;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no leader");
        sleep(Duration::from_millis(100)).await;
    }
}

/// Killing the leader drops every client while the others elect a new
/// one. The session survives, so no one else may be granted the lock;
/// the default policy reports the lease lost at once, the session policy
/// keeps it through the reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_hold_never_grants_twice() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let _one = ONE_AT_A_TIME.lock().await;
    let ensemble = zookeeper_ensemble(3).await;
    let all = [0, 1, 2];
    let [(strict, a, strict_lease), (keeping, b, keeping_lease)] =
        // The longest session the ensemble allows (20 ticks): a grace of
        // 10 − 1.625 − 1 ≈ 7.4 s for the election and the reconnect.
        held_under_both(&ensemble, &all, "leader", Duration::from_secs(10)).await;
    let other = client(&ensemble, &all, false).await;
    let opts = LockOptions::new();
    let strict_lost = lost_at(&strict_lease);

    let leader = leader(&ensemble).await;
    let killed = Instant::now();
    // When the session policy's client is back with its session.
    let mut states = keeping.client().state_watcher();
    let reconnected = tokio::spawn(async move {
        while states.changed().await != dlock_zk::zookeeper_client::SessionState::SyncConnected {}
        Instant::now()
    });
    ensemble.node(leader).kill().await;
    // Through the election and a while after, the other client tries both
    // names: neither may be granted while the sessions live.
    let mut back = None;
    while back.is_none() || killed.elapsed() < SESSION {
        for name in [&a, &b] {
            if let Ok(Ok(Some(_lease))) =
                timeout(Duration::from_secs(1), other.try_acquire(name, &opts)).await
            {
                panic!(
                    "{name} granted to a second client {:?} after the leader died",
                    killed.elapsed()
                );
            }
        }
        if back.is_none()
            && let Ok(Ok(_)) = timeout(Duration::from_secs(1), keeping.inspect(&b)).await
        {
            back = Some(killed.elapsed());
        }
        if killed.elapsed() > Duration::from_secs(30) {
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    let back = back.expect("the ensemble never served again after the leader died");
    let strict_lost = timeout(Duration::from_secs(1), strict_lost)
        .await
        .expect("the default policy reports the lease lost on the disconnect")
        .unwrap();
    let reconnected = timeout(Duration::from_secs(1), reconnected)
        .await
        .expect("the session moved to a surviving node")
        .unwrap();
    eprintln!(
        "leader killed: default policy lost() after {:?}; session moved after {:?}; \
         ensemble serving again after {back:?}",
        strict_lost - killed,
        reconnected - killed
    );
    assert!(
        !keeping_lease.lost_token().is_cancelled(),
        "the session policy keeps the lease through a reconnect within the session"
    );
    assert!(keeping_lease.is_valid());
    // Both nodes outlived the failover with their sessions.
    for (backend, name, lease) in [(&strict, &a, &strict_lease), (&keeping, &b, &keeping_lease)] {
        let holder = backend.inspect(name).await.unwrap().unwrap();
        assert_eq!(holder.owner, lease.owner(), "{name}");
    }
    keeping.release(&keeping_lease).await.unwrap();
    strict.release(&strict_lease).await.unwrap();
    let next = other.try_acquire(&b, &opts).await.unwrap();
    assert!(next.is_some(), "released, so the other client gets it");
}

/// Two of three nodes down: holders are told, waiters get errors within
/// their bound, nobody is granted; once the nodes are back the same
/// clients lock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_loss_tells_holders_and_grants_nothing() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let _one = ONE_AT_A_TIME.lock().await;
    let ensemble = zookeeper_ensemble(3).await;
    let all = [0, 1, 2];
    let [(_strict, a, strict_lease), (_keeping, _b, keeping_lease)] =
        held_under_both(&ensemble, &all, "quorum", SESSION).await;
    let waiter = client(&ensemble, &all, false).await;
    let opts = LockOptions::new();
    let (strict_lost, keeping_lost) = (lost_at(&strict_lease), lost_at(&keeping_lease));

    let down = Instant::now();
    ensemble.node(1).pause().await;
    ensemble.node(2).pause().await;

    let wait = Duration::from_secs(3);
    let waited = Instant::now();
    let granted = waiter.acquire(&a, &LockOptions::new().wait(wait)).await;
    assert!(granted.is_err(), "granted without a quorum: {granted:?}");
    assert!(
        waited.elapsed() < wait + Duration::from_secs(3),
        "the waiter's bound was {wait:?}, it took {:?}",
        waited.elapsed()
    );
    let fresh = waiter.try_acquire(&unique_name("quorum-free"), &opts).await;
    assert!(
        fresh.is_err(),
        "a free name granted without a quorum: {fresh:?}"
    );

    let strict_lost = timeout(SESSION, strict_lost)
        .await
        .expect("default policy: lost")
        .unwrap();
    let keeping_lost = timeout(SESSION, keeping_lost)
        .await
        .expect("session policy: lost once the grace period ends without a quorum")
        .unwrap();
    // The surviving node drops its clients only once it misses the quorum
    // (syncLimit, 2.5 s); the grace period runs from then. No session can
    // expire without a quorum, so this later loss is still safe.
    assert!(
        keeping_lost - down < SESSION * 2,
        "{:?}",
        keeping_lost - down
    );

    ensemble.node(1).unpause().await;
    ensemble.node(2).unpause().await;
    let back = Instant::now();
    let name = unique_name("quorum-back");
    loop {
        match waiter.try_acquire(&name, &opts).await {
            Ok(Some(_)) => break,
            other => {
                assert!(
                    back.elapsed() < Duration::from_secs(30),
                    "no lock after the quorum came back: {other:?}"
                );
                sleep(Duration::from_millis(100)).await;
            }
        }
    }
    eprintln!(
        "quorum lost: default lost() after {:?}, session policy after {:?}; locking again {:?} after the nodes came back",
        strict_lost - down,
        keeping_lost - down,
        back.elapsed()
    );
}

/// One node cut off from the others and from clients: a client that can
/// reach only that node loses its leases before a client on the majority
/// side is granted them, under either policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_minority_loses_before_the_majority_is_granted() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let _one = ONE_AT_A_TIME.lock().await;
    let ensemble = zookeeper_ensemble(3).await;
    let leader = leader(&ensemble).await;
    let minority = (leader + 1) % 3;
    let majority: Vec<usize> = (0..3).filter(|&i| i != minority).collect();
    let [(_strict, a, strict_lease), (_keeping, b, keeping_lease)] =
        held_under_both(&ensemble, &[minority], "partition", SESSION).await;
    // The control: a grace period of a whole session from the disconnect,
    // as a naive session policy would keep, outlives the takeover.
    let naive = ZkBackend::builder(ensemble.connect_string(&[minority]))
        .session_timeout(SESSION)
        .connect_timeout(Duration::from_secs(1))
        .reconnect_grace_for_tests(SESSION)
        .connect()
        .await
        .unwrap();
    let waiter = client(&ensemble, &majority, false).await;
    let opts = LockOptions::new();
    let c = unique_name("partition-naive");
    let naive_lease = must_acquire(&naive, &c, &opts).await;
    let (strict_lost, keeping_lost) = (lost_at(&strict_lease), lost_at(&keeping_lease));
    let naive_lost = lost_at(&naive_lease);

    let cut = Instant::now();
    ensemble.node(minority).disconnect().await;
    let wait = LockOptions::new().wait(SESSION * 4);
    let granted = async |name: &str| {
        let lease = waiter.acquire(name, &wait).await.unwrap();
        (Instant::now(), lease)
    };
    let (granted_a, granted_b, granted_c) = tokio::join!(granted(&a), granted(&b), granted(&c));
    let strict_lost = timeout(Duration::from_secs(1), strict_lost)
        .await
        .unwrap()
        .unwrap();
    let keeping_lost = timeout(Duration::from_secs(1), keeping_lost)
        .await
        .unwrap()
        .unwrap();
    eprintln!(
        "partition: minority lost() after {:?} (default) and {:?} (session policy); majority granted after {:?} and {:?}",
        strict_lost - cut,
        keeping_lost - cut,
        granted_a.0 - cut,
        granted_b.0 - cut
    );
    assert!(
        strict_lost < granted_a.0,
        "default policy: lost after the takeover"
    );
    assert!(
        keeping_lost < granted_b.0,
        "session policy: lost after the takeover"
    );
    assert!(granted_a.1.fencing_token() > strict_lease.fencing_token());
    assert!(granted_b.1.fencing_token() > keeping_lease.fencing_token());
    let naive_lost = timeout(SESSION * 2, naive_lost).await.unwrap().unwrap();
    assert!(
        naive_lost > granted_c.0,
        "the control: a grace of a whole session from the disconnect overlaps the next \
         holder ({:?} vs {:?} after the cut), which this test must be able to see",
        naive_lost - cut,
        granted_c.0 - cut
    );
}
