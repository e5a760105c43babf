//! Semaphores in Curator's `InterProcessSemaphoreV2` layout, so that a
//! Curator semaphore and a dlock one on the same path share their permits:
//!
//! - `<lock dir>/locks/`: a mutex (Curator's `-lock-` nodes) that orders
//!   the acquirers, first come first served;
//! - `<lock dir>/leases/`: one ephemeral node per permit held, and the
//!   one of the acquirer at the gate, which holds the mutex while it waits
//!   until the folder has at most N children, counting its own.
//!
//! Only the acquirer at the gate waits on the leases, so a release wakes
//! one waiter, never the herd. Our lease nodes are
//! `_c_<uuid>-__PERM<N>__<seq>`: the count in the name lets two dlock
//! clients that disagree on N meet as a conflict (Curator's nodes,
//! `_c_<uuid>-lease-<seq>`, do not say theirs, and count as permits of
//! whatever N the asker has). A semaphore's leases and a mutex's or
//! reader-writer lock's nodes on one name are a conflict too: each side
//! looks for the other after its own node exists, so of two racing, at
//! least one is refused (either may be: an acquirer waiting at the gate
//! has no lease node yet).
//!
//! A permit's token is drawn at its grant (see `grant`), as every shared
//! kind's is.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::driver::wait::Deadline;
use dlock_core::{Error, Lease, Mode, Result};
use tokio::time::sleep;
use zookeeper_client as zk;

use crate::acquire::{Place, Queue, sorted_queue};
use crate::backend::{NAME, ZkBackend};
use crate::error::{node_vanished, zk_error};
use crate::node_hold::{PermitHolds, hold_permits};
use crate::path::{Node, is_read_hold, parse};

/// The folder of a semaphore's permits in its lock folder.
pub(crate) const LEASES: &str = "leases";

/// The folder of the mutex that orders a semaphore's acquirers.
const GATE: &str = "locks";

impl ZkBackend {
    /// Waits for a permit of a semaphore of `permits` on `name` until
    /// `deadline` (`None`: one look, and no permit if another acquirer is
    /// at the gate then, as with Curator's own).
    pub(crate) async fn contend_permit(
        &self,
        name: &str,
        permits: u32,
        holder: &str,
        deadline: Option<Deadline>,
    ) -> Result<Option<Lease>> {
        let dir = self.lock_dir(name);
        let gate_dir = format!("{dir}/{GATE}");
        let Some(gate) = self
            .queue_for(name, gate_dir, Mode::Exclusive, holder, deadline)
            .await?
        else {
            return Ok(None);
        };
        let gate_path = gate.handle().unwrap_or_default().to_owned();
        let mut gate_undo = self.undo_node(&gate_path);
        let got = match self
            .take_permit(name, &dir, permits, holder, &gate, deadline)
            .await
        {
            Ok(Some((client, mut place))) => {
                // Our token is drawn before the gate is left (a session's
                // requests are sent, and applied, in call order, and
                // `join!` sends the grant's first): the next acquirer,
                // let in by the gate's delete, draws a higher one. One
                // round trip for both.
                let node = (place.owner, place.path.as_str(), place.fencing_token);
                let mode = Mode::Permit(permits);
                let (granted, ()) = tokio::join!(
                    self.grant(&client, name, mode, holder, node),
                    self.delete_node(gate_path)
                );
                // Dropped before here, the place's undo deletes the lease
                // node: the caller never saw it.
                if granted.is_ok() {
                    place.undo.disarm();
                }
                granted.map(Some)
            }
            other => {
                // Out of the gate whatever happened: the next one's turn.
                self.delete_node(gate_path).await;
                other.map(|_| None)
            }
        };
        gate_undo.disarm();
        got
    }

