//! An observer on a backend that watches (etcd, ZooKeeper) is woken by the
//! change itself, not by its timer: with a poll interval of an hour it
//! still reports each term as it begins and each resignation, in order.
//! (On the other backends it reads on its timer; `election.rs` covers
//! those.)

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock::{Election, Leader, LockOptions};
use dlock_conformance::harness::Service;
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::locker;

/// The next report, within a bound that only a hang reaches (the
/// observer's own timer is an hour).
async fn next(seen: &mut mpsc::UnboundedReceiver<Option<Leader>>) -> Option<Leader> {
    timeout(Duration::from_secs(60), seen.recv())
        .await
        .expect("the observer was not woken by the change")
        .expect("the observer stopped")
}

async fn every_change_wakes_the_observer(service: Service) {
    let name = dlock_conformance::support::unique_name("watched");
    let watcher = Election::new(locker(service).await, &name, "observer")
        .poll_interval(Duration::from_secs(3600));
    let candidate = Election::new(locker(service).await, &name, "leader")
        .options(LockOptions::new().ttl(Duration::from_secs(10)));
    let (report, mut seen) = mpsc::unbounded_channel();
    let observing = tokio::spawn(async move {
        let mut observer = watcher.observe();
        loop {
            match observer.changed().await {
                Ok(leader) => {
                    if report.send(leader).is_err() {
                        return;
                    }
                }
                Err(e) => eprintln!("the observer's read failed, reading again: {e}"),
            }
        }
    });
    assert_eq!(next(&mut seen).await, None, "nobody leads at first");
    let mut last = 0;
    for _ in 0..3 {
        let term = candidate.campaign().await.unwrap();
        let leader = next(&mut seen).await.expect("the term was seen");
        assert_eq!(leader.fencing_token, term.fencing_token());
        assert_eq!(leader.identity.as_deref(), Some("leader"));
        assert!(leader.fencing_token > last, "terms in order");
        last = leader.fencing_token;
        term.resign().await.unwrap();
        assert_eq!(next(&mut seen).await, None, "the resignation was seen");
    }
    observing.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_wakes_an_observer_by_its_watch() {
    every_change_wakes_the_observer(Service::Etcd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_wakes_an_observer_by_its_watch() {
    every_change_wakes_the_observer(Service::ZooKeeper).await;
}
