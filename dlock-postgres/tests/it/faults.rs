//! The fault cases against a real PostgreSQL: a cut or stalled holder, a
//! server restart, a server paused past the lease.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::Service;
use dlock_core::Backend;
use dlock_postgres::PgBackend;

async fn connect(url: String) -> Arc<dyn Backend> {
    // The default connect timeout: a loaded machine may take over a
    // second to open a connection (a fork and a SCRAM login on the server),
    // and a call's own connect is bounded by its request timeout anyway.
    let backend = PgBackend::builder(url)
        .request_timeout(dlock_conformance::faults::REQUEST_TIMEOUT)
        .connect()
        .await
        .unwrap();
    Arc::new(backend)
}

dlock_conformance::fault_tests!(connect, Service::Postgres);
dlock_conformance::shared_kind_fault_tests!(connect, Service::Postgres);
