use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::driver::Driver;
use crate::driver::wait::{Attempt, Backoff, Deadline, Wakeups, wait_for_lock};
use crate::settings::deadline_after;
use crate::{
    Admission, Capabilities, Error, HeldLock, Lease, LeaseKind, LockInfo, LockOptions, LockPage,
    Mode, OwnerToken, Result,
};

/// The in-memory reference driver: real TTLs on tokio's clock, fencing,
/// wake-ups on release. Locks are shared by the clones of one
/// `MemoryBackend` and nothing else, so it suits tests of code that takes
/// locks, and single-process programs.
///
/// Because it runs on tokio's clock, tests may use `tokio::time::pause`
/// to let leases expire without waiting.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    slots: Mutex<HashMap<String, Slot>>,
    wakeups: Wakeups,
    next_ticket: AtomicU64,
}

#[derive(Debug, Default)]
struct Slot {
    // The last fencing token granted, over every kind of hold. Kept after
    // release so that tokens keep increasing.
    version: u64,
    holds: Vec<Hold>,
    // Waiting acquires in arrival order: (ticket, mode).
    queue: Vec<(u64, Mode)>,
}

#[derive(Debug, Clone)]
struct Hold {
    owner: OwnerToken,
    mode: Mode,
    fence: u64,
    expires: Instant,
    holder: Arc<str>,
}

impl Hold {
    fn info(&self, now: Instant) -> LockInfo {
        LockInfo::new(self.owner, self.fence, Some(self.expires - now))
            .with_holder(&*self.holder)
            .with_mode(self.mode)
    }
}

impl Slot {
    fn prune(&mut self, now: Instant) {
        self.holds.retain(|h| h.expires > now);
    }

    fn info(&self, now: Instant) -> Option<LockInfo> {
        // Of several (readers, permits), the newest grant speaks for the
        // name.
        let hold = self
            .holds
            .iter()
            .filter(|h| h.expires > now)
            .max_by_key(|h| h.fence)?;
        Some(hold.info(now))
    }

    /// Where the lease's own live hold is.
    fn own(&self, lease: &Lease, now: Instant) -> Option<usize> {
        self.holds
            .iter()
            .position(|h| h.owner == lease.owner() && h.expires > now)
    }

    fn grant(&mut self, lease: &Lease, expires: Instant) {
        self.version += 1;
        self.holds.push(Hold {
            owner: lease.owner(),
            mode: lease.mode(),
            fence: self.version,
            expires,
            holder: lease.holder().into(),
        });
    }
}

/// A waiting acquire's place in its name's queue, given up when dropped.
struct Place<'a> {
    backend: &'a MemoryBackend,
    name: &'a str,
    ticket: u64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let left = self.backend.with_slots(|slots| {
            slots.get_mut(self.name).is_some_and(|slot| {
                let before = slot.queue.len();
                slot.queue.retain(|(t, _)| *t != self.ticket);
                before != slot.queue.len()
            })
        });
        // A waiter that gave up may have been what kept the next ones out
        // (a writer ahead of readers).
        if left {
            self.backend.inner.wakeups.wake(self.name);
        }
    }
}

impl MemoryBackend {
    /// An empty lock space.
    pub fn new() -> Self {
        Self::default()
    }

    fn with_slots<T>(&self, f: impl FnOnce(&mut HashMap<String, Slot>) -> T) -> T {
        let mut slots = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(&mut slots)
    }

    /// One attempt, by the waiter holding `ticket` (behind every waiter
    /// when `None`).
    fn attempt(&self, name: &str, opts: &LockOptions, ticket: Option<u64>) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        let mode = opts.get_mode();
        self.with_slots(|slots| {
            let slot = slots.entry(name.to_owned()).or_default();
            let now = Instant::now();
            slot.prune(now);
            let holders: Vec<Mode> = slot.holds.iter().map(|h| h.mode).collect();
            let ahead: Vec<Mode> = slot
                .queue
                .iter()
                .take_while(|(t, _)| Some(*t) != ticket)
                .map(|(_, m)| *m)
                .collect();
            match mode.admits(&holders, &ahead) {
                Admission::Grant => {
                    slot.queue.retain(|(t, _)| Some(*t) != ticket);
                    let lease = Lease::with_ttl(name, owner, slot.version + 1, opts, sent);
                    slot.grant(&lease, deadline_after(now, opts.get_ttl()));
                    Ok(Attempt::Acquired(lease))
                }
                Admission::Wait => Ok(Attempt::Held {
                    expires_in: slot.holds.iter().map(|h| h.expires - now).min(),
                }),
                Admission::Conflict(held) => Err(Error::ModeConflict {
                    name: name.to_owned(),
                    held,
                    asked: mode,
                }),
            }
        })
    }

    /// Runs `f` on the lease's own live hold: its slot and its index there.
    fn on_own_hold(&self, lease: &Lease, f: impl FnOnce(&mut Slot, usize, Instant)) -> Result<()> {
        self.with_slots(|slots| {
            let now = Instant::now();
            let slot = slots.get_mut(lease.name());
            match slot.and_then(|slot| Some((slot.own(lease, now)?, slot))) {
                Some((at, slot)) => {
                    f(slot, at, now);
                    Ok(())
                }
                None => Err(Error::not_held(lease.name())),
            }
        })
    }
}

