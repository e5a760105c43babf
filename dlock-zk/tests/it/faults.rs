//! The fault cases against a real ZooKeeper: a cut or stalled holder, a
//! server restart, a server paused past the session timeout.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::harness::Service;
use dlock_core::Backend;
use dlock_zk::ZkBackend;

async fn connect(url: String) -> Arc<dyn Backend> {
    let backend = ZkBackend::builder(url)
        .session_timeout(Duration::from_secs(2))
        .request_timeout(dlock_conformance::faults::REQUEST_TIMEOUT)
        .connect()
        .await
        .unwrap();
    Arc::new(backend)
}

dlock_conformance::fault_tests!(connect, Service::ZooKeeper);

dlock_conformance::shared_kind_fault_tests!(connect, Service::ZooKeeper);
