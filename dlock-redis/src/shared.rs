//! Reader-writer locks and semaphores: the calls of the shared kinds of
//! lock, on the scripts of `scripts/shared.rs`.

use std::time::Duration;

use dlock_core::driver::millis_up;
use dlock_core::driver::undo::{UndoOnDrop, retry_for};
use dlock_core::driver::wait::{Attempt, on_arrival};
use dlock_core::{Error, Lease, LockInfo, LockOptions, Mode, OwnerToken, Result};
use redis::ScriptInvocation;
use tokio::time::Instant;

use crate::backend::{NAME, RedisBackend};
use crate::error::{owner_checked, unconfirmed};
use crate::keys::{Keys, member, member_of};
use crate::scripts::FENCE_RETENTION_MS;

impl RedisBackend {
    /// The keys every shared script takes, in its order.
    fn shared_keys<'a>(&self, invocation: &mut ScriptInvocation<'a>, keys: &Keys) {
        invocation
            .key(keys.lock())
            .key(keys.fence())
            .key(keys.holds())
            .key(keys.queue())
            .key(keys.queue_expiry())
            .key(keys.queue_modes());
    }

    /// One acquire attempt at a shared kind of lock; with a `waiter`, a
    /// caller not admitted keeps (or takes) its place in the queue.
    pub(crate) async fn attempt_shared(
        &self,
        name: &str,
        keys: &Keys,
        opts: &LockOptions,
        waiter: &str,
    ) -> Result<Attempt> {
        let mode = opts.get_mode();
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        // Armed until the reply is in, as for the mutex (see `acquire.rs`).
        let mut cleanup = {
            let (backend, name, lease) = (
                self.clone(),
                name.to_owned(),
                Lease::with_ttl(name, owner, 0, opts, sent),
            );
            let waiter = waiter.to_owned();
            UndoOnDrop::new(async move {
                let ttl = lease.ttl().unwrap_or_default();
                let released = retry_for(ttl, || backend.end_shared(&lease, &waiter)).await;
                tracing::debug!(name, ?released, "undid an acquire of unknown outcome");
            })
        };
        let mut invocation = self.queue_scripts().shared.acquire.prepare_invoke();
        self.shared_keys(&mut invocation, keys);
        invocation
            .arg(member(owner, mode))
            .arg(mode.code())
            .arg(mode.marker())
            .arg(mode.permits())
            .arg(millis_up(opts.get_ttl()))
            .arg(opts.get_holder());
        if !waiter.is_empty() {
            invocation.arg(waiter).arg(millis_up(self.place_lifetime()));
        }
        let (reply, confirmed) = self
            .run::<(i64, String)>(&invocation, true, "acquire")
            .await?;
        if reply.0 == 1 && !confirmed {
            return Err(unconfirmed("acquire"));
        }
        let attempt = match reply {
            (1, fence) => {
                let fence = fence
                    .parse()
                    .map_err(|_| Error::malformed(NAME, "acquire", &fence))?;
                on_arrival(self, Lease::with_ttl(name, owner, fence, opts, sent))
            }
            (0, left) => Attempt::Held {
                expires_in: left.parse::<u64>().ok().map(Duration::from_millis),
            },
            (2, kind) => {
                cleanup.disarm();
                return Err(Error::ModeConflict {
                    name: name.to_owned(),
                    held: Mode::of_marker(&kind),
                    asked: mode,
                });
            }
            other => return Err(Error::malformed(NAME, "acquire", other)),
        };
        cleanup.disarm();
        Ok(attempt)
    }

    /// Ends a shared hold and wakes whoever that lets in.
    pub(crate) async fn release_shared(&self, lease: &Lease) -> Result<()> {
        self.end_shared(lease, "").await
    }

    /// Ends a shared hold, giving the queue place it was granted from back
    /// to `waiter` (`""`: to nobody) if it is that waiter's: the undo of a
    /// grant whose reply was lost. A waiter that lost its place to a grant
    /// it never heard of would queue anew behind later writers, and the
    /// readers let in beside it would hold those writers off while it
    /// waits behind them.
    async fn end_shared(&self, lease: &Lease, waiter: &str) -> Result<()> {
        let keys = self.keys(lease.name());
        let mode = lease.mode();
        let mut invocation = self.queue_scripts().shared.release.prepare_invoke();
        self.shared_keys(&mut invocation, &keys);
        invocation
            .arg(member_of(lease))
            .arg(mode.marker())
            .arg(mode.permits())
            .arg(waiter)
            .arg(millis_up(self.place_lifetime()));
        self.mark_replays(&mut invocation, &keys)?;
        let (released, confirmed) = self.run::<i64>(&invocation, false, "release").await?;
        owner_checked(lease, released, confirmed, "release")
    }

    /// `release_after` of a shared hold: it stays, under the hold's owner,
    /// until `hold_ms` from now on the server's clock.
    pub(crate) async fn hold_shared(&self, lease: &Lease, hold_ms: u64) -> Result<()> {
        let keys = self.keys(lease.name());
        let mode = lease.mode();
        let mut invocation = self.queue_scripts().shared.hold.prepare_invoke();
        self.shared_keys(&mut invocation, &keys);
        invocation
            .arg(member_of(lease))
            .arg(member(lease.owner().for_hold(), mode))
            .arg(hold_ms)
            .arg(mode.marker());
        self.mark_replays(&mut invocation, &keys)?;
        let (held, confirmed) = self.run::<i64>(&invocation, true, "release_after").await?;
        owner_checked(lease, held, confirmed, "release_after")
    }

    /// A read hold for the live write lease `write`, waiters or not.
    pub(crate) async fn downgrade_lease(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        if write.mode() != Mode::Write {
            return Err(Error::not_held(write.name()));
        }
        let keys = self.keys(write.name());
        let reader = OwnerToken::random()?;
        let sent = Instant::now();
        let mut invocation = self.queue_scripts().shared.downgrade.prepare_invoke();
        self.shared_keys(&mut invocation, &keys);
        invocation
            .arg(member_of(write))
            .arg(member(reader, Mode::Read))
            .arg(millis_up(opts.get_ttl()))
            .arg(Mode::Read.marker())
            .arg(opts.get_holder());
        // A read hold of unknown outcome (no reply in time, a dropped
        // future, an unconfirmed reply) is released, as an acquire's is.
        let mut undo = {
            let (backend, lease) = (
                self.clone(),
                Lease::with_ttl(write.name(), reader, 0, opts, sent),
            );
            UndoOnDrop::new(async move {
                let ttl = lease.ttl().unwrap_or_default();
                let _ = retry_for(ttl, || backend.release_shared(&lease)).await;
            })
        };
        let (reply, confirmed) = self
            .run::<(i64, String)>(&invocation, true, "downgrade")
            .await?;
        match reply {
            (1, _) if !confirmed => Err(unconfirmed("downgrade")),
            (1, fence) => {
                undo.disarm();
                let fence = fence
                    .parse()
                    .map_err(|_| Error::malformed(NAME, "downgrade", &fence))?;
                Ok(Lease::with_ttl(write.name(), reader, fence, opts, sent))
            }
            _ => {
                undo.disarm();
                Err(Error::not_held(write.name()))
            }
        }
    }

    /// Gives a shared waiter's place up.
    pub(crate) async fn abandon_shared(&self, name: &str, waiter: &str, mode: Mode) {
        let keys = self.keys(name);
        let mut invocation = self.queue_scripts().shared.abandon.prepare_invoke();
        self.shared_keys(&mut invocation, &keys);
        invocation
            .arg(waiter)
            .arg(mode.marker())
            .arg(mode.permits());
        let left = retry_for(self.inner.request_timeout * 2, || async {
            self.run::<i64>(&invocation, false, "leave the queue").await
        })
        .await;
        tracing::debug!(name, ?left, "left the queue");
    }

    /// Ends every hold of a name held as `marker` (an operator's force
    /// release).
    pub(crate) async fn clear_shared(&self, name: &str, marker: &str) -> Result<()> {
        let keys = self.keys(name);
        let mut invocation = self.queue_scripts().shared.clear.prepare_invoke();
        self.shared_keys(&mut invocation, &keys);
        let permits = Mode::of_marker(marker).permits();
        invocation.arg(marker).arg(permits);
        self.run::<i64>(&invocation, true, "force_release").await?;
        Ok(())
    }

    /// Extends shared leases in one script run (a single server), or one
    /// run per lease, all at once (a cluster, where a script stays in one
    /// slot); says which ones it did.
    pub(crate) async fn extend_shared(&self, leases: &mut [&mut Lease]) -> Result<Vec<bool>> {
        let script = &self.queue_scripts().shared.extend;
        let invocation = |leases: &[&mut Lease]| {
            let mut invocation = script.prepare_invoke();
            invocation.arg(FENCE_RETENTION_MS);
            for lease in leases {
                let keys = self.keys(lease.name());
                invocation
                    .key(keys.lock())
                    .key(keys.fence())
                    .key(keys.holds());
                invocation
                    .arg(member_of(lease))
                    .arg(millis_up(lease.ttl().unwrap_or_default()))
                    .arg(lease.mode().marker());
            }
            invocation
        };
        let sent = Instant::now();
        let replies: Vec<Result<(Vec<i64>, bool)>> = if self.inner.cluster {
            let runs = leases.chunks(1).map(|one| {
                let invocation = invocation(one);
                async move { self.run::<Vec<i64>>(&invocation, true, "extend").await }
            });
            futures_util::future::join_all(runs).await
        } else {
            vec![
                self.run::<Vec<i64>>(&invocation(leases), true, "extend")
                    .await,
            ]
        };
        let mut held = Vec::with_capacity(leases.len());
        for reply in replies {
            let (reply, confirmed) = reply?;
            if !confirmed {
                return Err(unconfirmed("extend"));
            }
            held.extend(reply.into_iter().map(|h| h == 1));
        }
        if held.len() != leases.len() {
            return Err(Error::malformed(NAME, "extend_many", held));
        }
        for (lease, &held) in leases.iter_mut().zip(&held) {
            if held {
                lease.extended(sent);
            }
        }
        Ok(held)
    }

    /// `force_release` for every kind: a mutex's holder by its token, a
    /// shared kind's holds all at once.
    pub(crate) async fn force_release_any(&self, name: &str) -> Result<Option<LockInfo>> {
        // The kind the last look saw: a marker for the shared kinds.
        let marker = std::sync::Mutex::new(String::new());
        let kind = || {
            marker
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        dlock_core::driver::admin::force_release_with(
            NAME,
            name,
            || async {
                let seen = self.inspect_with_kind(name).await?;
                Ok(seen.map(|(info, seen)| {
                    *kind() = seen;
                    info
                }))
            },
            || async {
                let seen = kind().clone();
                if seen.is_empty() {
                    return Ok(false);
                }
                self.clear_shared(name, &seen).await?;
                Ok(true)
            },
            |lease| async move { self.release_lease(&lease).await },
        )
        .await
    }
}
