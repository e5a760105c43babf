//! Joining a lock's queue (protected creation of an ephemeral sequential
//! node), reading the queue, and the grant to the node at its front.

use std::sync::Arc;

use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::{Error, Lease, Mode, OwnerToken, Result};
use zookeeper_client as zk;

use crate::backend::{NAME, ZkBackend};
use crate::error::{node_vanished, zk_error};
use crate::hold::HOLD_NODE;
use crate::node_hold::PERMIT_HOLD;
use crate::path::{Node, node_prefix, parse, protected_prefix, sequence};
use crate::semaphore::LEASES;

/// A lock's folder as one listing saw it.
pub(crate) struct Queue {
    /// The queue nodes of every kind, in sequence order.
    pub(crate) nodes: Vec<String>,
    /// Whether a hold node (see [`crate::hold`]) is there.
    pub(crate) hold: bool,
    /// Whether a semaphore's lease folder is there (see
    /// [`crate::semaphore`]).
    pub(crate) leases: bool,
    /// How many children the folder has, of any recipe.
    pub(crate) children: usize,
    /// Permits' holds, in a semaphore's lease folder (see [`crate::hold`]).
    pub(crate) held: Vec<String>,
}

/// A place in a lock's queue, not yet handed over as a lease: its node is
/// deleted if this is dropped.
pub(crate) struct Place {
    pub(crate) owner: OwnerToken,
    pub(crate) dir: String,
    /// The node's whole path.
    pub(crate) path: String,
    /// The node's name in `dir`.
    pub(crate) node: String,
    pub(crate) fencing_token: u64,
    /// The queue as listed right behind the create, if that listing came.
    pub(crate) listed: Option<Queue>,
    pub(crate) undo: UndoOnDrop,
}

impl ZkBackend {
    /// Takes a place in the queue in `dir` for `mode` with a fresh owner
    /// token.
    pub(crate) async fn join(
        &self,
        client: &zk::Client,
        dir: String,
        mode: Mode,
        holder: &str,
    ) -> Result<Place> {
        let owner = OwnerToken::random()?;
        let mut undo = self.undo_create(&dir, &protected_prefix(owner));
        let (path, czxid, listed) = self
            .enqueue_and_list(client, &dir, (owner, mode, holder))
            .await?;
        undo.disarm();
        let undo = self.undo_node(&path);
        // Checked only now, so that a bad one still gets the node deleted.
        let fencing_token = fencing_token(czxid)?;
        let node = path.rsplit('/').next().unwrap_or_default().to_owned();
        Ok(Place {
            owner,
            dir,
            path,
            node,
            fencing_token,
            listed,
            undo,
        })
    }

    /// The lease for a place at the front of the queue (its owner, node
    /// and node's czxid), if the session it
    /// was created in (`client`'s) is still the current one. The lease
    /// gets the session's lost signal as of now: one cancelled by a blip
    /// while we waited would make the lease lost on arrival.
    ///
    /// A mutex's token is its node's czxid. A shared kind's is drawn now,
    /// by writing our node (its mzxid): its czxid was drawn when it
    /// queued, and a downgrade's read node, made later, goes ahead of it.
    /// Every shared grant draws so (one write more), since a czxid drawn
    /// before another node's late token would be below it.
    pub(crate) async fn grant(
        &self,
        client: &Arc<zk::Client>,
        name: &str,
        mode: Mode,
        holder: &str,
        (owner, path, czxid_token): (OwnerToken, &str, u64),
    ) -> Result<Lease> {
        let fencing_token = if mode == Mode::Exclusive {
            czxid_token
        } else {
            match self
                .bounded(client.set_data(path, holder.as_bytes(), None))
                .await
            {
                Ok(stat) => fencing_token(stat.mzxid)?,
                Err(zk::Error::NoNode) => {
                    return Err(node_vanished());
                }
                Err(e) => return Err(zk_error(e, "draw the fencing token")),
            }
        };
        let Some(lost) = self.lease_node(client, path) else {
            return Err(Error::connection(
                NAME,
                "the session was replaced while waiting",
                zk::Error::SessionExpired,
            ));
        };
        let lease = Lease::with_session(name, owner, fencing_token, lost);
        Ok(lease
            .with_handle(path.to_owned())
            .with_mode(mode)
            .with_holder(holder))
    }

    /// Joins the queue of `dir`: creates our ephemeral sequential node,
    /// creating container parents as needed. If the reply is lost, finds the
    /// node by its protected prefix instead of leaving an orphan.
    async fn enqueue(
        &self,
        client: &zk::Client,
        dir: &str,
        (owner, mode, holder): (OwnerToken, Mode, &str),
    ) -> Result<(String, i64)> {
        let prefix = protected_prefix(owner);
        let path = format!("{dir}/{}", node_prefix(owner, mode));
        let node_opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let dir_opts = zk::CreateMode::Container.with_acls(self.acls());
        // Whether a try lost its reply: giving up is then retryable.
        let mut lost = false;
        for _ in 0..5 {
            match self
                .bounded(client.create(&path, holder.as_bytes(), &node_opts))
                .await
            {
                Ok((stat, seq)) => {
                    let node = format!("{path}{seq}");
                    return Ok((node, stat.czxid));
                }
                // The parents are containers: missing at first, and removed
                // by the server whenever they are empty.
                Err(zk::Error::NoNode) => {
                    match self.bounded(client.mkdir(dir, &dir_opts)).await {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        // Creating a parent twice is harmless, so a reply
                        // lost (or not had within the request timeout) is
                        // retried like the lock node's own create.
                        Err(zk::Error::ConnectionLoss) => lost = true,
                        Err(e) => return Err(zk_error(e, "create the lock's parent")),
                    }
                }
                Err(zk::Error::ConnectionLoss) => {
                    if let Some(found) = self.find_own(client, dir, &prefix).await? {
                        return Ok(found);
                    }
                    lost = true;
                }
                Err(e) => return Err(zk_error(e, "create the lock node")),
            }
        }
        let doing = format!("could not create a lock node under {dir} in 5 tries");
        let last = if lost {
            zk::Error::ConnectionLoss
        } else {
            zk::Error::NoNode
        };
        Err(zk_error(last, &doing))
    }

