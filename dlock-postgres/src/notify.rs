//! Wake-ups across processes: with `wake_ups(true)` a release sends
//! `pg_notify('dlock_<table>', <name in hex>)` in its own statement, and a
//! backend that has waiters listens on that channel on a connection of its
//! own, opened when it first waits, and wakes its waiters of the name.
//!
//! PostgreSQL delivers a notification at the release's commit, only to
//! connections listening then, and drops what a connection missed while it
//! was gone; an expiry sends nothing. So waiters still poll, and every
//! waiter looks again whenever the listener (re)connects.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_core::wait::Backoff;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::task::AbortHandle;

use crate::backend::Inner;

/// The listening task of one backend, started when it first waits;
/// stopped when the backend goes.
#[derive(Debug, Default)]
pub(crate) struct Listener {
    task: Mutex<Option<AbortHandle>>,
    /// Times it started listening, and notifications it heard: for tests.
    listened: AtomicU64,
    heard: AtomicU64,
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(task) = self.task.get_mut().unwrap_or_else(PoisonError::into_inner) {
            task.abort();
        }
    }
}

impl Listener {
    /// Starts listening for `inner`'s table, unless it does already.
    pub fn start(inner: &Arc<Inner>, options: &PgConnectOptions) {
        let mut task = inner
            .listener
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if task.is_some() {
            return;
        }
        let (weak, options) = (Arc::downgrade(inner), options.clone());
        let channel = inner.sql.channel().to_owned();
        *task = Some(tokio::spawn(listen(weak, options, channel)).abort_handle());
    }
}

/// Listens on `channel` until the backend is gone, connecting again after
/// any failure.
async fn listen(inner: Weak<Inner>, options: PgConnectOptions, channel: String) {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options);
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(e) => {
                tracing::debug!(error = %e, "cannot listen for releases; waiters poll");
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        if let Err(e) = listener.listen(&channel).await {
            tracing::debug!(error = %e, "cannot listen for releases; waiters poll");
            tokio::time::sleep(backoff.next_delay()).await;
            continue;
        }
        backoff.reset();
        // Listening now: every waiter looks for a release it missed.
        let mut missed = true;
        loop {
            if std::mem::take(&mut missed) {
                let Some(inner) = inner.upgrade() else { return };
                inner.listener.listened.fetch_add(1, Ordering::Relaxed);
                inner.wakeups.wake_all();
                inner.shared_wakeups.wake_all();
            }
            match listener.try_recv().await {
                Ok(Some(notification)) => {
                    let Some(inner) = inner.upgrade() else { return };
                    if let Some((name, waiters)) = decode(notification.payload()) {
                        inner.listener.heard.fetch_add(1, Ordering::Relaxed);
                        inner.wakeups.wake(&name);
                        for waiter in waiters.split(',').filter(|w| !w.is_empty()) {
                            inner.shared_wakeups.wake(waiter);
                        }
                    }
                }
                // The connection dropped: the next receive connects and
                // listens again, and what was sent meanwhile is lost.
                Ok(None) => missed = true,
                Err(e) => {
                    tracing::debug!(error = %e, "listener failed; connecting again");
                    tokio::time::sleep(backoff.next_delay()).await;
                    break;
                }
            }
        }
    }
}

impl Listener {
    /// Times the listener started listening (a reconnect counts), and
    /// notifications it heard.
    #[cfg(feature = "_test-hooks")]
    pub fn counts(&self) -> (u64, u64) {
        (
            self.listened.load(Ordering::Relaxed),
            self.heard.load(Ordering::Relaxed),
        )
    }
}

/// A notification's payload: the lock name's bytes in hex, and after a
/// `:` the tokens of the waiters of a shared kind to wake, comma-separated.
fn decode(payload: &str) -> Option<(String, &str)> {
    let (hex, waiters) = payload.split_once(':').unwrap_or((payload, ""));
    Some((String::from_utf8(crate::sql::unhex(hex)?).ok()?, waiters))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_names_in_hex() {
        assert_eq!(decode("612762"), Some(("a'b".to_owned(), "")));
        assert_eq!(decode("c3a9:ab,cd"), Some(("\u{e9}".to_owned(), "ab,cd")));
        assert_eq!(decode("6"), None);
        assert_eq!(decode("zz"), None);
        assert_eq!(decode("ff"), None);
    }
}
