//! Sessions: the etcd leases a backend's holds and waiters share, one per
//! TTL in the whole seconds etcd keeps it, as etcd's own clients attach
//! every key of a client to one session lease. A session is renewed once
//! for all its keys (one keep-alive, one read of its keys), whatever their
//! number; it ends when its lease does, and every hold on it with it.
//!
//! Two keys of one name cannot share a lease (the key is the name and the
//! lease), so a name this backend holds or waits for on a session already
//! takes its next key with a lease of its own; so does a hold that needs a
//! lifetime of its own (`max_hold`, a lock-delay, no renewal).
//!
//! A session outlives the holds on it, so what ends one without a release
//! (its validity ran out unrenewed, its `Lease` was dropped, a write whose
//! undo could not delete it) must not keep its key for the session's life:
//! each renewal of a session sweeps such keys (see [`Sweep`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dlock_core::LockOptions;
use tokio::time::Instant;

/// A lease's keys as one renewal read them.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// When the renewal that read them was sent (its keep-alive with it).
    pub(crate) sent: Instant,
    /// The revision of the read.
    pub(crate) revision: i64,
    pub(crate) set: Arc<HashSet<Vec<u8>>>,
}

/// A session lease as this backend last renewed it.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub(crate) id: i64,
    /// Its TTL in etcd, whole seconds.
    pub(crate) ttl: i64,
    /// When the request that last started its TTL was sent.
    pub(crate) renewed: Instant,
    /// Its keys as the last renewal that read them found them.
    pub(crate) keys: Option<Keys>,
}

impl Session {
    /// The session's TTL as a duration.
    pub(crate) fn ttl(&self) -> Duration {
        crate::join::secs(self.ttl)
    }

    /// Until when a renewal's answer may come: later, the server may have
    /// been ending the lease as it answered (see `extend`), and the
    /// session is not trusted any more. Its TTL less the drift a hold of
    /// that TTL allows, from its last renewal.
    pub(crate) fn valid_until(&self) -> Instant {
        LockOptions::new().ttl(self.ttl()).valid_until(self.renewed)
    }
}

/// The sessions of one backend (and its clones).
#[derive(Default)]
pub(crate) struct Sessions {
    state: Mutex<State>,
    /// One renewal of sessions at a time: the renewer's batches of one
    /// session that come together share the first one's answer.
    pub(crate) renewing: tokio::sync::Mutex<()>,
    /// One start of a session at a time.
    pub(crate) starting: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// The session of each TTL.
    by_ttl: HashMap<i64, Session>,
    /// Session keys a hold or waiter of this backend may still count as
    /// its own. A released hold's key made again for a newer hold has
    /// another create revision: renewing the old hold never takes the
    /// newer key for its own.
    claimed: HashMap<Vec<u8>, Claim>,
    /// When a renewal last failed for want of an answer.
    failed: Option<Instant>,
}

/// A session key in use.
#[derive(Debug, Clone, Copy, Default)]
struct Claim {
    /// The create revision of the key that stands (0 before it is known).
    created: i64,
    /// The validity of the hold it is (`None` for a waiter's place).
    valid_until: Option<Instant>,
    /// When a delayed release's hold of the key ends: it is not made again
    /// meanwhile.
    kept_until: Option<Instant>,
}

/// What a session's renewal does with one of the session's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sweep {
    /// A hold whose validity ended unrenewed (or whose `Lease` was
    /// dropped): deleted, as the end of a lease of its own would.
    Expired { created: i64 },
    /// No hold or waiter of this backend claims it: a write that landed
    /// after its undo gave up. Deleted if it was made before the read.
    Leaked,
}

impl Sessions {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every change is one statement: a panic elsewhere leaves nothing
        // half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session of TTL `ttl`, if there is one.
    pub(crate) fn current(&self, ttl: i64) -> Option<Session> {
        self.state().by_ttl.get(&ttl).cloned()
    }

    /// The session whose lease is `id`, if it is still one.
    pub(crate) fn by_id(&self, id: i64) -> Option<Session> {
        self.state().by_ttl.values().find(|s| s.id == id).cloned()
    }

    /// A new session of its TTL.
    pub(crate) fn offer(&self, session: Session) {
        self.state().by_ttl.insert(session.ttl, session);
    }

    /// Session `id` was renewed by a request sent at `sent`, which read its
    /// `keys` too.
    pub(crate) fn renewed(&self, id: i64, sent: Instant, keys: Keys) {
        let mut state = self.state();
        if let Some(session) = state.by_ttl.values_mut().find(|s| s.id == id)
            && sent >= session.renewed
        {
            session.renewed = sent;
            session.keys = Some(keys);
        }
    }

    /// A renewal had no answer (or an error).
    pub(crate) fn failed(&self) {
        self.state().failed = Some(Instant::now());
    }

    /// Whether a renewal failed at or after `since`.
    pub(crate) fn failed_since(&self, since: Instant) -> bool {
        self.state().failed.is_some_and(|at| at >= since)
    }

    /// Session `id` ended: the next hold starts another.
    pub(crate) fn ended(&self, id: i64) {
        self.state().by_ttl.retain(|_, s| s.id != id);
    }

