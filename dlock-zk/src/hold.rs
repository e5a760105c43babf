//! Delayed release ("lock at least"): the released lock's name stays
//! locked by a persistent node, `<lock dir>/dlock-hold`, so that the hold
//! outlives the session that made it.
//!
//! Its data is `<owner> <hold ms> <fencing token>`; its `mtime`, set by the
//! leader when the node was written, starts the hold. An acquirer at the
//! front of the queue that sees the node learns the leader's clock now by
//! writing its own node (the reply's `mtime`), so the hold is judged by
//! the server's clock alone, never the clients'. An expired hold is
//! deleted by whoever finds it, version-checked.
//!
//! The node is written and the lock node deleted in one transaction, so a
//! waiter woken by the delete always sees the hold.
//!
//! A permit's hold and a reader's are nodes of their own instead, with the
//! same data (see [`crate::node_hold`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock_core::{Lease, LockInfo, OwnerToken, Result};
use zookeeper_client as zk;

use crate::backend::ZkBackend;
use crate::error::{gave_up, not_held, zk_error};

/// The hold node's name in a lock's folder. It has none of the queue's
/// markers, so no recipe queues it.
pub(crate) const HOLD_NODE: &str = "dlock-hold";

/// A hold as read from its node.
pub(crate) struct Hold {
    owner: OwnerToken,
    hold_ms: i64,
    fencing_token: u64,
    stat: zk::Stat,
}

impl Hold {
    pub(crate) fn parse(data: &[u8], stat: zk::Stat) -> Option<Hold> {
        let text = std::str::from_utf8(data).ok()?;
        let mut parts = text.split(' ');
        let owner = parts.next()?.parse().ok()?;
        let hold_ms = parts.next()?.parse().ok()?;
        let fencing_token = parts.next()?.parse().ok()?;
        Some(Hold {
            owner,
            hold_ms,
            fencing_token,
            stat,
        })
    }

    /// When the hold ends, in the leader's epoch milliseconds.
    pub(crate) fn ends_at(&self) -> i64 {
        self.stat.mtime.saturating_add(self.hold_ms)
    }

    /// The holder as `inspect` shows it. The time left is judged by this
    /// machine's clock against the leader's, so it is approximate; acquirers
    /// do not use it.
    pub(crate) fn info(&self) -> Option<LockInfo> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
        let now_ms = i64::try_from(now.as_millis()).ok()?;
        let left = u64::try_from(self.ends_at().saturating_sub(now_ms)).ok()?;
        (left > 0).then(|| {
            LockInfo::new(
                self.owner,
                self.fencing_token,
                Some(Duration::from_millis(left)),
            )
        })
    }
}

pub(crate) fn hold_path(dir: &str) -> String {
    format!("{dir}/{HOLD_NODE}")
}

impl ZkBackend {
    /// The hold of `dir`, if its node exists and is one of ours.
    pub(crate) async fn read_hold(&self, client: &zk::Client, dir: &str) -> Result<Option<Hold>> {
        self.read_hold_at(client, &hold_path(dir)).await
    }

    /// The hold whose node is `path`: a lock's or a permit's.
    pub(crate) async fn read_hold_at(
        &self,
        client: &zk::Client,
        path: &str,
    ) -> Result<Option<Hold>> {
        match self.bounded(client.get_data(path)).await {
            Ok((data, stat)) => Ok(Hold::parse(&data, stat)),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(zk_error(e, "read the lock's hold")),
        }
    }

    /// Deletes the hold whose node is `path` (a lock's or a permit's)
    /// whatever its state (a forced release); returns it if it was still
    /// keeping the lock.
    pub(crate) async fn delete_hold(
        &self,
        client: &zk::Client,
        path: &str,
    ) -> Result<Option<LockInfo>> {
        let hold = self.read_hold_at(client, path).await?;
        match self.bounded(client.delete(path, None)).await {
            Ok(()) | Err(zk::Error::NoNode) => Ok(hold.and_then(|h| h.info())),
            Err(e) => Err(zk_error(e, "delete the lock's hold")),
        }
    }

    /// How long the hold of `dir` still keeps the lock, by the leader's
    /// clock; `None` when there is none (an expired one is deleted). `node`
    /// is written (with `data`, what it holds: a queue node's holder
    /// description) to learn the leader's time: our queue node, or the
    /// lock's folder.
    pub(crate) async fn hold_left(
        &self,
        client: &zk::Client,
        dir: &str,
        (node, data): (&str, &[u8]),
    ) -> Result<Option<Duration>> {
        let Some(hold) = self.read_hold(client, dir).await? else {
            return Ok(None);
        };
        let now = match self.bounded(client.set_data(node, data, None)).await {
            Ok(stat) => stat.mtime,
            Err(e) => return Err(zk_error(e, "read the server's clock")),
        };
        let left = hold.ends_at().saturating_sub(now);
        if left > 0 {
            return Ok(u64::try_from(left).ok().map(Duration::from_millis));
        }
        match self
            .bounded(client.delete(&hold_path(dir), Some(hold.stat.version)))
            .await
        {
            Ok(()) | Err(zk::Error::NoNode) => Ok(None),
            // Rewritten meanwhile: a new hold, to be looked at again.
            Err(zk::Error::BadVersion) => Ok(Some(Duration::ZERO)),
            Err(e) => Err(zk_error(e, "delete an ended hold")),
        }
    }

