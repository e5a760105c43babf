//! Following the Sentinels' primary: a task per backend that looks at each
//! announced switch, at each failed request, and every second; and the
//! switch of the backend's connections.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use dlock_core::Error;
use redis::{PushInfo, PushKind, Value};
use tokio::time::MissedTickBehavior;

use super::{Move, Why, judge};
use crate::backend::{NAME, RedisBackend};

/// How often the Sentinels are asked for the primary when none announces a
/// switch: a Sentinel cut off from us cannot announce, and a client that
/// waited for its own requests to fail would go on using a cut-off primary
/// that still answers it (until Sentinel demotes it, after the heal).
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How often the primary may be looked up again: a primary that is down
/// makes every request fail, and each failure asks for a lookup.
const LOOKUP_INTERVAL: Duration = Duration::from_millis(100);

/// Whether an announcement is a switch of `service`'s primary.
fn is_switch(push: &PushInfo, service: &str) -> bool {
    match (&push.kind, push.data.as_slice()) {
        (PushKind::Message, [_, Value::BulkString(payload)]) => payload
            .split(|&b| b == b' ')
            .next()
            .is_some_and(|name| name == service.as_bytes()),
        // A Sentinel connection dropped: look now, which reopens it.
        (PushKind::Disconnection, _) => true,
        _ => false,
    }
}

impl RedisBackend {
    /// Starts the task that follows the Sentinels' primary: at each
    /// announced switch, at each nudge of a failed request, and every
    /// `poll` ([`POLL_INTERVAL`] unless a test says otherwise). It ends
    /// with the backend.
    pub(crate) fn watch_sentinels(&self, poll: Option<Duration>) {
        let Some(sentinel) = &self.inner.sentinel else {
            return;
        };
        let Some(mut heard) = sentinel
            .heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        // The task keeps no backend alive while it waits.
        let backend = Arc::downgrade(&self.inner);
        let (nudge, service) = (sentinel.nudge.clone(), sentinel.service.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(poll.unwrap_or(POLL_INTERVAL));
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    push = heard.recv() => match push {
                        Some(push) if is_switch(&push, &service) => {}
                        Some(_) => continue,
                        None => return,
                    },
                    () = nudge.notified() => {}
                    _ = tick.tick() => {}
                }
                let Some(inner) = backend.upgrade() else {
                    return;
                };
                RedisBackend { inner }.follow_primary().await;
                // A burst of failed requests asks once.
                tokio::time::sleep(LOOKUP_INTERVAL).await;
            }
        });
    }

    /// Asks the Sentinels for the primary and, when a newer epoch names
    /// another, points the connections at it once it confirms its role.
    /// Until it does, or while it is refused for its eviction policy,
    /// every grant and extension is refused: the old primary is not the
    /// primary any more.
    async fn follow_primary(&self) {
        let Some(sentinel) = &self.inner.sentinel else {
            return;
        };
        // One at a time, from the lookup to the swap: a slower follower
        // with an older answer must not undo a newer one.
        let Ok(_following) = sentinel.following.try_lock() else {
            return;
        };
        let named = match sentinel.lookup().await {
            Ok(named) => named,
            Err(e) => {
                tracing::debug!(error = %e, "no primary from Sentinel");
                return;
            }
        };
        let current = sentinel.current();
        match judge(current.as_ref(), sentinel.floor(), &named) {
            Move::Stay => {
                sentinel.stay(named);
                return;
            }
            Move::Ignore => {
                tracing::debug!(addr = %named.addr, epoch = named.epoch, "an older answer");
                return;
            }
            Move::Switch => {}
        }
        if sentinel.recently_refused(&named) {
            return;
        }
        // The primary in use is not the primary any more: refuse grants
        // there from now on, not once the new one is reached.
        sentinel.block(named.clone(), Why::Unreachable("connecting".to_owned()));
        let builder = &self.inner.builder;
        let bound = builder.connect_timeout * 2 + self.inner.request_timeout;
        let opened = match sentinel.info_for(&named) {
            Ok(info) => tokio::time::timeout(bound, builder.open_primary(info, &self.inner.pushes))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::timed_out(
                        NAME,
                        format!("no answer within {bound:?}"),
                    ))
                }),
            Err(e) => Err(e),
        };
        match opened {
            Ok((conn, push_conn)) => {
                *self
                    .inner
                    .conn
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = conn;
                self.inner.notifications.reconnect(push_conn);
                tracing::info!(primary = %named.addr, epoch = named.epoch, "following the new primary");
                sentinel.switch_to(named);
            }
            Err(Error::UnsafeServer { message, .. }) => {
                tracing::warn!(primary = %named.addr, %message, "not following the new primary");
                // The holds granted on the old primary live on this one
                // now, which may evict them.
                self.inner
                    .trust
                    .distrust(format!("the new primary {}: {message}", named.addr));
                sentinel.block(named, Why::Unsafe(message));
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot use the new primary yet");
                sentinel.block(named, Why::Unreachable(e.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(channel: &str, payload: &str) -> PushInfo {
        PushInfo {
            kind: PushKind::Message,
            data: vec![
                Value::BulkString(channel.as_bytes().to_vec()),
                Value::BulkString(payload.as_bytes().to_vec()),
            ],
        }
    }

    #[test]
    fn a_switch_of_the_service_is_heard_and_others_are_not() {
        let svc = "+switch-master svc 10.0.0.1 6379 10.0.0.2 6379";
        let (_, payload) = svc.split_once(' ').unwrap_or_default();
        assert!(is_switch(&message("+switch-master", payload), "svc"));
        assert!(!is_switch(&message("+switch-master", payload), "sv"));
        assert!(!is_switch(
            &message("+switch-master", "other 10.0.0.1 6379 10.0.0.2 6379"),
            "svc"
        ));
        let dropped = PushInfo {
            kind: PushKind::Disconnection,
            data: Vec::new(),
        };
        assert!(is_switch(&dropped, "svc"));
        let subscribed = PushInfo {
            kind: PushKind::Subscribe,
            data: vec![Value::BulkString(b"+switch-master".to_vec()), Value::Int(1)],
        };
        assert!(!is_switch(&subscribed, "svc"));
    }
}
