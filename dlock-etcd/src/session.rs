//! Sessions: the etcd leases a backend's holds and waiters share, one per
//! TTL in the whole seconds etcd keeps it, as etcd's own clients attach
//! every key of a client to one session lease. A session is renewed once
//! for all its keys (one keep-alive, one read of its keys), whatever their
//! number; it ends when its lease does, and every hold on it with it.
//!
//! Two keys of one name cannot share a lease (the key is the name and the
//! lease), so a name this backend holds or waits for on a session already
//! takes its next key with a lease of its own; so does a hold that needs a
//! lifetime of its own (`max_hold`, a lock-delay).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// A lease's keys, read at a revision.
pub(crate) type Keys = (i64, Arc<HashSet<Vec<u8>>>);

/// A session lease as this backend last renewed it.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub(crate) id: i64,
    /// Its TTL in etcd, whole seconds.
    pub(crate) ttl: i64,
    /// When the request that last started its TTL was sent.
    pub(crate) renewed: Instant,
    /// Its keys as the last renewal read them, and the revision they were
    /// read at (`None` before one).
    pub(crate) keys: Option<Keys>,
}

impl Session {
    /// The session's TTL as a duration.
    pub(crate) fn ttl(&self) -> Duration {
        crate::join::secs(self.ttl)
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
    /// its own: the create revision of the one that stands (0 before its
    /// creation is known), and when a delayed release's hold of it ends
    /// (the key is not made again meanwhile). A released hold's key made
    /// again for a newer hold has another create revision: renewing the
    /// old hold never takes the newer key for its own.
    claimed: HashMap<Vec<u8>, Claim>,
}

/// A session key in use.
struct Claim {
    created: i64,
    until: Option<Instant>,
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

    /// Offers a new lease as the session of its TTL; whether it is now
    /// (another call may have made one first).
    pub(crate) fn offer(&self, session: Session) -> bool {
        let mut state = self.state();
        let taken = state
            .by_ttl
            .get(&session.ttl)
            .is_some_and(|s| s.id != session.id);
        if !taken {
            state.by_ttl.insert(session.ttl, session);
        }
        !taken
    }

    /// Session `id` was renewed by a request sent at `sent`; `keys` are
    /// its keys, if the renewal read them.
    pub(crate) fn renewed(&self, id: i64, sent: Instant, keys: Option<Keys>) {
        let mut state = self.state();
        if let Some(session) = state.by_ttl.values_mut().find(|s| s.id == id)
            && sent >= session.renewed
        {
            session.renewed = sent;
            if keys.is_some() {
                session.keys = keys;
            }
        }
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
            Some(Claim { until: None, .. }) => false,
            Some(Claim {
                until: Some(until), ..
            }) if *until > now => false,
            _ => {
                let claim = Claim {
                    created: 0,
                    until: None,
                };
                state.claimed.insert(key.to_vec(), claim);
                true
            }
        }
    }

    /// Claimed `key` was made at revision `created`.
    pub(crate) fn made(&self, key: &[u8], created: i64) {
        if let Some(claim) = self.state().claimed.get_mut(key) {
            claim.created = created;
        }
    }

    /// Whether `key`, made at `created`, is still the hold's that made it.
    pub(crate) fn is_current(&self, key: &[u8], created: i64) -> bool {
        let state = self.state();
        state
            .claimed
            .get(key)
            .is_some_and(|c| c.created == created && c.until.is_none())
    }

    /// The hold `key` made at `created` is over: freed if it is still the
    /// key's (a stale hold's release leaves a newer hold's claim).
    pub(crate) fn free_made(&self, key: &[u8], created: i64) {
        let mut state = self.state();
        if state
            .claimed
            .get(key)
            .is_some_and(|c| c.created == created && c.until.is_none())
        {
            state.claimed.remove(key);
        }
    }

    /// `key` is no hold's or waiter's of this backend any more; `until`:
    /// not before then (a delayed release's hold keeps it).
    pub(crate) fn free(&self, key: &[u8], until: Option<Instant>) {
        let mut state = self.state();
        match until {
            Some(until) => {
                let claim = Claim {
                    created: 0,
                    until: Some(until),
                };
                state.claimed.insert(key.to_vec(), claim);
            }
            None => {
                state.claimed.remove(key);
            }
        }
    }
}
