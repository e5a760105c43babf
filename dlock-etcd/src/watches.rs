//! The watches waiters read: one per name and backend, kept open while it
//! is used and a little after, and shared by the waits on that name.
//!
//! A watch opened while others write is registered behind the server's
//! current revision: etcd puts it among its "unsynced" watchers, which it
//! catches up every 100 ms, so a wait that opened its own watch heard the
//! release that let it in up to 100 ms late (the hand-off p99 of 66–79 ms
//! the benchmark showed, while every other waiter heard it within 4 ms). A
//! watch that stays open stays synced: the next wait on the name hears the
//! release at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::{Error, Result};
use tokio::sync::broadcast;

use crate::backend::EtcdBackend;
use crate::proto::Event;

/// How long a watch nobody reads stays open: long enough for the next
/// acquire of a name a client takes in a loop.
const IDLE: Duration = Duration::from_secs(5);

/// The changes of a name, as its watch reads them; `None` when the watch
/// ended (broke, or was cancelled by the server).
type Changes = Option<Arc<Vec<Event>>>;

/// The open watches of a backend, by name: each is its task's, which ends
/// it (when its runtime does, too), and so closes its subscriptions.
#[derive(Default)]
pub(crate) struct Watches {
    by_name: Mutex<HashMap<String, broadcast::WeakSender<Changes>>>,
}

/// A wait's view of its name's watch: every change made after it was
/// taken, in order.
pub(crate) struct Subscription(broadcast::Receiver<Changes>);

impl Subscription {
    /// The next changes. An error (the watch ended, or this wait fell so
    /// far behind that changes were dropped) leaves the caller to
    /// subscribe and read again.
    pub(crate) async fn changes(&mut self) -> Result<Arc<Vec<Event>>> {
        match self.0.recv().await {
            Ok(Some(events)) => Ok(events),
            Ok(None) | Err(broadcast::error::RecvError::Closed) => Err(ended()),
            Err(broadcast::error::RecvError::Lagged(_)) => Err(Error::connection(
                crate::backend::NAME,
                "watch the lock: changes were dropped".to_owned(),
                tonic::Status::resource_exhausted("lagged"),
            )),
        }
    }
}

fn ended() -> Error {
    Error::connection(
        crate::backend::NAME,
        "watch the lock: the watch ended".to_owned(),
        tonic::Status::unavailable("the watch ended"),
    )
}

impl EtcdBackend {
    /// A subscription to `name`'s watch (see `key::name_span`), opened now
    /// if it is not open: every change after this returns reaches it.
    pub(crate) async fn subscribe(&self, name: &str) -> Result<Subscription> {
        let watches = &self.inner.watches;
        if let Some(sender) = watches.lock().get(name).and_then(|s| s.upgrade()) {
            return Ok(Subscription(sender.subscribe()));
        }
        let range = crate::key::name_span(&self.inner.prefix, name);
        let mut watch = self.client().watch(range).await?;
        let (sender, receiver) = broadcast::channel(64);
        watches.lock().insert(name.to_owned(), sender.downgrade());
        let (backend, name) = (self.clone(), name.to_owned());
        tokio::spawn(async move {
            let mut used = tokio::time::Instant::now();
            loop {
                if sender.receiver_count() > 0 {
                    used = tokio::time::Instant::now();
                } else if used.elapsed() >= IDLE {
                    break;
                }
                let changes = tokio::select! {
                    changes = watch.changes() => changes,
                    () = tokio::time::sleep(IDLE / 2) => continue,
                };
                match changes {
                    // Nobody listening (between waits) is no error.
                    Ok(events) => drop(sender.send(Some(Arc::new(events)))),
                    Err(e) => {
                        tracing::debug!(error = %e, "a lock's watch ended");
                        drop(sender.send(None));
                        break;
                    }
                }
            }
            backend.inner.watches.forget(&name, &sender);
        });
        Ok(Subscription(receiver))
    }
}

impl Watches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::WeakSender<Changes>>> {
        // Every change is one statement: a panic elsewhere leaves nothing
        // half done.
        self.by_name.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The watch of `name` behind `sender` ended: later waits open another.
    fn forget(&self, name: &str, sender: &broadcast::Sender<Changes>) {
        let mut by_name = self.lock();
        let same = by_name
            .get(name)
            .and_then(broadcast::WeakSender::upgrade)
            .is_some_and(|s| s.same_channel(sender));
        if same {
            by_name.remove(name);
        }
    }
}
