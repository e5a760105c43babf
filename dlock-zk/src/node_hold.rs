//! Holds that are nodes of their own, in the place of the lease's node: a
//! permit's hold in its semaphore's lease folder (so that it still counts
//! against the semaphore, for Curator's clients too), and a reader's in
//! the lock's queue with the reader's sequence number (so that readers still
//! share with it and writers wait for it). Their data is a hold's (see
//! [`crate::hold`]), judged by the server's clock; whoever finds one ended
//! deletes it.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Lease, Result};
use zookeeper_client as zk;

use crate::backend::ZkBackend;
use crate::error::{not_held, zk_error};
use crate::hold::Hold;
use crate::path::read_hold_node;

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
        let hold_ms = dlock_core::driver::millis_up(hold);
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
}
