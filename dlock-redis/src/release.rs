//! Release, release after a hold, and the undo of an acquire whose outcome
//! is unknown.

use std::time::Duration;

use dlock_core::driver::undo::retry_for;
use dlock_core::{Lease, Mode, OwnerToken, Result};
use redis::ScriptInvocation;

use crate::backend::RedisBackend;
use crate::error::owner_checked;
use crate::keys::{Keys, value, value_of};
use dlock_core::driver::millis_up;

use crate::scripts::HOLD;

impl RedisBackend {
    /// Deletes the lock if `lease` holds it, and hands it over to the head
    /// of its queue (or wakes the head).
    pub(crate) async fn release_lease(&self, lease: &Lease) -> Result<()> {
        if lease.mode() != Mode::Exclusive {
            return self.release_shared(lease).await;
        }
        let keys = self.keys(lease.name());
        let value = value_of(lease);
        let mut invocation = self.release_script(&keys, &value);
        self.mark_replays(&mut invocation, &keys)?;
        let (released, confirmed) = self.run::<i64>(&invocation, false, "release").await?;
        owner_checked(lease, released, confirmed, "release")
    }

    /// On a cluster, makes a release or hold idempotent: the cluster client
    /// sends a request again when its connection dropped, and the first may
    /// have run. The script remembers the request's id in the lock's slot
    /// for two request timeouts, and a replay that finds it reports
    /// success; a new call (a new id) is still "not held". The mark is the
    /// script's last key, its id and lifetime the last arguments.
    pub(crate) fn mark_replays(
        &self,
        invocation: &mut ScriptInvocation<'_>,
        keys: &Keys,
    ) -> Result<()> {
        if self.inner.cluster {
            let remember = millis_up(self.inner.request_timeout).saturating_mul(2);
            invocation
                .key(format!("{}:done", keys.lock()))
                .arg(OwnerToken::random()?.to_string())
                .arg(remember);
        }
        Ok(())
    }

    /// Keeps the lock of `lease` held for `hold` more, by the server's
    /// clock, under an owner no client has.
    pub(crate) async fn release_with_hold(&self, lease: &Lease, hold: Duration) -> Result<()> {
        // Rounded up: the hold is a minimum.
        let hold_ms = millis_up(hold);
        if hold_ms == 0 {
            return self.release_lease(lease).await;
        }
        if lease.mode() != Mode::Exclusive {
            return self.hold_shared(lease, hold_ms).await;
        }
        // The key gets the hold's owner and expires on the server's clock.
        // No publish: waiters poll against the remaining TTL, which the
        // server reports.
        let keys = self.keys(lease.name());
        let mut invocation = HOLD.prepare_invoke();
        invocation
            .key(keys.lock())
            .arg(value_of(lease))
            // The hold keeps the holder description, for operators.
            .arg(value(lease.owner().for_hold(), lease.holder()))
            .arg(hold_ms);
        self.mark_replays(&mut invocation, &keys)?;
        let (held, confirmed) = self.run::<i64>(&invocation, true, "release_after").await?;
        owner_checked(lease, held, confirmed, "release_after")
    }

    /// The release script for the grant whose lock key value is `value`
    /// on the lock of `keys`; it hands the lock over to the head of the
    /// queue, or wakes it.
    fn release_script<'a>(&'a self, keys: &'a Keys, value: &'a str) -> redis::ScriptInvocation<'a> {
        let mut invocation = self.queue_scripts().release.prepare_invoke();
        invocation.key(keys.lock());
        if self.inner.cluster {
            // One server derives them from the lock key (see the script).
            invocation
                .key(keys.queue())
                .key(keys.queue_expiry())
                .key(keys.fence())
                .key(keys.queue_values());
        }
        invocation.arg(value);
        invocation
    }

    /// Releases `name` if the grant whose lock key value is `value` holds
    /// it, retrying while the server is out of reach, until it answers or
    /// the TTL has freed the lock anyway. Publishes like any release, so
    /// that waiters wake.
    pub(crate) async fn undo(&self, name: &str, value: &str, ttl: Duration) {
        let keys = self.keys(name);
        let invocation = self.release_script(&keys, value);
        let released = retry_for(ttl, || async {
            self.run::<i64>(&invocation, false, "undo an acquire").await
        })
        .await;
        tracing::debug!(name, ?released, "undid an acquire of unknown outcome");
    }
}