    /// Sleeps until the hold of `dir` changes or goes (a forced release),
    /// or `left` (its time left, capped by the caller's deadline) passes.
    pub(crate) async fn wait_for_hold(
        &self,
        client: &zk::Client,
        dir: &str,
        left: Duration,
    ) -> Result<()> {
        let watcher = match self
            .bounded(client.check_and_watch_stat(&hold_path(dir)))
            .await
        {
            Ok((_, watcher)) => watcher,
            Err(e) => return Err(zk_error(e, "watch the lock's hold")),
        };
        tokio::select! {
            _ = watcher.changed() => {}
            () = tokio::time::sleep(left) => {}
        }
        Ok(())
    }

    /// Commits a hold's transaction within the request timeout: `Err`
    /// when no answer came in time (its outcome unknown), a failure as the
    /// client's multi error and the error it stands for.
    pub(crate) async fn commit_within(
        &self,
        txn: &mut zk::MultiWriter<'_>,
    ) -> Result<Result<(), (zk::MultiWriteError, zk::Error)>, tokio::time::error::Elapsed> {
        let commit = txn.commit();
        tokio::time::timeout(dlock_core::driver::Driver::request_timeout(self), async {
            match commit.await {
                Ok(_) => Ok(()),
                Err(e) => Err((e.clone(), zk::Error::from(e))),
            }
        })
        .await
    }

    /// Writes the hold and deletes the lease's node in one transaction.
    pub(crate) async fn write_hold(&self, lease: &Lease, node: &str, hold: Duration) -> Result<()> {
        let dir = self.lock_dir(lease.name());
        let path = hold_path(&dir);
        // Rounded up: the hold is a minimum.
        let hold_ms = dlock_core::driver::millis_up(hold);
        let data = format!("{} {hold_ms} {}", lease.owner(), lease.fencing_token());
        let client = self.client();
        let create = zk::CreateMode::Persistent.with_acls(self.acls());
        for _ in 0..3 {
            let existing = match self.bounded(client.check_stat(&path)).await {
                Ok(stat) => stat,
                Err(e) => return Err(zk_error(e, "read the lock's hold")),
            };
            let mut txn = client.new_multi_writer();
            let staged = match existing {
                Some(stat) => txn.add_set_data(&path, data.as_bytes(), Some(stat.version)),
                None => txn.add_create(&path, data.as_bytes(), &create),
            };
            staged
                .and_then(|()| txn.add_delete(node, None))
                .map_err(|e| zk_error(e, "write the lock's hold"))?;
            match self.commit_within(&mut txn).await {
                Ok(Ok(_)) => {
                    self.delete_hold_later(dir, hold);
                    return Ok(());
                }
                // Our lock node is gone: the lease had ended.
                Ok(Err((
                    zk::MultiWriteError::OperationFailed {
                        index: 1,
                        source: zk::Error::NoNode,
                    },
                    _,
                ))) => return Err(not_held(lease)),
                Ok(Err((_, zk::Error::SessionExpired))) => return Err(not_held(lease)),
                // The hold node changed between the look and the write (an
                // ended hold deleted by someone else): look again.
                Ok(Err((
                    zk::MultiWriteError::OperationFailed {
                        index: 0,
                        source: zk::Error::NoNode | zk::Error::NodeExists | zk::Error::BadVersion,
                    },
                    _,
                ))) => {}
                Ok(Err((_, e))) => return Err(zk_error(e, "release_after")),
                Err(_) => return Err(zk_error(zk::Error::ConnectionLoss, "release_after")),
            }
        }
        Err(gave_up(format!("the hold of {dir} kept changing")))
    }

    /// Deletes the hold node once it has ended, if this client is still
    /// there then, so that a name used once (a job occurrence) leaves
    /// nothing behind. If it is not, the node stays until the name's next
    /// acquirer deletes it.
    fn delete_hold_later(&self, dir: String, hold: Duration) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::downgrade(&self.inner);
        rt.spawn(async move {
            // A little past the end; whether it has ended is then judged by
            // the leader's clock.
            tokio::time::sleep(hold.saturating_add(Duration::from_millis(100))).await;
            let Some(inner) = inner.upgrade() else {
                return;
            };
            let backend = ZkBackend { inner };
            if let Err(e) = backend.delete_ended_hold(&dir).await {
                tracing::debug!(%dir, error = %e, "could not delete an ended hold");
            }
        });
    }

    /// Deletes the hold of `dir` if it has ended by the leader's clock,
    /// which a write to the lock's folder itself tells.
    async fn delete_ended_hold(&self, dir: &str) -> Result<()> {
        self.hold_left(&self.client(), dir, (dir, &[]))
            .await
            .map(drop)
    }
}
