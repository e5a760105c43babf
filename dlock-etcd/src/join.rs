//! Joining a lock's queue: a key under the locker's session (or a lease of
//! its own) made in one transaction with a read of the queue, and leaving
//! it again (the key deleted, or its own lease revoked).

use std::collections::HashMap;
use std::time::Duration;

use dlock_core::driver::undo::{UndoOnDrop, retry_for};
use dlock_core::{Error, LockOptions, OwnerToken, Result};
use tokio::time::Instant;

use crate::acquire::Place;
use crate::backend::{EtcdBackend, NAME};
use crate::error::{is_lease_not_found, is_lease_taken};
use crate::key::{Entry, hold_key, name_ranges, queue, record};
use crate::ops::{
    created_at, created_before, delete_op, put_op, range_op, ranged, revision, under_lease,
};
use crate::proto::{TxnRequest, TxnResponse};
use crate::session::Session;

/// A fresh lease id: etcd takes a client's choice, which lets a lease whose
/// grant had no answer be revoked all the same.
fn lease_id() -> i64 {
    fastrand::i64(1..i64::MAX)
}

/// A TTL in the whole seconds etcd counts in, rounded up.
pub(crate) fn ttl_seconds(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// A write refused because its lease was gone: the lease's TTL ended
/// before the write arrived (a link slower than the TTL), which is a grant
/// that could not be made in time, not the server's fault.
pub(crate) fn lease_ended(error: Error, opts: &LockOptions) -> Error {
    if !is_lease_not_found(&error) {
        return error;
    }
    Error::timed_out(
        NAME,
        format!(
            "join the lock's queue: its lease ({} s) ended before its key was written",
            ttl_seconds(opts.get_ttl())
        ),
    )
}

/// Whole seconds as a duration.
pub(crate) fn secs(secs: i64) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

/// Whether a hold asked for with `opts` needs an etcd lease of its own: one
/// that is not renewed, whose renewal stops at a `max_hold`, or whose lease
/// outlasts its trust by a lock-delay, ends at its TTL on the server, not
/// with a session.
fn needs_own_lease(opts: &LockOptions) -> bool {
    !opts.get_renew() || opts.get_max_hold().is_some() || opts.trusted_ttl() < opts.get_ttl()
}

/// A queue joined: our place, the queue with our key in it, and the
/// revision it was read at.
pub(crate) type Joined = (Place, Vec<Entry>, i64);

impl EtcdBackend {
    /// Takes a place at the back of `name`'s queue: a key under the session
    /// of the TTL asked for (started first if there is none, or it ended),
    /// or under a lease of its own (see [`crate::session`]).
    pub(crate) async fn join(&self, name: &str, opts: &LockOptions) -> Result<Joined> {
        if needs_own_lease(opts) {
            return self.join_own(name, opts).await;
        }
        let ttl = ttl_seconds(opts.get_ttl());
        let mut retried = false;
        loop {
            let session = match self.live_session(ttl).await? {
                Some(session) => session,
                None => self.start_session(ttl).await?,
            };
            let key = hold_key(&self.inner.prefix, name, opts.get_mode(), session.id);
            if !self.sessions().claim(&key) {
                return self.join_own(name, opts).await;
            }
            match self.join_session(name, opts, &session, key).await {
                Ok(Some(joined)) => return Ok(joined),
                // The key stood already: a leftover of ours, which the
                // session's next renewal sweeps. A lease of its own, then.
                Ok(None) => return self.join_own(name, opts).await,
                // The session ended before our key was written: once more
                // with a new one.
                Err(e) if is_lease_not_found(&e) && !retried => {
                    self.sessions().ended(session.id);
                    retried = true;
                }
                Err(e) => return Err(lease_ended(e, opts)),
            }
        }
    }

    /// Starts the session of TTL `ttl`, unless a join that came first just
    /// did: the first acquires of a TTL, coming together, share one.
    async fn start_session(&self, ttl: i64) -> Result<Session> {
        let _one = self.sessions().starting.lock().await;
        if let Some(session) = self.live_session(ttl).await? {
            return Ok(session);
        }
        let id = lease_id();
        let mut undo = self.undo_lease(id, secs(ttl));
        let renewed = Instant::now();
        self.client().grant(id, ttl).await?;
        undo.disarm();
        let session = Session {
            id,
            ttl,
            renewed,
            keys: None,
        };
        self.sessions().offer(session.clone());
        Ok(session)
    }

    /// The session of TTL `ttl`, renewed first if a third of its TTL has
    /// passed; `None` if there is none or it ended.
    async fn live_session(&self, ttl: i64) -> Result<Option<Session>> {
        let Some(session) = self.sessions().current(ttl) else {
            return Ok(None);
        };
        let now = Instant::now();
        if now < session.renewed + session.ttl() / 3 {
            return Ok(Some(session));
        }
        if now >= session.valid_until() {
            self.sessions().ended(session.id);
            return Ok(None);
        }
        // Renewed as its holds renew it (which also sweeps it).
        let renewed = self
            .renew(&HashMap::from([(session.id, 0)]), Instant::now())
            .await?;
        Ok(renewed
            .contains_key(&session.id)
            .then(|| self.sessions().current(ttl))
            .flatten()
            .filter(|s| s.id == session.id))
    }

    /// Makes `key` (claimed) under `session` and reads the queue, in one
    /// transaction; `None` if the key stood already.
    async fn join_session(
        &self,
        name: &str,
        opts: &LockOptions,
        session: &Session,
        key: Vec<u8>,
    ) -> Result<Option<Joined>> {
        let owner = OwnerToken::random()?;
        let value = record(opts.get_mode(), 0, owner, opts.get_holder());
        let mut undo = self.undo_key(key.clone(), session.id, session.ttl());
        let reply = self
            .create_key(name, key.clone(), value, session.id)
            .await?;
        if !reply.succeeded {
            undo.disarm();
            self.sessions().free_unmade(&key);
            return Ok(None);
        }
        let revision = revision(&reply)?;
        self.sessions().made(&key, revision);
        // Known now: an undo deletes this key and no later one (a newer
        // hold's key made again under the session after ours went).
        undo.disarm();
        let which = Which::MadeAt {
            created: revision,
            lease: session.id,
        };
        let undo = self.delete_soon(key.clone(), which, session.ttl());
        let queue = queue(&self.inner.prefix, name, ranged(&reply)?)?;
        let place = Place {
            name: name.to_owned(),
            opts: opts.clone(),
            owner,
            lease: session.id,
            shared: true,
            key,
            create_revision: revision,
            place: 0,
            renewed: session.renewed,
            undo: std::sync::Mutex::new(undo),
        };
        Ok(Some((place, queue, revision)))
    }

    /// Takes a place with a new lease of its own, in one round trip: the
    /// lease's grant and the transaction that creates our key under it and
    /// reads the whole queue (its reads see its writes) go out together. A
    /// transaction that reaches the server before the grant fails,
    /// changing nothing, and is sent again.
    async fn join_own(&self, name: &str, opts: &LockOptions) -> Result<Joined> {
        let owner = OwnerToken::random()?;
        let (lease, undo, renewed) = self.reserve_lease(opts);
        let key = hold_key(&self.inner.prefix, name, opts.get_mode(), lease);
        let value = record(opts.get_mode(), 0, owner, opts.get_holder());
        let grant = self.client().grant(lease, ttl_seconds(opts.get_ttl()));
        let create = self.create_key(name, key.clone(), value.clone(), lease);
        let (granted, created) = tokio::join!(grant, create);
        granted?;
        let reply = match created {
            Err(e) if is_lease_not_found(&e) => self
                .create_key(name, key.clone(), value, lease)
                .await
                .map_err(|e| lease_ended(e, opts))?,
            other => other?,
        };
        if !reply.succeeded {
            return Err(Error::malformed(NAME, "a new lock key (it existed)", &key));
        }
        let revision = revision(&reply)?;
        let queue = queue(&self.inner.prefix, name, ranged(&reply)?)?;
        let place = Place {
            name: name.to_owned(),
            opts: opts.clone(),
            owner,
            lease,
            shared: false,
            key,
            create_revision: revision,
            place: 0,
            renewed,
            undo: std::sync::Mutex::new(undo),
        };
        Ok((place, queue, revision))
    }

    /// Creates `key` with `value` under `lease` unless it stands, and reads
    /// `name`'s keys, in one transaction.
    async fn create_key(
        &self,
        name: &str,
        key: Vec<u8>,
        value: Vec<u8>,
        lease: i64,
    ) -> Result<TxnResponse> {
        let [(shared, shared_end), (mutex, mutex_end)] = name_ranges(&self.inner.prefix, name);
        let txn = TxnRequest {
            compare: vec![created_at(key.clone(), 0)],
            success: vec![
                put_op(key, value, lease),
                range_op(shared, shared_end),
                range_op(mutex, mutex_end),
            ],
            failure: Vec::new(),
        };
        self.client().txn("join the lock's queue", txn).await
    }

    /// Revokes `lease` (asked for with `ttl`) on a spawned task if dropped
    /// armed, trying again with backoff for as long as the server may keep
    /// the lease (past that, it ends the lease anyway): a key left standing
    /// could sit at the front of its queue for the whole TTL.
    ///
    /// The lease's own grant may still be in flight, and be handled after
    /// a bare revoke, which would then find nothing, leaving the late grant
    /// (and the key made under it) for the whole TTL. So the undo first
    /// grants the id itself, for the shortest TTL: whichever grant comes
    /// first, the other fails, and the revoke after both finds the lease.
    pub(crate) fn undo_lease(&self, lease: i64, ttl: Duration) -> UndoOnDrop {
        let client = self.client().clone();
        // The server's lease: whole seconds, and at least etcd's default
        // minimum (2 s), however short the TTL asked for.
        let secs = u64::try_from(ttl_seconds(ttl)).unwrap_or(u64::MAX).max(2);
        let within = Duration::from_secs(secs);
        UndoOnDrop::new(async move {
            let revoked = retry_for(within, || async {
                match client.grant(lease, 1).await {
                    Err(e) if !is_lease_taken(&e) => Err(e),
                    _ => client.revoke(lease).await,
                }
            })
            .await;
            if revoked.is_none() {
                tracing::debug!("could not revoke an abandoned lease; its TTL ends it");
            }
        })
    }

    /// Deletes session key `key`, whose creation has no answer yet, on a
    /// spawned task if dropped armed, if it is under `session` (then it is
    /// ours: this backend claimed it), and frees it for this backend's next
    /// hold. A creation that lands after that is swept by the session's
    /// next renewal.
    fn undo_key(&self, key: Vec<u8>, session: i64, ttl: Duration) -> UndoOnDrop {
        self.delete_soon(key, Which::Under(session), ttl)
    }

    /// Deletes `which` key `key` on a spawned task if dropped armed, then
    /// frees it for this backend's next hold. Tried again with backoff: a
    /// session lives on with its other keys, and so would this one, at the
    /// front of its queue (until a renewal sweeps it).
    pub(crate) fn delete_soon(&self, key: Vec<u8>, which: Which, ttl: Duration) -> UndoOnDrop {
        let backend = self.clone();
        // Several TTLs: the session is renewed meanwhile by its other holds.
        let within = ttl.max(Duration::from_secs(2)) * 4;
        UndoOnDrop::new(async move {
            let started = Instant::now();
            let deleted = retry_for(within, || async {
                let txn = which.delete(&key);
                let reply = backend.client().txn("delete an abandoned key", txn).await?;
                // A creation still on its way may land after a delete that
                // found nothing (etcd serves a connection's requests side
                // by side): looked for again until it would have timed out.
                let unmade = matches!(which, Which::Under(_)) && !reply.succeeded;
                if unmade && started.elapsed() < backend.inner.client.request_timeout {
                    return Err(crate::error::timed_out("the key's creation"));
                }
                Ok(())
            })
            .await;
            if deleted.is_none() {
                tracing::warn!("could not delete an abandoned lock key; its session ends it");
            }
            match which {
                Which::MadeAt { created, .. } => backend.sessions().free_made(&key, created),
                Which::Under(_) => backend.sessions().free_unmade(&key),
                Which::Leaked { .. } => {}
            }
        })
    }

    /// A new etcd lease for a hold asked for with `opts`: the lease id,
    /// its undo (armed), and when the grant was sent. The server may grant
    /// a longer TTL (whole seconds, at least the cluster's minimum): the
    /// lock then outlives its lease's validity, later, never sooner.
    pub(crate) async fn new_lease(&self, opts: &LockOptions) -> Result<(i64, UndoOnDrop, Instant)> {
        let (lease, undo, sent) = self.reserve_lease(opts);
        self.client()
            .grant(lease, ttl_seconds(opts.get_ttl()))
            .await?;
        Ok((lease, undo, sent))
    }

    /// A fresh lease id, its undo (armed before any request that may grant
    /// it), and the instant its TTL is counted from: now, before the grant
    /// is sent.
    fn reserve_lease(&self, opts: &LockOptions) -> (i64, UndoOnDrop, Instant) {
        let lease = lease_id();
        let undo = self.undo_lease(lease, opts.get_ttl());
        (lease, undo, Instant::now())
    }

    /// Leaves the queue now (deletes the key, or revokes its own lease), or
    /// in the background if that fails.
    pub(crate) async fn leave(&self, mut place: Place) {
        // Its own undo is this one's from here on.
        place.disarm();
        if place.shared {
            let ttl = secs(ttl_seconds(place.opts.get_ttl()));
            let which = Which::MadeAt {
                created: place.create_revision,
                lease: place.lease,
            };
            let mut undo = self.delete_soon(place.key.clone(), which, ttl);
            let txn = which.delete(&place.key);
            let left = self.client().txn("leave the lock's queue", txn).await;
            if left.is_ok() {
                undo.disarm();
                self.sessions().free_made(&place.key, place.create_revision);
            }
        } else {
            self.revoke_soon(place.lease, place.opts.get_ttl()).await;
        }
    }

    /// Revokes `lease` (of `ttl`) now, or on a spawned task if that fails
    /// (or this is dropped midway).
    pub(crate) async fn revoke_soon(&self, lease: i64, ttl: Duration) {
        let mut undo = self.undo_lease(lease, ttl);
        if self.client().revoke(lease).await.is_ok() {
            undo.disarm();
        }
    }
}

/// Which key a deletion may delete.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Which {
    /// The one made at this create revision under this lease: a hold's
    /// (not after a delayed release moved it to another lease).
    MadeAt { created: i64, lease: i64 },
    /// The one under this session lease: a place whose creation had no
    /// answer (it is ours: this backend claimed the key).
    Under(i64),
    /// The one under this session lease made at revision `before` or
    /// earlier: a key no hold claims, found by a renewal's read at that
    /// revision (a key made since is a newer hold's).
    Leaked { lease: i64, before: i64 },
}

