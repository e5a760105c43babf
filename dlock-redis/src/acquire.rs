//! One acquire attempt: the acquire script, and what its reply means.

use std::time::Duration;

use dlock_core::undo::UndoOnDrop;
use dlock_core::wait::{Attempt, on_arrival};
use dlock_core::{Error, Lease, LockOptions, Mode, OwnerToken, Result};
use tokio::time::Instant;

use crate::backend::{NAME, RedisBackend};
use crate::error::unconfirmed;
use crate::keys::{Keys, value};
use dlock_core::millis_up;

impl RedisBackend {
    /// One acquire script: a grant, or the holder's remaining TTL. With a
    /// `waiter`, a caller not granted keeps (or takes) its place in the
    /// name's queue.
    pub(crate) async fn attempt(
        &self,
        name: &str,
        keys: &Keys,
        opts: &LockOptions,
        waiter: &str,
    ) -> Result<Attempt> {
        if opts.mode_value() != Mode::Exclusive {
            return self.attempt_shared(name, keys, opts, waiter).await;
        }
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        // Armed until the reply is in: if the request fails or this future is
        // dropped mid-flight, the script may still run and take the lock for
        // a caller who never hears of it, so release it by its token.
        let mut cleanup = {
            let (backend, name, ttl) = (self.clone(), name.to_owned(), opts.ttl_value());
            let value = value(owner, opts.holder_value());
            UndoOnDrop::new(async move { backend.undo(&name, &value, ttl).await })
        };
        let mut invocation = self.queue_scripts().acquire.prepare_invoke();
        invocation
            .key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.queue_expiry)
            .arg(value(owner, opts.holder_value()))
            .arg(millis_up(opts.ttl_value()));
        if !waiter.is_empty() {
            invocation.arg(waiter).arg(millis_up(self.place_lifetime()));
        }
        let (reply, confirmed) = self
            .run::<(i64, String)>(&invocation, true, "acquire")
            .await?;
        if reply.0 == 1 && !confirmed {
            // Granted on the primary only: the armed undo releases it.
            return Err(unconfirmed("acquire"));
        }
        let attempt = match reply {
            (1, fence) => {
                let fence = fence
                    .parse()
                    .map_err(|_| Error::malformed(NAME, "acquire", &fence))?;
                on_arrival(self, Lease::with_ttl(name, owner, fence, opts, sent))
            }
            (0, pttl) => Attempt::Held {
                expires_in: pttl.parse::<u64>().ok().map(Duration::from_millis),
            },
            (2, marker) => {
                cleanup.disarm();
                return Err(Error::ModeConflict {
                    name: name.to_owned(),
                    held: Mode::of_marker(&marker),
                    asked: Mode::Exclusive,
                });
            }
            other => return Err(Error::malformed(NAME, "acquire", other)),
        };
        cleanup.disarm();
        Ok(attempt)
    }
}
