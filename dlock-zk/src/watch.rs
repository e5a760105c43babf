//! Telling an observer that a name's holds changed: a ZooKeeper watch on
//! the children of the name's folder (its queue, holds and delayed
//! releases), or on the folder's creation while it does not exist.
//! ZooKeeper's watches fire once, so each is set again before `changed`
//! returns. A semaphore's permits live one folder down (`leases`), which
//! this watch does not see: observers of semaphores read on their timer.

use std::future::Future;
use std::pin::Pin;

use dlock_core::driver::async_trait;
use dlock_core::{NameWatch, Result};
use zookeeper_client as zk;

use crate::backend::ZkBackend;
use crate::error::zk_error;

/// A watch's firing, kept across calls of `changed` that were cancelled
/// (an observer's timer won): dropping it would remove the watch.
type Firing = Pin<Box<dyn Future<Output = zk::WatchedEvent> + Send>>;

/// A one-shot watch on a lock's folder, set again after each firing.
pub(crate) struct FolderWatch {
    backend: ZkBackend,
    dir: String,
    /// `None` only after setting it again failed (the error was returned).
    armed: Option<Firing>,
}

impl std::fmt::Debug for FolderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolderWatch")
            .field("dir", &self.dir)
            .finish()
    }
}

#[async_trait]
impl NameWatch for FolderWatch {
    async fn changed(&mut self) -> Result<()> {
        if let Some(armed) = &mut self.armed {
            // A change, or the session's end (its watches go with it):
            // either way the caller reads again.
            armed.await;
        }
        self.armed = None;
        // Set again before returning: the caller reads next, and a change
        // after this fires the new watch.
        self.armed = Some(arm(&self.backend, &self.dir).await?);
        Ok(())
    }
}

/// A watch on `dir`'s children, or on `dir` coming to be.
async fn arm(backend: &ZkBackend, dir: &str) -> Result<Firing> {
    const DOING: &str = "watch the lock";
    let client = backend.client();
    // Twice at most: a folder made between the two requests is listed on
    // the second round.
    for _ in 0..2 {
        match backend.bounded(client.list_and_watch_children(dir)).await {
            Ok((_, watcher)) => return Ok(Box::pin(watcher.changed())),
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(zk_error(e, DOING)),
        }
        match backend.bounded(client.check_and_watch_stat(dir)).await {
            // Still missing: its creation fires this watch.
            Ok((None, watcher)) => return Ok(Box::pin(watcher.changed())),
            // Made meanwhile: a data watch would miss its children.
            Ok((Some(_), _)) => {}
            Err(e) => return Err(zk_error(e, DOING)),
        }
    }
    Err(zk_error(zk::Error::NoNode, DOING))
}

impl ZkBackend {
    /// [`Driver::watch`](dlock_core::driver::Driver::watch): a watch on
    /// `name`'s folder.
    pub(crate) async fn watch_name(&self, name: &str) -> Result<Box<dyn NameWatch>> {
        let dir = self.lock_dir(name);
        let armed = arm(self, &dir).await?;
        Ok(Box::new(FolderWatch {
            backend: self.clone(),
            dir,
            armed: Some(armed),
        }))
    }
}
