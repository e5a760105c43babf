//! Renewal: one keep-alive per etcd lease however many holds share it (a
//! session's), all on one stream, with one read of each lease's keys, so
//! that a hold whose key was deleted (an operator's forced release) is
//! found not held, and a session's keys that no hold keeps are swept.

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
use crate::proto::RangeRequest;
use crate::session::{Keys, Sweep};

/// A lease renewed: when the renewal was sent, and its keys as read with it.
pub(crate) struct Renewal {
    pub(crate) sent: Instant,
    keys: Keys,
}

impl Renewal {
    /// Whether the hold with `key`, created at `created`, is among the
    /// lease's keys (`None`: made after they were read, unknown).
    fn shows(&self, key: &[u8], created: i64) -> Option<bool> {
        if self.keys.set.contains(key) {
            Some(true)
        } else if created > self.keys.revision {
            None
        } else {
            Some(false)
        }
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
        // Keys a renewal's read does not show (or not yet): asked for
        // one by one, so that a key the read missed (made on a member the
        // read's was behind) is no loss. Rare: a key is missing when an
        // operator deleted it.
        let unsure: Vec<(usize, Vec<u8>, Handle)> = leases
            .iter()
            .zip(&handles)
            .enumerate()
            .filter_map(|(i, (lease, handle))| {
                let handle = (*handle)?;
                let key = key_of(&self.inner.prefix, lease, handle.id);
                let renewal = renewed.get(&handle.id)?;
                (renewal.shows(&key, handle.created) != Some(true)).then_some((i, key, handle))
            })
            .collect();
        let checked = join_all(unsure.iter().map(|(_, key, h)| self.stands(key, *h))).await;
        let mut stands: HashMap<usize, bool> = HashMap::new();
        for ((i, _, _), standing) in unsure.iter().zip(checked) {
            stands.insert(*i, standing?);
        }
        let mut held = Vec::with_capacity(leases.len());
        for (i, (lease, handle)) in leases.iter_mut().zip(handles).enumerate() {
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
                .filter(|_| ours && stands.get(&i).copied().unwrap_or(true));
            // A renewal answered after the validity deadline is none: the
            // server may have answered it as it was ending the lease (etcd
            // issue 14758), and its own expiry is never before that
            // deadline, so a reply in time cannot have met that race.
            match renewal {
                Some(renewal) if lease.is_valid() => {
                    lease.extended(renewal.sent);
                    if handle.shared {
                        let until = lease.valid_until();
                        self.sessions().valid(&key, handle.created, until);
                    }
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

    /// Whether the hold `handle` of `key` still stands: its key, made at
    /// its create revision, under its lease.
    async fn stands(&self, key: &[u8], handle: Handle) -> Result<bool> {
        let read = RangeRequest {
            key: key.to_vec(),
            keys_only: true,
            ..RangeRequest::default()
        };
        let reply = self.client().range("read a lock key", read).await?;
        Ok(reply
            .kvs
            .first()
            .is_some_and(|kv| kv.create_revision == handle.created && kv.lease == handle.id))
    }

    /// Renews each etcd lease of `newest` (its id, and the create revision
    /// of the latest key it must show), or finds it gone (left out), and
    /// sweeps the sessions among them. A session whose keys were read
    /// since shortly before `started` (by another batch of the same
    /// renewal), after the latest key was made, is not asked again: 100,000
    /// holds on a session cost two requests a renewal, not two per batch.
    pub(crate) async fn renew(
        &self,
        newest: &HashMap<i64, i64>,
        started: Instant,
    ) -> Result<HashMap<i64, Renewal>> {
        let _one = self.sessions().renewing.lock().await;
        // The renewal this one waited for had no answer: the server is out
        // of reach, and asking again would only make this call wait twice.
        if self.sessions().failed_since(started) {
            return Err(crate::error::timed_out(
                "keep leases alive (the renewal before this one had no answer)",
            ));
        }
        let mut renewed = HashMap::new();
        let mut ask = Vec::new();
        for (&id, &created) in newest {
            let session = self.sessions().by_id(id);
            match session.and_then(|s| Some((s.keys.clone()?, s))) {
                Some((keys, s))
                    if keys.sent + s.ttl() / 10 >= started && keys.revision >= created =>
                {
                    renewed.insert(
                        id,
                        Renewal {
                            sent: keys.sent,
                            keys,
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
        let answered = Instant::now();
        let kept = kept.inspect_err(|_| self.sessions().failed())?;
        if read.iter().any(Result::is_err) {
            self.sessions().failed();
        }
        for ((id, kept), read) in ask.into_iter().zip(kept).zip(read) {
            let session = self.sessions().by_id(id);
            // A session's answer after its validity is none (as a hold's).
            let late = session
                .as_ref()
                .is_some_and(|s| answered >= s.valid_until());
            match (kept, read?) {
                (KeptAlive::Renewed, Some((revision, keys))) if !late => {
                    let keys = Keys {
                        sent,
                        revision,
                        set: Arc::new(keys.into_iter().collect::<HashSet<_>>()),
                    };
                    if session.is_some() {
                        self.sweep(id, &keys);
                        self.sessions().renewed(id, sent, keys.clone());
                    }
                    renewed.insert(id, Renewal { sent, keys });
                }
                _ => self.sessions().ended(id),
            }
        }
        Ok(renewed)
    }

    /// Deletes, on spawned tasks, the keys of session `id` that no hold
    /// keeps (see [`Sweep`]).
    fn sweep(&self, id: i64, keys: &Keys) {
        let now = Instant::now();
        for key in keys.set.iter() {
            let which = match self.sessions().sweep(key, now) {
                Some(Sweep::Expired { created }) => Which::MadeAt { created, lease: id },
                Some(Sweep::Leaked) => Which::Leaked {
                    lease: id,
                    before: keys.revision,
                },
                None => continue,
            };
            tracing::debug!(key = %String::from_utf8_lossy(key), "deleting a lock key nobody keeps");
            // Dropped armed: the undo runs.
            drop(self.delete_soon(key.clone(), which, secs(1)));
        }
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
            let which = Which::MadeAt {
                created: handle.created,
                lease: handle.id,
            };
            self.delete_soon(key, which, secs(ttl_seconds(ttl)))
        } else {
            self.undo_lease(handle.id, ttl)
        })
    }
}
