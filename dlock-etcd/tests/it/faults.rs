//! The fault cases against a real etcd: a cut or stalled holder, a server
//! restart, a server paused past the lease.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::Service;
use dlock_core::Backend;
use dlock_etcd::EtcdBackend;

/// The suite's request timeout and half as much again: an attempt may take
/// two round trips (the lease's grant, then the key, when the key's
/// transaction reaches the server first), and the slow-link cases need the
/// reply of an attempt over a 600 ms round trip. The stall cases' bounds
/// still hold with room to spare.
async fn connect(url: String) -> Arc<dyn Backend> {
    let backend = EtcdBackend::builder(url)
        .request_timeout(dlock_conformance::faults::REQUEST_TIMEOUT * 3 / 2)
        .connect()
        .await
        .unwrap();
    Arc::new(backend)
}

dlock_conformance::fault_tests!(connect, Service::Etcd);

dlock_conformance::shared_kind_fault_tests!(connect, Service::Etcd);
