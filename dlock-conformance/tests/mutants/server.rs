//! The simulated lock server: TTLs, fencing, release notifications, and the
//! few places where a bug of [`Bug`](crate::Bug) changes what it does.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use dlock_core::wait::Wakeups;
use dlock_core::{HeldLock, LockInfo, OwnerToken};
use tokio::time::Instant;

/// The lock server: TTLs, fencing, release notifications.
#[derive(Debug, Default)]
pub(crate) struct Server {
    slots: Mutex<HashMap<String, Slot>>,
    pub(crate) wakeups: Wakeups,
    /// On for [`Bug::TryIgnoresExpiry`](crate::Bug::TryIgnoresExpiry): an
    /// expired holder still holds.
    ignores_expiry: bool,
}

#[derive(Debug, Default)]
struct Slot {
    version: u64,
    holder: Option<(OwnerToken, Instant)>,
}

impl Server {
    pub(crate) fn new(ignores_expiry: bool) -> Self {
        Server {
            ignores_expiry,
            ..Server::default()
        }
    }

    fn live(&self, slot: &Slot, now: Instant) -> Option<(OwnerToken, Instant)> {
        slot.holder
            .filter(|&(_, expires)| self.ignores_expiry || expires > now)
    }

    /// `SET NX PX`: the new version, or the holder's remaining lease.
    pub(crate) fn acquire(
        &self,
        name: &str,
        owner: OwnerToken,
        ttl: Duration,
    ) -> Result<u64, Duration> {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(name.to_owned()).or_default();
        let now = Instant::now();
        if let Some((_, expires)) = self.live(slot, now) {
            return Err(expires.saturating_duration_since(now));
        }
        slot.version += 1;
        slot.holder = Some((owner, now + ttl));
        Ok(slot.version)
    }

    /// The holder's remaining lease, if the lock is held.
    pub(crate) fn check(&self, name: &str) -> Option<Duration> {
        let slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let slot = slots.get(name)?;
        self.live(slot, now)
            .map(|(_, expires)| expires.saturating_duration_since(now))
    }

    /// An unconditional write.
    pub(crate) fn set(&self, name: &str, owner: OwnerToken, ttl: Duration) -> u64 {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(name.to_owned()).or_default();
        slot.version += 1;
        slot.holder = Some((owner, Instant::now() + ttl));
        slot.version
    }

    pub(crate) fn release(&self, name: &str, owner: Option<OwnerToken>) -> bool {
        let mut slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        let mine = self
            .live(slot, now)
            .is_some_and(|(holder, _)| owner.is_none_or(|o| o == holder));
        if mine {
            // The row stays with its holder's expiry set to now, as the
            // MySQL driver keeps it.
            slot.holder = slot.holder.map(|(o, _)| (o, now));
            self.wakeups.wake(name);
        }
        mine
    }

    /// Keeps the lock until `hold` from now for `new_owner` (the holder's
    /// own when `None`); `owner: None` for any holder.
    pub(crate) fn hold(
        &self,
        name: &str,
        owner: Option<OwnerToken>,
        new_owner: Option<OwnerToken>,
        hold: Duration,
    ) -> bool {
        let mut slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        match self.live(slot, now) {
            Some((holder, _)) if owner.is_none_or(|o| o == holder) => {
                slot.holder = Some((new_owner.unwrap_or(holder), now + hold));
                true
            }
            _ => false,
        }
    }

    pub(crate) fn extend(&self, name: &str, owner: OwnerToken, ttl: Duration) -> bool {
        let mut slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        if self.live(slot, now).is_some_and(|(o, _)| o == owner) {
            slot.holder = Some((owner, now + ttl));
            return true;
        }
        false
    }

    /// Extends each `(name, owner, ttl)` its owner holds; with `by_name`,
    /// answers for a name as a whole instead.
    pub(crate) fn extend_many(
        &self,
        batch: &[(String, OwnerToken, Duration)],
        by_name: bool,
        unchecked: bool,
    ) -> Vec<bool> {
        let done: Vec<bool> = batch
            .iter()
            .map(|(n, o, t)| self.extend(n, *o, *t))
            .collect();
        if unchecked {
            let mut slots = self.slots.lock().unwrap();
            let now = Instant::now();
            for (name, _, ttl) in batch {
                if let Some(slot) = slots.get_mut(name)
                    && let Some((owner, _)) = self.live(slot, now)
                {
                    slot.holder = Some((owner, now + *ttl));
                }
            }
        }
        if !by_name {
            return done;
        }
        batch
            .iter()
            .map(|(name, ..)| batch.iter().zip(&done).any(|((n, ..), &d)| d && n == name))
            .collect()
    }

    /// Held locks under `prefix` after `cursor`, sorted; with `all`, free
    /// ones too.
    pub(crate) fn list(&self, prefix: &str, cursor: Option<&str>, all: bool) -> Vec<HeldLock> {
        let slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let mut locks: Vec<HeldLock> = slots
            .iter()
            .filter(|(name, _)| {
                name.starts_with(prefix) && cursor.is_none_or(|c| name.as_str() > c)
            })
            .filter_map(|(name, slot)| {
                let (owner, expires) = if all {
                    slot.holder?
                } else {
                    self.live(slot, now)?
                };
                let left = expires.saturating_duration_since(now);
                Some(HeldLock::new(
                    name.clone(),
                    LockInfo::new(owner, slot.version, Some(left)),
                ))
            })
            .collect();
        locks.sort_by(|a, b| a.name.cmp(&b.name));
        locks
    }

    pub(crate) fn inspect(&self, name: &str) -> Option<LockInfo> {
        let slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let slot = slots.get(name)?;
        let (owner, expires) = self.live(slot, now)?;
        Some(LockInfo::new(
            owner,
            slot.version,
            Some(expires.saturating_duration_since(now)),
        ))
    }
}
