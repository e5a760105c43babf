//! The fault cases through PgBouncer in transaction pooling mode, the link
//! faulted between the client and PgBouncer.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::harness::Service;
use dlock_core::Backend;
use dlock_postgres::PgBackend;

async fn connect(url: String) -> Arc<dyn Backend> {
    let backend = PgBackend::builder(url)
        .connect_timeout(Duration::from_secs(1))
        .request_timeout(dlock_conformance::faults::REQUEST_TIMEOUT)
        .connect()
        .await
        .unwrap();
    Arc::new(backend)
}

dlock_conformance::fault_tests!(connect, Service::PgBouncer);
