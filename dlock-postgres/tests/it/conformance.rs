//! The whole conformance suite against a real PostgreSQL in a container.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::{Service, shared};
use dlock_core::Backend;
use dlock_postgres::PgBackend;

async fn postgres() -> Arc<dyn Backend> {
    let server = shared(Service::Postgres).await;
    let backend = PgBackend::builder(server.url())
        // Without wake-ups a queue's next waiter learns of its turn when
        // it polls: often, so that the stress cases hand over quickly.
        .max_poll_interval(std::time::Duration::from_millis(100))
        .connect()
        .await
        .expect("connect to the test PostgreSQL");
    Arc::new(backend)
}

dlock_conformance::conformance_tests!(postgres);
