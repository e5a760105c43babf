//! The grant to a place the queue admits, one attempt (`try_acquire`),
//! and the downgrade of a writer; joining the queue is `join`'s.

use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::driver::wait::on_arrival;
use dlock_core::{Admission, Error, Lease, LockOptions, Mode, OwnerToken, Result};
use tokio::time::Instant;

use crate::backend::EtcdBackend;
use crate::error::is_lease_not_found;
use crate::key::{hold_key, judge, mutex_owner, record};
use crate::ops::{created_at, put_op, revision, token, under_lease};
use crate::proto::TxnRequest;

/// A key in a lock's queue, not yet handed over as a lease: the key is
/// deleted (with its lease, if the lease is its own) if this is dropped.
pub(crate) struct Place {
    pub(crate) name: String,
    pub(crate) opts: LockOptions,
    pub(crate) owner: OwnerToken,
    pub(crate) lease: i64,
    /// Whether the lease is a session's, which other keys share.
    pub(crate) shared: bool,
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
        // A mutex's owner is its key's (see `key`).
        let owner = if self.opts.get_mode() == Mode::Exclusive {
            mutex_owner(self.lease, self.create_revision)
        } else {
            self.owner
        };
        Lease::with_ttl(self.name, owner, fencing_token, &self.opts, self.renewed).with_handle(
            Handle {
                id: self.lease,
                created: self.create_revision,
                place: self.place,
                shared: self.shared,
            }
            .to_string(),
        )
    }

    /// The outcome is known: nothing to undo.
    pub(crate) fn disarm(&mut self) {
        match self.undo.get_mut() {
            Ok(undo) => undo.disarm(),
            Err(poisoned) => poisoned.into_inner().disarm(),
        }
    }
}

/// What a lease's handle says: its etcd lease, its key's create revision,
/// the place a downgrade's read hold took (0 for any other), and whether
/// the lease is a session's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) id: i64,
    pub(crate) created: i64,
    pub(crate) place: i64,
    pub(crate) shared: bool,
}

impl std::fmt::Display for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Handle {
            id,
            created,
            place,
            shared,
        } = self;
        let kind = if *shared { "s" } else { "o" };
        write!(f, "{id:x}:{created}:{place}:{kind}")
    }
}

/// What `lease`'s handle says. A lease of another backend has none, and is
/// not held here.
pub(crate) fn parse_handle(lease: &Lease) -> Result<Handle> {
    lease
        .handle()
        .map(|h| h.split(':'))
        .and_then(|mut parts| {
            Some(Handle {
                id: i64::from_str_radix(parts.next()?, 16).ok()?,
                created: parts.next()?.parse().ok()?,
                place: parts.next()?.parse().ok()?,
                shared: parts.next()? == "s",
            })
        })
        .ok_or_else(|| Error::not_held(lease.name()))
}

/// The key `lease` holds, under lease `id`.
pub(crate) fn key_of(prefix: &str, lease: &Lease, id: i64) -> Vec<u8> {
    hold_key(prefix, lease.name(), lease.mode(), id)
}

impl EtcdBackend {
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
        let reply = match self.client().txn("confirm the grant", txn).await {
            // The lease ended while it waited, and its key with it.
            Err(e) if is_lease_not_found(&e) => return Ok(None),
            other => other?,
        };
        if reply.succeeded {
            Ok(Some(token(revision(&reply)?)?))
        } else {
            Ok(None)
        }
    }

    /// Notes a hold granted on a session: its validity, so that the
    /// session's renewals sweep its key once that ran out unrenewed.
    pub(crate) fn note_grant(&self, lease: &Lease) {
        if let Ok(handle) = parse_handle(lease)
            && handle.shared
        {
            let key = key_of(&self.inner.prefix, lease, handle.id);
            self.sessions()
                .valid(&key, handle.created, lease.valid_until());
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
                let lease = on_arrival(self, place.into_lease(token)).into_lease();
                if let Some(lease) = &lease {
                    self.note_grant(lease);
                }
                Ok(lease)
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

    /// A read hold of `write`'s name that takes the writer's place in the
    /// queue, made only while the writer's key stands.
    pub(crate) async fn downgrade_lease(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        let not_held = || Error::not_held(write.name());
        if write.mode() != Mode::Write || !write.is_valid() {
            return Err(not_held());
        }
        let writer = parse_handle(write)?;
        let created = writer.created;
        let opts = opts.clone().mode(Mode::Read);
        self.bounded("downgrade", async {
            let owner = OwnerToken::random()?;
            let (lease, undo, renewed) = self.new_lease(&opts).await?;
            let prefix = &self.inner.prefix;
            // Its own lease: the writer's key may be the session's.
            let key = hold_key(prefix, write.name(), Mode::Read, lease);
            let writer_key = key_of(prefix, write, writer.id);
            let value = record(Mode::Read, created, owner, opts.get_holder());
            let txn = TxnRequest {
                compare: vec![
                    created_at(writer_key.clone(), created),
                    under_lease(writer_key, writer.id),
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
                shared: false,
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
    fn handles_round_trip_and_foreign_leases_are_not_held() {
        let opts = LockOptions::new();
        let lease = Lease::with_ttl("n", OwnerToken::from_u128(1), 5, &opts, Instant::now());
        assert!(matches!(parse_handle(&lease), Err(Error::NotHeld { .. })));
        let handle = Handle {
            id: 0x7fff_0000_0000_0001,
            created: 42,
            place: 7,
            shared: true,
        };
        let lease = lease.with_handle(handle.to_string());
        assert_eq!(parse_handle(&lease).ok(), Some(handle));
    }
}
