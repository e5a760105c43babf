//! The whole conformance suite against a real MariaDB, with waiters woken
//! across processes (`wake_ups(true)`): they sleep in the server and
//! releases end their sleep with `KILL QUERY`.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::{Service, shared};
use dlock_core::Backend;
use dlock_mysql::MySqlBackend;

async fn mariadb() -> Arc<dyn Backend> {
    let server = shared(Service::MariaDb).await;
    let backend = MySqlBackend::builder(server.url())
        .wake_ups(true)
        // The shared kinds' waiters poll (the wake-ups are the mutex's):
        // often, so that their stress case hands over quickly.
        .max_poll_interval(std::time::Duration::from_millis(100))
        .connect()
        .await
        .expect("connect to the test MariaDB");
    backend.migrate().await.expect("migrate");
    Arc::new(backend)
}

dlock_conformance::conformance_tests!(mariadb);
dlock_conformance::shared_kind_tests!(mariadb);
