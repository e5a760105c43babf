//! The fault cases against a real Redis: a cut or stalled holder, a server
//! restart, a server paused past the lease.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::Service;
use dlock_core::Backend;
use dlock_redis::RedisBackend;

async fn connect(url: String) -> Arc<dyn Backend> {
    let backend = RedisBackend::builder(url)
        .request_timeout(dlock_conformance::faults::REQUEST_TIMEOUT)
        .connect()
        .await
        .unwrap();
    Arc::new(backend)
}

dlock_conformance::fault_tests!(connect, Service::Redis);

dlock_conformance::shared_kind_fault_tests!(connect, Service::Redis);
