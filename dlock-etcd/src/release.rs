//! Release (revoke the hold's lease, which deletes its key), the delayed
//! release (the key moved to a lease as long as the hold), and the
//! operator's forced release.

use std::time::Duration;

use dlock_core::{Error, Lease, LockInfo, LockOptions, Result};

use crate::acquire::{created_at, parse_handle, parse_place, put_op, under_lease};
use crate::backend::EtcdBackend;
use crate::key::{hold_key, holds, record};
use crate::list::describe;
use crate::proto::TxnRequest;

impl EtcdBackend {
    /// Revokes the lease: its key goes with it, and the watch of the next
    /// in line fires. A lease already gone was not held. The key is never
    /// deleted by name: a stale delete could remove a newer holder's.
    pub(crate) async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let (id, _) = parse_handle(lease)?;
        if self.client().revoke(id).await? {
            Ok(())
        } else {
            Err(not_held(lease))
        }
    }

    /// Moves the key to a new lease of `hold` (whole seconds, rounded up)
    /// if it is still ours, then revokes the old lease: the key keeps its
    /// place, so the name stays locked until the new lease ends.
    pub(crate) async fn release_lease_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        if hold.is_zero() {
            return self.release_lease(lease).await;
        }
        let (id, created) = parse_handle(lease)?;
        self.bounded("release after a hold", async {
            let opts = LockOptions::new()
                .ttl(hold)
                .mode(lease.mode())
                .holder(lease.holder());
            let (held_by, mut undo, _) = self.new_lease(&opts).await?;
            let key = hold_key(&self.inner.prefix, lease.name(), id);
            // The hold keeps the place (a downgrade's is its writer's) and
            // is owned by no lease's token, as every driver's hold is.
            let value = record(
                lease.mode(),
                parse_place(lease),
                lease.owner().for_hold(),
                lease.holder(),
            );
            let txn = TxnRequest {
                compare: vec![
                    created_at(key.clone(), created),
                    under_lease(key.clone(), id),
                ],
                success: vec![put_op(key, value, held_by)],
                failure: Vec::new(),
            };
            let reply = self.client().txn("hand the key to the hold", txn).await?;
            if !reply.succeeded {
                return Err(not_held(lease));
            }
            undo.disarm();
            // The old lease has no key left, but could still be renewed.
            self.revoke_soon(id, lease.ttl().unwrap_or_default()).await;
            Ok(())
        })
        .await
    }

    /// Revokes the lease of every hold of `name` (waiters keep their
    /// places); returns the first hold.
    pub(crate) async fn force_release_any(&self, name: &str) -> Result<Option<LockInfo>> {
        self.bounded("force a release", async {
            let (queue, _) = self.read_queue(name).await?;
            let mut first = None;
            for entry in holds(&queue) {
                self.client().revoke(entry.lease).await?;
                first.get_or_insert_with(|| describe(entry, None));
            }
            Ok(first)
        })
        .await
    }
}

fn not_held(lease: &Lease) -> Error {
    Error::not_held(lease.name())
}
