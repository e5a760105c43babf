//! The whole conformance suite against a real MariaDB, with waiters woken
//! across processes (`wake_ups(true)`): they sleep in the server and
//! releases end their sleep with `KILL QUERY`; and the mutex suite again
//! on the write lock and the semaphore of one.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::{Service, shared};
use dlock_core::Backend;
use dlock_mysql::MySqlBackend;

async fn mariadb() -> Arc<dyn Backend> {
    let server = shared(Service::MariaDb).await;
    let backend = MySqlBackend::builder(server.url())
        .wake_ups(true)
        // Waiters without a free sleeper connection poll: often, so that
        // the stress cases hand over quickly.
        .max_poll_interval(std::time::Duration::from_millis(100))
        .connect()
        .await
        .expect("connect to the test MariaDB");
    backend.migrate().await.expect("migrate");
    Arc::new(backend)
}

dlock_conformance::conformance_tests!(mariadb);
dlock_conformance::shared_kind_tests!(mariadb);
