//! The whole conformance suite against a real MariaDB in a container.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::{Service, shared};
use dlock_core::Backend;
use dlock_mysql::MySqlBackend;

async fn mariadb() -> Arc<dyn Backend> {
    let server = shared(Service::MariaDb).await;
    let backend = MySqlBackend::builder(server.url())
        // Waiters across processes learn of their turn when they poll:
        // often, so that the stress cases hand over quickly.
        .max_poll_interval(std::time::Duration::from_millis(100))
        .connect()
        .await
        .expect("connect to the test MariaDB");
    backend.migrate().await.expect("migrate");
    Arc::new(backend)
}

dlock_conformance::conformance_tests!(mariadb);
