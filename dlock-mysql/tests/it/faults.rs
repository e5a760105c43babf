//! The fault cases against a real MariaDB: a cut or stalled holder, a
//! server restart, a server paused past the lease.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::Service;
use dlock_core::Backend;
use dlock_mysql::MySqlBackend;

async fn connect(url: String) -> Arc<dyn Backend> {
    // The default connect timeout: it bounds only the connects made while
    // the client is built (a loaded machine may take over a second), and a
    // call's own connect is bounded by its request timeout anyway.
    let backend = MySqlBackend::builder(url)
        .request_timeout(dlock_conformance::faults::REQUEST_TIMEOUT)
        .connect()
        .await
        .unwrap();
    backend.migrate().await.unwrap();
    Arc::new(backend)
}

dlock_conformance::fault_tests!(connect, Service::MariaDb);
dlock_conformance::shared_kind_fault_tests!(connect, Service::MariaDb);