    /// Joins the queue and lists it in one round trip: the client sends
    /// requests in call order, so the listing goes out right behind the
    /// create, and the server, answering a session's requests in order,
    /// lists the queue with our node in it. Falls back to [`Self::enqueue`]
    /// (which creates missing parents and finds a node whose reply was
    /// lost) when the create fails.
    async fn enqueue_and_list(
        &self,
        client: &zk::Client,
        dir: &str,
        (owner, mode, holder): (OwnerToken, Mode, &str),
    ) -> Result<(String, i64, Option<Queue>)> {
        let prefix = protected_prefix(owner);
        let path = format!("{dir}/{}", node_prefix(owner, mode));
        let node_opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        // The node's data is the holder description (Curator's nodes hold
        // their client's address, which reads as theirs).
        let create = client.create(&path, holder.as_bytes(), &node_opts);
        let list = client.list_children(dir);
        let (created, listed) = tokio::join!(self.bounded(create), self.bounded(list));
        match created {
            Ok((stat, seq)) => Ok((
                format!("{path}{seq}"),
                stat.czxid,
                listed.ok().map(sorted_queue),
            )),
            // Not created: the parents are missing (containers come and go).
            Err(zk::Error::NoNode) => {
                let (node, czxid) = self.enqueue(client, dir, (owner, mode, holder)).await?;
                Ok((node, czxid, None))
            }
            // Maybe created: look for it before creating another.
            Err(zk::Error::ConnectionLoss) => match self.find_own(client, dir, &prefix).await? {
                Some((node, czxid)) => Ok((node, czxid, None)),
                None => {
                    let (node, czxid) = self.enqueue(client, dir, (owner, mode, holder)).await?;
                    Ok((node, czxid, None))
                }
            },
            Err(e) => Err(zk_error(e, "create the lock node")),
        }
    }

    /// Our node in `dir`, by its protected prefix, if this session owns
    /// it. A node of another session (one that expired while the create's
    /// reply was lost) goes with that session: taking it for ours would
    /// hold a lock that vanishes (CURATOR-498). One session is one client
    /// here, so this only guards what that already rules out.
    pub(crate) async fn find_own(
        &self,
        client: &zk::Client,
        dir: &str,
        prefix: &str,
    ) -> Result<Option<(String, i64)>> {
        // On an ensemble the create may have reached the leader through the
        // member we lost, and not yet be applied on the one we reconnected
        // to. A sync goes through the leader after every proposal before it;
        // proposals of ours arriving later are refused (the session moved).
        match self.bounded(client.sync(dir)).await {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(zk_error(e, "sync before looking for our lock node")),
        }
        let children = match self.bounded(client.list_children(dir)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(zk_error(e, "look for our lock node")),
        };
        let Some(node) = children.into_iter().find(|c| c.starts_with(prefix)) else {
            return Ok(None);
        };
        let path = format!("{dir}/{node}");
        match self.bounded(client.check_stat(&path)).await {
            Ok(Some(stat)) if stat.ephemeral_owner == client.session_id().0 => {
                Ok(Some((path, stat.czxid)))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(zk_error(e, "read our lock node")),
        }
    }

    /// The queue of `dir`.
    pub(crate) async fn queue(&self, client: &zk::Client, dir: &str) -> Result<Queue> {
        let children: Vec<String> = match self.bounded(client.list_children(dir)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(zk_error(e, "list the lock queue")),
        };
        Ok(sorted_queue(children))
    }
}

/// A folder's children as a queue: the lock nodes sorted by sequence
/// number, and whether the hold is there. A downgrade's read node shares
/// its writer's number and sorts right behind it.
pub(crate) fn sorted_queue(mut children: Vec<String>) -> Queue {
    let hold = children.iter().any(|c| c == HOLD_NODE);
    let leases = children.iter().any(|c| c == LEASES);
    let count = children.len();
    let held = children
        .iter()
        .filter(|c| c.starts_with(PERMIT_HOLD))
        .cloned()
        .collect();
    children.retain(|c| sequence(c).is_some());
    children.sort_by_key(|c| parse(c).map(|(kind, seq)| (seq, kind == Node::Read)));
    Queue {
        nodes: children,
        hold,
        leases,
        children: count,
        held,
    }
}

/// A fencing token from a zxid (a node's creation or last write), which
/// is positive on a healthy server; anything else (some versions report -1) is an error,
/// never a token that could go backwards.
pub(crate) fn fencing_token(czxid: i64) -> Result<u64> {
    u64::try_from(czxid)
        .ok()
        .filter(|&z| z > 0)
        .ok_or_else(|| Error::malformed(NAME, "a lock node's stat (its czxid)", czxid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_positive_czxids_are_fencing_tokens() {
        assert_eq!(fencing_token(42).ok(), Some(42));
        for bad in [-1, 0, i64::MIN] {
            assert!(
                matches!(fencing_token(bad), Err(Error::Backend { .. })),
                "{bad}"
            );
        }
    }
}
