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

/// The fault cases again, on the write lock.
mod write_lock {
    use super::*;

    async fn connect_write_lock(url: String) -> Arc<dyn Backend> {
        Arc::new(dlock_conformance::MutexAs::write_lock(connect(url).await))
    }

    dlock_conformance::fault_tests!(connect_write_lock, Service::Redis);
}

/// The fault cases again, on a semaphore of one permit.
mod one_permit {
    use super::*;

    async fn connect_one_permit(url: String) -> Arc<dyn Backend> {
        Arc::new(dlock_conformance::MutexAs::one_permit(connect(url).await))
    }

    dlock_conformance::fault_tests!(connect_one_permit, Service::Redis);
}
