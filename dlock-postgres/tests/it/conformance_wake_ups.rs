//! The whole conformance suite against a real PostgreSQL, with waiters
//! woken across processes (`wake_ups(true)`: `pg_notify` on release, a
//! listener per backend).

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::{Service, shared};
use dlock_core::Backend;
use dlock_postgres::PgBackend;

async fn postgres() -> Arc<dyn Backend> {
    let server = shared(Service::Postgres).await;
    let backend = PgBackend::builder(server.url())
        .wake_ups(true)
        .connect()
        .await
        .expect("connect to the test PostgreSQL");
    Arc::new(backend)
}

dlock_conformance::conformance_tests!(postgres);

// The mutex suite on the write lock and on a semaphore of one: with
// wake-ups, so that the stress cases' 10,000 queued hand-offs do not each
// wait for a poll.
dlock_conformance::shared_kind_tests!(postgres);
