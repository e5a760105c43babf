//! Renewal: a lease keep-alive restarts the etcd lease's TTL, and many
//! leases share one keep-alive stream.

use dlock_core::{Error, Lease, Result};
use tokio::time::Instant;

use crate::acquire::parse_handle;
use crate::backend::EtcdBackend;
use crate::client::KeptAlive;

impl EtcdBackend {
    /// Keeps the lease's etcd lease alive; a lease that is gone (expired,
    /// revoked by a release or an operator) is not held.
    ///
    /// Nor is a lease past its validity deadline: the server may keep the
    /// key a little longer (its TTL is whole seconds), but its holder
    /// stopped trusting it, and a renewal must not bring it back. Its
    /// etcd lease is revoked, so the name is free at once (unless the
    /// lease has a lock-delay).
    pub(crate) async fn extend_lease(&self, lease: &mut Lease) -> Result<()> {
        let (id, _) = parse_handle(lease)?;
        let ttl = lease.ttl().unwrap_or_default();
        let not_held = || Error::not_held(lease.name());
        if !lease.is_valid() {
            // Revoked now, so that the name is free when this returns;
            // unless a lock-delay keeps it from everyone until its TTL.
            if lease.lock_delay().is_zero() {
                self.revoke_soon(id, ttl).await;
            }
            return Err(not_held());
        }
        let sent = Instant::now();
        let kept = self.client().keep_alive(&[id]).await?;
        // A renewal answered after the validity deadline is none: the
        // server may have answered it as it was ending the lease (etcd
        // issue 14758), and its own expiry is never before that deadline,
        // so a reply in time cannot have met that race.
        match kept.as_slice() {
            [KeptAlive::Renewed] if lease.is_valid() => {
                lease.extended(sent);
                Ok(())
            }
            [KeptAlive::Renewed] => {
                if lease.lock_delay().is_zero() {
                    self.revoke_soon(id, ttl).await;
                }
                Err(not_held())
            }
            _ => Err(not_held()),
        }
    }

    /// Keeps every lease alive on one keep-alive stream: one request per
    /// lease on it, however many there are, within one request timeout.
    /// Leases past their validity are not renewed (as in `extend_lease`);
    /// their etcd leases are revoked on spawned tasks.
    pub(crate) async fn extend_leases(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let ids: Vec<Option<i64>> = leases
            .iter()
            .map(|l| {
                let id = parse_handle(l).ok().map(|h| h.0);
                if l.is_valid() {
                    id
                } else {
                    if let Some(id) = id {
                        self.revoke_in_background(id, l);
                    }
                    None
                }
            })
            .collect();
        let known: Vec<i64> = ids.iter().flatten().copied().collect();
        if known.is_empty() {
            return Ok(vec![false; leases.len()]);
        }
        let sent = Instant::now();
        let mut kept = self
            .bounded("keep leases alive", self.client().keep_alive(&known))
            .await?
            .into_iter();
        let mut held = Vec::with_capacity(leases.len());
        for (lease, id) in leases.iter_mut().zip(ids) {
            let kept = id.is_some() && kept.next() == Some(KeptAlive::Renewed);
            // Answered after the validity deadline: none (as in
            // `extend_lease`).
            let renewed = kept && lease.is_valid();
            if renewed {
                lease.extended(sent);
            } else if let (true, Some(id)) = (kept, id) {
                self.revoke_in_background(id, lease);
            }
            held.push(renewed);
        }
        Ok(held)
    }

    /// Revokes `lease`'s etcd lease `id` on a spawned task, unless a
    /// lock-delay keeps the name from everyone until its TTL.
    fn revoke_in_background(&self, id: i64, lease: &Lease) {
        if !lease.lock_delay().is_zero() {
            return;
        }
        // Dropped armed: the undo runs.
        drop(self.undo_lease(id, lease.ttl().unwrap_or_default()));
    }
}
