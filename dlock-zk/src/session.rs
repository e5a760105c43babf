//! The session: which client is current, when its leases are lost, and a
//! new session once the old one has expired.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_core::CancellationToken;
use dlock_core::driver::wait::Backoff;
use tokio::time::{Instant, sleep, sleep_until};
use zookeeper_client as zk;

use crate::backend::{Inner, ZkBackend};
use crate::builder::ZkBuilder;

/// The current session's client, the signal its leases are lost by, and
/// the nodes of its leases not yet released.
pub(crate) struct Session {
    client: Arc<zk::Client>,
    lost: CancellationToken,
    /// Deleted once the session is back if the leases are lost: a session
    /// the server kept alive would otherwise keep a lost lease's lock
    /// until its guard is dropped.
    leases: HashSet<String>,
}

impl ZkBackend {
    /// A backend on `client`'s session, with the session's watcher started.
    pub(crate) fn start(config: ZkBuilder, root: String, client: zk::Client) -> Self {
        let watcher = client.state_watcher();
        let inner = Arc::new(Inner {
            root,
            session: Mutex::new(Session {
                client: Arc::new(client),
                lost: CancellationToken::new(),
                leases: HashSet::new(),
            }),
            orphans: Mutex::new(Vec::new()),
            uncertain: Mutex::new(Vec::new()),
            cleaning: tokio::sync::Mutex::new(()),
            config,
        });
        tokio::spawn(watch_session(Arc::downgrade(&inner), watcher));
        ZkBackend { inner }
    }

    /// The current session's client.
    pub fn client(&self) -> Arc<zk::Client> {
        self.session().0
    }

    /// The current session's client and lost signal, read together.
    pub(crate) fn session(&self) -> (Arc<zk::Client>, CancellationToken) {
        let s = self
            .inner
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (s.client.clone(), s.lost.clone())
    }

    /// Records `path` as a lease's node, if `client`'s session is still the
    /// current one, and gives the lease's lost signal. Done under the lock
    /// that `give_up_leases` takes, so a lease is either given up with its
    /// node or granted after.
    pub(crate) fn lease_node(
        &self,
        client: &Arc<zk::Client>,
        path: &str,
    ) -> Option<CancellationToken> {
        let mut s = self
            .inner
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !Arc::ptr_eq(&s.client, client) {
            return None;
        }
        s.leases.insert(path.to_owned());
        Some(s.lost.child_token())
    }

    /// Forgets a lease's node: it is being released.
    pub(crate) fn forget_lease_node(&self, path: &str) {
        self.inner
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leases
            .remove(path);
    }

    /// Marks every lease of the current session lost; later leases get a
    /// fresh signal.
    fn end_leases(&self) {
        self.end_leases_and(|_| {});
    }

    /// Ends every lease of the current session and has their nodes deleted
    /// on reconnect: the client has not heard from the server for so long
    /// that the server may have expired the session and
    /// granted the locks again, or may yet take it back (a server that
    /// was frozen, a reconnect racing the expiry). A session it takes back
    /// must not keep a lost lease's lock until its guard is dropped.
    fn give_up_leases(&self) {
        self.end_leases_and(|s| {
            let nodes = std::mem::take(&mut s.leases);
            self.inner
                .orphans
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(nodes);
        });
    }

    fn end_leases_and(&self, also: impl FnOnce(&mut Session)) {
        let mut s = self
            .inner
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        s.lost.cancel();
        s.lost = CancellationToken::new();
        also(&mut s);
    }

    /// Replaces an expired session, retrying while the backend lives.
    async fn reopen(&self) -> Option<zk::StateWatcher> {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            match self.inner.config.open().await {
                Ok(client) => {
                    let watcher = client.state_watcher();
                    let mut s = self
                        .inner
                        .session
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    s.client = Arc::new(client);
                    s.leases.clear();
                    // Nodes of the old session are gone with it.
                    self.forget_cleanups();
                    return Some(watcher);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot open a new ZooKeeper session");
                    if Arc::strong_count(&self.inner) <= 1 {
                        return None;
                    }
                    sleep(backoff.next_delay()).await;
                }
            }
        }
    }
}

/// Follows the session: leases end on disconnect or expiry, orphaned nodes
/// are deleted on reconnect, an expired session is replaced by a new one.
async fn watch_session(inner: Weak<Inner>, mut watcher: zk::StateWatcher) {
    // While disconnected with leases kept: when they are given up.
    let mut grace_ends: Option<Instant> = None;
    // While disconnected: when the session may have expired on the server.
    let mut give_up_at: Option<Instant> = None;
    loop {
        let state = tokio::select! {
            state = watcher.changed() => state,
            () = sleep_until_some(grace_ends) => {
                grace_ends = None;
                if let Some(inner) = inner.upgrade() {
                    tracing::warn!("no reconnect within the grace period: leases lost");
                    ZkBackend { inner }.end_leases();
                }
                continue;
            }
            () = sleep_until_some(give_up_at) => {
                give_up_at = None;
                if let Some(inner) = inner.upgrade() {
                    tracing::warn!("no reconnect before the server may expire the session: lock nodes given up");
                    ZkBackend { inner }.give_up_leases();
                }
                continue;
            }
        };
        let Some(backend) = inner.upgrade().map(|inner| ZkBackend { inner }) else {
            return;
        };
        match state {
            zk::SessionState::Disconnected => {
                let session = backend.client().session_timeout();
                let config = &backend.inner.config;
                let grace = config.reconnect_grace(session);
                if grace.is_zero() {
                    backend.end_leases();
                } else if grace_ends.is_none() {
                    grace_ends = Some(Instant::now() + grace);
                }
                if give_up_at.is_none() {
                    give_up_at = Some(Instant::now() + config.give_up_after(session));
                }
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                // The same session, back with the quorum: its lock nodes
                // are still there. A read-only server speaks for no quorum.
                if state == zk::SessionState::SyncConnected {
                    // A deadline passed but its timer not yet run (a busy
                    // runtime) still counts: the reconnect came after it.
                    let now = Instant::now();
                    if grace_ends.take().is_some_and(|at| at <= now) {
                        backend.end_leases();
                    }
                    if give_up_at.take().is_some_and(|at| at <= now) {
                        backend.give_up_leases();
                    }
                }
                // Off the watcher: however many there are, the next
                // disconnect must still end the leases at once.
                tokio::spawn(async move {
                    let _one = backend.inner.cleaning.lock().await;
                    backend.delete_orphans().await;
                    backend.resolve_uncertain().await;
                });
            }
            zk::SessionState::Expired | zk::SessionState::AuthFailed => {
                grace_ends = None;
                give_up_at = None;
                backend.end_leases();
                watcher = match backend.reopen().await {
                    Some(watcher) => watcher,
                    None => return,
                };
            }
            zk::SessionState::Closed => return,
        }
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}