    /// At the gate: takes a lease node and waits until the leases fit;
    /// returns the place to grant. Only while the gate's session lasts: a gate lost meanwhile lets the
    /// next acquirer in beside us, and two acquirers waiting on the leases
    /// at once could each wait for the other.
    async fn take_permit(
        &self,
        name: &str,
        dir: &str,
        permits: u32,
        holder: &str,
        gate: &Lease,
        deadline: Option<Deadline>,
    ) -> Result<Option<(Arc<zk::Client>, Place)>> {
        let gate_lost = || {
            Error::connection(
                NAME,
                "the session was lost at the semaphore's gate",
                zk::Error::SessionExpired,
            )
        };
        let client = self.client();
        if gate.lost_token().is_cancelled() {
            return Err(gate_lost());
        }
        let mode = Mode::Permit(permits);
        let mut place = self
            .join(&client, format!("{dir}/{LEASES}"), mode, holder)
            .await?;
        loop {
            // The listing sent with the create (see `join`) for the first
            // look; a watch comes only with a listing of our own, and a
            // wait needs one.
            let first = place.listed.take();
            let (leases, watcher) = match first.filter(|q| q.nodes.contains(&place.node)) {
                Some(leases) => (leases, None),
                None => match self
                    .bounded(client.list_and_watch_children(&place.dir))
                    .await
                {
                    Ok((children, watcher)) => (sorted_queue(children), Some(watcher)),
                    Err(e) => return Err(zk_error(e, "watch the semaphore's leases")),
                },
            };
            if !leases.nodes.contains(&place.node) {
                return Err(node_vanished());
            }
            if let Some(held) = disagreeing(&leases, permits) {
                return self.conflict(place, name, held, mode).await;
            }
            if u32::try_from(leases.children).is_ok_and(|n| n <= permits) {
                // The leases fit; the name may still be a lock of another
                // kind, or held after a delayed release.
                let lock = self.queue(&client, dir).await?;
                // A reader's delayed release that has ended is no reader.
                let holds: Vec<String> = lock
                    .nodes
                    .iter()
                    .take(1)
                    .filter(|n| is_read_hold(n))
                    .cloned()
                    .collect();
                if !holds.is_empty() {
                    let ours = (place.path.as_str(), holder.as_bytes());
                    if let PermitHolds::Deleted =
                        self.permit_holds(&client, dir, &holds, ours).await?
                    {
                        continue;
                    }
                }
                if let Some(front) = lock.nodes.first().and_then(|n| parse(n)) {
                    return self
                        .conflict(place, name, front.0.mode_for(mode), mode)
                        .await;
                }
                let left = if lock.hold {
                    self.hold_left(&client, dir, (&place.path, holder.as_bytes()))
                        .await?
                } else {
                    None
                };
                let Some(left) = left else {
                    if gate.lost_token().is_cancelled() {
                        return Err(gate_lost());
                    }
                    return Ok(Some((client, place)));
                };
                let Some(deadline) = deadline.filter(|d| !d.is_past()) else {
                    return self.give_up(place, name, deadline).await;
                };
                self.wait_for_hold(&client, dir, deadline.cap(left)).await?;
                continue;
            }
            // Full: an ended permit hold among the leases is deleted, and
            // a standing one ends the wait at its end at the latest.
            let mut until = Duration::MAX;
            if !leases.held.is_empty() {
                match self
                    .permit_holds(
                        &client,
                        &place.dir,
                        &leases.held,
                        (&place.path, holder.as_bytes()),
                    )
                    .await?
                {
                    PermitHolds::Deleted => continue,
                    PermitHolds::Left(left) => until = left,
                    PermitHolds::None => {}
                }
            }
            let Some(deadline) = deadline.filter(|d| !d.is_past()) else {
                return self.give_up(place, name, deadline).await;
            };
            let Some(watcher) = watcher else {
                continue;
            };
            tokio::select! {
                _ = watcher.changed() => {}
                () = sleep(deadline.cap(until)) => {
                    if deadline.is_past() {
                        return self.give_up(place, name, Some(deadline)).await;
                    }
                }
            }
        }
    }

    /// Leaves without a permit: none free at a look (`None`), or the
    /// deadline passed.
    async fn give_up<T>(
        &self,
        place: Place,
        name: &str,
        deadline: Option<Deadline>,
    ) -> Result<Option<T>> {
        self.leave(place).await;
        match deadline {
            None => Ok(None),
            Some(deadline) => Err(deadline.timeout_error(name)),
        }
    }

    async fn conflict<T>(
        &self,
        place: Place,
        name: &str,
        held: Mode,
        asked: Mode,
    ) -> Result<Option<T>> {
        self.leave(place).await;
        Err(Error::ModeConflict {
            name: name.to_owned(),
            held,
            asked,
        })
    }

    /// The permits held on the lock in `dir`, for a request of another
    /// kind: one mode per lease node (a Curator lease, whose semaphore's
    /// size is unknown, as `Permit(0)`). Ended permit holds are deleted
    /// first, so that they do not keep other kinds out.
    pub(crate) async fn permits_held(&self, client: &zk::Client, dir: &str) -> Result<Vec<Mode>> {
        let leases = format!("{dir}/{LEASES}");
        let mut children = self.children(client, &leases).await?;
        let held = sorted_queue(children.clone()).held;
        if !held.is_empty()
            && let PermitHolds::Deleted = self
                .permit_holds(client, &leases, &held, (&leases, &[]))
                .await?
        {
            children = self.children(client, &leases).await?;
        }
        Ok(children
            .iter()
            .map(|node| match parse(node) {
                Some((Node::Permit(n), _)) => Mode::Permit(n),
                _ => Mode::Permit(hold_permits(node).unwrap_or(0)),
            })
            .collect())
    }

    /// The children of `dir`, none if it is gone.
    async fn children(&self, client: &zk::Client, dir: &str) -> Result<Vec<String>> {
        match self.bounded(client.list_children(dir)).await {
            Ok(children) => Ok(children),
            Err(zk::Error::NoNode) => Ok(Vec::new()),
            Err(e) => Err(zk_error(e, "list the semaphore's leases")),
        }
    }
}

/// A lease or hold of a semaphore of another size than `permits`, if any.
fn disagreeing(leases: &Queue, permits: u32) -> Option<Mode> {
    let sizes = leases.nodes.iter().filter_map(|node| match parse(node) {
        Some((Node::Permit(n), _)) => Some(n),
        _ => None,
    });
    let held = leases.held.iter().filter_map(|node| hold_permits(node));
    sizes.chain(held).find(|&n| n != permits).map(Mode::Permit)
}
