//! The fault cases through PgBouncer in transaction pooling mode, the link
//! faulted between the client and PgBouncer.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::Service;
use dlock_core::Backend;
use dlock_postgres::PgBackend;

async fn connect(url: String) -> Arc<dyn Backend> {
    // The default connect timeout: a loaded machine may take over a
    // second to open a connection (a fork and a SCRAM login on the server),
    // and a call's own connect is bounded by its request timeout anyway.
    // No statement cache: a call that PgBouncer gives a server connection
    // lacking its prepared statement takes a second round trip (the
    // README's "Statements"), and the slow-link cases' 600 ms round trip
    // against a 1 s request timeout leaves room for one only, as the
    // README tells such a link's users. The prepared path through
    // PgBouncer runs in `conformance_pgbouncer`, and under faults on the
    // direct link (`faults`).
    let backend = PgBackend::builder(url)
        .request_timeout(dlock_conformance::faults::REQUEST_TIMEOUT)
        .statement_cache(false)
        .connect()
        .await
        .unwrap();
    Arc::new(backend)
}

dlock_conformance::fault_tests!(connect, Service::PgBouncer);
