//! Giving lock nodes back: a release, the deletes that wait for a
//! reconnect, and the undo of an acquire cut short.
//!
//! The undo is core's `UndoOnDrop`, armed twice per acquire: before the
//! create (when dropped, the node is looked for by its protected prefix,
//! since a create whose reply never came may have landed, or may land
//! after a reconnect) and once the node is known (when dropped, it is
//! deleted).

use std::sync::PoisonError;
use std::time::Duration;

use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::driver::wait::Backoff;
use dlock_core::{Error, Lease, Mode, Result};
use tokio::time::{Instant, sleep};
use zookeeper_client as zk;

use crate::acquire::Place;
use crate::backend::ZkBackend;
use crate::error::{not_held, zk_error};

/// A create whose outcome is unknown; see `Inner::uncertain`.
pub(crate) struct Uncertain {
    dir: String,
    prefix: String,
    since: Instant,
}

impl ZkBackend {
    /// Deletes the lease's node. A delete that fails for want of a
    /// connection is retried on reconnect, though the caller hears of the
    /// failure.
    pub(crate) async fn delete_lease(&self, lease: &Lease) -> Result<()> {
        let path = self.node_of(lease).ok_or_else(|| not_held(lease))?;
        match self.bounded(self.client().delete(path, None)).await {
            Ok(()) => {
                self.forget_lease_node(path);
                Ok(())
            }
            Err(zk::Error::NoNode | zk::Error::SessionExpired) => {
                self.forget_lease_node(path);
                Err(not_held(lease))
            }
            Err(e) => {
                self.inner
                    .orphans
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(path.to_owned());
                Err(zk_error(e, "release"))
            }
        }
    }

    /// Releases the lease so that its lock stays held for `hold` more
    /// (see [`crate::hold`]).
    pub(crate) async fn release_holding(&self, lease: &Lease, hold: Duration) -> Result<()> {
        if hold.is_zero() {
            return self.delete_lease(lease).await;
        }
        let node = self.node_of(lease).ok_or_else(|| not_held(lease))?;
        // A lost lease holds nothing to keep: its node only goes.
        if lease.lost_token().is_cancelled() {
            self.delete_lease(lease).await?;
            return Err(not_held(lease));
        }
        let released = match lease.mode() {
            Mode::Permit(_) => self.write_permit_hold(lease, node, hold).await,
            Mode::Read => self.write_read_hold(lease, node, hold).await,
            _ => self.write_hold(lease, node, hold).await,
        };
        // The node is gone, or a hold now; otherwise it may still stand.
        if matches!(&released, Ok(()) | Err(Error::NotHeld { .. })) {
            self.forget_lease_node(node);
        }
        released
    }

    /// Deletes a lock node, remembering it for the next reconnect when the
    /// connection is down.
    pub(crate) async fn delete_node(&self, path: String) {
        match self.bounded(self.client().delete(&path, None)).await {
            // A lease's node (a semaphore's gate) too: not one to give up.
            Ok(()) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => {
                self.forget_lease_node(&path);
            }
            Err(e) => {
                tracing::debug!(%path, error = %e, "delete failed; retrying on reconnect");
                self.inner
                    .orphans
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(path);
            }
        }
    }

    /// Deletes the nodes whose delete failed for want of a connection.
    pub(crate) async fn delete_orphans(&self) {
        let orphans = std::mem::take(
            &mut *self
                .inner
                .orphans
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for path in orphans {
            self.delete_node(path).await;
        }
    }

    /// Looks for the nodes of creates whose outcome is unknown and deletes
    /// those it finds. Keeps looking (on each call) for up to two session
    /// timeouts: a create queued while disconnected reaches the server
    /// after the reconnect. Returns whether any is left to look for.
    pub(crate) async fn resolve_uncertain(&self) -> bool {
        let pending = std::mem::take(
            &mut *self
                .inner
                .uncertain
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let client = self.client();
        // All at once: a session's requests are pipelined, so a pass costs
        // the round trips of one search, not one search per pending create.
        // One after another, the searches for many dropped acquires (each
        // a sync, a listing and a look) left a found node in place for
        // seconds over a slow link, holding its name.
        let found = futures_util::future::join_all(pending.into_iter().map(|u| {
            let client = &client;
            async move {
                let found = self.find_own(client, &u.dir, &u.prefix).await;
                (u, found)
            }
        }))
        .await;
        let mut left = Vec::new();
        let mut deletes = Vec::new();
        for (u, found) in found {
            match found {
                Ok(Some((path, _))) => deletes.push(self.delete_node(path)),
                Ok(None) if u.since.elapsed() > self.inner.config.session_timeout * 2 => {}
                Ok(None) | Err(_) => left.push(u),
            }
        }
        futures_util::future::join_all(deletes).await;
        let any = !left.is_empty();
        self.inner
            .uncertain
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(left);
        any
    }

    /// Drops every pending delete and search: a new session replaced the
    /// one whose nodes they were, and those nodes went with it.
    pub(crate) fn forget_cleanups(&self) {
        self.inner
            .orphans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.inner
            .uncertain
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The undo of a create about to be sent to `dir` with `prefix`: if
    /// dropped armed, the node is looked for until found or hopeless.
    pub(crate) fn undo_create(&self, dir: &str, prefix: &str) -> UndoOnDrop {
        let (backend, dir, prefix) = (self.clone(), dir.to_owned(), prefix.to_owned());
        UndoOnDrop::new(async move {
            backend
                .inner
                .uncertain
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Uncertain {
                    dir,
                    prefix,
                    since: Instant::now(),
                });
            let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
            while backend.resolve_uncertain().await {
                sleep(backoff.next_delay()).await;
            }
        })
    }

    /// The undo of a queue place whose node is `path`: deleted if dropped
    /// armed.
    pub(crate) fn undo_node(&self, path: &str) -> UndoOnDrop {
        let (backend, path) = (self.clone(), path.to_owned());
        UndoOnDrop::new(async move { backend.delete_node(path).await })
    }

    /// Leaves the queue: deletes the node, and disarms its undo only once
    /// the delete is done, so that a caller dropping this midway still has
    /// the node deleted.
    pub(crate) async fn leave(&self, place: Place) {
        let Place { path, mut undo, .. } = place;
        self.delete_node(path).await;
        undo.disarm();
    }
}
