use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

/// In-process wake-ups per lock name: drivers call [`Wakeups::wake`] when
/// they release a lock or hear of a release (a pub/sub message, a watch),
/// and their wait loops sleep on a [`Waiter`].
#[derive(Debug, Default)]
pub struct Wakeups {
    names: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
}

impl Wakeups {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers interest in `name` until the returned waiter is dropped.
    pub fn register(&self, name: &str) -> Waiter<'_> {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        let entry = names
            .entry(name.to_owned())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Waiter {
            hub: self,
            name: name.to_owned(),
            notify: entry.0.clone(),
        }
    }

    /// Wakes every waiter of `name` in this process.
    pub fn wake(&self, name: &str) {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((notify, _)) = names.get(name) {
            notify.notify_waiters();
        }
    }

    /// Wakes every waiter of every name: for drivers that lost their
    /// notification channel and cannot tell which releases they missed.
    pub fn wake_all(&self) {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        for (notify, _) in names.values() {
            notify.notify_waiters();
        }
    }
}

/// Interest in one name's wake-ups; see [`Wakeups::register`].
#[derive(Debug)]
pub struct Waiter<'a> {
    hub: &'a Wakeups,
    name: String,
    notify: Arc<Notify>,
}

impl Waiter<'_> {
    /// A future that completes on the next wake-up of this name. It hears
    /// every wake-up from the moment it is created, before it is polled, so
    /// create it *before* the attempt whose failure makes you wait.
    pub fn notified(&self) -> Notified<'_> {
        self.notify.notified()
    }

    /// The name waited for.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut names = self
            .hub
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = names.get_mut(&self.name) {
            entry.1 -= 1;
            if entry.1 == 0 {
                names.remove(&self.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_wakeup_before_the_wait_is_not_missed() {
        let hub = Wakeups::new();
        let waiter = hub.register("x");
        let notified = waiter.notified();
        hub.wake("x");
        tokio::time::timeout(Duration::from_secs(1), notified)
            .await
            .expect("the wake-up was lost");
        drop(waiter);
        let names = hub.names.lock().unwrap_or_else(PoisonError::into_inner);
        assert!(names.is_empty(), "a dropped waiter stays registered");
    }
}