impl Which {
    /// The transaction that deletes `key` if it is this one.
    pub(crate) fn delete(self, key: &[u8]) -> TxnRequest {
        TxnRequest {
            compare: self.compare(key),
            success: vec![delete_op(key.to_vec())],
            failure: Vec::new(),
        }
    }

    /// The comparisons that `key` is this one.
    fn compare(self, key: &[u8]) -> Vec<crate::proto::Compare> {
        match self {
            Which::MadeAt { created, lease } => vec![
                created_at(key.to_vec(), created),
                under_lease(key.to_vec(), lease),
            ],
            Which::Under(lease) => vec![under_lease(key.to_vec(), lease)],
            Which::Leaked { lease, before } => vec![
                under_lease(key.to_vec(), lease),
                created_before(key.to_vec(), before.saturating_add(1)),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(ttl_seconds(Duration::ZERO), 1);
    }

    #[test]
    fn holds_with_a_lifetime_of_their_own_take_their_own_lease() {
        let plain = LockOptions::new();
        assert!(!needs_own_lease(&plain));
        let bounded = plain.clone().max_hold(Duration::from_secs(60));
        assert!(needs_own_lease(&bounded));
        assert!(needs_own_lease(&plain.clone().renew(false)));
        let delayed = plain.lock_delay(Duration::from_secs(1));
        assert!(needs_own_lease(&delayed.for_server()));
    }
}
