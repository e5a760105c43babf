//! One acquire attempt: the acquire script, and what its reply means; or a
//! grant a release handed over to the wait.

use std::collections::{HashSet, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use dlock_core::undo::UndoOnDrop;
use dlock_core::wait::{Attempt, on_arrival};
use dlock_core::{Error, Lease, LockOptions, Mode, OwnerToken, Result};
use tokio::time::Instant;

use crate::backend::{COUNTED_NAMES, NAME, RedisBackend};
use crate::error::unconfirmed;
use crate::keys::{Keys, value};
use crate::scripts::FENCE_RETENTION_MS;
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

/// Every fencing token is at least this (2001-09-09 in µs, the server's
/// clock): a counter below it was made by `INCR` on nothing.
const CLOCK_FLOOR_US: u64 = 1_000_000_000_000_000;

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
        if opts.mode_value() != Mode::Exclusive {
            return self.attempt_shared(name, keys, opts, waiter).await;
        }
        // A bare acquire that finds the key there goes on to the script
        // under the same owner: the key may be its own grant (a cluster
        // client's resend), which the script then finds.
        let mut bare_owner = None;
        if pending.is_none()
            && waiter.is_empty()
            && self.inner.builder.durable.is_none()
            && self.counted(name)
        {
            let owner = OwnerToken::random()?;
            if let Some(attempt) = self.attempt_bare(name, keys, opts, owner).await? {
                return Ok(attempt);
            }
            bare_owner = Some(owner);
        }
        let (owner, number, sent) = match pending {
            None => (
                bare_owner.map_or_else(OwnerToken::random, Ok)?,
                0,
                Instant::now(),
            ),
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
                            let old = value(grant.owner, opts.holder_value());
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
            .key(keys.lock())
            .key(keys.fence())
            .key(keys.queue())
            .key(keys.queue_expiry())
            .key(keys.queue_values())
            .arg(value(owner, opts.holder_value()))
            .arg(millis_up(opts.ttl_value()));
        if !waiter.is_empty() {
            invocation.arg(waiter).arg(millis_up(self.place_lifetime()));
            if pending.is_some() {
                invocation.arg(number);
            }
        }
        let (reply, confirmed) = self
            .run::<Vec<String>>(&invocation, true, "acquire")
            .await?;
        let malformed = || Error::malformed(NAME, "acquire", &reply);
        let (code, detail) = match reply.as_slice() {
            [code, detail, ..] => (code.parse::<i64>().map_err(|_| malformed())?, detail),
            _ => return Err(malformed()),
        };
        if matches!(code, 1 | 3) && !confirmed {
            // Granted on the primary only: the armed undo releases it.
            return Err(unconfirmed("acquire"));
        }
        let attempt = match code {
            1 => {
                let fence = detail.parse().map_err(|_| malformed())?;
                self.arrived(Lease::with_ttl(name, owner, fence, opts, sent), pending)?
            }
            // Granted before: by this request's first run (a replay), an
            // earlier attempt of the wait, or a hand-over. The key expires
            // `left` after the script ran, which was after `sent`; the
            // lease counts as if granted `ttl - left` before `sent`.
            3 => {
                let fence = detail.parse().map_err(|_| malformed())?;
                let left = reply
                    .get(2)
                    .and_then(|ms| ms.parse::<u64>().ok())
                    .map(Duration::from_millis)
                    .ok_or_else(malformed)?;
                match sent.checked_sub(opts.ttl_value().saturating_sub(left)) {
                    Some(from) => {
                        self.arrived(Lease::with_ttl(name, owner, fence, opts, from), pending)?
                    }
                    // Only within a TTL of the machine's boot.
                    None => self.arrived_late(name, owner, opts, pending)?,
                }
            }
            0 => Attempt::Held {
                expires_in: detail.parse::<u64>().ok().map(Duration::from_millis),
            },
            2 => {
                let marker = detail;
                if let Some(cleanup) = &mut cleanup {
                    cleanup.disarm();
                }
                return Err(Error::ModeConflict {
                    name: name.to_owned(),
                    held: Mode::of_marker(marker),
                    asked: Mode::Exclusive,
                });
            }
            _ => return Err(malformed()),
        };
        if let Some(cleanup) = &mut cleanup {
            cleanup.disarm();
        }
        Ok(attempt)
    }

    /// The acquire of a lock nobody waits for, in bare commands and one
    /// round trip (a script costs the server several times a `SET`): `SET
    /// NX PX`, the fencing counter's `INCR` and the server's clock. `None`
    /// when the key is there: held, of another kind, promised to its queue
    /// (see the scripts' `promise`), or granted to `owner` by this very
    /// request (a cluster client's resend); the acquire script then says
    /// which.
    ///
    /// The token is `max(INCR, server µs)`, as a script draws it: a counter
    /// brought back older (a restart from a snapshot, a failover to a
    /// replica that missed grants) is below the clock, past every token
    /// drawn before. The release raises the counter to the token, so that
    /// it stays above the clock's tokens even if that clock steps back.
    /// Only for names whose counter this client drew lately: a counter
    /// made by this `INCR` has no expiry, and costs a second request.
    async fn attempt_bare(
        &self,
        name: &str,
        keys: &Keys,
        opts: &LockOptions,
        owner: OwnerToken,
    ) -> Result<Option<Attempt>> {
        let value = value(owner, opts.holder_value());
        let ttl = opts.ttl_value();
        // Sized up front: this runs for every uncontended lock.
        let (lock, fence) = (keys.lock(), keys.fence());
        let mut set = redis::Cmd::with_capacity(6, lock.len() + value.len() + 32);
        set.arg("SET")
            .arg(lock)
            .arg(&value)
            .arg("NX")
            .arg("PX")
            .arg(millis_up(ttl));
        let mut incr = redis::Cmd::with_capacity(2, fence.len() + 4);
        incr.arg("INCR").arg(fence);
        let mut pipe = redis::Pipeline::with_capacity(3);
        pipe.add_command(set)
            .add_command(incr)
            .add_command(redis::cmd("TIME"));
        // As in `attempt`: a request that fails or is dropped mid-flight
        // may still have taken the lock.
        let mut cleanup = Unknown {
            backend: self,
            name,
            value: &value,
            ttl,
            armed: true,
        };
        let sent = Instant::now();
        let mut conn = self.connection();
        let (granted, counter, (secs, micros)) = self
            .bounded(
                "acquire",
                pipe.query_async::<(Option<String>, u64, (u64, u64))>(&mut conn),
            )
            .await?;
        if counter < CLOCK_FLOOR_US {
            // This `INCR` made the counter (it was gone: a first grant in
            // an hour, a restart, a delete), without an expiry.
            let mut expire = redis::cmd("PEXPIRE");
            expire.arg(keys.fence()).arg(FENCE_RETENTION_MS);
            self.bounded("acquire", expire.query_async::<i64>(&mut conn))
                .await?;
        }
        cleanup.armed = false;
        if granted.is_none() {
            return Ok(None);
        }
        let clock = secs.saturating_mul(1_000_000).saturating_add(micros);
        let lease = Lease::with_ttl(name, owner, counter.max(clock), opts, sent);
        Ok(Some(self.arrived(lease, None)?))
    }

    /// Whether this client drew the fencing counter of `name` lately.
    fn counted(&self, name: &str) -> bool {
        self.counted_names().contains(name)
    }

    /// Notes that this client drew the fencing counter of `name`.
    fn count(&self, name: &str) {
        let mut counted = self.counted_names();
        if !counted.contains(name) {
            if counted.len() >= COUNTED_NAMES {
                counted.clear();
            }
            counted.insert(name.to_owned());
        }
    }

    fn counted_names(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.inner
            .counted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A grant in hand, judged by [`on_arrival`]. One that came too late is
    /// released by its value; a wait then goes on under a new value, so
    /// that it can never take that value's grant as its own again.
    fn arrived(&self, lease: Lease, pending: Option<&Pending>) -> Result<Attempt> {
        let attempt = on_arrival(self, lease);
        match (&attempt, pending) {
            (Attempt::Acquired(lease), _) => self.count(lease.name()),
            (Attempt::Held { .. }, Some(pending)) => pending.state().owner = OwnerToken::random()?,
            (Attempt::Held { .. }, None) => {}
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
        self.undo_in_background(name, value(owner, opts.holder_value()), opts);
        if let Some(pending) = pending {
            pending.state().owner = OwnerToken::random()?;
        }
        Ok(Attempt::Held { expires_in: None })
    }

    /// Releases `value` of `name` on a task of its own.
    fn undo_in_background(&self, name: &str, value: String, opts: &LockOptions) {
        let (backend, name, ttl) = (self.clone(), name.to_owned(), opts.ttl_value());
        tokio::spawn(async move { backend.undo(&name, &value, ttl).await });
    }
}

/// A bare acquire whose outcome is not known yet, released by its value if
/// dropped armed (as [`UndoOnDrop`]), allocating only then.
struct Unknown<'a> {
    backend: &'a RedisBackend,
    name: &'a str,
    value: &'a str,
    ttl: Duration,
    armed: bool,
}

impl Drop for Unknown<'_> {
    fn drop(&mut self) {
        if self.armed {
            let (backend, name) = (self.backend.clone(), self.name.to_owned());
            let (value, ttl) = (self.value.to_owned(), self.ttl);
            // Dropped armed, it spawns the undo.
            drop(UndoOnDrop::new(async move {
                backend.undo(&name, &value, ttl).await;
            }));
        }
    }
}
