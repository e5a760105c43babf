//! Joining a lock's queue (a lease, then a key under it and a read of the
//! queue in one transaction), the grant to a place the queue admits, one
//! attempt (`try_acquire`), and the downgrade of a writer.

use std::time::Duration;

use dlock_core::driver::undo::{UndoOnDrop, retry_for};
use dlock_core::driver::wait::on_arrival;
use dlock_core::{Admission, Error, Lease, LockOptions, Mode, OwnerToken, Result};
use tokio::time::Instant;

use crate::backend::{EtcdBackend, NAME};
use crate::error::{is_lease_not_found, is_lease_taken};
use crate::key::{Entry, hold_key, judge, name_range, queue, record};
use crate::proto::{
    Compare, PutRequest, RangeRequest, RequestOp, ResponseHeader, TxnRequest, TxnResponse, compare,
    request_op, response_op,
};

/// A key in a lock's queue, not yet handed over as a lease: its lease is
/// revoked (and so the key deleted) if this is dropped.
pub(crate) struct Place {
    pub(crate) name: String,
    pub(crate) opts: LockOptions,
    pub(crate) owner: OwnerToken,
    pub(crate) lease: i64,
    pub(crate) key: Vec<u8>,
    pub(crate) create_revision: i64,
    /// A downgrade's writer's create revision, whose place it takes; 0.
    pub(crate) place: i64,
    /// When the request that last started the lease's TTL was sent.
    pub(crate) renewed: Instant,
    /// In a mutex only so that a `&Place` may be held across an await
    /// (`UndoOnDrop` is `Send`, not `Sync`).
    pub(crate) undo: std::sync::Mutex<UndoOnDrop>,
}

impl Place {
    /// The lease of this place, granted with `fencing_token`.
    pub(crate) fn into_lease(mut self, fencing_token: u64) -> Lease {
        self.disarm();
        Lease::with_ttl(
            self.name,
            self.owner,
            fencing_token,
            &self.opts,
            self.renewed,
        )
        .with_handle(handle(self.lease, self.create_revision, self.place))
    }

    /// The outcome is known: nothing to undo.
    pub(crate) fn disarm(&mut self) {
        match self.undo.get_mut() {
            Ok(undo) => undo.disarm(),
            Err(poisoned) => poisoned.into_inner().disarm(),
        }
    }
}

/// A lease's handle: its etcd lease id, its key's create revision, and
/// the place a downgrade's read hold took (0 for any other).
fn handle(lease: i64, create_revision: i64, place: i64) -> String {
    format!("{lease:x}:{create_revision}:{place}")
}

/// The place a downgrade's read hold took (0 for any other hold).
pub(crate) fn parse_place(lease: &Lease) -> i64 {
    lease
        .handle()
        .and_then(|h| h.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// What a lease's handle says: (lease id, create revision). A lease of
/// another backend has none, and is not held here.
pub(crate) fn parse_handle(lease: &Lease) -> Result<(i64, i64)> {
    lease
        .handle()
        .map(|h| h.split(':'))
        .and_then(|mut parts| {
            let id = i64::from_str_radix(parts.next()?, 16).ok()?;
            Some((id, parts.next()?.parse().ok()?))
        })
        .ok_or_else(|| Error::not_held(lease.name()))
}

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

pub(crate) fn range_op(key: Vec<u8>, range_end: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key,
            range_end,
            ..RangeRequest::default()
        })),
    }
}

pub(crate) fn put_op(key: Vec<u8>, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key,
            value,
            lease,
            ..PutRequest::default()
        })),
    }
}

/// The comparison that `key` was created at `revision` (0: does not exist).
pub(crate) fn created_at(key: Vec<u8>, revision: i64) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Create as i32,
        key,
        target_union: Some(compare::TargetUnion::CreateRevision(revision)),
        range_end: Vec::new(),
    }
}

/// The comparison that `key` is attached to `lease` (a key handed to a
/// delayed release's lease no longer belongs to its old lease).
pub(crate) fn under_lease(key: Vec<u8>, lease: i64) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Lease as i32,
        key,
        target_union: Some(compare::TargetUnion::Lease(lease)),
        range_end: Vec::new(),
    }
}