    /// Claims `key` for a new hold or waiter; `false` if it is in use.
    pub(crate) fn claim(&self, key: &[u8]) -> bool {
        let mut state = self.state();
        let now = Instant::now();
        match state.claimed.get(key) {
            Some(Claim {
                kept_until: Some(until),
                ..
            }) if *until <= now => {}
            Some(_) => return false,
            None => {}
        }
        state.claimed.insert(key.to_vec(), Claim::default());
        true
    }

    /// Claimed `key` was made at revision `created`.
    pub(crate) fn made(&self, key: &[u8], created: i64) {
        if let Some(claim) = self.state().claimed.get_mut(key) {
            claim.created = created;
        }
    }

    /// The hold `key`, made at `created`, is valid until `valid_until`
    /// (granted or renewed).
    pub(crate) fn valid(&self, key: &[u8], created: i64, valid_until: Option<Instant>) {
        if let Some(claim) = self.state().claimed.get_mut(key)
            && claim.created == created
        {
            claim.valid_until = valid_until;
        }
    }

    /// Whether `key`, made at `created`, is still the hold's that made it.
    pub(crate) fn is_current(&self, key: &[u8], created: i64) -> bool {
        let state = self.state();
        state
            .claimed
            .get(key)
            .is_some_and(|c| c.created == created && c.kept_until.is_none())
    }

    /// What to do with `key`, found among its session's keys at a renewal.
    pub(crate) fn sweep(&self, key: &[u8], now: Instant) -> Option<Sweep> {
        match self.state().claimed.get(key) {
            None => Some(Sweep::Leaked),
            Some(Claim {
                created,
                valid_until: Some(until),
                kept_until: None,
            }) if *created > 0 && now >= *until => Some(Sweep::Expired { created: *created }),
            Some(_) => None,
        }
    }

    /// The hold `key` made at `created` is over: freed if it is still the
    /// key's (a stale hold's release leaves a newer hold's claim).
    pub(crate) fn free_made(&self, key: &[u8], created: i64) {
        let mut state = self.state();
        let current = state
            .claimed
            .get(key)
            .is_some_and(|c| c.created == created && c.kept_until.is_none());
        if current {
            state.claimed.remove(key);
        }
    }

    /// A place whose creation had no answer is given up: freed unless a
    /// creation became known since (that hold frees it).
    pub(crate) fn free_unmade(&self, key: &[u8]) {
        let mut state = self.state();
        if state.claimed.get(key).is_some_and(|c| c.created == 0) {
            state.claimed.remove(key);
        }
    }

    /// `key` went to a delayed release's hold, which ends at `until`: not
    /// made again before then.
    pub(crate) fn keep_until(&self, key: &[u8], until: Instant) {
        let claim = Claim {
            kept_until: Some(until),
            ..Claim::default()
        };
        let mut state = self.state();
        state.claimed.insert(key.to_vec(), claim);
        // Delayed releases' claims that ended go, so that they do not pile
        // up.
        let now = Instant::now();
        state
            .claimed
            .retain(|_, c| c.kept_until.is_none_or(|until| until > now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_key_is_not_claimed_again_until_its_hold_is_over() {
        let sessions = Sessions::default();
        assert!(sessions.claim(b"k"));
        assert!(!sessions.claim(b"k"));
        sessions.made(b"k", 7);
        assert!(sessions.is_current(b"k", 7));
        // A stale hold's end frees nothing of the current one's.
        sessions.free_made(b"k", 5);
        sessions.free_unmade(b"k");
        assert!(sessions.is_current(b"k", 7));
        sessions.free_made(b"k", 7);
        assert!(!sessions.is_current(b"k", 7));
        assert!(sessions.claim(b"k"));
        // A delayed release keeps the key from new holds until it ends.
        sessions.keep_until(b"k", Instant::now() + Duration::from_secs(60));
        assert!(!sessions.claim(b"k"));
        assert!(!sessions.is_current(b"k", 0));
    }

    #[test]
    fn renewals_sweep_keys_nobody_keeps_and_holds_past_their_validity() {
        let sessions = Sessions::default();
        let now = Instant::now();
        assert_eq!(sessions.sweep(b"leaked", now), Some(Sweep::Leaked));
        assert!(sessions.claim(b"waiter"));
        sessions.made(b"waiter", 3);
        assert_eq!(sessions.sweep(b"waiter", now), None);
        assert!(sessions.claim(b"hold"));
        sessions.made(b"hold", 4);
        sessions.valid(b"hold", 4, Some(now + Duration::from_secs(1)));
        assert_eq!(sessions.sweep(b"hold", now), None);
        let later = now + Duration::from_secs(2);
        assert_eq!(
            sessions.sweep(b"hold", later),
            Some(Sweep::Expired { created: 4 })
        );
        // A validity noted for another (stale) creation changes nothing.
        sessions.valid(b"hold", 2, None);
        assert_eq!(
            sessions.sweep(b"hold", later),
            Some(Sweep::Expired { created: 4 })
        );
    }
}
