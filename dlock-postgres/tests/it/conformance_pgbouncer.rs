//! The whole conformance suite through PgBouncer in transaction pooling
//! mode: consecutive statements of one client connection may run on
//! different server connections, so nothing may rely on a session.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::{Service, shared};
use dlock_core::Backend;
use dlock_postgres::PgBackend;

async fn pgbouncer() -> Arc<dyn Backend> {
    let server = shared(Service::PgBouncer).await;
    let backend = PgBackend::builder(server.url())
        // Without wake-ups a queue's next waiter learns of its turn when
        // it polls: often, so that the stress cases hand over quickly.
        .max_poll_interval(std::time::Duration::from_millis(100))
        .connect()
        .await
        .expect("connect through the test PgBouncer");
    Arc::new(backend)
}

dlock_conformance::conformance_tests!(pgbouncer);
