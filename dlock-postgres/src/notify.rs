//! Wake-ups across processes: with `wake_ups(true)` a release sends
//! `pg_notify('dlock_<table>', '<name in hex>:<waiters>')` in its own
//! transaction, naming the queued waiters it may let in (a mutex's first
//! place; see `sql`), and a backend that has waiters listens on that
//! channel on a connection of its own, opened when it first waits, and
//! wakes those of its waiters that are named.
//!
//! PostgreSQL delivers a notification at the release's commit, only to
//! connections listening then, and drops what a connection missed while it
//! was gone; an expiry sends nothing. So waiters still poll, and every
//! waiter looks again whenever the listener (re)connects. A listener counts
//! as listening only once it has heard a notification that it asked its
//! backend's pool to send: through a pooler in transaction mode it hears
//! nothing, and its backend's waiters poll, as without wake-ups.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_core::OwnerToken;
use dlock_core::driver::wait::Backoff;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::task::AbortHandle;
use tokio::time::{Instant, timeout};

use crate::backend::Inner;

/// The listening task of one backend, started when it first waits;
/// stopped when the backend goes.
#[derive(Debug, Default)]
pub(crate) struct Listener {
    task: Mutex<Option<AbortHandle>>,
    /// Listening now: only then do this backend's waiters take a place in
    /// a queue, whose releases name one waiter each (a deaf one at the
    /// head would leave a free lock to the others' polls).
    listening: AtomicBool,
    /// It heard nothing that the pool sent, and stopped for good: waiters
    /// poll, woken in this process by name.
    gave_up: AtomicBool,
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
/// any failure, and after a quiet spell in which its connection did not
/// answer (a half-open connection would otherwise keep it deaf, with no
/// error, until TCP gives up).
async fn listen(inner: Weak<Inner>, options: PgConnectOptions, channel: String) {
    let Some((request, connect, quiet)) = inner.upgrade().map(|inner| {
        let quiet = (inner.max_poll * 10).max(inner.request_timeout);
        (inner.request_timeout, inner.connect_timeout, quiet)
    }) else {
        return;
    };
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut heard_once = false;
    loop {
        let subscribed = timeout(connect + request, subscribe(&options, connect, &channel));
        let mut listener = match subscribed.await {
            Ok(Ok(listener)) => listener,
            failed => {
                let error = failed.map_or_else(|_| "timed out".to_owned(), |e| format!("{e:?}"));
                tracing::debug!(error, "cannot listen for releases; waiters poll");
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        };
        match hears(&inner, &mut listener, request).await {
            Heard::Yes => heard_once = true,
            // A listener that heard once is not behind a pooler: this one
            // was only slow (a spike, a failover), and is asked again.
            Heard::No if heard_once => {
                deaf(&inner);
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
            // Sent, and not heard: a pooler in transaction mode. Listening
            // again would only leave more of its server connections
            // listening, each a source of notifications for other clients'
            // statements: waiters poll for good.
            Heard::No => {
                tracing::warn!(
                    "wake-ups: the listener did not hear a notification sent through the \
                     pool within the request timeout (is the URL a pooler in transaction \
                     mode?); this backend's waiters poll from now on"
                );
                deaf(&inner);
                if let Some(inner) = inner.upgrade() {
                    inner.listener.gave_up.store(true, Ordering::Relaxed);
                    // Waiting as waiters of a backend that hears: they poll
                    // by name from their next wait on.
                    inner.queued_wakeups.wake_all();
                }
                return;
            }
            Heard::Unsent(error) => {
                tracing::warn!(
                    error,
                    "wake-ups: could not check the listener; waiters poll"
                );
                deaf(&inner);
                tokio::time::sleep(backoff.next_delay()).await;
                continue;
            }
        }
        backoff.reset();
        // Listening now: every waiter looks for a release it missed.
        let mut missed = true;
        loop {
            if std::mem::take(&mut missed) {
                let Some(inner) = inner.upgrade() else { return };
                inner.listener.listening.store(true, Ordering::Relaxed);
                inner.listener.listened.fetch_add(1, Ordering::Relaxed);
                inner.wakeups.wake_all();
                inner.queued_wakeups.wake_all();
            }
            // A message half read stays in the connection's buffer for
            // the next call; a reconnect cut short by the timeout may have
            // dropped some, so every waiter looks again after a quiet spell.
            let received = match timeout(quiet, listener.try_recv()).await {
                Ok(received) => received,
                Err(_) => {
                    missed = true;
                    let ping = sqlx::raw_sql("SELECT 1").execute(&mut listener);
                    if matches!(timeout(request, ping).await, Ok(Ok(_))) {
                        continue;
                    }
                    tracing::debug!("listener's connection did not answer; connecting again");
                    deaf(&inner);
                    break;
                }
            };
            match received {
                Ok(Some(notification)) => {
                    let Some(inner) = inner.upgrade() else { return };
                    match decode(notification.payload()) {
                        Some((_, Some(waiters))) => {
                            inner.listener.heard.fetch_add(1, Ordering::Relaxed);
                            for waiter in waiters.split(',').filter(|w| !w.is_empty()) {
                                inner.queued_wakeups.wake(waiter);
                            }
                        }
                        // A release by a client from before waiters
                        // queued, which names none.
                        Some((name, None)) => {
                            inner.listener.heard.fetch_add(1, Ordering::Relaxed);
                            inner.wakeups.wake(&name);
                            inner.queued_wakeups.wake_all();
                        }
                        None => {}
                    }
                }
                // The connection dropped: the next receive connects and
                // listens again, and what was sent meanwhile is lost.
                Ok(None) => {
                    deaf(&inner);
                    missed = true;
                }
                Err(e) => {
                    deaf(&inner);
                    tracing::debug!(error = %e, "listener failed; connecting again");
                    tokio::time::sleep(backoff.next_delay()).await;
                    break;
                }
            }
        }
    }
}

/// What a listener's check found.
enum Heard {
    /// It heard the notification sent through the pool.
    Yes,
    /// The notification went out, and it did not hear it in time.
    No,
    /// The notification could not be sent: nothing is known.
    Unsent(String),
}

/// Whether `listener` hears a notification sent on another connection
/// (one of the pool's), within `limit`. A listener can be subscribed and
/// answer, yet hear nothing: through a pooler in transaction mode
/// (PgBouncer's), `LISTEN` stays on a server connection that goes back to
/// the pooler's pool, and the notifications sent to it never reach this
/// client. Its waiters would then take places in queues and wait for
/// wake-ups that never come.
async fn hears(inner: &Weak<Inner>, listener: &mut PgListener, limit: Duration) -> Heard {
    let Some(strong) = inner.upgrade() else {
        return Heard::Unsent("the backend is gone".to_owned());
    };
    let token = match OwnerToken::random() {
        Ok(token) => token.to_string(),
        Err(e) => return Heard::Unsent(e.to_string()),
    };
    let sql = strong.sql.probe(&token);
    let sent = strong
        .pool
        .execute(
            sqlx::raw_sql(sql.written_out()),
            "listen",
            Instant::now() + limit,
        )
        .await;
    drop(strong);
    if let Err(e) = sent {
        return Heard::Unsent(e.to_string());
    }
    let expected = format!("probe:{token}");
    let heard = timeout(limit, async {
        // Releases heard meanwhile change nothing: every waiter looks again
        // once this listens.
        loop {
            match listener.try_recv().await {
                Ok(Some(notification)) if notification.payload() == expected => {
                    return Heard::Yes;
                }
                Ok(Some(_)) => {}
                Ok(None) => return Heard::Unsent("the listener's connection dropped".to_owned()),
                Err(e) => return Heard::Unsent(e.to_string()),
            }
        }
    });
    heard.await.unwrap_or(Heard::No)
}

/// The listener hears nothing for now.
fn deaf(inner: &Weak<Inner>) {
    if let Some(inner) = inner.upgrade() {
        inner.listener.listening.store(false, Ordering::Relaxed);
    }
}

/// A listener on `channel`, connected, on a pool of its own: a listener
/// dropped for a connection that stopped answering sends `UNLISTEN` on
/// it before giving it back to its pool (sqlx does, on a task with no
/// time limit, which ends when TCP gives the connection up), so the next
/// one must not wait for that pool's one connection.
async fn subscribe(
    options: &PgConnectOptions,
    connect: Duration,
    channel: &str,
) -> sqlx::Result<PgListener> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(connect)
        .connect_lazy_with(options.clone());
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

impl Listener {
    /// Whether it listens now.
    pub fn listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    /// Whether it stopped for good (see [`Heard::No`]).
    pub fn gave_up(&self) -> bool {
        self.gave_up.load(Ordering::Relaxed)
    }

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
/// `:` the tokens of the queued waiters to wake, comma-separated (none: a
/// release that wakes nobody, for nobody queued). Without the `:`, every
/// waiter of the name.
fn decode(payload: &str) -> Option<(String, Option<&str>)> {
    let (hex, waiters) = match payload.split_once(':') {
        Some((hex, waiters)) => (hex, Some(waiters)),
        None => (payload, None),
    };
    Some((String::from_utf8(crate::sql::unhex(hex)?).ok()?, waiters))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_names_in_hex() {
        assert_eq!(decode("612762"), Some(("a'b".to_owned(), None)));
        assert_eq!(decode("612762:"), Some(("a'b".to_owned(), Some(""))));
        assert_eq!(
            decode("c3a9:ab,cd"),
            Some(("\u{e9}".to_owned(), Some("ab,cd")))
        );
        assert_eq!(decode("6"), None);
        assert_eq!(decode("zz"), None);
        assert_eq!(decode("ff"), None);
    }
}
