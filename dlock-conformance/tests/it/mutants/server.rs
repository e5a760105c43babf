//! The simulated lock server: TTLs, fencing, release notifications, and the
//! few places where a bug of [`Bug`](crate::mutants::Bug) changes what it does.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use dlock_core::driver::wait::Wakeups;
use dlock_core::{Admission, HeldLock, LockInfo, Mode, OwnerToken};

use crate::mutants::Bug;
use tokio::time::Instant;

/// The lock server: TTLs, fencing, release notifications.
#[derive(Debug, Default)]
pub(crate) struct Server {
    slots: Mutex<HashMap<String, Slot>>,
    pub(crate) wakeups: Wakeups,
    /// On for [`Bug::TryIgnoresExpiry`](crate::mutants::Bug::TryIgnoresExpiry): an
    /// expired holder still holds.
    ignores_expiry: bool,
    /// The holder description of each grant, by owner token.
    holders: Mutex<HashMap<OwnerToken, String>>,
}

#[derive(Debug, Default)]
struct Slot {
    version: u64,
    holder: Option<(OwnerToken, Instant)>,
    /// Holds of the shared kinds (reader-writer locks, semaphores); kept
    /// past their expiry, which the readers of this list judge.
    holds: Vec<(OwnerToken, Mode, Instant)>,
    /// Their waiters in arrival order: (ticket, mode).
    queue: Vec<(u64, Mode)>,
    /// The places of `queue` a grant was made from, with the grant's
    /// owner: passed by as waiters, but kept where they are, so that the
    /// undo of a grant whose reply was lost can give the place back.
    granted: HashMap<u64, OwnerToken>,
    /// [`Bug::FencePerKind`]: a counter per kind of lock.
    versions: HashMap<String, u64>,
    /// [`Bug::TokenDrawnAtQueueing`]: the token each queued ticket drew.
    drawn: HashMap<u64, u64>,
    /// The fencing token of each shared hold, by owner.
    tokens: HashMap<OwnerToken, u64>,
}

impl Server {
    pub(crate) fn new(ignores_expiry: bool) -> Self {
        Server {
            ignores_expiry,
            ..Server::default()
        }
    }

    /// Stores the holder description of the grant `owner` may get.
    pub(crate) fn describe(&self, owner: OwnerToken, holder: Option<String>) {
        if let Some(holder) = holder {
            self.holders.lock().unwrap().insert(owner, holder);
        }
    }

