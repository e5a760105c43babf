//! A three-member etcd cluster losing its leader, and one member cut off
//! from the others, with locks held. Each case has a cluster of its own,
//! on a network of its own; the cases run one at a time.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock_conformance::support::unique_name;
use dlock_conformance::topology::{Topology, etcd_cluster};
use dlock_core::{Backend, LockOptions, Locker};
use dlock_etcd::EtcdBackend;
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep, timeout};

/// One cluster at a time on two cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

async fn client(cluster: &Topology, members: &[usize]) -> EtcdBackend {
    EtcdBackend::builder(cluster.etcd_url(members))
        .request_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap()
}

async fn leader(cluster: &Topology) -> usize {
    let started = Instant::now();
    loop {
        if let Some(leader) = cluster.etcd_leader().await {
            return leader;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no leader");
        sleep(Duration::from_millis(100)).await;
    }
}

/// The leader dies while a lock is held: the surviving members elect
/// another, the holder's keep-alives are retried through the leaderless
/// time and it keeps the lock, nobody else is granted it meanwhile, and
/// the next grant's token is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_hold_keeps_the_holder_and_tokens_increase() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = etcd_cluster(3).await;
    let all = [0, 1, 2];
    let holder = Locker::new(client(&cluster, &all).await);
    let other = client(&cluster, &all).await;
    let name = unique_name("leader-killed");
    // Renewed every 4 s: the election and the clients' finding a live
    // member have 8 s before the lease's validity ends.
    let opts = LockOptions::new().ttl(Duration::from_secs(12));
    let guard = holder.try_acquire(&name, &opts).await.unwrap().unwrap();

    let killed = Instant::now();
    cluster.node(leader(&cluster).await).kill().await;
    // Until the cluster serves again, and a renewal period after, the
    // other client tries the name: it is never granted.
    let mut serving_again = None;
    while serving_again.is_none() || killed.elapsed() < Duration::from_secs(6) {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "the cluster never served again after its leader died"
        );
        let fresh = unique_name("leader-killed-fresh");
        match timeout(Duration::from_secs(2), other.try_acquire(&fresh, &opts)).await {
            Ok(Ok(Some(lease))) => {
                serving_again.get_or_insert(killed.elapsed());
                let _ = other.release(&lease).await;
            }
            _ => sleep(Duration::from_millis(50)).await,
        }
        if let Ok(Ok(Some(_))) =
            timeout(Duration::from_secs(2), other.try_acquire(&name, &opts)).await
        {
            panic!(
                "granted to a second client {:?} after the leader died (holder valid: {})",
                killed.elapsed(),
                guard.is_valid()
            );
        }
    }
    eprintln!(
        "leader killed: the cluster granted again after {:?}",
        serving_again.unwrap_or_default()
    );
    assert!(
        guard.is_valid(),
        "the holder kept its lock through the election"
    );
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    // The other client's attempts that timed out in the election are
    // undone in the background; their keys may stand a moment longer.
    let next = other
        .acquire(&name, &opts.clone().wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(next.fencing_token() > token);
    other.release(&next).await.unwrap();
}

/// A member cut off from the other two (its clients still reach it) has
/// no leader: its client's renewals fail, its holder's validity ends
/// before a client of the majority is granted the lock, and it is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_partition_loses_its_leases_before_the_majority_grants() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = etcd_cluster(3).await;
    let minority = Locker::new(client(&cluster, &[0]).await);
    let majority = client(&cluster, &[1, 2]).await;
    let name = unique_name("minority");
    let opts = LockOptions::new().ttl(Duration::from_secs(3));
    let guard = minority.try_acquire(&name, &opts).await.unwrap().unwrap();

    let (cut, rest) = (cluster.node(0), [cluster.node(1), cluster.node(2)]);
    for other in rest {
        cut.stop_sending_to(other).await;
        other.stop_sending_to(cut).await;
    }
    let started = Instant::now();
    let lost = async {
        guard.lost().await;
        Instant::now()
    };
    // Through the majority's election (when the cut member led), calls
    // fail within their bound; the caller tries again.
    let grant = async {
        loop {
            let wait = opts.clone().wait(Duration::from_secs(10));
            match majority.acquire(&name, &wait).await {
                Ok(lease) => break (lease, Instant::now()),
                Err(e) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(30),
                        "the majority never granted the name: {e}"
                    );
                    sleep(Duration::from_millis(100)).await;
                }
            }
        }
    };
    let (lost_at, (granted, granted_at)) =
        tokio::join!(timeout(Duration::from_secs(40), lost), grant);
    let lost_at = lost_at.expect("the cut-off holder was told its lock is lost");
    eprintln!(
        "minority cut off: its holder told {:?} after the cut, the majority granted the name \
         after {:?}",
        lost_at - started,
        granted_at - started
    );
    // The holder stopped trusting its lease (its validity, counted from
    // before its last renewal was sent, ended) before the grant; the lost
    // signal, a timer at that deadline, may come a little after it.
    let valid_until = guard.valid_until().expect("a TTL lease");
    assert!(
        valid_until < granted_at,
        "the majority granted the name {:?} before the cut-off holder's validity ended",
        valid_until - granted_at
    );
    assert!(lost_at >= valid_until);
    assert!(granted.fencing_token() > guard.fencing_token());
    // The cut-off member refuses rather than serving a stale grant.
    let refused = minority
        .try_acquire(&unique_name("minority-fresh"), &opts)
        .await;
    assert!(
        refused.is_err(),
        "a member without a leader granted: {refused:?}"
    );
    majority.release(&granted).await.unwrap();
}
