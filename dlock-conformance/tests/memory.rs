//! The whole suite against the in-memory reference driver: no Docker needed.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_core::{Backend, MemoryBackend};

async fn memory() -> Arc<dyn Backend> {
    Arc::new(MemoryBackend::new())
}

dlock_conformance::conformance_tests!(memory);
