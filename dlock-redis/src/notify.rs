//! Pub/sub wake-ups: one RESP3 connection per backend carries the release
//! channels of every name that has a waiter in this process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use dlock_core::wait::Wakeups;
use redis::aio::ConnectionManager;
use redis::{PushInfo, PushKind, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};

enum Command {
    Subscribe(String, oneshot::Sender<RedisResult<()>>),
    Unsubscribe(String),
}

/// Channel subscriptions, counted per channel, and the tasks that keep them.
#[derive(Debug)]
pub(crate) struct Notifications {
    pub wakeups: Arc<Wakeups>,
    interest: Arc<Mutex<HashMap<String, usize>>>,
    commands: mpsc::UnboundedSender<Command>,
}

impl Notifications {
    /// Starts the tasks: one applies (un)subscriptions in order, one turns
    /// release messages into wake-ups. Both end when the backend is dropped.
    pub fn start(
        mut conn: ConnectionManager,
        mut pushes: mpsc::UnboundedReceiver<PushInfo>,
    ) -> Self {
        let wakeups = Arc::new(Wakeups::new());
        let interest: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let (commands, mut rx) = mpsc::unbounded_channel();

        let still_wanted = interest.clone();
        tokio::spawn(async move {
            while let Some(command) = rx.recv().await {
                match command {
                    // Subscribing twice is harmless, and the reply tells the
                    // waiter that releases from now on will reach it.
                    Command::Subscribe(channel, ack) => {
                        let _ = ack.send(conn.subscribe(&channel).await);
                    }
                    Command::Unsubscribe(channel) => {
                        let wanted = still_wanted
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .contains_key(&channel);
                        if !wanted && let Err(e) = conn.unsubscribe(&channel).await {
                            tracing::debug!(%channel, error = %e, "unsubscribe failed");
                        }
                    }
                }
            }
        });

        let hub = wakeups.clone();
        tokio::spawn(async move {
            while let Some(push) = pushes.recv().await {
                match push.kind {
                    PushKind::Message => {
                        if let [_, Value::BulkString(name)] = push.data.as_slice() {
                            hub.wake(&String::from_utf8_lossy(name));
                        }
                    }
                    // Releases published while disconnected are lost: let
                    // every waiter look again.
                    PushKind::Disconnection => hub.wake_all(),
                    _ => {}
                }
            }
        });

        Notifications {
            wakeups,
            interest,
            commands,
        }
    }

    /// Subscribes to `channel` for as long as the returned guard lives. When
    /// this returns, releases published on the channel reach this process.
    pub async fn interest(&self, channel: &str) -> Interest<'_> {
        *self
            .interest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(channel.to_owned())
            .or_default() += 1;
        let (ack, done) = oneshot::channel();
        let sent = self
            .commands
            .send(Command::Subscribe(channel.to_owned(), ack))
            .is_ok();
        // Without a subscription the wait loop still polls, bounded by the
        // holder's TTL, so a failure here slows waiters but breaks nothing.
        match done.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(%channel, error = %e, "subscribe failed; polling"),
            Err(_) if sent => tracing::warn!(%channel, "subscriber gone; polling"),
            Err(_) => {}
        }
        Interest {
            notifications: self,
            channel: channel.to_owned(),
        }
    }
}

/// A waiter's interest in one release channel.
pub(crate) struct Interest<'a> {
    notifications: &'a Notifications,
    channel: String,
}

impl Drop for Interest<'_> {
    fn drop(&mut self) {
        let mut interest = self
            .notifications
            .interest
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = interest.get_mut(&self.channel) {
            *count -= 1;
            if *count == 0 {
                interest.remove(&self.channel);
                let _ = self
                    .notifications
                    .commands
                    .send(Command::Unsubscribe(self.channel.clone()));
            }
        }
    }
}