/// A transaction's revision, as a fencing token.
pub(crate) fn revision(reply: &TxnResponse) -> Result<i64> {
    header_revision(reply.header.as_ref(), "a transaction (its header)", reply)
}

/// The revision a reply's header gives, which is positive on a healthy
/// server; `what` and `reply` name a malformed one.
pub(crate) fn header_revision(
    header: Option<&ResponseHeader>,
    what: &str,
    reply: impl std::fmt::Debug,
) -> Result<i64> {
    header
        .map(|h| h.revision)
        .filter(|&r| r > 0)
        .ok_or_else(|| Error::malformed(NAME, what, reply))
}

/// The range read in a transaction's replies.
pub(crate) fn ranged(reply: &TxnResponse) -> Result<&[crate::proto::KeyValue]> {
    reply
        .responses
        .iter()
        .find_map(|r| match &r.response {
            Some(response_op::Response::ResponseRange(range)) => Some(range.kvs.as_slice()),
            _ => None,
        })
        .ok_or_else(|| Error::malformed(NAME, "a transaction (no range)", reply))
}

/// A token from a revision, which is positive on a healthy server.
pub(crate) fn token(revision: i64) -> Result<u64> {
    u64::try_from(revision)
        .ok()
        .filter(|&t| t > 0)
        .ok_or_else(|| Error::malformed(NAME, "a revision", revision))
}

impl EtcdBackend {
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

    /// Takes a place at the back of `name`'s queue with a new lease, in
    /// one round trip: the lease's grant and the transaction that creates
    /// our key under it and reads the whole queue (its reads see its
    /// writes) go out together. A transaction that reaches the server
    /// before the grant fails, changing nothing, and is sent again. Returns
    /// the place, the queue with our key in it, and the revision it was
    /// read at.
    pub(crate) async fn join(
        &self,
        name: &str,
        opts: &LockOptions,
    ) -> Result<(Place, Vec<Entry>, i64)> {
        let owner = OwnerToken::random()?;
        let (lease, undo, renewed) = self.reserve_lease(opts);
        let grant = self.client().grant(lease, ttl_seconds(opts.get_ttl()));
        let (granted, created) = tokio::join!(grant, self.create_key(name, opts, lease, owner));
        granted?;
        let reply = match created {
            Err(e) if is_lease_not_found(&e) => self.create_key(name, opts, lease, owner).await?,
            other => other?,
        };
        let revision = revision(&reply)?;
        let queue = queue(&self.inner.prefix, ranged(&reply)?)?;
        let place = Place {
            name: name.to_owned(),
            opts: opts.clone(),
            owner,
            lease,
            key: hold_key(&self.inner.prefix, name, lease),
            create_revision: revision,
            place: 0,
            renewed,
            undo: std::sync::Mutex::new(undo),
        };
        Ok((place, queue, revision))
    }

    /// Creates our key under `lease` and reads `name`'s keys, in one
    /// transaction.
    async fn create_key(
        &self,
        name: &str,
        opts: &LockOptions,
        lease: i64,
        owner: OwnerToken,
    ) -> Result<TxnResponse> {
        let prefix = &self.inner.prefix;
        let key = hold_key(prefix, name, lease);
        let (start, end) = name_range(prefix, name);
        let value = record(opts.get_mode(), 0, owner, opts.get_holder());
        let txn = TxnRequest {
            compare: vec![created_at(key.clone(), 0)],
            success: vec![put_op(key.clone(), value, lease), range_op(start, end)],
            failure: Vec::new(),
        };
        let reply = self.client().txn("join the lock's queue", txn).await?;
        if !reply.succeeded {
            return Err(Error::malformed(NAME, "a new lock key (it existed)", &key));
        }
        Ok(reply)
    }

    /// Draws the fencing token of a shared kind's grant (a reader's, a
    /// writer's, a permit's): rewrites its key, if it still stands, and
    /// returns the write's revision. `None` when the key is gone (its lease
    /// ended while it waited).
    ///
    /// Such grants do not follow their keys' create revisions (readers
    /// enter together, a downgrade's read hold is made after the writers
    /// that wait behind its writer), while a write's revision is later than
    /// every grant before it. A mutex needs no draw: its grants follow its
    /// keys' order.
    pub(crate) async fn confirm(&self, place: &Place) -> Result<Option<u64>> {
        let value = record(
            place.opts.get_mode(),
            0,
            place.owner,
            place.opts.get_holder(),
        );
        let txn = TxnRequest {
            compare: vec![created_at(place.key.clone(), place.create_revision)],
            success: vec![put_op(place.key.clone(), value, place.lease)],
            failure: Vec::new(),
        };
        let reply = self.client().txn("confirm the grant", txn).await?;
        if reply.succeeded {
            Ok(Some(token(revision(&reply)?)?))
        } else {
            Ok(None)
        }
    }

