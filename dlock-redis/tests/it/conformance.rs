//! The whole conformance suite against a real Redis in a container.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::{Service, shared};
use dlock_core::Backend;
use dlock_redis::RedisBackend;

async fn redis() -> Arc<dyn Backend> {
    let server = shared(Service::Redis).await;
    Arc::new(
        RedisBackend::connect(server.url())
            .await
            .expect("connect to the test Redis"),
    )
}

dlock_conformance::conformance_tests!(redis);

dlock_conformance::shared_kind_tests!(redis);
