//! Pub/sub wake-ups: one RESP3 connection per backend carries the release
//! channels of every name that has a waiter in this process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use dlock_core::OwnerToken;
use dlock_core::driver::wait::{Backoff, Wakeups};
use redis::aio::{AsyncPushSender, SendError};
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot};

use crate::conn::PushConn;
use crate::keys::name_of;

enum Command {
    /// The answer says whether the subscription is in place.
    Subscribe(String, oneshot::Sender<bool>),
    Unsubscribe(String),
    /// The connection dropped: subscribe to every wanted channel again,
    /// then let every waiter look again for releases it missed.
    Resubscribe,
    /// Sentinel named a new primary: listen there from now on (the
    /// connection waits in [`Notifications::moved_to`]).
    Reconnect,
}

/// A connection to a new primary, until the subscriber takes it up. Not
/// in the command itself: a subscriber retrying a dead connection looks
/// here between tries.
type MovedTo = Arc<Mutex<Option<PushConn>>>;

type Interests = Arc<Mutex<HashMap<String, usize>>>;

/// Channel subscriptions, counted per channel, and the tasks that keep them.
#[derive(Debug)]
pub(crate) struct Notifications {
    pub wakeups: Arc<Wakeups>,
    interest: Interests,
    commands: mpsc::UnboundedSender<Command>,
    /// Set once a channel is kept for good ([`Notifications::keep`]).
    kept: tokio::sync::OnceCell<()>,
    moved_to: MovedTo,
}

/// Turns the notification connection's pushes into wake-ups, on the
/// connection's own task: no channel and no task of ours stand between a
/// release's message and its waiter.
#[derive(Debug)]
pub(crate) struct Pushes {
    wakeups: Arc<Wakeups>,
    prefix: String,
    /// The waiters of this client that take hand-overs, and the grant a
    /// release handed over to each, until its wait takes it.
    grants: Mutex<HashMap<String, Option<HandedOver>>>,
    /// Set once the subscriber runs. Weak: the subscriber must end when the
    /// backend is dropped, and a strong sender here (which the connection
    /// keeps) would keep its channel open forever.
    resubscribe: OnceLock<mpsc::WeakUnboundedSender<Command>>,
}

impl Pushes {
    /// The sink for a backend whose lock keys start with `prefix`.
    pub fn new(prefix: String) -> Arc<Self> {
        Arc::new(Pushes {
            wakeups: Arc::new(Wakeups::new()),
            prefix,
            grants: Mutex::default(),
            resubscribe: OnceLock::new(),
        })
    }

    fn grants(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<HandedOver>>> {
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps the grants handed over to `waiter` until [`Pushes::forget`].
    pub fn expect(&self, waiter: &str) {
        self.grants().insert(waiter.to_owned(), None);
    }

    /// The grant handed over to `waiter` since the last call, if any.
    pub fn take(&self, waiter: &str) -> Option<HandedOver> {
        self.grants().get_mut(waiter).and_then(Option::take)
    }

    /// Stops keeping grants for `waiter`.
    pub fn forget(&self, waiter: &str) {
        self.grants().remove(waiter);
    }

    /// Records a hand-over message, `+<fencing token> <waiter> <attempt>
    /// <owner token> <lock key>`, for its waiter; returns the lock key.
    fn handed_over<'a>(&self, message: &'a str) -> Option<&'a str> {
        let mut parts = message.strip_prefix('+')?.splitn(5, ' ');
        let (fence, waiter, attempt, owner, key) = (
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
            parts.next()?,
        );
        let grant = HandedOver {
            fence: fence.parse().ok()?,
            attempt: attempt.parse().ok()?,
            owner: owner.parse().ok()?,
        };
        if let Some(slot) = self.grants().get_mut(waiter) {
            *slot = Some(grant);
        }
        Some(key)
    }
}

/// A grant a release handed over to a waiter of this client.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandedOver {
    pub fence: u64,
    /// The number of the waiter's attempt whose ask the grant counts from.
    pub attempt: u64,
    /// The owner token of the lock value granted: the waiter's, unless it
    /// changed its value since.
    pub owner: OwnerToken,
}

