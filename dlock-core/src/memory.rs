use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::options::deadline_after;
use crate::wait::{Attempt, Backoff, Deadline, Wakeups, check_request, wait_for_lock};
use crate::{
    Backend, Capabilities, Error, HeldLock, Lease, LeaseKind, LockInfo, LockOptions, LockPage,
    OwnerToken, Result, validate_name,
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
}

#[derive(Debug, Default)]
struct Slot {
    // The last fencing token granted. Kept after release so that tokens
    // keep increasing.
    version: u64,
    holder: Option<(OwnerToken, Instant)>,
}

impl Slot {
    fn live_holder(&self, now: Instant) -> Option<(OwnerToken, Instant)> {
        self.holder.filter(|&(_, expires)| expires > now)
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

    fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        self.with_slots(|slots| {
            let slot = slots.entry(name.to_owned()).or_default();
            let now = Instant::now();
            if let Some((_, expires)) = slot.live_holder(now) {
                return Ok(Attempt::Held {
                    expires_in: Some(expires - now),
                });
            }
            slot.version += 1;
            slot.holder = Some((owner, deadline_after(now, opts.ttl_value())));
            Ok(Attempt::Acquired(Lease::with_ttl(
                name,
                owner,
                slot.version,
                opts,
                sent,
            )))
        })
    }

    /// Runs `f` on the slot if `lease` is its live holder.
    fn on_own_slot(&self, lease: &Lease, f: impl FnOnce(&mut Slot, Instant)) -> Result<()> {
        self.with_slots(|slots| {
            let now = Instant::now();
            match slots.get_mut(lease.name()) {
                Some(slot)
                    if slot
                        .live_holder(now)
                        .is_some_and(|(owner, _)| owner == lease.owner()) =>
                {
                    f(slot, now);
                    Ok(())
                }
                _ => Err(Error::NotHeld {
                    name: lease.name().to_owned(),
                }),
            }
        })
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            lease: LeaseKind::Ttl,
            fencing: true,
            fencing_survives_restart: false,
            notify: true,
            fifo: false,
            distributed: false,
            // Nothing is ever in flight.
            cleanup: true,
            delayed_release: true,
            // The default `extend_many`, one lease after another, costs no
            // request at all here.
            batch_extend: true,
        }
    }

    fn driver(&self) -> &'static str {
        "memory"
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        check_request(name, opts)?;
        Ok(self.attempt(name, opts)?.into_lease())
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        check_request(name, opts)?;
        let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        let deadline = Deadline::after(opts.wait_value());
        wait_for_lock(
            name,
            deadline,
            Some(&self.inner.wakeups),
            backoff,
            || async { self.attempt(name, opts) },
        )
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.on_own_slot(lease, |slot, _| slot.holder = None)?;
        self.inner.wakeups.wake(lease.name());
        Ok(())
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        crate::check_hold(hold)?;
        if hold.is_zero() {
            return self.release(lease).await;
        }
        self.on_own_slot(lease, |slot, now| {
            slot.holder = Some((lease.owner().for_hold(), deadline_after(now, hold)));
        })
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        let sent = Instant::now();
        let ttl = lease.ttl().unwrap_or_default();
        self.on_own_slot(lease, |slot, now| {
            slot.holder = slot
                .holder
                .map(|(owner, _)| (owner, deadline_after(now, ttl)));
        })?;
        lease.extended(sent);
        Ok(())
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        let limit = limit.max(1);
        Ok(self.with_slots(|slots| {
            let now = Instant::now();
            let mut held: Vec<HeldLock> = slots
                .iter()
                .filter(|(name, _)| name.starts_with(prefix))
                .filter(|(name, _)| cursor.is_none_or(|c| name.as_str() > c))
                .filter_map(|(name, slot)| {
                    let (owner, expires) = slot.live_holder(now)?;
                    let info = LockInfo::new(owner, slot.version, Some(expires - now));
                    Some(HeldLock::new(name.clone(), info))
                })
                .collect();
            held.sort_by(|a, b| a.name.cmp(&b.name));
            let next = (held.len() > limit).then(|| held[limit - 1].name.clone());
            held.truncate(limit);
            LockPage::new(held, next)
        }))
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        validate_name(name)?;
        Ok(self.with_slots(|slots| {
            let slot = slots.get(name)?;
            let now = Instant::now();
            let (owner, expires) = slot.live_holder(now)?;
            Some(LockInfo::new(owner, slot.version, Some(expires - now)))
        }))
    }
}
