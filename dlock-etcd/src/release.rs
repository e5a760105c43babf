//! Release (a session's key deleted, a lease of its own revoked), the
//! delayed release (the key moved to a lease as long as the hold), and the
//! operator's forced release.

use std::time::Duration;

use dlock_core::{Error, Lease, LockInfo, LockOptions, Result};
use tokio::time::Instant;

use crate::acquire::{key_of, parse_handle};
use crate::backend::EtcdBackend;
use crate::join::{Which, secs, ttl_seconds};
use crate::key::{holds, record};
use crate::list::describe;
use crate::ops::{created_at, delete_op, put_op, under_lease};
use crate::proto::TxnRequest;

impl EtcdBackend {
    /// Releases: the hold's key is deleted if it is still the one this hold
    /// made and under its lease (its create revision and lease say so: a
    /// stale delete never removes a newer holder's key, nor a delayed
    /// release's), and a lease of its own is revoked. The watch of the next
    /// in line fires. Gone already (expired, forced, handed to a delayed
    /// release): not held.
    pub(crate) async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let handle = parse_handle(lease)?;
        let key = key_of(&self.inner.prefix, lease, handle.id);
        let ttl = lease.ttl().unwrap_or_default();
        // Dropped armed (no answer): deleted in the background, as a
        // session would keep the key.
        let which = Which::MadeAt {
            created: handle.created,
            lease: handle.id,
        };
        let mut undo = self.delete_soon(key.clone(), which, secs(ttl_seconds(ttl)));
        let txn = which.delete(&key);
        let reply = self.client().txn("release", txn).await;
        if !handle.shared {
            // Its key is gone either way; the lease could still be renewed.
            self.revoke_soon(handle.id, ttl).await;
        }
        let reply = reply?;
        undo.disarm();
        self.sessions().free_made(&key, handle.created);
        if reply.succeeded {
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
        let handle = parse_handle(lease)?;
        let (id, created) = (handle.id, handle.created);
        self.bounded("release after a hold", async {
            let opts = LockOptions::new()
                .ttl(hold)
                .mode(lease.mode())
                .holder(lease.holder());
            let (held_by, mut undo, _) = self.new_lease(&opts).await?;
            let key = key_of(&self.inner.prefix, lease, id);
            // The hold keeps the place (a downgrade's is its writer's) and
            // is owned by no lease's token, as every driver's hold is.
            let value = record(
                lease.mode(),
                handle.place,
                lease.owner().for_hold(),
                lease.holder(),
            );
            let txn = TxnRequest {
                compare: vec![
                    created_at(key.clone(), created),
                    under_lease(key.clone(), id),
                ],
                success: vec![put_op(key.clone(), value, held_by)],
                failure: Vec::new(),
            };
            let reply = self.client().txn("hand the key to the hold", txn).await?;
            if !reply.succeeded {
                return Err(not_held(lease));
            }
            undo.disarm();
            if handle.shared {
                // The key is the hold's until its lease ends: not made
                // again on the session meanwhile.
                self.sessions().keep_until(&key, Instant::now() + hold);
            } else {
                // The old lease has no key left, but could still be renewed.
                self.revoke_soon(id, lease.ttl().unwrap_or_default()).await;
            }
            Ok(())
        })
        .await
    }

    /// Deletes the key of every hold of `name` (waiters keep their places),
    /// never its lease, which may be a session's with other holds on it;
    /// returns the first hold. Its holder finds the key gone at its next
    /// renewal.
    pub(crate) async fn force_release_any(&self, name: &str) -> Result<Option<LockInfo>> {
        self.bounded("force a release", async {
            let (queue, _) = self.read_queue(name).await?;
            let mut first = None;
            for entry in holds(&queue) {
                let txn = TxnRequest {
                    compare: vec![created_at(entry.key.clone(), entry.create_revision)],
                    success: vec![delete_op(entry.key.clone())],
                    failure: Vec::new(),
                };
                self.client().txn("force a release", txn).await?;
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