    /// One attempt: join the queue and stay if it admits us at once,
    /// otherwise leave it.
    pub(crate) async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        let (place, queue, _) = self.join(name, opts).await?;
        let at = queue.iter().position(|e| e.key == place.key);
        match at.map(|at| judge(&queue, at)) {
            Some(Admission::Grant) => {
                let token = token(place.create_revision)?;
                // A grant whose reply came after its validity is none.
                Ok(on_arrival(self, place.into_lease(token)).into_lease())
            }
            Some(Admission::Conflict(held)) => {
                self.leave(place).await;
                Err(Error::ModeConflict {
                    name: name.to_owned(),
                    held,
                    asked: opts.get_mode(),
                })
            }
            Some(Admission::Wait) | None => {
                self.leave(place).await;
                Ok(None)
            }
        }
    }

    /// Leaves the queue now (revokes the place's lease), or in the
    /// background if that fails.
    pub(crate) async fn leave(&self, mut place: Place) {
        self.revoke_soon(place.lease, place.opts.get_ttl()).await;
        place.disarm();
    }

    /// Revokes `lease` (of `ttl`) now, or on a spawned task if that fails
    /// (or this is dropped midway).
    pub(crate) async fn revoke_soon(&self, lease: i64, ttl: Duration) {
        let mut undo = self.undo_lease(lease, ttl);
        if self.client().revoke(lease).await.is_ok() {
            undo.disarm();
        }
    }

    /// A read hold of `write`'s name that takes the writer's place in the
    /// queue, made only while the writer's key stands.
    pub(crate) async fn downgrade_lease(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        let not_held = || Error::not_held(write.name());
        if write.mode() != Mode::Write || !write.is_valid() {
            return Err(not_held());
        }
        let (writer, created) = parse_handle(write)?;
        let opts = opts.clone().mode(Mode::Read);
        self.bounded("downgrade", async {
            let owner = OwnerToken::random()?;
            let (lease, undo, renewed) = self.new_lease(&opts).await?;
            let prefix = &self.inner.prefix;
            let key = hold_key(prefix, write.name(), lease);
            let writer_key = hold_key(prefix, write.name(), writer);
            let value = record(Mode::Read, created, owner, opts.get_holder());
            let txn = TxnRequest {
                compare: vec![
                    created_at(writer_key.clone(), created),
                    under_lease(writer_key, writer),
                ],
                success: vec![put_op(key.clone(), value, lease)],
                failure: Vec::new(),
            };
            let reply = self.client().txn("downgrade", txn).await?;
            if !reply.succeeded {
                return Err(not_held());
            }
            let revision = revision(&reply)?;
            let place = Place {
                name: write.name().to_owned(),
                opts,
                owner,
                lease,
                key,
                create_revision: revision,
                place: created,
                renewed,
                undo: std::sync::Mutex::new(undo),
            };
            // Granted too late to be valid: no grant (and released).
            on_arrival(self, place.into_lease(token(revision)?))
                .into_lease()
                .ok_or_else(|| {
                    crate::error::timed_out("downgrade (the reply came after the hold's validity)")
                })
        })
        .await
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
    fn handles_round_trip_and_foreign_leases_are_not_held() {
        let opts = LockOptions::new();
        let lease = Lease::with_ttl("n", OwnerToken::from_u128(1), 5, &opts, Instant::now());
        assert!(matches!(parse_handle(&lease), Err(Error::NotHeld { .. })));
        assert_eq!(parse_place(&lease), 0);
        let lease = lease.with_handle(handle(0x7fff_0000_0000_0001, 42, 7));
        assert_eq!(parse_handle(&lease).ok(), Some((0x7fff_0000_0000_0001, 42)));
        assert_eq!(parse_place(&lease), 7);
    }
}