#[async_trait]
impl Driver for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            lease: LeaseKind::Ttl,
            fencing: true,
            fencing_survives_restart: false,
            notify: true,
            fifo: true,
            distributed: false,
            // Nothing is ever in flight.
            cleanup: true,
            delayed_release: true,
            // The default `extend_many`, one lease after another, costs no
            // request at all here.
            batch_extend: true,
            rwlock: true,
            semaphore: true,
            ttl_resolution: Duration::from_millis(1),
            ttl_restarts_on_leader_change: false,
            freed_on_disconnect: false,
        }
    }

    fn driver(&self) -> &'static str {
        "memory"
    }

    /// Nothing here waits on a server: a call takes as long as a lock of
    /// a mutex in this process.
    fn request_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        Ok(self.attempt(name, opts, None)?.into_lease())
    }

    async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease> {
        let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        // A first attempt without a place: an acquire that is granted at
        // once never queues.
        if let Attempt::Acquired(lease) = self.attempt(name, opts, None)? {
            return Ok(lease);
        }
        let place = Place {
            backend: self,
            name,
            ticket: self.inner.next_ticket.fetch_add(1, Ordering::Relaxed),
        };
        self.with_slots(|slots| {
            let slot = slots.entry(name.to_owned()).or_default();
            slot.queue.push((place.ticket, opts.get_mode()));
        });
        wait_for_lock(
            name,
            deadline,
            Some(&self.inner.wakeups),
            backoff,
            || async { self.attempt(name, opts, Some(place.ticket)) },
        )
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.on_own_hold(lease, |slot, at, _| {
            slot.holds.swap_remove(at);
        })?;
        self.inner.wakeups.wake(lease.name());
        Ok(())
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        if hold.is_zero() {
            return Driver::release(self, lease).await;
        }
        self.on_own_hold(lease, |slot, at, now| {
            slot.holds[at].owner = lease.owner().for_hold();
            slot.holds[at].expires = deadline_after(now, hold);
        })
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        let sent = Instant::now();
        let ttl = lease.ttl().unwrap_or_default();
        self.on_own_hold(lease, |slot, at, now| {
            slot.holds[at].expires = deadline_after(now, ttl);
        })?;
        lease.extended(sent);
        Ok(())
    }

    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        self.with_slots(|slots| {
            let now = Instant::now();
            let slot = slots
                .get_mut(write.name())
                .filter(|slot| {
                    slot.holds.iter().any(|h| {
                        h.owner == write.owner() && h.mode == Mode::Write && h.expires > now
                    })
                })
                .ok_or_else(|| Error::not_held(write.name()))?;
            let lease = Lease::with_ttl(write.name(), owner, slot.version + 1, opts, sent);
            slot.grant(&lease, deadline_after(now, opts.get_ttl()));
            Ok(lease)
        })
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        // Every holder goes: several readers or permits included.
        let info = self.with_slots(|slots| {
            let slot = slots.get_mut(name)?;
            let info = slot.info(Instant::now());
            slot.holds.clear();
            info
        });
        self.inner.wakeups.wake(name);
        Ok(info)
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        Ok(self.with_slots(|slots| {
            let now = Instant::now();
            let mut held: Vec<HeldLock> = slots
                .iter()
                .filter(|(name, _)| name.starts_with(prefix))
                .filter(|(name, _)| cursor.is_none_or(|c| name.as_str() > c))
                .filter_map(|(name, slot)| Some(HeldLock::new(name.clone(), slot.info(now)?)))
                .collect();
            held.sort_by(|a, b| a.name.cmp(&b.name));
            let next = (held.len() > limit).then(|| held[limit - 1].name.clone());
            held.truncate(limit);
            LockPage::new(held, next)
        }))
    }

    async fn holders(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>> {
        Ok(self.with_slots(|slots| {
            let now = Instant::now();
            let Some(slot) = slots.get(name) else {
                return Vec::new();
            };
            if limit == 1 {
                // What `list` and `force_release` show: the newest grant.
                return slot.info(now).into_iter().collect();
            }
            let mut live: Vec<&Hold> = slot.holds.iter().filter(|h| h.expires > now).collect();
            live.sort_by_key(|h| std::cmp::Reverse(h.expires));
            live.into_iter().take(limit).map(|h| h.info(now)).collect()
        }))
    }
}
