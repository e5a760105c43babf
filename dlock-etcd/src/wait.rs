//! Waiting in the queue: the name's watch (see `watches`), subscribed to
//! before we queue, keeps our copy of the queue current, so that a release
//! reaches the next in line as one message from the server and no read.
//! Our lease (the session's, most often) is kept alive meanwhile.

use std::collections::HashMap;

use dlock_core::driver::wait::{Attempt, Deadline, on_arrival};
use dlock_core::{Admission, Error, Lease, LockOptions, Mode, Result};
use tokio::time::Instant;

use crate::acquire::Place;
use crate::backend::EtcdBackend;
use crate::key::{Entry, apply_changes, judge, name_ranges, queue};
use crate::ops::{range_op, ranged, revision, token};
use crate::proto::TxnRequest;

/// What woke a waiter.
enum Woken {
    Changes(Result<std::sync::Arc<Vec<crate::proto::Event>>>),
    Timer,
}

impl EtcdBackend {
    /// The wait loop of `acquire`, until `deadline`.
    pub(crate) async fn wait_for(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Lease> {
        // The watch starts before our key is made, so that the queue read
        // with it and the changes after it miss nothing.
        let mut watch = self.subscribe(name).await?;
        let (mut place, mut queue, mut revision) = self.join(name, opts).await?;
        #[cfg(feature = "_test-hooks")]
        if let Some(pause) = self.inner.pause_after_join {
            tokio::time::sleep(pause).await;
        }
        // A grant seen by the join's own read is confirmed by its write.
        let mut confirmed = true;
        loop {
            let Some(at) = queue.iter().position(|e| e.key == place.key) else {
                // Our lease ended while we waited (we could not renew it in
                // time), or its renewal came too late to trust: queue
                // again, at the back, once the old key is surely gone (a
                // late renewal may have kept it, at the front of the queue).
                self.leave(place).await;
                (place, queue, revision) = self.join(name, opts).await?;
                confirmed = true;
                continue;
            };
            match judge(&queue, at) {
                Admission::Grant => {
                    // A mutex's grants follow its keys' order, so its key's
                    // create revision is a token that increases; shared
                    // kinds draw theirs when granted (see `confirm`).
                    let token = if confirmed || place.opts.get_mode() == Mode::Exclusive {
                        token(place.create_revision)?
                    } else {
                        match self.confirm(&place).await? {
                            Some(token) => token,
                            None => {
                                queue.clear();
                                continue;
                            }
                        }
                    };
                    // Our key stood at the read, so our lease was alive
                    // then; a lease that ended since is past its validity
                    // (counted from before its last renewal) and refused.
                    match on_arrival(self, place.into_lease(token)) {
                        Attempt::Acquired(lease) => {
                            self.note_grant(&lease);
                            return Ok(lease);
                        }
                        Attempt::Held { .. } => {
                            (place, queue, revision) = self.join(name, opts).await?;
                            confirmed = true;
                            continue;
                        }
                    }
                }
                Admission::Conflict(held) => {
                    self.leave(place).await;
                    return Err(Error::ModeConflict {
                        name: name.to_owned(),
                        held,
                        asked: opts.get_mode(),
                    });
                }
                Admission::Wait => {}
            }
            if deadline.is_past() {
                self.leave(place).await;
                return Err(deadline.timeout_error(name));
            }
            // A third of the time the place is trusted (a lock-delay adds to
            // the TTL the server keeps, not to that).
            let renew_at = place.renewed + place.opts.trusted_ttl() / 3;
            let until =
                Instant::now() + deadline.cap(renew_at.saturating_duration_since(Instant::now()));
            let woken = tokio::select! {
                changes = watch.changes() => Woken::Changes(changes),
                () = tokio::time::sleep_until(until) => Woken::Timer,
            };
            match woken {
                Woken::Changes(Ok(events)) => {
                    apply_changes(&self.inner.prefix, name, &mut queue, &events, revision)?;
                }
                // The watch broke or the server cancelled it: watch anew,
                // then read the queue as it is now.
                Woken::Changes(Err(e)) => {
                    tracing::debug!(error = %e, "the lock's watch ended; watching again");
                    watch = self.subscribe(name).await?;
                    (queue, revision) = self.read_queue(name).await?;
                }
                Woken::Timer if Instant::now() >= renew_at => {
                    self.renew_place(&mut place, &mut queue).await?;
                }
                Woken::Timer => {}
            }
            confirmed = false;
        }
    }

    /// Keeps a waiter's lease alive, as holds renew theirs (a session's
    /// renewal serves them all). A lease found gone took our key with it:
    /// the key leaves our copy of the queue, and the caller queues again
    /// (the old place's undo deletes what is left of it). So does a renewal
    /// answered after the place's validity, which may have met the server
    /// ending the lease (see `extend_lease`).
    async fn renew_place(&self, place: &mut Place, queue: &mut Vec<Entry>) -> Result<()> {
        let valid_until = place.opts.valid_until(place.renewed);
        let renewed = self
            .renew(&HashMap::from([(place.lease, 0)]), Instant::now())
            .await?;
        match renewed.get(&place.lease) {
            Some(renewal) if Instant::now() < valid_until => {
                place.renewed = place.renewed.max(renewal.sent);
            }
            _ => queue.retain(|e| e.key != place.key),
        }
        Ok(())
    }

    /// `name`'s queue now, and the revision it was read at: its two ranges
    /// read in one transaction.
    pub(crate) async fn read_queue(&self, name: &str) -> Result<(Vec<Entry>, i64)> {
        let [(shared, shared_end), (mutex, mutex_end)] = name_ranges(&self.inner.prefix, name);
        let txn = TxnRequest {
            compare: Vec::new(),
            success: vec![range_op(shared, shared_end), range_op(mutex, mutex_end)],
            failure: Vec::new(),
        };
        let reply = self.client().txn("read the lock's queue", txn).await?;
        let revision = revision(&reply)?;
        Ok((queue(&self.inner.prefix, name, ranged(&reply)?)?, revision))
    }
}
