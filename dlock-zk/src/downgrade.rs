//! Downgrade: a write holder takes a read hold that no writer queued after
//! it can pass. The read hold is a read node, `_c_<uuid>-__READ__<n>`,
//! created (ephemeral, not sequential) with the write node's own sequence
//! number `n`: it sorts right behind the write node, ahead of every node
//! queued after it. Every recipe that sorts by sequence number (ours,
//! Curator's, kazoo's) then sees a reader ahead of the waiting writers,
//! and a writer waits for it once the write lock goes. A read node queued
//! the usual way would sit behind those writers, and Curator's own answer
//! (a reader passes when its own thread holds the write lock) lets the
//! first of them in once the write lock goes (CURATOR-621).
//!
//! Its token is the node's czxid: above the writer's (drawn at its grant,
//! before), below that of any grant after it (each drawn at its grant,
//! when this node stands or is gone; see `grant`).

use dlock_core::{Lease, LockOptions, Mode, OwnerToken, Result};
use zookeeper_client as zk;

use crate::acquire::fencing_token;
use crate::backend::ZkBackend;
use crate::error::{not_held, zk_error};
use crate::path::{downgraded_node, protected_prefix};

impl ZkBackend {
    /// [`Backend::downgrade`](dlock_core::Backend::downgrade).
    pub(crate) async fn downgrade_lease(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        if write.mode() != Mode::Write {
            return Err(not_held(write));
        }
        let writer = self.node_of(write).ok_or_else(|| not_held(write))?;
        let client = self.client();
        let owner = OwnerToken::random()?;
        let dir = self.lock_dir(write.name());
        let prefix = protected_prefix(owner);
        let node = downgraded_node(owner, writer).ok_or_else(|| not_held(write))?;
        let path = format!("{dir}/{node}");
        // Armed until the reply is in: a create whose reply never came is
        // looked for by its prefix and deleted.
        let mut undo = self.undo_create(&dir, &prefix);
        let node_opts = zk::CreateMode::Ephemeral.with_acls(self.acls());
        let holder = opts.get_holder();
        let created = self
            .bounded(client.create(&path, holder.as_bytes(), &node_opts))
            .await;
        if !matches!(created, Err(zk::Error::ConnectionLoss)) {
            // Any other answer says whether the node is there, and
            // `bounded` answers a timeout as a connection loss.
            undo.disarm();
        }
        let stat = match created {
            Ok((stat, _)) => stat,
            // The folder went: the write lock was released.
            Err(zk::Error::NoNode) => return Err(not_held(write)),
            Err(e) => return Err(zk_error(e, "downgrade")),
        };
        let mut undo = self.undo_node(&path);
        // Only now is the write lock's node looked at: while it stands,
        // every writer behind it lists the queue after our node exists,
        // and so waits for it. If it went first, the name may be anyone's.
        match self.bounded(client.check_stat(writer)).await {
            Ok(Some(_)) if !write.lost_token().is_cancelled() => {}
            Ok(_) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => {
                self.delete_node(path).await;
                undo.disarm();
                return Err(not_held(write));
            }
            Err(e) => return Err(zk_error(e, "downgrade: look at the write lock")),
        }
        // The lease gets the lost signal of the session the node lives in.
        let token = fencing_token(stat.czxid)?;
        let Some(lost) = self.lease_node(&client, &path) else {
            self.delete_node(path).await;
            undo.disarm();
            return Err(not_held(write));
        };
        let lease = Lease::with_session(write.name(), owner, token, lost);
        undo.disarm();
        Ok(lease
            .with_handle(path)
            .with_mode(Mode::Read)
            .with_holder(holder))
    }
}
