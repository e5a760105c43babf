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

dlock_conformance::shared_kind_tests!(memory);
