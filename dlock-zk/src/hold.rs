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
//! same data, in the place of the lease's node: a permit's in its
//! semaphore's lease folder, a reader's in the queue with the reader's
//! sequence number, so that other readers still share with it.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock_core::{Lease, LockInfo, OwnerToken, Result};
use zookeeper_client as zk;

use crate::backend::ZkBackend;
use crate::error::{gave_up, not_held, zk_error};
use crate::path::read_hold_node;

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
    fn ends_at(&self) -> i64 {
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

/// The prefix of a permit's hold in its semaphore's lease folder
/// (`dlock-hold-<N>-<owner>`, N the semaphore's size): a persistent node
/// that counts as a lease, for Curator's semaphores too, until it has
/// ended and someone deletes it.
pub(crate) const PERMIT_HOLD: &str = "dlock-hold-";

/// The semaphore size a permit's hold node names.
pub(crate) fn hold_permits(node: &str) -> Option<u32> {
    node.strip_prefix(PERMIT_HOLD)?
        .split_once('-')?
        .0
        .parse()
        .ok()
}

/// What a look at a semaphore's permit holds found.
pub(crate) enum PermitHolds {
    /// None has ended: the first to end does so in this long.
    Left(Duration),
    /// Some had ended, and are deleted: the leases changed.
    Deleted,
    /// There are none.
    None,
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

    /// The permit holds (or a reader's hold) `held` in the folder
    /// `leases`, ended ones deleted: the server's clock is learned by
    /// writing `node` (ours) with `data`, what it holds.
    pub(crate) async fn permit_holds(
        &self,
        client: &zk::Client,
        leases: &str,
        held: &[String],
        (node, data): (&str, &[u8]),
    ) -> Result<PermitHolds> {
        let mut holds = Vec::new();
        for name in held {
            let path = format!("{leases}/{name}");
            match self.bounded(client.get_data(&path)).await {
                // One that does not read is taken for ended (we write
                // every one): a hold nobody can judge would never end.
                Ok((data, stat)) => holds.push((path, Hold::parse(&data, stat), stat.version)),
                Err(zk::Error::NoNode) => return Ok(PermitHolds::Deleted),
                Err(e) => return Err(zk_error(e, "read a permit's hold")),
            }
        }
        if holds.is_empty() {
            return Ok(PermitHolds::None);
        }
        let now = match self.bounded(client.set_data(node, data, None)).await {
            Ok(stat) => stat.mtime,
            Err(e) => return Err(zk_error(e, "read the server's clock")),
        };
        let mut first_end = None;
        let mut deleted = false;
        for (path, hold, version) in holds {
            let left = hold.map_or(0, |h| h.ends_at().saturating_sub(now));
            if left > 0 {
                let left = u64::try_from(left).map_or(Duration::MAX, Duration::from_millis);
                first_end = Some(first_end.map_or(left, |f: Duration| f.min(left)));
                continue;
            }
            match self.bounded(client.delete(&path, Some(version))).await {
                Ok(()) | Err(zk::Error::NoNode | zk::Error::BadVersion) => deleted = true,
                Err(e) => return Err(zk_error(e, "delete an ended hold")),
            }
        }
        Ok(match (deleted, first_end) {
            (true, _) => PermitHolds::Deleted,
            (false, Some(left)) => PermitHolds::Left(left),
            (false, None) => PermitHolds::None,
        })
    }

    /// A permit's delayed release: its lease node becomes a persistent
    /// hold in the same folder, in one transaction, so that it still
    /// counts against the semaphore (for Curator's clients too) until
    /// `hold` has passed by the server's clock.
    pub(crate) async fn write_permit_hold(
        &self,
        lease: &Lease,
        node: &str,
        hold: Duration,
    ) -> Result<()> {
        let Some((leases, _)) = node.rsplit_once('/') else {
            return Err(not_held(lease));
        };
        let permits = lease.mode().permits();
        let path = format!("{leases}/{PERMIT_HOLD}{permits}-{}", lease.owner());
        self.replace_with_hold(lease, node, path, hold).await
    }

    /// A reader's delayed release: its node becomes a persistent read node
    /// with the same sequence number ([`read_hold_node`]), in one
    /// transaction, so that it keeps its place in the queue. Every recipe
    /// (ours, Curator's, kazoo's) sees a reader there: writers wait for it,
    /// readers share with it, until `hold` has passed by the server's clock
    /// and someone deletes it (this client, or any dlock acquirer that
    /// finds it ended; see `wait`). Its data is a hold's.
    pub(crate) async fn write_read_hold(
        &self,
        lease: &Lease,
        node: &str,
        hold: Duration,
    ) -> Result<()> {
        let Some((dir, name)) = node.rsplit_once('/') else {
            return Err(not_held(lease));
        };
        let held = read_hold_node(lease.owner().for_hold(), name).ok_or_else(|| not_held(lease))?;
        self.replace_with_hold(lease, node, format!("{dir}/{held}"), hold)
            .await
    }

    /// Replaces the lease's `node` with the persistent hold `path`, and
    /// deletes the hold once it has ended.
    async fn replace_with_hold(
        &self,
        lease: &Lease,
        node: &str,
        path: String,
        hold: Duration,
    ) -> Result<()> {
        let Some((folder, _)) = path.rsplit_once('/') else {
            return Err(not_held(lease));
        };
        let hold_ms = dlock_core::millis_up(hold);
        let data = format!("{} {hold_ms} {}", lease.owner(), lease.fencing_token());
        let client = self.client();
        let create = zk::CreateMode::Persistent.with_acls(self.acls());
        let mut txn = client.new_multi_writer();
        txn.add_create(&path, data.as_bytes(), &create)
            .and_then(|()| txn.add_delete(node, None))
            .map_err(|e| zk_error(e, "write the hold"))?;
        let outcome = self.commit_within(&mut txn).await;
        if matches!(outcome, Ok(Ok(())) | Err(_)) {
            // Written, or maybe (no answer): deleted once ended.
            self.delete_node_hold_later(folder.to_owned(), path, hold);
        }
        match outcome {
            Ok(Ok(())) => Ok(()),
            // Our lease node is gone, already a hold, or its folder gone
            // with it: released.
            Ok(Err((
                zk::MultiWriteError::OperationFailed {
                    index: 1,
                    source: zk::Error::NoNode,
                }
                | zk::MultiWriteError::OperationFailed {
                    index: 0,
                    source: zk::Error::NodeExists | zk::Error::NoNode,
                },
                _,
            ))) => Err(not_held(lease)),
            Ok(Err((_, zk::Error::SessionExpired))) => Err(not_held(lease)),
            Ok(Err((_, e))) => Err(zk_error(e, "release_after")),
            Err(_) => Err(zk_error(zk::Error::ConnectionLoss, "release_after")),
        }
    }

    /// Deletes a permit's or a reader's hold once it has ended, if this
    /// client is still there then (else the next acquirer that waits for
    /// it does).
    fn delete_node_hold_later(&self, leases: String, path: String, hold: Duration) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = Arc::downgrade(&self.inner);
        rt.spawn(async move {
            let name = path.rsplit('/').next().unwrap_or_default().to_owned();
            let mut wait = hold.saturating_add(Duration::from_millis(100));
            // Until it is gone: the leader's clock may be behind ours.
            for _ in 0..10 {
                tokio::time::sleep(wait).await;
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let backend = ZkBackend { inner };
                let client = backend.client();
                // The server's clock, from a write to the lease folder.
                let looked = backend
                    .permit_holds(
                        &client,
                        &leases,
                        std::slice::from_ref(&name),
                        (&leases, &[]),
                    )
                    .await;
                wait = match looked {
                    Ok(PermitHolds::Left(left)) => left.saturating_add(Duration::from_millis(100)),
                    Ok(PermitHolds::Deleted | PermitHolds::None) => return,
                    Err(e) => {
                        tracing::debug!(%path, error = %e, "could not delete an ended hold");
                        Duration::from_secs(1)
                    }
                };
            }
        });
    }

    /// Commits a hold's transaction within the request timeout: `Err`
    /// when no answer came in time (its outcome unknown), a failure as the
    /// client's multi error and the error it stands for.
    async fn commit_within(
        &self,
        txn: &mut zk::MultiWriter<'_>,
    ) -> Result<Result<(), (zk::MultiWriteError, zk::Error)>, tokio::time::error::Elapsed> {
        let commit = txn.commit();
        tokio::time::timeout(self.request_timeout(), async {
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
        let hold_ms = dlock_core::millis_up(hold);
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
