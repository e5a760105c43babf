//! The wait: a place in the queue, and a watch on the node just ahead.

use std::time::Duration;

use dlock_core::driver::wait::{Backoff, Deadline};
use dlock_core::{Admission, Error, Lease, Mode, Result};
use tokio::time::sleep;
use zookeeper_client as zk;

use crate::acquire::Queue;
use crate::backend::ZkBackend;
use crate::error::{gave_up, node_vanished, zk_error};
use crate::node_hold::PermitHolds;
use crate::path::{is_read_hold, parse};

impl ZkBackend {
    /// Contends for `name` until `deadline`, again after a dropped
    /// connection: it costs that attempt its node (the server went, or the
    /// session moved to another server of the ensemble), not the caller its
    /// wait.
    pub(crate) async fn wait_for(
        &self,
        name: &str,
        mode: Mode,
        holder: &str,
        deadline: Deadline,
    ) -> Result<Lease> {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            match self.contend(name, mode, holder, Some(deadline)).await {
                Ok(Some(lease)) => return Ok(lease),
                Ok(None) => return Err(deadline.timeout_error(name)),
                Err(e) if e.is_retryable() && !deadline.is_past() => {
                    tracing::debug!(name, error = %e, "contending again");
                    sleep(deadline.cap(backoff.next_delay())).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Contends for `name` in `mode`: in the lock's queue, or for a permit
    /// as [`crate::semaphore`] says.
    pub(crate) async fn contend(
        &self,
        name: &str,
        mode: Mode,
        holder: &str,
        deadline: Option<Deadline>,
    ) -> Result<Option<Lease>> {
        match mode {
            Mode::Permit(permits) => self.contend_permit(name, permits, holder, deadline).await,
            _ => {
                self.queue_for(name, self.lock_dir(name), mode, holder, deadline)
                    .await
            }
        }
    }

    /// Takes a place in the queue in `dir` for `mode` and waits until the
    /// queue admits it ([`Mode::admits`] over the nodes ahead of ours), up to
    /// `deadline` (`None`: one look only). The name's kind is the front
    /// node's: a node of another kind further back has met the front
    /// itself and is on its way out, so it is passed over, not taken for
    /// a conflict.
    /// The node is deleted if this ends without a lease, and also if this
    /// future is dropped.
    ///
    /// Not core's `wait_for_lock`, which repeats whole attempts: a waiter
    /// here keeps its place (and so its turn) and sleeps on a watch.
    pub(crate) async fn queue_for(
        &self,
        name: &str,
        dir: String,
        mode: Mode,
        holder: &str,
        deadline: Option<Deadline>,
    ) -> Result<Option<Lease>> {
        let client = self.client();
        let mut place = self.join(&client, dir, mode, holder).await?;
        loop {
            let queue = match place.listed.take() {
                // The listing sent with the create: the server answers a
                // session's requests in order, so it holds our node. Read
                // again if it does not, rather than trust it.
                Some(first) if first.nodes.contains(&place.node) => first,
                _ => self.queue(&client, &place.dir).await?,
            };
            let Some(at) = queue.nodes.iter().position(|c| *c == place.node) else {
                // Our node vanished: the session expired under us.
                return Err(node_vanished());
            };
            // Readers' delayed releases ahead (see `crate::hold`) are
            // readers until they end by the server's clock; whoever finds
            // one ended deletes it, so none outlives its hold for long.
            let holds: Vec<String> = queue.nodes[..at]
                .iter()
                .filter(|node| is_read_hold(node))
                .cloned()
                .collect();
            let mut hold_ends = Duration::MAX;
            if !holds.is_empty() {
                // The server's clock, from a write to the folder: a write
                // to our node would wake the waiter behind us.
                let folder = (place.dir.as_str(), &[][..]);
                match self
                    .permit_holds(&client, &place.dir, &holds, folder)
                    .await?
                {
                    PermitHolds::Deleted if !mode.same_kind(Mode::Read) => {
                        // A reader queued behind us saw the hold live, took
                        // us for a node of another kind on its way out, and
                        // may hold now: ours goes, and we queue again,
                        // behind it, to meet the conflict.
                        let dir = place.dir.clone();
                        self.leave(place).await;
                        place = self.join(&client, dir, mode, holder).await?;
                        continue;
                    }
                    PermitHolds::Deleted => continue,
                    PermitHolds::Left(left) => hold_ends = left,
                    PermitHolds::None => {}
                }
            }
            let modes = queue.nodes[..at]
                .iter()
                .filter_map(|node| parse(node))
                .map(|(kind, _)| kind.mode_for(mode));
            let front: Vec<Mode> = modes
                .clone()
                .take(1)
                .filter(|m| !m.same_kind(mode))
                .collect();
            let ahead: Vec<Mode> = modes.clone().filter(|m| m.same_kind(mode)).collect();
            let mut holders = front;
            // kazoo's nodes are of whichever kind asks, so a node of
            // another kind behind one has not met a conflict at the front
            // and is not on its way out: the name is in two kinds' use,
            // and we are the one to leave. (That node may itself be on its
            // way out, refused by a third kind between: a refusal then is
            // spurious but safe.)
            if queue.nodes[..at]
                .first()
                .and_then(|node| parse(node))
                .is_some_and(|(kind, _)| kind.is_kazoo())
                && let Some(other) = modes.skip(1).find(|m| !m.same_kind(mode))
            {
                holders.push(other);
            }
            if queue.leases {
                holders.extend(self.permits_held(&client, &place.dir).await?);
            }
            let watch = match mode.admits(&holders, &ahead) {
                Admission::Conflict(held) => {
                    self.leave(place).await;
                    return Err(Error::ModeConflict {
                        name: name.to_owned(),
                        held,
                        asked: mode,
                    });
                }
                Admission::Grant => {
                    let left = if queue.hold {
                        self.hold_left(&client, &place.dir, (&place.path, holder.as_bytes()))
                            .await?
                    } else {
                        None
                    };
                    match left {
                        Some(left) => Watch::Hold(left),
                        None => {
                            let node = (place.owner, place.path.as_str(), place.fencing_token);
                            let lease = self.grant(&client, name, mode, holder, node).await?;
                            place.undo.disarm();
                            return Ok(Some(lease));
                        }
                    }
                }
                // A request that waits has a node ahead (at the front, the
                // queue grants or refuses).
                Admission::Wait => match waits_for(mode, &queue, at) {
                    Some(node) => Watch::Node(node),
                    None => return Err(gave_up(format!("nothing ahead in {}", place.dir))),
                },
            };
            let Some(deadline) = deadline else {
                // Leave the queue before saying "held", so the next attempt
                // (ours or anyone's) does not queue behind a ghost.
                self.leave(place).await;
                return Ok(None);
            };
            if deadline.is_past() {
                self.leave(place).await;
                return Err(deadline.timeout_error(name));
            }
            let woken = match watch {
                // Until the hold ends, or its node goes (an operator's
                // forced release).
                Watch::Hold(left) => {
                    self.wait_for_hold(&client, &place.dir, deadline.cap(left))
                        .await?;
                    continue;
                }
                Watch::Node(node) => {
                    if !is_read_hold(&node) {
                        // Only a hold ends with no event to wake us.
                        hold_ends = Duration::MAX;
                    }
                    let path = format!("{}/{node}", place.dir);
                    match self.bounded(client.check_and_watch_stat(&path)).await {
                        Ok((Some(_), watcher)) => watcher,
                        Ok((None, _)) => continue,
                        Err(e) => return Err(zk_error(e, "watch the node ahead")),
                    }
                }
            };
            tokio::select! {
                event = woken.changed() => {
                    // A shared grant writes its node (its token; see
                    // `grant`): the node is still there, so the last look
                    // at the queue stands, and only the watch is set again.
                    if event.event_type == zk::EventType::NodeDataChanged {
                        place.listed = Some(queue);
                    }
                    continue;
                }
                // A hold ahead ends (nobody may delete its node), or the
                // deadline passes.
                () = sleep(deadline.cap(hold_ends)) => {
                    if !deadline.is_past() {
                        continue;
                    }
                }
            }
            self.leave(place).await;
            return Err(deadline.timeout_error(name));
        }
    }
}

/// What a waiter sleeps on.
enum Watch {
    /// The hold node, at most this long.
    Hold(Duration),
    /// The node whose going may admit us.
    Node(String),
}

/// The node a request in `mode` at `at` in `queue` waits for: a release
/// wakes one waiter (or the readers behind one writer), not the herd. A
/// writer or mutex waits for the node just ahead, a reader for the nearest
/// writer ahead.
fn waits_for(mode: Mode, queue: &Queue, at: usize) -> Option<String> {
    let ahead = &queue.nodes[..at];
    match mode {
        Mode::Read => ahead
            .iter()
            .rev()
            .find(|node| parse(node).is_some_and(|(kind, _)| kind.mode_for(mode) == Mode::Write))
            .cloned(),
        _ => ahead.last().cloned(),
    }
}