    fn info(&self, owner: OwnerToken, version: u64, left: Duration) -> LockInfo {
        let info = LockInfo::new(owner, version, Some(left));
        match self.holders.lock().unwrap().get(&owner) {
            Some(holder) => info.with_holder(holder.clone()),
            None => info,
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
    /// own when `None`); `owner: None` for any holder. With `exclusive`
    /// ([`Bug::ReadHoldIsExclusive`]), a shared hold becomes a writer's.
    pub(crate) fn hold(
        &self,
        name: &str,
        owner: Option<OwnerToken>,
        new_owner: Option<OwnerToken>,
        hold: Duration,
        exclusive: bool,
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
            // A shared hold's: it keeps its place among the others.
            _ => {
                let shared = slot
                    .holds
                    .iter_mut()
                    .find(|h| h.2 > now && Some(h.0) == owner);
                let Some(h) = shared else {
                    return false;
                };
                let token = slot.tokens.remove(&h.0).unwrap_or_default();
                (h.0, h.2) = (new_owner.unwrap_or(h.0), now + hold);
                if exclusive && h.1 == Mode::Read {
                    h.1 = Mode::Write;
                }
                slot.tokens.insert(h.0, token);
                true
            }
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
                    self.live(slot, now)
                        .or_else(|| Self::newest_shared(slot, now))?
                };
                let left = expires.saturating_duration_since(now);
                Some(HeldLock::new(
                    name.clone(),
                    self.info(owner, slot.version, left),
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
        let (owner, expires) = self
            .live(slot, now)
            .or_else(|| Self::newest_shared(slot, now))?;
        Some(self.info(owner, slot.version, expires.saturating_duration_since(now)))
    }

    /// A shared kind's newest live hold, which speaks for the name.
    fn newest_shared(slot: &Slot, now: Instant) -> Option<(OwnerToken, Instant)> {
        let newest = slot.holds.iter().rev().find(|h| h.2 > now)?;
        Some((newest.0, newest.2))
    }

    /// Ends every hold of `name`, of every kind.
    pub(crate) fn clear(&self, name: &str) {
        if let Some(slot) = self.slots.lock().unwrap().get_mut(name) {
            slot.holder = None;
            slot.holds.clear();
        }
        self.wakeups.wake(name);
    }

    /// Every live hold of `name`, the longest first.
    pub(crate) fn holders(&self, name: &str) -> Vec<LockInfo> {
        let slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let Some(slot) = slots.get(name) else {
            return Vec::new();
        };
        let mutex = self.live(slot, now).map(|(o, e)| (o, slot.version, e));
        let shared = slot.holds.iter().filter(|h| h.2 > now);
        let mut holds: Vec<_> = shared
            .map(|&(o, _, e)| (o, slot.tokens.get(&o).copied().unwrap_or_default(), e))
            .chain(mutex)
            .collect();
        holds.sort_by_key(|h| std::cmp::Reverse(h.2));
        holds
            .into_iter()
            .map(|(owner, token, expires)| self.info(owner, token, expires - now))
            .collect()
    }

    /// A mutex acquire's conflict with the shared kinds of lock.
    pub(crate) fn shared_conflict(&self, name: &str) -> Option<Mode> {
        let slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let slot = slots.get(name)?;
        let held = slot.holds.iter().find(|h| h.2 > now).map(|h| h.1);
        held.or_else(|| slot.queue.first().map(|q| q.1))
    }

    /// An acquire of a shared kind, by the waiter with `ticket` (behind
    /// every waiter when `None`): the fencing token, or the holders'
    /// remaining lease, or the conflicting mode.
    pub(crate) fn acquire_shared(
        &self,
        name: &str,
        owner: OwnerToken,
        mode: Mode,
        ttl: Duration,
        ticket: Option<u64>,
        bug: Option<Bug>,
    ) -> Result<Result<u64, Option<Duration>>, Mode> {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(name.to_owned()).or_default();
        let now = Instant::now();
        let sees_mutex = !(bug == Some(Bug::PermitIgnoresMutex) && matches!(mode, Mode::Permit(_)));
        if sees_mutex && slot.holder.is_some_and(|(_, expires)| expires > now) {
            return Err(Mode::Exclusive);
        }
        let counted = |h: &&(OwnerToken, Mode, Instant)| {
            h.2 > now || (bug == Some(Bug::ExpiredPermitCounted) && matches!(h.1, Mode::Permit(_)))
        };
        let holders: Vec<Mode> = slot
            .holds
            .iter()
            .filter(counted)
            .map(|h| h.1)
            .filter(|m| match (bug, mode) {
                (Some(Bug::ReaderBesideWriter), Mode::Read) => *m != Mode::Write,
                (Some(Bug::WriterBesideReaders), Mode::Write) => *m != Mode::Read,
                _ => true,
            })
            .collect();
        // A place granted from is a holder's: no waiter, but its own
        // waiter's place still.
        let granted = &slot.granted;
        let waiters = slot
            .queue
            .iter()
            .copied()
            .filter(|(t, _)| Some(*t) == ticket || !granted.contains_key(t));
        let ahead: Vec<Mode> = if bug == Some(Bug::LifoWaiters) && ticket.is_some() {
            waiters
                .rev()
                .take_while(|(t, _)| Some(*t) != ticket)
                .map(|q| q.1)
                .collect()
        } else {
            waiters
                .take_while(|(t, _)| Some(*t) != ticket)
                .map(|q| q.1)
                .collect()
        };
        let ahead: Vec<Mode> = match (bug, mode) {
            (Some(Bug::NoWriterPreference), Mode::Read) => {
                ahead.into_iter().filter(|m| *m != Mode::Write).collect()
            }
            _ => ahead,
        };
        let unify = |m: Mode| match (bug, m, mode) {
            (Some(Bug::PermitCountsUnchecked), Mode::Permit(_), Mode::Permit(_)) => mode,
            _ => m,
        };
        let holders: Vec<Mode> = holders.into_iter().map(unify).collect();
        let ahead: Vec<Mode> = ahead.into_iter().map(unify).collect();
        let asked = match (bug, mode) {
            (Some(Bug::OverAdmitsByOne), Mode::Permit(n)) => Mode::Permit(n + 1),
            _ => mode,
        };
        let admission = match asked.admits(&holders, &ahead) {
            Admission::Grant
                if bug == Some(Bug::QueuedReadersOneByOne)
                    && mode == Mode::Read
                    && ticket.is_some()
                    && !holders.is_empty() =>
            {
                Admission::Wait
            }
            other => other,
        };
        match admission {
            Admission::Conflict(held) => Err(held),
            Admission::Wait => {
                // The waiter asks from its place again: a grant made from
                // it is gone, or never reached the waiter.
                if let Some(t) = ticket {
                    slot.granted.remove(&t);
                }
                Ok(Err(slot
                    .holds
                    .iter()
                    .filter(|h| h.2 > now)
                    .map(|h| h.2 - now)
                    .min()))
            }
            Admission::Grant => {
                match ticket {
                    Some(t)
                        if bug != Some(Bug::UndoLosesPlace)
                            && slot.queue.iter().any(|q| q.0 == t) =>
                    {
                        slot.granted.insert(t, owner);
                    }
                    _ => slot.queue.retain(|(t, _)| Some(*t) != ticket),
                }
                slot.holds.push((owner, mode, now + ttl));
                let token = match ticket.and_then(|t| slot.drawn.remove(&t)) {
                    Some(token) => token,
                    None => Self::next_version(slot, mode, bug),
                };
                slot.tokens.insert(owner, token);
                Ok(Ok(token))
            }
        }
    }

    fn next_version(slot: &mut Slot, mode: Mode, bug: Option<Bug>) -> u64 {
        if bug == Some(Bug::FencePerKind) {
            let kind = match mode {
                Mode::Read | Mode::Write => "rw".to_owned(),
                other => other.to_string(),
            };
            let version = slot.versions.entry(kind).or_default();
            *version += 1;
            return *version;
        }
        slot.version += 1;
        slot.version
    }

    pub(crate) fn enqueue(&self, name: &str, ticket: u64, mode: Mode, bug: Option<Bug>) {
        let mut slots = self.slots.lock().unwrap();
        let slot = slots.entry(name.to_owned()).or_default();
        slot.queue.push((ticket, mode));
        if bug == Some(Bug::TokenDrawnAtQueueing) {
            let token = Self::next_version(slot, mode, bug);
            slot.drawn.insert(ticket, token);
        }
    }

    pub(crate) fn dequeue(&self, name: &str, ticket: u64) {
        let mut slots = self.slots.lock().unwrap();
        if let Some(slot) = slots.get_mut(name) {
            slot.queue.retain(|(t, _)| *t != ticket);
            slot.granted.remove(&ticket);
            slot.drawn.remove(&ticket);
        }
        self.wakeups.wake(name);
    }

    /// Releases a shared hold: the owner's live one, or (owner `None`) any.
    pub(crate) fn release_shared(&self, name: &str, owner: Option<OwnerToken>) -> bool {
        self.end_shared(name, owner, None)
    }

    /// Undoes a shared acquire of unknown outcome by `owner`: ends its
    /// hold, and gives the place `ticket` it was granted from (if so) back
    /// to its waiter, where it was.
    pub(crate) fn undo_shared(&self, name: &str, owner: OwnerToken, ticket: Option<u64>) -> bool {
        self.end_shared(name, Some(owner), ticket)
    }

    fn end_shared(&self, name: &str, owner: Option<OwnerToken>, give_back: Option<u64>) -> bool {
        let mut slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let Some(slot) = slots.get_mut(name) else {
            return false;
        };
        let Some(i) = slot
            .holds
            .iter()
            .position(|h| h.2 > now && owner.is_none_or(|o| o == h.0))
        else {
            return false;
        };
        let (ended, ..) = slot.holds.remove(i);
        if let Some(t) = give_back
            && slot.granted.get(&t) == Some(&ended)
        {
            slot.granted.remove(&t);
        }
        self.wakeups.wake(name);
        true
    }

    /// Extends the owner's live shared hold (any, live or not, with
    /// [`Bug::RenewalResurrects`]).
    pub(crate) fn extend_shared(
        &self,
        name: &str,
        owner: OwnerToken,
        ttl: Duration,
        bug: Option<Bug>,
    ) -> bool {
        let mut slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let silently = bug == Some(Bug::RenewalResurrectsSilently);
        let resurrects = bug == Some(Bug::RenewalResurrects) || silently;
        let Some(hold) = slots.get_mut(name).and_then(|slot| {
            slot.holds
                .iter_mut()
                .find(|h| h.0 == owner && (resurrects || h.2 > now))
        }) else {
            return false;
        };
        let live = hold.2 > now;
        hold.2 = now + ttl;
        live || !silently
    }

    /// A read hold for the live writer `owner`, waiters or not.
    pub(crate) fn downgrade(
        &self,
        name: &str,
        owner: OwnerToken,
        reader: OwnerToken,
        ttl: Duration,
        bug: Option<Bug>,
    ) -> Option<u64> {
        let mut slots = self.slots.lock().unwrap();
        let now = Instant::now();
        let slot = slots.get_mut(name)?;
        slot.holds
            .iter()
            .any(|h| h.0 == owner && h.1 == Mode::Write && h.2 > now)
            .then(|| {
                slot.holds.push((reader, Mode::Read, now + ttl));
                let token = Self::next_version(slot, Mode::Read, bug);
                slot.tokens.insert(reader, token);
                token
            })
    }
}
