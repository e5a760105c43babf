//! One acquire attempt: the acquire script, and what its reply means; or a
//! grant a release handed over to the wait.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use dlock_core::driver::wait::{Attempt, on_arrival};
use dlock_core::{Error, Lease, LockOptions, Mode, OwnerToken, Result};
use redis::Value;
use tokio::time::Instant;

use crate::backend::{NAME, RedisBackend};
use crate::error::unconfirmed;
use crate::keys::{Keys, value};
use dlock_core::driver::millis_up;

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
    /// The number of the next attempt.
    next: u64,
    /// When the latest attempts were sent, by number: a hand-over names
    /// the attempt whose ask it counts the grant's TTL from, and the lease
    /// counts from that attempt's sending, which came before.
    sent: VecDeque<(u64, Instant)>,
}

/// How many attempts' sending times a wait keeps. A hand-over naming an
/// older one (which only a message delayed across that many attempts
/// would) is taken by an attempt instead.
const KEPT_SENDS: usize = 16;

impl Pending {
    pub fn new() -> Result<Self> {
        Ok(Pending {
            state: Mutex::new(PendingState {
                owner: OwnerToken::random()?,
                next: 0,
                sent: VecDeque::with_capacity(KEPT_SENDS),
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
        if opts.get_mode() != Mode::Exclusive {
            return self.attempt_shared(name, keys, opts, waiter).await;
        }
        let (owner, number, sent) = match pending {
            None => (OwnerToken::random()?, 0, Instant::now()),
            Some(pending) => {
                let handed = self.inner.pushes.take(waiter);
                let mut state = pending.state();
                if let Some(grant) = handed {
                    let asked = state.sent.iter().find(|(n, _)| *n == grant.attempt);
                    match asked {
                        Some(&(_, asked)) if grant.owner == state.owner => {
                            let lease =
                                Lease::with_ttl(name, state.owner, grant.fence, opts, asked);
                            drop(state);
                            return self.arrived(lease, Some(pending));
                        }
                        // Handed over to the value this wait gave up: free it.
                        _ if grant.owner != state.owner => {
                            let old = value(grant.owner, opts.get_holder());
                            self.undo_in_background(name, old, opts);
                        }
                        // Counted from an attempt no longer known: the
                        // attempt below finds the grant, and its TTL left.
                        _ => {}
                    }
                }
                let number = state.next;
                state.next += 1;
                if state.sent.len() == KEPT_SENDS {
                    state.sent.pop_front();
                }
                let sent = Instant::now();
                state.sent.push_back((number, sent));
                (state.owner, number, sent)
            }
        };
        let value = value(owner, opts.get_holder());
        // Armed until the reply is in: if the request fails or this future is
        // dropped mid-flight, the script may still run and take the lock for
        // a caller who never hears of it, so release it by its value. A
        // wait's value is released when the wait ends instead: a later
        // attempt may have been granted it meanwhile.
        let mut cleanup = Unsettled {
            backend: self,
            name,
            value: &value,
            opts,
            armed: pending.is_none(),
        };
        let mut invocation = self.queue_scripts().acquire.prepare_invoke();
        invocation.key(keys.lock());
        if self.inner.cluster {
            // One server derives them from the lock key (see the script).
            invocation
                .key(keys.fence())
                .key(keys.queue())
                .key(keys.queue_expiry())
                .key(keys.queue_values());
        }
        invocation.arg(&value).arg(millis_up(opts.get_ttl()));
        if !waiter.is_empty() {
            invocation.arg(waiter).arg(millis_up(self.place_lifetime()));
            if pending.is_some() {
                invocation.arg(number);
            }
        }
        let (reply, confirmed) = self.run::<Value>(&invocation, true, "acquire").await?;
        let malformed = || Error::malformed(NAME, "acquire", &reply);
        // A grant now is the fencing token alone; other outcomes a table.
        let (code, detail, third) = match &reply {
            Value::BulkString(_) => (1, &reply, None),
            Value::Array(fields) => match fields.as_slice() {
                [Value::Int(code), detail, rest @ ..] => (*code, detail, rest.first()),
                _ => return Err(malformed()),
            },
            _ => return Err(malformed()),
        };
        if matches!(code, 1 | 3) && !confirmed {
            // Granted on the primary only: the armed undo releases it.
            return Err(unconfirmed("acquire"));
        }
        let attempt = match code {
            1 => {
                let fence = count(detail).ok_or_else(malformed)?;
                self.arrived(Lease::with_ttl(name, owner, fence, opts, sent), pending)?
            }
            // Granted before: by this request's first run (a replay), an
            // earlier attempt of the wait, or a hand-over. The key expires
            // `left` after the script ran, which was after `sent`; the
            // lease counts as if granted `ttl - left` before `sent`.
            3 => {
                let fence = count(detail).ok_or_else(malformed)?;
                let left = third
                    .and_then(count)
                    .map(Duration::from_millis)
                    .ok_or_else(malformed)?;
                match sent.checked_sub(opts.get_ttl().saturating_sub(left)) {
                    Some(from) => {
                        self.arrived(Lease::with_ttl(name, owner, fence, opts, from), pending)?
                    }
                    // Only within a TTL of the machine's boot.
                    None => self.arrived_late(name, owner, opts, pending)?,
                }
            }
            // The holder's PTTL; negative: free but promised to the head.
            0 => Attempt::Held {
                expires_in: count(detail).map(Duration::from_millis),
            },
            2 => {
                cleanup.armed = false;
                return Err(Error::ModeConflict {
                    name: name.to_owned(),
                    held: Mode::of_marker(text(detail).ok_or_else(malformed)?),
                    asked: Mode::Exclusive,
                });
            }
            _ => return Err(malformed()),
        };
        cleanup.armed = false;
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

    /// A grant whose validity cannot be counted: released like one that
    /// came too late.
    fn arrived_late(
        &self,
        name: &str,
        owner: OwnerToken,
        opts: &LockOptions,
        pending: Option<&Pending>,
    ) -> Result<Attempt> {
        self.undo_in_background(name, value(owner, opts.get_holder()), opts);
        if let Some(pending) = pending {
            pending.state().owner = OwnerToken::random()?;
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// Releases `value` of `name` on a task of its own, if there is a
    /// runtime to spawn it on (an acquire dropped as its runtime shuts
    /// down leaves the lock to its TTL).
    fn undo_in_background(&self, name: &str, value: String, opts: &LockOptions) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, name, ttl) = (self.clone(), name.to_owned(), opts.get_ttl());
        rt.spawn(async move { backend.undo(&name, &value, ttl).await });
    }
}

/// An acquire whose outcome is not known yet: dropped while armed (the
/// request failed, or the caller dropped the future mid-flight), it
/// releases `value` on a task of its own. It borrows until then, so the
/// common case, a reply, costs no allocation.
struct Unsettled<'a> {
    backend: &'a RedisBackend,
    name: &'a str,
    value: &'a str,
    opts: &'a LockOptions,
    armed: bool,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if self.armed {
            let value = self.value.to_owned();
            self.backend.undo_in_background(self.name, value, self.opts);
        }
    }
}

/// A reply field as text.
fn text(field: &Value) -> Option<&str> {
    match field {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text),
        _ => None,
    }
}

/// A reply field as a number: an integer, or its decimal text. `None` for
/// a negative one (a PTTL's "no key", "no expiry").
fn count(field: &Value) -> Option<u64> {
    match field {
        Value::Int(n) => u64::try_from(*n).ok(),
        other => text(other)?.parse().ok(),
    }
}
