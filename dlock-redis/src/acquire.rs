//! One acquire attempt: the acquire script, and what its reply means; or a
//! grant a release handed over to the wait.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use dlock_core::undo::UndoOnDrop;
use dlock_core::wait::{Attempt, on_arrival};
use dlock_core::{Error, Lease, LockOptions, Mode, OwnerToken, Result};
use tokio::time::Instant;

use crate::backend::{NAME, RedisBackend};
use crate::error::unconfirmed;
use crate::keys::{Keys, value};
use dlock_core::millis_up;

/// A mutex wait that takes hand-overs: a release gives the lock to the
/// head of the queue in the same script, and the waiter learns of it from
/// the message (see the release script). For that, the wait keeps one lock
/// value across its attempts, so it owns every grant of that value, and a
/// grant found by a later attempt or handed over is its own.
#[derive(Debug)]
pub(crate) struct Pending {
    state: Mutex<PendingState>,
}

#[derive(Debug)]
struct PendingState {
    owner: OwnerToken,
    /// No grant of `owner` was made before this: when the last attempt
    /// answered "held" was sent (the server ran it later, and a hand-over
    /// counts the lease from the waiter's last ask), or before that, when
    /// the wait's first attempt was sent.
    anchor: Option<Instant>,
}

impl Pending {
    pub fn new() -> Result<Self> {
        Ok(Pending {
            state: Mutex::new(PendingState {
                owner: OwnerToken::random()?,
                anchor: None,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PendingState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The owner token of the wait's lock value now.
    pub fn owner(&self) -> OwnerToken {
        self.state().owner
    }
}

impl RedisBackend {
    /// One acquire script: a grant, or the holder's remaining TTL. With a
    /// `waiter`, a caller not granted keeps (or takes) its place in the
    /// name's queue; with `pending` too, it takes hand-overs, and a grant
    /// handed over since the last attempt is taken without a request.
    pub(crate) async fn attempt(
        &self,
        name: &str,
        keys: &Keys,
        opts: &LockOptions,
        waiter: &str,
        pending: Option<&Pending>,
    ) -> Result<Attempt> {
        if opts.mode_value() != Mode::Exclusive {
            return self.attempt_shared(name, keys, opts, waiter).await;
        }
        let sent = Instant::now();
        let (owner, handed) = match pending {
            None => (OwnerToken::random()?, None),
            Some(pending) => {
                let mut state = pending.state();
                let handed = self.inner.pushes.take(waiter);
                let anchor = *state.anchor.get_or_insert(sent);
                (state.owner, handed.map(|grant| (grant, anchor)))
            }
        };
        if let Some((grant, anchor)) = handed {
            if grant.owner == owner {
                let lease = Lease::with_ttl(name, owner, grant.fence, opts, anchor);
                return self.arrived(lease, pending);
            }
            // Handed over to the value this wait gave up: free it.
            self.undo_in_background(name, value(grant.owner, opts.holder_value()), opts);
        }
        // Armed until the reply is in: if the request fails or this future is
        // dropped mid-flight, the script may still run and take the lock for
        // a caller who never hears of it, so release it by its token. A
        // wait's value is released when the wait ends instead: a later
        // attempt may have been granted it meanwhile.
        let mut cleanup = pending.is_none().then(|| {
            let (backend, name, ttl) = (self.clone(), name.to_owned(), opts.ttl_value());
            let value = value(owner, opts.holder_value());
            UndoOnDrop::new(async move { backend.undo(&name, &value, ttl).await })
        });
        let mut invocation = self.queue_scripts().acquire.prepare_invoke();
        invocation
            .key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.queue_expiry)
            .key(&keys.queue_values)
            .arg(value(owner, opts.holder_value()))
            .arg(millis_up(opts.ttl_value()));
        if !waiter.is_empty() {
            invocation.arg(waiter).arg(millis_up(self.place_lifetime()));
            if pending.is_some() {
                invocation.arg(1);
            }
        }
        let (reply, confirmed) = self
            .run::<(i64, String)>(&invocation, true, "acquire")
            .await?;
        if matches!(reply.0, 1 | 3) && !confirmed {
            // Granted on the primary only: the armed undo releases it.
            return Err(unconfirmed("acquire"));
        }
        let attempt = match reply {
            (granted @ (1 | 3), fence) => {
                let fence = fence
                    .parse()
                    .map_err(|_| Error::malformed(NAME, "acquire", &fence))?;
                // Granted earlier (3): by this request's first run, an
                // earlier attempt of the wait, or a hand-over; each came
                // after the wait's anchor.
                let from = match pending {
                    Some(pending) if granted == 3 => pending.state().anchor.unwrap_or(sent),
                    _ => sent,
                };
                self.arrived(Lease::with_ttl(name, owner, fence, opts, from), pending)?
            }
            (0, pttl) => {
                if let Some(pending) = pending {
                    pending.state().anchor = Some(sent);
                }
                Attempt::Held {
                    expires_in: pttl.parse::<u64>().ok().map(Duration::from_millis),
                }
            }
            (2, marker) => {
                if let Some(cleanup) = &mut cleanup {
                    cleanup.disarm();
                }
                return Err(Error::ModeConflict {
                    name: name.to_owned(),
                    held: Mode::of_marker(&marker),
                    asked: Mode::Exclusive,
                });
            }
            other => return Err(Error::malformed(NAME, "acquire", other)),
        };
        if let Some(cleanup) = &mut cleanup {
            cleanup.disarm();
        }
        Ok(attempt)
    }

    /// A grant in hand, judged by [`on_arrival`]. One that came too late is
    /// released by its value; a wait then goes on under a new value, so
    /// that it can never take that value's grant as its own again.
    fn arrived(&self, lease: Lease, pending: Option<&Pending>) -> Result<Attempt> {
        let attempt = on_arrival(self, lease);
        if let (Attempt::Held { .. }, Some(pending)) = (&attempt, pending) {
            pending.state().owner = OwnerToken::random()?;
        }
        Ok(attempt)
    }

    /// Releases `value` of `name` on a task of its own.
    fn undo_in_background(&self, name: &str, value: String, opts: &LockOptions) {
        let (backend, name, ttl) = (self.clone(), name.to_owned(), opts.ttl_value());
        tokio::spawn(async move { backend.undo(&name, &value, ttl).await });
    }
}
