//! A task that asks for a name it holds as a mutex or a write lock, through
//! the same locker, is answered at once with `Error::Reentrant` on every
//! backend, however long its wait bound: waiting would wait for itself.
//! A single attempt (`try_acquire`) finds the name held, as another
//! task's does, and the name is the task's to take again once released.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock::{Error, LockOptions, Locker, MemoryBackend};
use dlock_conformance::harness::Service;
use tokio::time::timeout;

use crate::locker;

async fn a_task_locking_what_it_holds_is_answered_at_once(locker: Locker) {
    let name = dlock_conformance::support::unique_name("reentrant");
    // A wait far longer than the test: only an answer at once passes.
    let patient = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(600));
    let held = locker.acquire(&name, &patient).await.unwrap();
    for again in [
        patient.clone(),
        patient.clone().read(),
        patient.clone().write(),
    ] {
        let asked = timeout(
            Duration::from_secs(20),
            locker.clone().acquire(&name, &again),
        )
        .await
        .expect("answered at once, not after waiting for itself");
        assert!(
            matches!(&asked, Err(Error::Reentrant { name: n }) if *n == name),
            "{asked:?}"
        );
    }
    // A single attempt waits for nothing: it finds the name held, here and
    // in another task.
    assert!(matches!(
        locker.try_acquire(&name, &patient).await,
        Ok(None)
    ));
    let other = tokio::spawn({
        let (locker, name) = (locker.clone(), name.clone());
        async move { locker.try_acquire(&name, &LockOptions::new()).await }
    });
    assert!(matches!(other.await.unwrap(), Ok(None)));
    held.release().await.unwrap();
    let again = locker.acquire(&name, &patient).await.unwrap();
    again.release().await.unwrap();
}

macro_rules! backend_tests {
    ($module:ident, $service:expr) => {
        mod $module {
            #[tokio::test]
            async fn a_task_locking_what_it_holds_is_answered_at_once() {
                let locker = super::locker($service).await;
                super::a_task_locking_what_it_holds_is_answered_at_once(locker).await;
            }
        }
    };
}

#[tokio::test]
async fn memory() {
    a_task_locking_what_it_holds_is_answered_at_once(Locker::new(MemoryBackend::new())).await;
}

backend_tests!(redis, super::Service::Redis);
backend_tests!(mysql, super::Service::MariaDb);
backend_tests!(postgres, super::Service::Postgres);
backend_tests!(zookeeper, super::Service::ZooKeeper);
backend_tests!(etcd, super::Service::Etcd);
