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

/// The mutex suite again, on the write lock.
mod write_lock {
    use super::*;

    async fn redis_write_lock() -> Arc<dyn Backend> {
        Arc::new(dlock_conformance::MutexAs::write_lock(redis().await))
    }

    dlock_conformance::conformance_tests!(redis_write_lock);
}

/// The mutex suite again, on a semaphore of one permit.
mod one_permit {
    use super::*;

    async fn redis_one_permit() -> Arc<dyn Backend> {
        Arc::new(dlock_conformance::MutexAs::one_permit(redis().await))
    }

    dlock_conformance::conformance_tests!(redis_one_permit);
}
