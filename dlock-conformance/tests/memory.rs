//! The whole suite against the in-memory reference driver: no Docker needed.

use std::sync::{Arc, LazyLock};

use dlock_core::{Backend, MemoryBackend};

/// One lock space for every client, as one server would be; each test uses
/// its own lock names.
static SPACE: LazyLock<MemoryBackend> = LazyLock::new(MemoryBackend::new);

async fn memory() -> Arc<dyn Backend> {
    Arc::new(SPACE.clone())
}

dlock_conformance::conformance_tests!(memory);

/// The mutex suite again, on the write lock.
mod write_lock {
    use super::*;

    async fn memory_write_lock() -> Arc<dyn Backend> {
        Arc::new(dlock_conformance::MutexAs::write_lock(memory().await))
    }

    dlock_conformance::conformance_tests!(memory_write_lock);
}

/// The mutex suite again, on a semaphore of one permit.
mod one_permit {
    use super::*;

    async fn memory_one_permit() -> Arc<dyn Backend> {
        Arc::new(dlock_conformance::MutexAs::one_permit(memory().await))
    }

    dlock_conformance::conformance_tests!(memory_one_permit);
}
