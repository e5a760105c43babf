//! Acquire's wait: a place in the name's queue, wake-ups on this client's
//! channel when the place comes first, and giving the place up when the
//! wait ends without a grant.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::driver::undo::{UndoOnDrop, retry_for};
use dlock_core::driver::wait::{Attempt, Backoff, Deadline, wait_for_lock};
use dlock_core::{Lease, LockOptions, Mode, OwnerToken, Result};

use crate::acquire::Pending;
use crate::backend::RedisBackend;
use crate::keys::value;
use crate::scripts::PLACE_HEARTBEATS;

/// The longest a queued waiter goes without asking again, whatever its
/// client's `max_poll_interval`: a waiter whose process died keeps the
/// name from the living for a few of these, not for hours.
const MAX_HEARTBEAT: Duration = Duration::from_secs(5);

impl RedisBackend {
    /// How often a queued waiter asks again, at the longest.
    fn heartbeat(&self) -> Duration {
        self.inner.max_poll.min(MAX_HEARTBEAT)
    }

    /// How long a queued waiter keeps its place without asking again: a
    /// few of its longest sleeps, plus the longest its next ask may take to
    /// reach the server and the reply before it (each bounded by a connect
    /// and a request timeout: the connection may be re-opening), so a slow
    /// waiter does not lose its place to its own round trips.
    pub(crate) fn place_lifetime(&self) -> Duration {
        let round_trip = self.inner.builder.connect_timeout + self.inner.request_timeout;
        self.heartbeat() * PLACE_HEARTBEATS + round_trip * 2
    }

    /// Acquire's wait: one attempt, then a place in the name's queue and
    /// wake-ups on this client's channel when the place comes first.
    pub(crate) async fn wait_for(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Lease> {
        let keys = self.keys(name);
        let notifications = &self.inner.notifications;
        // Until this client first waits, the uncontended case costs one
        // round trip: subscribe and queue only once the lock turns out to
        // be held (or the attempt failed in a way worth another try, which
        // the wait loop makes). From then on the channel is kept, and the
        // first attempt queues at once, unless the wait is too short to
        // be worth a place: then one plain attempt comes first, and only
        // if that fails does the wait queue (a place is given back when
        // the wait ends, but until then it holds the queue up).
        //
        // On a cluster each lock has its own channel per client, in the
        // lock's slot: it is subscribed for the wait only.
        let worth_queueing = deadline.cap(self.inner.request_timeout) >= self.inner.request_timeout;
        let cluster = self.inner.cluster;
        if cluster || !notifications.is_kept() || !worth_queueing {
            match self.attempt(name, &keys, opts, "", None).await {
                Ok(Attempt::Acquired(lease)) => return Ok(lease),
                Ok(Attempt::Held { .. }) => {}
                Err(e) if e.is_retryable() => {}
                Err(e) => return Err(e),
            }
            if deadline.is_past() {
                return Err(deadline.timeout_error(name));
            }
        }
        // The subscriber may be busy resubscribing to a node that is down,
        // or the server may refuse us SUBSCRIBE (an ACL): wait for it only
        // so long. A waiter without a subscription still queues — outside
        // the queue it would be refused whenever anyone waits — and hears
        // that its turn came at its next poll instead.
        let limit = deadline.cap(self.inner.request_timeout * 2);
        let (_interest, subscribed) = if cluster {
            let channel = format!("{}:wake:{}", keys.lock(), self.inner.client_id);
            let (interest, subscribed) = notifications.interest(&channel, limit).await;
            (Some(interest), subscribed)
        } else {
            let channel = format!("{}{}", self.inner.wake_prefix, self.inner.client_id);
            (None, notifications.keep(&channel, limit).await)
        };
        if !subscribed {
            tracing::debug!(name, "waiting without wake-ups: polling");
        }
        let waiter = format!("{}{}", OwnerToken::random()?, self.inner.client_id);
        // A mutex waiter takes the lock handed over by a release, unless
        // every grant must be confirmed by replicas (a hand-over is not),
        // or it would not hear of it (it would learn at its next poll, and
        // hold the lock for nothing until then).
        // Nor with a lock-delay: a hand-over's freshness is judged on the
        // TTL the server keeps, longer than the one the waiter trusts.
        let takes_hand_overs = subscribed
            && opts.get_mode() == Mode::Exclusive
            && self.inner.builder.durable.is_none()
            && opts.trusted_ttl() == opts.get_ttl();
        let pending = takes_hand_overs
            .then(Pending::new)
            .transpose()?
            .map(Arc::new);
        let _expecting = pending.is_some().then(|| Expecting::new(self, &waiter));
        // However the wait ends without a grant (timeout, error, dropped),
        // give the place up, so that the next waiter need not wait for it
        // to lapse, and a grant handed over that it never took. A grant
        // took it out of the queue already.
        let mut leave = {
            let (backend, name, waiter) = (self.clone(), name.to_owned(), waiter.clone());
            let (mode, pending) = (opts.get_mode(), pending.clone());
            let holder = opts.get_holder().to_owned();
            UndoOnDrop::new(async move {
                if mode == Mode::Exclusive {
                    let held = pending.map(|p| value(p.owner(), &holder));
                    backend.abandon(&name, &waiter, held.as_deref()).await;
                } else {
                    backend.abandon_shared(&name, &waiter, mode).await;
                }
            })
        };
        // Heartbeats no longer apart than this keep the place.
        let heartbeat = self.heartbeat();
        let backoff = Backoff::new(heartbeat.min(Duration::from_millis(100)), heartbeat);
        let lease = wait_for_lock(
            name,
            deadline,
            Some(&notifications.wakeups),
            backoff,
            || self.attempt(name, &keys, opts, &waiter, pending.as_deref()),
        )
        .await?;
        leave.disarm();
        Ok(lease)
    }

    /// Takes `waiter` out of the queue of `name`, and releases the lock if
    /// it was handed over to the waiter's lock value `held`; wakes the
    /// next waiter if it was first, or the lock was released, and the lock
    /// is free.
    async fn abandon(&self, name: &str, waiter: &str, held: Option<&str>) {
        let keys = self.keys(name);
        let mut invocation = self.queue_scripts().abandon.prepare_invoke();
        invocation
            .key(keys.lock())
            .key(keys.queue())
            .key(keys.queue_expiry())
            .key(keys.queue_values())
            .arg(waiter);
        if let Some(held) = held {
            invocation.arg(held);
        }
        let left = retry_for(self.inner.request_timeout * 2, || async {
            self.run::<i64>(&invocation, false, "leave the queue").await
        })
        .await;
        // Otherwise the place lapses by itself.
        tracing::debug!(name, ?left, "left the queue");
    }
}

/// A waiter whose hand-overs this client keeps, for as long as it waits.
struct Expecting<'a> {
    backend: &'a RedisBackend,
    waiter: &'a str,
}

impl<'a> Expecting<'a> {
    fn new(backend: &'a RedisBackend, waiter: &'a str) -> Self {
        backend.inner.pushes.expect(waiter);
        Expecting { backend, waiter }
    }
}

impl Drop for Expecting<'_> {
    fn drop(&mut self) {
        self.backend.inner.pushes.forget(self.waiter);
    }
}
