//! Extending leases: one, or a whole batch in one script run (one per
//! hash slot on a cluster).

use dlock_core::driver::batch::extend_by_kind;
use dlock_core::{Error, Lease, Mode, Result};
use tokio::time::Instant;

use crate::backend::{NAME, RedisBackend};
use crate::error::{owner_checked, unconfirmed};
use crate::keys::{cluster_slot, value_of};
use dlock_core::driver::millis_up;

use crate::scripts::{EXTEND, EXTEND_MANY, FENCE_RETENTION_MS};

impl RedisBackend {
    /// Pushes the expiry of the lock `lease` holds (and of its fencing
    /// counter) out by the lease's TTL.
    pub(crate) async fn extend_lease(&self, lease: &mut Lease) -> Result<()> {
        if lease.mode() != Mode::Exclusive {
            let held = self.extend_shared(&mut [lease]).await?;
            return match held.as_slice() {
                [true] => Ok(()),
                _ => Err(Error::not_held(lease.name())),
            };
        }
        let keys = self.keys(lease.name());
        let ttl = lease.ttl().unwrap_or_default();
        let sent = Instant::now();
        let mut invocation = EXTEND.prepare_invoke();
        invocation
            .key(keys.lock())
            .key(keys.fence())
            .arg(value_of(lease))
            .arg(millis_up(ttl))
            .arg(FENCE_RETENTION_MS);
        let (extended, confirmed) = self.run::<i64>(&invocation, true, "extend").await?;
        // Unconfirmed, the lease keeps its old deadline: the promoted
        // replica may hold only that one.
        owner_checked(lease, extended, confirmed, "extend")?;
        lease.extended(sent);
        Ok(())
    }

    /// Extends every lease of `leases` it can; says which ones it did.
    pub(crate) async fn extend_leases(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        if leases.iter().any(|l| l.mode() != Mode::Exclusive) {
            return extend_by_kind(
                leases,
                |mut mutexes| async move {
                    let held = Box::pin(self.extend_leases(&mut mutexes)).await;
                    (mutexes, held)
                },
                |mut shared| async move {
                    let held = {
                        let mut refs: Vec<&mut Lease> = shared.iter_mut().collect();
                        self.extend_shared(&mut refs).await
                    };
                    (shared, held)
                },
            )
            .await;
        }
        if self.inner.cluster {
            return self.extend_by_slot(leases).await;
        }
        // One script run for the batch: on a single server, keys of many
        // slots may meet in one script.
        let mut invocation = EXTEND_MANY.prepare_invoke();
        invocation.arg(FENCE_RETENTION_MS);
        for lease in leases.iter() {
            let keys = self.keys(lease.name());
            invocation.key(keys.lock()).key(keys.fence());
            invocation
                .arg(value_of(lease))
                .arg(millis_up(lease.ttl().unwrap_or_default()));
        }
        let sent = Instant::now();
        let (held, confirmed) = self.run::<Vec<i64>>(&invocation, true, "extend").await?;
        if !confirmed {
            return Err(unconfirmed("extend"));
        }
        if held.len() != leases.len() {
            return Err(Error::malformed(NAME, "extend_many", held));
        }
        Ok(leases
            .iter_mut()
            .zip(held)
            .map(|(lease, held)| {
                if held == 1 {
                    lease.extended(sent);
                }
                held == 1
            })
            .collect())
    }

    /// `extend_many` on a cluster: a script may touch one slot only, so one
    /// `EXTEND_MANY` per slot, all in flight at once (the cluster
    /// connection pipelines those bound for one node).
    async fn extend_by_slot(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let mut by_slot: std::collections::HashMap<u16, Vec<usize>> = Default::default();
        for (i, lease) in leases.iter().enumerate() {
            by_slot
                .entry(cluster_slot(lease.name()))
                .or_default()
                .push(i);
        }
        let sent = Instant::now();
        let groups: Vec<Vec<usize>> = by_slot.into_values().collect();
        let replies = futures_util::future::join_all(groups.iter().map(|group| {
            let mut invocation = EXTEND_MANY.prepare_invoke();
            invocation.arg(FENCE_RETENTION_MS);
            for &i in group {
                let keys = self.keys(leases[i].name());
                invocation.key(keys.lock()).key(keys.fence());
                invocation
                    .arg(value_of(&leases[i]))
                    .arg(millis_up(leases[i].ttl().unwrap_or_default()));
            }
            async move { self.run::<Vec<i64>>(&invocation, true, "extend").await }
        }))
        .await;
        let mut held = vec![false; leases.len()];
        let mut failure = None;
        for (group, reply) in groups.iter().zip(replies) {
            match reply {
                // Durable and unconfirmed, the slot's leases keep their old
                // deadlines: the promoted replica may hold only those.
                Ok((_, false)) => failure = Some(unconfirmed("extend")),
                Ok((reply, true)) if reply.len() == group.len() => {
                    for (&i, h) in group.iter().zip(reply) {
                        held[i] = h == 1;
                        if held[i] {
                            leases[i].extended(sent);
                        }
                    }
                }
                Ok((reply, true)) => failure = Some(Error::malformed(NAME, "extend_many", reply)),
                Err(e) => failure = Some(e),
            }
        }
        // One slot's node unreachable fails the batch, which the renewal
        // retries; the slots that answered have their leases extended
        // already, so a shard down does not cost the others theirs.
        match failure {
            Some(e) => Err(e),
            None => Ok(held),
        }
    }
}
