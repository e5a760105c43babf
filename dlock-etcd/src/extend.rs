//! Renewal: one keep-alive per etcd lease however many holds share it (a
//! session's), all on one stream, with one read of each lease's keys, so
//! that a hold whose key was deleted (an operator's forced release) is
//! found not held.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::{Error, Lease, Result};
use futures_util::future::join_all;
use tokio::time::Instant;

use crate::acquire::{Handle, key_of, parse_handle};
use crate::backend::EtcdBackend;
use crate::client::KeptAlive;
use crate::join::{Which, secs, ttl_seconds};

/// A lease renewed: when the renewal was sent, and its keys as read then
/// (at `revision`).
struct Renewal {
    sent: Instant,
    keys: Arc<HashSet<Vec<u8>>>,
    revision: i64,
}

impl Renewal {
    /// Whether the hold with `key`, created at `created`, still stands: its
    /// key is among the lease's, or was made after they were read.
    fn stands(&self, key: &[u8], created: i64) -> bool {
        self.keys.contains(key) || created > self.revision
    }
}

impl EtcdBackend {
    /// Renews one lease (see `extend_leases`). One past its validity is
    /// let go before this returns, so that the name is free when it does
    /// (unless a lock-delay keeps it).
    pub(crate) async fn extend_lease(&self, lease: &mut Lease) -> Result<()> {
        if !lease.is_valid() {
            parse_handle(lease)?;
            if lease.lock_delay().is_zero() {
                // Tried again in the background if it fails.
                let _ = self.release_lease(lease).await;
            }
            return Err(Error::not_held(lease.name()));
        }
        match self.extend_leases(std::slice::from_mut(lease)).await?[..] {
            [true] => Ok(()),
            _ => Err(Error::not_held(lease.name())),
        }
    }

    /// Keeps every lease alive: each etcd lease among them is renewed once,
    /// all on one stream, within one request timeout. A lease whose etcd
    /// lease is gone (expired, revoked) or whose key is gone is not held;
    /// nor is one past its validity deadline: the server may keep the key a
    /// little longer (its TTL is whole seconds), but its holder stopped
    /// trusting it, and a renewal must not bring it back. Its key is then
    /// deleted (or its own lease revoked) so that the name is free at once,
    /// unless a lock-delay keeps it from everyone until its TTL.
    pub(crate) async fn extend_leases(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let started = Instant::now();
        let handles: Vec<Option<Handle>> = leases
            .iter()
            .map(|lease| {
                let handle = parse_handle(lease).ok()?;
                if lease.is_valid() {
                    Some(handle)
                } else {
                    drop(self.let_go(handle, lease));
                    None
                }
            })
            .collect();
        // Per etcd lease, the latest key it must show.
        let mut newest: HashMap<i64, i64> = HashMap::new();
        for handle in handles.iter().flatten() {
            let created = newest.entry(handle.id).or_default();
            *created = (*created).max(handle.created);
        }
        let renewed = self.renew(&newest, started).await?;
        let mut held = Vec::with_capacity(leases.len());
        for (lease, handle) in leases.iter_mut().zip(handles) {
            let Some(handle) = handle else {
                held.push(false);
                continue;
            };
            let key = key_of(&self.inner.prefix, lease, handle.id);
            // A session's key may have been made again since, for a newer
            // hold of this backend: ours only if it is the one we made.
            let ours = !handle.shared || self.sessions().is_current(&key, handle.created);
            let renewal = renewed
                .get(&handle.id)
                .filter(|r| ours && r.stands(&key, handle.created));
            // A renewal answered after the validity deadline is none: the
            // server may have answered it as it was ending the lease (etcd
            // issue 14758), and its own expiry is never before that
            // deadline, so a reply in time cannot have met that race.
            match renewal {
                Some(renewal) if lease.is_valid() => {
                    lease.extended(renewal.sent);
                    held.push(true);
                }
                Some(_) => {
                    drop(self.let_go(handle, lease));
                    held.push(false);
                }
                None => held.push(false),
            }
        }
        Ok(held)
    }

    /// Renews each etcd lease of `newest` (its id, and the create revision
    /// of the latest key it must show), or finds it gone (left out). A
    /// session renewed since shortly before `started`, by another batch of
    /// the same renewal or an acquire, and whose keys were read after the
    /// latest key was made, is not asked again: 100,000 holds on a session
    /// cost two requests a renewal, not two per batch.
    async fn renew(
        &self,
        newest: &HashMap<i64, i64>,
        started: Instant,
    ) -> Result<HashMap<i64, Renewal>> {
        let _one = self.sessions().renewing.lock().await;
        let mut renewed = HashMap::new();
        let mut ask = Vec::new();
        for (&id, &created) in newest {
            let session = self.sessions().by_id(id);
            match session.and_then(|s| Some((s.keys.clone()?, s))) {
                Some(((revision, keys), s))
                    if s.renewed + s.ttl() / 10 >= started && revision >= created =>
                {
                    let sent = s.renewed;
                    renewed.insert(
                        id,
                        Renewal {
                            sent,
                            keys,
                            revision,
                        },
                    );
                }
                _ => ask.push(id),
            }
        }
        if ask.is_empty() {
            return Ok(renewed);
        }
        let sent = Instant::now();
        let read = join_all(ask.iter().map(|&id| self.client().lease_keys(id)));
        let (kept, read) = tokio::join!(self.client().keep_alive(&ask), read);
        for ((id, kept), read) in ask.into_iter().zip(kept?).zip(read) {
            match (kept, read?) {
                (KeptAlive::Renewed, Some((revision, keys))) => {
                    let keys: Arc<HashSet<Vec<u8>>> = Arc::new(keys.into_iter().collect());
                    let read = Some((revision, keys.clone()));
                    self.sessions().renewed(id, sent, read);
                    renewed.insert(
                        id,
                        Renewal {
                            sent,
                            keys,
                            revision,
                        },
                    );
                }
                _ => self.sessions().ended(id),
            }
        }
        Ok(renewed)
    }

    /// A hold past its validity: its key is deleted (a session's) or its
    /// lease revoked (its own) by the undo returned, which runs on a
    /// spawned task if dropped armed; `None` when a lock-delay keeps the
    /// name from everyone until its TTL.
    fn let_go(&self, handle: Handle, lease: &Lease) -> Option<UndoOnDrop> {
        if !lease.lock_delay().is_zero() {
            return None;
        }
        let ttl = lease.ttl().unwrap_or_default();
        Some(if handle.shared {
            let key = key_of(&self.inner.prefix, lease, handle.id);
            let ttl = secs(ttl_seconds(ttl));
            self.delete_soon(key, Which::MadeAt(handle.created), ttl)
        } else {
            self.undo_lease(handle.id, ttl)
        })
    }
}