impl AsyncPushSender for Pushes {
    fn send(&self, push: PushInfo) -> Result<(), SendError> {
        match push.kind {
            // A wake-up carries the lock's key.
            PushKind::Message | PushKind::SMessage => {
                if let [_, Value::BulkString(message)] = push.data.as_slice() {
                    let message = String::from_utf8_lossy(message);
                    // Anything else is a wake-up: the lock key (a prefix
                    // may start with `+` too).
                    let key = self.handed_over(&message).unwrap_or(&message);
                    if let Some(name) = name_of(&self.prefix, key) {
                        self.wakeups.wake(&name);
                    }
                }
            }
            // Releases published while disconnected are lost. Waking
            // waiters now would send them at a dead connection: wake them
            // once the subscriptions are back instead.
            PushKind::Disconnection => {
                if let Some(commands) = self.resubscribe.get().and_then(|c| c.upgrade()) {
                    let _ = commands.send(Command::Resubscribe);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl Notifications {
    /// Starts the task that applies (un)subscriptions in order; it ends
    /// when the backend is dropped. `pushes` is the sink `conn` hands its
    /// messages to.
    pub fn start(conn: PushConn, pushes: &Pushes) -> Self {
        let wakeups = pushes.wakeups.clone();
        let interest: Interests = Arc::default();
        let (commands, rx) = mpsc::unbounded_channel();
        let moved_to = MovedTo::default();
        tokio::spawn(subscriber(
            conn,
            rx,
            interest.clone(),
            wakeups.clone(),
            moved_to.clone(),
        ));
        let _ = pushes.resubscribe.set(commands.downgrade());
        Notifications {
            wakeups,
            interest,
            commands,
            kept: tokio::sync::OnceCell::new(),
            moved_to,
        }
    }

    /// Subscribes to `channel` for as long as the returned guard lives. When
    /// this returns, releases published on the channel reach this process.
    /// Dropping this future midway drops the interest with it.
    /// The flag says whether the subscription is in place.
    /// Waits for the subscription at most `limit`: the subscriber may be
    /// busy resubscribing to a node that is down, and a waiter's deadline
    /// comes first.
    pub async fn interest(&self, channel: &str, limit: Duration) -> (Interest<'_>, bool) {
        *self
            .interest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(channel.to_owned())
            .or_default() += 1;
        // From here on the count comes down on every path, a cancelled
        // await included.
        let interest = Interest {
            notifications: self,
            channel: channel.to_owned(),
        };
        let (ack, done) = oneshot::channel();
        let sent = self
            .commands
            .send(Command::Subscribe(channel.to_owned(), ack))
            .is_ok();
        // Without a subscription the wait loop still polls, bounded by the
        // holder's TTL, so a failure here slows waiters but breaks nothing.
        let Ok(done) = tokio::time::timeout(limit, done).await else {
            tracing::warn!(%channel, "no subscription in time; polling");
            return (interest, false);
        };
        let subscribed = match done {
            Ok(true) => true,
            Ok(false) => {
                tracing::warn!(%channel, "subscribe failed; polling");
                false
            }
            Err(_) if sent => {
                tracing::warn!(%channel, "subscriber gone; polling");
                false
            }
            Err(_) => false,
        };
        (interest, subscribed)
    }

    /// Subscribes to `channel` for the rest of this client's life, the
    /// first time it is asked; later calls return at once. A client's
    /// waiters all hear on one channel, so keeping it costs one
    /// subscription, and saves a subscribe and an unsubscribe per wait.
    ///
    /// Returns whether the channel is subscribed; a failed attempt is
    /// tried again at the next call.
    pub async fn keep(&self, channel: &str, limit: Duration) -> bool {
        self.kept
            .get_or_try_init(|| async {
                match self.interest(channel, limit).await {
                    // Never dropped: the count stays up, so the
                    // subscription is renewed after a reconnect like any
                    // other.
                    (interest, true) => {
                        std::mem::forget(interest);
                        Ok(())
                    }
                    (_, false) => Err(()),
                }
            })
            .await
            .is_ok()
    }

    /// Moves the subscriptions to a new connection (a new primary).
    pub fn reconnect(&self, conn: PushConn) {
        *self.moved_to.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn);
        let _ = self.commands.send(Command::Reconnect);
    }

    /// Whether [`Notifications::keep`] has subscribed.
    pub fn is_kept(&self) -> bool {
        self.kept.initialized()
    }

    /// How many channels this process wants to hear from now.
    #[cfg(feature = "_test-hooks")]
    pub fn channels(&self) -> usize {
        self.interest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// Applies (un)subscriptions in the order they were asked for.
async fn subscriber(
    mut conn: PushConn,
    mut rx: mpsc::UnboundedReceiver<Command>,
    interest: Interests,
    wakeups: Arc<Wakeups>,
    moved_to: MovedTo,
) {
    let wanted = |channel: &str| {
        interest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(channel)
    };
    while let Some(command) = rx.recv().await {
        match command {
            // Subscribing twice is harmless, and the reply tells the
            // waiter that releases from now on will reach it.
            Command::Subscribe(channel, ack) => {
                let failed = conn.subscribe(std::slice::from_ref(&channel)).await;
                let _ = ack.send(failed.is_empty());
            }
            Command::Unsubscribe(channel) => {
                if !wanted(&channel)
                    && let Err(e) = conn.unsubscribe(&channel).await
                {
                    tracing::debug!(%channel, error = %e, "unsubscribe failed");
                }
            }
            Command::Resubscribe | Command::Reconnect => {
                resubscribe(&mut conn, &interest, &wakeups, &moved_to).await;
            }
        }
    }
}

/// Subscribes to every wanted channel again, then lets every waiter look
/// again for releases it missed.
async fn resubscribe(
    conn: &mut PushConn,
    interest: &Interests,
    wakeups: &Wakeups,
    moved_to: &MovedTo,
) {
    // Short steps: waiters wait on this to hear of releases.
    let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(250));
    let wanted = || -> Vec<String> {
        interest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    };
    let mut pending = wanted();
    loop {
        if let Some(new) = moved_to
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            *conn = new;
            pending = wanted();
        }
        // Channels no longer wanted need no retry.
        let still = wanted();
        pending.retain(|c| still.contains(c));
        if pending.is_empty() {
            break;
        }
        let before = pending.len();
        pending = conn.subscribe(&pending).await;
        if pending.len() < before {
            // Some are back: their waiters look again now, not once every
            // channel is.
            wakeups.wake_all();
        }
        if !pending.is_empty() {
            tracing::debug!(left = pending.len(), "resubscribing failed; retrying");
            tokio::time::sleep(backoff.next_delay()).await;
        }
    }
    // Subscribed again: whatever was released in the gap is found by
    // looking again now.
    wakeups.wake_all();
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
