//! Telling an observer that a name's holds changed: etcd's watch on the
//! name's keys (its holds and its waiters).

use dlock_core::driver::async_trait;
use dlock_core::{NameWatch, Result};
use futures_util::FutureExt;

use crate::backend::EtcdBackend;
use crate::client::Watch;
use crate::key::name_span;

/// A watch on one name's keys, open until dropped.
pub(crate) struct KeysWatch(Watch);

impl std::fmt::Debug for KeysWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeysWatch")
    }
}

#[async_trait]
impl NameWatch for KeysWatch {
    async fn changed(&mut self) -> Result<()> {
        // The stream stays open between calls: a change made while the
        // caller read is the next reply.
        self.0.changes().await?;
        // Replies queued already are covered by the read that follows.
        while let Some(more) = self.0.changes().now_or_never() {
            more?;
        }
        Ok(())
    }
}

impl EtcdBackend {
    /// [`Driver::watch`](dlock_core::driver::Driver::watch): a watch on
    /// `name`'s key ranges, from now on. It may also fire for names that
    /// continue `name` with a byte below `/` (see `name_span`): the caller
    /// reads again, and finds nothing new.
    pub(crate) async fn watch_name(&self, name: &str) -> Result<Box<dyn NameWatch>> {
        let range = name_span(&self.inner.prefix, name);
        Ok(Box::new(KeysWatch(self.client().watch(range).await?)))
    }
}
