//! Telling an observer that a name's holds changed: a ZooKeeper watch on
//! the children of the name's folder (its queue, holds and delayed
//! releases), or on the folder's creation while it does not exist.
//! ZooKeeper's watches fire once, so each is set again before `changed`
//! returns.

use dlock_core::driver::async_trait;
use dlock_core::{NameWatch, Result};
use zookeeper_client as zk;

use crate::backend::ZkBackend;
use crate::error::zk_error;

/// A one-shot watch on a lock's folder, set again after each firing.
pub(crate) struct FolderWatch {
    backend: ZkBackend,
    dir: String,
    /// `None` only while it is being set again.
    armed: Option<zk::OneshotWatcher>,
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
        if let Some(armed) = self.armed.take() {
            // A change, or the session's end (its watches go with it):
            // either way the caller reads again.
            armed.changed().await;
        }
        // Set again before returning: the caller reads next, and a change
        // after this fires the new watch.
        self.armed = Some(arm(&self.backend, &self.dir).await?);
        Ok(())
    }
}

/// A watch on `dir`'s children, or on `dir` coming to be.
async fn arm(backend: &ZkBackend, dir: &str) -> Result<zk::OneshotWatcher> {
    let client = backend.client();
    match backend.bounded(client.list_and_watch_children(dir)).await {
        Ok((_, watcher)) => Ok(watcher),
        Err(zk::Error::NoNode) => match backend.bounded(client.check_and_watch_stat(dir)).await {
            Ok((_, watcher)) => Ok(watcher),
            Err(e) => Err(zk_error(e, "watch the lock")),
        },
        Err(e) => Err(zk_error(e, "watch the lock")),
    }
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
