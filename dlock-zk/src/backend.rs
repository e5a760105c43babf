use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_core::wait::{Backoff, Deadline};
use dlock_core::{
    Backend, CancellationToken, Capabilities, Error, HeldLock, Lease, LeaseKind, LockInfo,
    LockOptions, LockPage, OwnerToken, Result, async_trait, check_duration, validate_name,
};
use tokio::time::sleep;
use zookeeper_client as zk;

use crate::hold::{HOLD_NODE, hold_path};
use crate::path::{escape, owner_of, protected_prefix, sequence, unescape};

pub(crate) const NAME: &str = "zookeeper";

/// A ZooKeeper lock backend: one session, shared by clones.
///
/// Leases live as long as the session: there is no TTL and extend only
/// checks that the lock node still exists.
///
/// # When a lease is lost
///
/// A lease's `lost` signal (and so `Guard::lost`) fires the moment the
/// client reports it is **disconnected**, not only when the session expires:
/// once disconnected, the client cannot know whether the server has expired
/// the session and handed the lock to the next waiter. If the connection
/// comes back within the session timeout the lock node still exists; the
/// driver keeps it until the lease is released or dropped (a release that
/// failed during the disconnect is retried on reconnect), but the lease
/// stays marked lost.
///
/// With [`ZkBuilder::keep_leases_while_reconnecting`] a disconnect starts
/// a grace period instead: a reconnect to the same session within it keeps
/// the leases (the session's ephemeral nodes live as long as it does), and
/// only the end of the grace period, or the session's expiry, marks them
/// lost. The grace period ends before the server can have expired the
/// session, whatever made the connection fall silent.
#[derive(Clone)]
pub struct ZkBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    config: ZkBuilder,
    root: String,
    session: Mutex<Session>,
    /// Lock nodes whose delete failed for want of a connection.
    orphans: Mutex<Vec<String>>,
    /// Creates whose outcome is unknown (the reply never came): the node
    /// may exist, or appear once a queued request reaches the server, so
    /// it is looked for by its protected prefix until found or hopeless.
    uncertain: Mutex<Vec<Uncertain>>,
}

struct Session {
    client: Arc<zk::Client>,
    lost: CancellationToken,
}

impl fmt::Debug for ZkBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBackend")
            .field("root", &self.inner.root)
            .finish_non_exhaustive()
    }
}

/// Settings for [`ZkBackend`]; start from [`ZkBackend::builder`].
#[derive(Clone)]
pub struct ZkBuilder {
    connect: String,
    root: String,
    session_timeout: Duration,
    connect_timeout: Duration,
    request_timeout: Duration,
    auth: Option<(String, String)>,
    tls_ca: Option<String>,
    keep_while_reconnecting: bool,
    grace_override: Option<Duration>,
}

impl fmt::Debug for ZkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkBuilder")
            .field("connect", &self.connect)
            .field("root", &self.root)
            .field("session_timeout", &self.session_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("auth", &self.auth.as_ref().map(|(user, _)| user))
            .field("tls", &self.tls_ca.is_some())
            .field("keep_while_reconnecting", &self.keep_while_reconnecting)
            .finish_non_exhaustive()
    }
}

impl ZkBuilder {
    /// The parent of every lock node (default `/dlock`).
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// The session timeout (default 10 s): how long after losing touch with
    /// the client the server frees its locks. The server bounds it to
    /// between 2 and 20 ticks.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long to wait for a connection to each server (default 5 s);
    /// `connect` gives up after this much per server in the connect string.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one request may wait for its reply before it counts as
    /// failed (default 2 s, and never longer than the session timeout).
    /// The client holds requests while it is disconnected; one that finds
    /// no answer in this time belongs to a session in doubt.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Keeps leases through a disconnect for as long as the session may
    /// still live (default `false`: a disconnect marks every lease lost at
    /// once, like Curator's standard connection-state policy).
    ///
    /// With `true`, like Curator's session policy, leases survive the loss
    /// of the server the client talks to, or of the ensemble's leader, when
    /// the client gets back to its session in time. The grace period is
    /// the session timeout less the longest the server may have gone without
    /// hearing from the client when it reports the disconnect (13 ticks of
    /// its connect timeout / 8) and a tenth of the session timeout for
    /// clock rates and a late timer: with the defaults (10 s session, 5 s
    /// connect timeout) only 10 − 8.1 − 1 ≈ 0.9 s, so pair the option
    /// with a shorter connect timeout: with 2 s, 10 − 3.25 − 1 ≈ 5.75 s. A
    /// lease is not valid in that window in the sense of the contract: the
    /// holder cannot prove it holds the lock until it reconnects, so work
    /// that must not overlap another holder should check the fencing token
    /// at the resource.
    pub fn keep_leases_while_reconnecting(mut self, keep: bool) -> Self {
        self.keep_while_reconnecting = keep;
        self
    }

    /// A grace period of one's own instead of the computed one: only for
    /// tests that show what a too-long grace period does.
    #[doc(hidden)]
    pub fn reconnect_grace_for_tests(mut self, grace: Duration) -> Self {
        self.keep_while_reconnecting = true;
        self.grace_override = Some(grace);
        self
    }

    /// How long leases outlive a disconnect of a session whose negotiated
    /// timeout is `session`: until the server could have expired it.
    /// Mirrors zookeeper-client, which pings once nothing was sent for 3
    /// ticks and reports a silent connection lost once nothing was received
    /// for 8 ticks, checked each tick (a tick is its connect timeout / 8,
    /// or session / 20 when the connect timeout exceeds 3/5 of the
    /// session). The server may last have heard from the client 13 ticks
    /// (3 + 1 + 8 + 1) before the client reports the disconnect, and a tenth
    /// of the session is kept for clock rates and a late timer.
    fn reconnect_grace(&self, session: Duration) -> Duration {
        if !self.keep_while_reconnecting {
            return Duration::ZERO;
        }
        if let Some(grace) = self.grace_override {
            return grace;
        }
        let tick = if self.connect_timeout > session * 3 / 5 {
            session / 20
        } else {
            self.connect_timeout / 8
        };
        session
            .saturating_sub(tick * 13)
            .saturating_sub(session / 10)
    }

    /// Connects with TLS, trusting these CA certificates (PEM). The
    /// servers' certificates must name the hosts of the connect string.
    #[cfg(feature = "tls")]
    pub fn tls_ca_certificates(mut self, pem: impl Into<String>) -> Self {
        self.tls_ca = Some(pem.into());
        self
    }

    /// Digest authentication. Lock nodes and their parents are then created
    /// with the `creator all` ACL, so clients of another identity can
    /// neither contend on these locks nor delete their nodes.
    pub fn digest_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Some((user.into(), password.into()));
        self
    }

    /// Connects and starts watching the session.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed connect string or root,
    /// [`Error::Connection`] when no server answers,
    /// [`Error::Backend`] when authentication fails.
    pub async fn connect(self) -> Result<ZkBackend> {
        let root = self.root.trim_end_matches('/').to_owned();
        if !root.starts_with('/') || root.contains("//") {
            return Err(Error::invalid_option(
                "root",
                format!("must be an absolute path like /dlock, got {:?}", self.root),
            ));
        }
        // ZooKeeper counts in i32 milliseconds; an hour is far beyond any
        // server's session bound anyway.
        let (ms, hour) = (Duration::from_millis(1), Duration::from_secs(3600));
        let session_min = Duration::from_millis(100);
        check_duration("session_timeout", self.session_timeout, session_min, hour)?;
        check_duration("connect_timeout", self.connect_timeout, ms, hour)?;
        check_duration("request_timeout", self.request_timeout, ms, hour)?;
        let client = self.open().await?;
        let watcher = client.state_watcher();
        let inner = Arc::new(Inner {
            root,
            session: Mutex::new(Session {
                client: Arc::new(client),
                lost: CancellationToken::new(),
            }),
            orphans: Mutex::new(Vec::new()),
            uncertain: Mutex::new(Vec::new()),
            config: self,
        });
        tokio::spawn(watch_session(Arc::downgrade(&inner), watcher));
        Ok(ZkBackend { inner })
    }

    async fn open(&self) -> Result<zk::Client> {
        let cluster = self
            .connect
            .strip_prefix("zk://")
            .or_else(|| self.connect.strip_prefix("zookeeper://"))
            .unwrap_or(&self.connect);
        if cluster.is_empty() || cluster.starts_with('/') {
            return Err(Error::invalid_option(
                "url",
                "expected zk://host:port[,host:port...][/chroot]",
            ));
        }
        let mut connector = zk::Client::connector()
            .with_session_timeout(self.session_timeout)
            .with_connection_timeout(self.connect_timeout);
        if let Some((user, password)) = &self.auth {
            connector = connector.with_auth("digest", format!("{user}:{password}").as_bytes());
        }
        // The client keeps trying while servers accept connections but do
        // not serve (a server still starting, say); give up in bounded time.
        let hosts = cluster
            .split('/')
            .next()
            .unwrap_or(cluster)
            .split(',')
            .count();
        let bound = self
            .connect_timeout
            .saturating_mul(u32::try_from(hosts).unwrap_or(u32::MAX))
            .saturating_add(Duration::from_secs(1));
        let connecting = match &self.tls_ca {
            None => Box::pin(connector.connect(cluster)),
            Some(ca) => self.secure_connect(connector, ca, cluster)?,
        };
        match tokio::time::timeout(bound, connecting).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(e @ (zk::Error::BadArguments(_) | zk::Error::NoHosts))) => Err(
                Error::invalid_option("url", format!("bad connect string: {e}")),
            ),
            Ok(Err(e)) => Err(zk_error(e, "connect")),
            Err(_) => Err(Error::connection(
                NAME,
                format!("connect: no session after {bound:?}"),
                zk::Error::Timeout,
            )),
        }
    }
}

/// A connect in progress.
type Connecting<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<zk::Client, zk::Error>> + Send + 'a>>;

impl ZkBuilder {
    #[cfg(feature = "tls")]
    fn secure_connect<'a>(
        &self,
        connector: zk::Connector,
        ca: &str,
        cluster: &'a str,
    ) -> Result<Connecting<'a>> {
        // zookeeper-client's rustls brings aws-lc-rs; with ring in the same
        // build (sqlx, redis) rustls will not pick one by itself.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let options = zk::TlsOptions::default()
            .with_pem_ca(ca)
            .map_err(|e| Error::invalid_option("tls_ca_certificates", e.to_string()))?;
        Ok(Box::pin(
            connector.with_tls(options).secure_connect(cluster),
        ))
    }

    #[cfg(not(feature = "tls"))]
    fn secure_connect<'a>(&self, _: zk::Connector, _: &str, _: &'a str) -> Result<Connecting<'a>> {
        Err(Error::invalid_option(
            "tls_ca_certificates",
            "needs the `tls` feature",
        ))
    }
}

pub(crate) fn zk_error(e: zk::Error, doing: &str) -> Error {
    match e {
        zk::Error::AuthFailed | zk::Error::NoAuth => {
            Error::backend(NAME, format!("{doing}: authentication failed"), e)
        }
        zk::Error::ConnectionLoss
        | zk::Error::SessionExpired
        | zk::Error::ClientClosed
        | zk::Error::Timeout => Error::connection(NAME, doing, e),
        e => Error::backend(NAME, doing, e),
    }
}

/// Follows the session: leases end on disconnect or expiry, orphaned nodes
/// are deleted on reconnect, an expired session is replaced by a new one.
async fn watch_session(inner: Weak<Inner>, mut watcher: zk::StateWatcher) {
    // While disconnected with leases kept: when they are given up.
    let mut grace_ends: Option<tokio::time::Instant> = None;
    loop {
        let state = match grace_ends {
            None => watcher.changed().await,
            Some(at) => tokio::select! {
                state = watcher.changed() => state,
                () = tokio::time::sleep_until(at) => {
                    grace_ends = None;
                    if let Some(inner) = inner.upgrade() {
                        tracing::warn!("no reconnect within the grace period: leases lost");
                        ZkBackend { inner }.end_leases();
                    }
                    continue;
                }
            },
        };
        let Some(backend) = inner.upgrade().map(|inner| ZkBackend { inner }) else {
            return;
        };
        match state {
            zk::SessionState::Disconnected => {
                let session = backend.client().session_timeout();
                let grace = backend.inner.config.reconnect_grace(session);
                if grace.is_zero() {
                    backend.end_leases();
                } else if grace_ends.is_none() {
                    grace_ends = Some(tokio::time::Instant::now() + grace);
                }
            }
            zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                // The same session, back with the quorum: its lock nodes
                // are still there. A read-only server speaks for no quorum.
                if state == zk::SessionState::SyncConnected {
                    grace_ends = None;
                }
                backend.delete_orphans().await;
                backend.resolve_uncertain().await;
            }
            zk::SessionState::Expired | zk::SessionState::AuthFailed => {
                grace_ends = None;
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

impl ZkBackend {
    /// Connects with default settings to `zk://host:port[,host:port...][/chroot]`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Settings, starting from a connect string (`zk://` prefix optional).
    pub fn builder(url: impl Into<String>) -> ZkBuilder {
        ZkBuilder {
            connect: url.into(),
            root: "/dlock".to_owned(),
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            auth: None,
            tls_ca: None,
            keep_while_reconnecting: false,
            grace_override: None,
        }
    }

    /// The current session's client.
    pub fn client(&self) -> Arc<zk::Client> {
        self.session().0
    }

    fn session(&self) -> (Arc<zk::Client>, CancellationToken) {
        let s = self
            .inner
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (s.client.clone(), s.lost.clone())
    }

    /// Marks every lease of the current session lost; later leases get a
    /// fresh signal.
    fn end_leases(&self) {
        let mut s = self
            .inner
            .session
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        s.lost.cancel();
        s.lost = CancellationToken::new();
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
                    // Nodes of the old session are gone with it.
                    self.inner
                        .orphans
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clear();
                    self.inner
                        .uncertain
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clear();
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

    /// Looks for the nodes of creates whose outcome is unknown and deletes
    /// those it finds. Keeps looking (on each call) for up to two session
    /// timeouts: a create queued while disconnected reaches the server
    /// after the reconnect. Returns whether any is left to look for.
    async fn resolve_uncertain(&self) -> bool {
        let pending = std::mem::take(
            &mut *self
                .inner
                .uncertain
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        let client = self.client();
        let mut left = Vec::new();
        for u in pending {
            match self.find_own(&client, &u.dir, &u.prefix).await {
                Ok(Some((path, _))) => self.delete_node(path).await,
                Ok(None) if u.since.elapsed() > self.inner.config.session_timeout * 2 => {}
                Ok(None) | Err(_) => left.push(u),
            }
        }
        let any = !left.is_empty();
        self.inner
            .uncertain
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(left);
        any
    }

    async fn delete_orphans(&self) {
        let orphans = std::mem::take(
            &mut *self
                .inner
                .orphans
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for path in orphans {
            self.delete_node(path).await;
        }
    }

    /// Deletes a lock node, remembering it for the next reconnect when the
    /// connection is down.
    async fn delete_node(&self, path: String) {
        match self.bounded(self.client().delete(&path, None)).await {
            Ok(()) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => {}
            Err(e) => {
                tracing::debug!(%path, error = %e, "delete failed; retrying on reconnect");
                self.inner
                    .orphans
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(path);
            }
        }
    }

    /// The request timeout in force: as set, but never past the session
    /// timeout.
    pub(crate) fn request_timeout(&self) -> Duration {
        let config = &self.inner.config;
        config.request_timeout.min(config.session_timeout)
    }

    /// Bounds a request by the request timeout: the client holds requests
    /// while it is disconnected, and one unanswered that long belongs to a
    /// session in doubt. Counts as a lost connection.
    pub(crate) async fn bounded<T>(
        &self,
        request: impl Future<Output = Result<T, zk::Error>>,
    ) -> Result<T, zk::Error> {
        tokio::time::timeout(self.request_timeout(), request)
            .await
            .unwrap_or(Err(zk::Error::ConnectionLoss))
    }

    pub(crate) fn lock_dir(&self, name: &str) -> String {
        format!("{}/{}", self.inner.root, escape(name))
    }

    pub(crate) fn acls(&self) -> zk::Acls<'static> {
        if self.inner.config.auth.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    /// Joins the queue of `dir`: creates our ephemeral sequential node,
    /// creating container parents as needed. If the reply is lost, finds the
    /// node by its protected prefix instead of leaving an orphan.
    async fn enqueue(
        &self,
        client: &zk::Client,
        dir: &str,
        owner: OwnerToken,
    ) -> Result<(String, i64)> {
        let prefix = protected_prefix(owner);
        let path = format!("{dir}/{prefix}lock-");
        let node_opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let dir_opts = zk::CreateMode::Container.with_acls(self.acls());
        let mut last = None;
        for _ in 0..5 {
            match self.bounded(client.create(&path, &[], &node_opts)).await {
                Ok((stat, seq)) => {
                    let node = format!("{path}{seq}");
                    return Ok((node, stat.czxid));
                }
                // The parents are containers: missing at first, and removed
                // by the server whenever they are empty.
                Err(zk::Error::NoNode) => {
                    match self.bounded(client.mkdir(dir, &dir_opts)).await {
                        Ok(()) | Err(zk::Error::NodeExists) => {}
                        Err(e) => return Err(zk_error(e, "create the lock's parent")),
                    }
                    last = Some(zk::Error::NoNode);
                }
                Err(zk::Error::ConnectionLoss) => {
                    if let Some(found) = self.find_own(client, dir, &prefix).await? {
                        return Ok(found);
                    }
                    last = Some(zk::Error::ConnectionLoss);
                }
                Err(e) => return Err(zk_error(e, "create the lock node")),
            }
        }
        let doing = format!("could not create a lock node under {dir} in 5 tries");
        Err(match last {
            Some(e) => zk_error(e, &doing),
            None => Error::Backend {
                backend: NAME,
                message: doing,
                source: None,
            },
        })
    }

    /// Joins the queue and lists it in one round trip: the client sends
    /// requests in call order, so the listing goes out right behind the
    /// create, and the server, answering a session's requests in order,
    /// lists the queue with our node in it. Falls back to [`Self::enqueue`]
    /// (which creates missing parents and finds a node whose reply was
    /// lost) when the create fails.
    async fn enqueue_and_list(
        &self,
        client: &zk::Client,
        dir: &str,
        owner: OwnerToken,
    ) -> Result<(String, i64, Option<(Vec<String>, bool)>)> {
        let prefix = protected_prefix(owner);
        let path = format!("{dir}/{prefix}lock-");
        let node_opts = zk::CreateMode::EphemeralSequential.with_acls(self.acls());
        let create = client.create(&path, &[], &node_opts);
        let list = client.list_children(dir);
        let (created, listed) = tokio::join!(self.bounded(create), self.bounded(list));
        match created {
            Ok((stat, seq)) => Ok((
                format!("{path}{seq}"),
                stat.czxid,
                listed.ok().map(sorted_queue),
            )),
            // Not created: the parents are missing (containers come and go).
            Err(zk::Error::NoNode) => {
                let (node, czxid) = self.enqueue(client, dir, owner).await?;
                Ok((node, czxid, None))
            }
            // Maybe created: look for it before creating another.
            Err(zk::Error::ConnectionLoss) => match self.find_own(client, dir, &prefix).await? {
                Some((node, czxid)) => Ok((node, czxid, None)),
                None => {
                    let (node, czxid) = self.enqueue(client, dir, owner).await?;
                    Ok((node, czxid, None))
                }
            },
            Err(e) => Err(zk_error(e, "create the lock node")),
        }
    }

    /// Our node in `dir`, by its protected prefix.
    async fn find_own(
        &self,
        client: &zk::Client,
        dir: &str,
        prefix: &str,
    ) -> Result<Option<(String, i64)>> {
        let children = match self.bounded(client.list_children(dir)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) => return Err(zk_error(e, "look for our lock node")),
        };
        let Some(node) = children.into_iter().find(|c| c.starts_with(prefix)) else {
            return Ok(None);
        };
        let path = format!("{dir}/{node}");
        match self.bounded(client.check_stat(&path)).await {
            Ok(Some(stat)) => Ok(Some((path, stat.czxid))),
            Ok(None) => Ok(None),
            Err(e) => Err(zk_error(e, "read our lock node")),
        }
    }

    /// The queue of `dir`, sorted by sequence number, and whether a hold
    /// node (see [`crate::hold`]) is there too.
    async fn queue(&self, client: &zk::Client, dir: &str) -> Result<(Vec<String>, bool)> {
        let children: Vec<String> = match self.bounded(client.list_children(dir)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(zk_error(e, "list the lock queue")),
        };
        Ok(sorted_queue(children))
    }

    /// Takes a place in the queue and waits for the front, up to `deadline`
    /// (`None`: one look only). The node is deleted if this ends without a
    /// lease, and also if this future is dropped.
    async fn contend(&self, name: &str, deadline: Option<Deadline>) -> Result<Option<Lease>> {
        let client = self.client();
        let owner = OwnerToken::random()?;
        let dir = self.lock_dir(name);
        let mut pending = Pending {
            backend: self.clone(),
            dir: dir.clone(),
            prefix: protected_prefix(owner),
            node: None,
            armed: true,
        };
        let (path, czxid, mut listed) = self.enqueue_and_list(&client, &dir, owner).await?;
        pending.node = Some(path.clone());
        // Checked only now, so that a bad one still gets the node deleted.
        let czxid = fencing_token(czxid)?;
        let node = path.rsplit('/').next().unwrap_or_default().to_owned();
        loop {
            let (queue, hold) = match listed.take() {
                // The listing sent with the create: the server answers a
                // session's requests in order, so it holds our node. Read
                // again if it does not, rather than trust it.
                Some(first) if first.0.contains(&node) => first,
                _ => self.queue(&client, &dir).await?,
            };
            let Some(at) = queue.iter().position(|c| *c == node) else {
                // Our node vanished: the session expired under us.
                return Err(Error::connection(
                    NAME,
                    "our lock node disappeared (session expired)",
                    zk::Error::SessionExpired,
                ));
            };
            if at == 0
                && hold
                && let Some(left) = self.hold_left(&client, &dir, &path).await?
            {
                let Some(deadline) = deadline else {
                    pending.leave().await;
                    return Ok(None);
                };
                if deadline.is_past() {
                    pending.leave().await;
                    return Err(deadline.timeout_error(name));
                }
                // Until the hold ends, or its node goes (an operator's
                // forced release).
                let watcher = match self
                    .bounded(client.check_and_watch_stat(&hold_path(&dir)))
                    .await
                {
                    Ok((_, watcher)) => watcher,
                    Err(e) => return Err(zk_error(e, "watch the lock's hold")),
                };
                tokio::select! {
                    _ = watcher.changed() => {}
                    () = sleep(deadline.cap(left)) => {}
                }
                continue;
            }
            if at == 0 {
                // The session's signal as of now: one cancelled by a blip
                // while we waited would make the lease lost on arrival.
                let (current, lost) = self.session();
                if !Arc::ptr_eq(&current, &client) {
                    return Err(Error::connection(
                        NAME,
                        "the session was replaced while waiting",
                        zk::Error::SessionExpired,
                    ));
                }
                pending.armed = false;
                let lease =
                    Lease::with_session(name, owner, czxid, lost.child_token()).with_handle(path);
                return Ok(Some(lease));
            }
            let Some(deadline) = deadline else {
                // Leave the queue before saying "held", so the next attempt
                // (ours or anyone's) does not queue behind a ghost.
                pending.leave().await;
                return Ok(None);
            };
            // Watch only the node just ahead of ours: a release wakes one
            // waiter, not the herd.
            let predecessor = format!("{dir}/{}", queue[at - 1]);
            let watcher = match self
                .bounded(client.check_and_watch_stat(&predecessor))
                .await
            {
                Ok((Some(_), watcher)) => watcher,
                Ok((None, _)) => continue,
                Err(e) => return Err(zk_error(e, "watch the lock's predecessor")),
            };
            if !deadline.is_past() {
                tokio::select! {
                    _ = watcher.changed() => continue,
                    () = sleep(deadline.cap(Duration::MAX)) => {}
                }
            }
            pending.leave().await;
            return Err(deadline.timeout_error(name));
        }
    }

    /// The lease's node, if the lease is one of ours.
    fn node_of<'a>(&self, lease: &'a Lease) -> Option<&'a str> {
        let path = lease.handle()?;
        let node = path.rsplit('/').next()?;
        (path.starts_with(&self.lock_dir(lease.name()))
            && node.starts_with(&protected_prefix(lease.owner())))
        .then_some(path)
    }
}

impl Pending {
    /// Leaves the queue: deletes the node, and disarms only once the
    /// delete is done, so that a caller dropping this midway still has the
    /// node deleted (by `Drop`).
    async fn leave(mut self) {
        if let Some(node) = self.node.clone() {
            self.backend.delete_node(node).await;
        }
        self.armed = false;
    }
}

/// The lock nodes among a folder's children, sorted by sequence number, and
/// whether a hold node is there too.
fn sorted_queue(mut children: Vec<String>) -> (Vec<String>, bool) {
    let hold = children.iter().any(|c| c == HOLD_NODE);
    children.retain(|c| sequence(c).is_some());
    children.sort_by_key(|c| sequence(c));
    (children, hold)
}

/// A fencing token from a node's creation zxid, which is positive on a
/// healthy server; anything else (some versions report -1) is an error,
/// never a token that could go backwards.
fn fencing_token(czxid: i64) -> Result<u64> {
    u64::try_from(czxid)
        .ok()
        .filter(|&z| z > 0)
        .ok_or_else(|| Error::Backend {
            backend: NAME,
            message: format!(
                "the server reported an invalid creation zxid ({czxid}) for a lock node"
            ),
            source: None,
        })
}

/// A queue place not yet handed over as a lease: deleted when dropped.
struct Pending {
    backend: ZkBackend,
    dir: String,
    prefix: String,
    node: Option<String>,
    armed: bool,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let backend = self.backend.clone();
        let dir = std::mem::take(&mut self.dir);
        let prefix = std::mem::take(&mut self.prefix);
        let node = self.node.take();
        rt.spawn(async move {
            match node {
                Some(node) => backend.delete_node(node).await,
                // Dropped while the create was unanswered: it may have
                // landed, or may land after a reconnect.
                None => {
                    backend
                        .inner
                        .uncertain
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Uncertain {
                            dir,
                            prefix,
                            since: tokio::time::Instant::now(),
                        });
                    let mut backoff =
                        Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
                    while backend.resolve_uncertain().await {
                        sleep(backoff.next_delay()).await;
                    }
                }
            }
        });
    }
}

/// A create whose outcome is unknown; see `Inner::uncertain`.
struct Uncertain {
    dir: String,
    prefix: String,
    since: tokio::time::Instant,
}

#[async_trait]
impl Backend for ZkBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Session);
        caps.fencing = true;
        caps.fencing_survives_restart = true;
        caps.notify = true;
        caps.fifo = true;
        caps.distributed = true;
        caps.cleanup = true;
        caps.delayed_release = true;
        caps
    }

    fn driver(&self) -> &'static str {
        NAME
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        validate_name(name)?;
        opts.validate()?;
        self.contend(name, None).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        validate_name(name)?;
        opts.validate()?;
        let deadline = Deadline::after(opts.wait_value());
        let contend = async {
            // A connection that drops mid-wait (the server went, or the
            // session moves to another server of the ensemble) costs this
            // attempt its node, not the caller its wait: contend again.
            let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
            loop {
                match self.contend(name, Some(deadline)).await {
                    Ok(Some(lease)) => return Ok(lease),
                    Ok(None) => return Err(deadline.timeout_error(name)),
                    Err(e) if e.is_retryable() && !deadline.is_past() => {
                        tracing::debug!(name, error = %e, "contending again");
                        sleep(deadline.cap(backoff.next_delay())).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        deadline.bound(name, self.request_timeout(), contend).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let not_held = || Error::NotHeld {
            name: lease.name().to_owned(),
        };
        let path = self.node_of(lease).ok_or_else(not_held)?;
        match self.bounded(self.client().delete(path, None)).await {
            Ok(()) => Ok(()),
            Err(zk::Error::NoNode | zk::Error::SessionExpired) => Err(not_held()),
            Err(e) => {
                self.inner
                    .orphans
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(path.to_owned());
                Err(zk_error(e, "release"))
            }
        }
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        dlock_core::check_hold(hold)?;
        if hold.is_zero() {
            return self.release(lease).await;
        }
        let node = self.node_of(lease).ok_or_else(|| Error::NotHeld {
            name: lease.name().to_owned(),
        })?;
        self.write_hold(lease, node, hold).await
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        let not_held = || Error::NotHeld {
            name: lease.name().to_owned(),
        };
        let path = self.node_of(lease).ok_or_else(not_held)?;
        match self.bounded(self.client().check_stat(path)).await {
            Ok(Some(_)) if !lease.lost_token().is_cancelled() => Ok(()),
            Ok(_) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => Err(not_held()),
            Err(e) => Err(zk_error(e, "extend")),
        }
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        let limit = limit.max(1);
        let client = self.client();
        let children = match self.bounded(client.list_children(&self.inner.root)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(zk_error(e, "list the locks")),
        };
        let mut names: Vec<String> = children
            .iter()
            .filter_map(|c| unescape(c))
            .filter(|n| n.starts_with(prefix) && cursor.is_none_or(|c| n.as_str() > c))
            .collect();
        names.sort();
        // One look at each folder of the page; a folder whose queue is
        // empty is a lock nobody holds.
        let more = names.len() > limit;
        names.truncate(limit);
        let mut locks = Vec::new();
        for name in &names {
            if let Some(info) = self.holder(&client, &self.lock_dir(name)).await? {
                locks.push(HeldLock::new(name.clone(), info));
            }
        }
        Ok(LockPage::new(
            locks,
            more.then(|| names.last().cloned()).flatten(),
        ))
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        validate_name(name)?;
        let client = self.client();
        let dir = self.lock_dir(name);
        let (queue, hold) = self.queue(&client, &dir).await?;
        if hold && let Some(info) = self.delete_hold(&client, &dir).await? {
            // The node at the front only waited for the hold.
            return Ok(Some(info));
        }
        let Some(first) = queue.first() else {
            return Ok(None);
        };
        let path = format!("{dir}/{first}");
        let stat = match self.bounded(client.check_stat(&path)).await {
            Ok(Some(stat)) => stat,
            Ok(None) => return Ok(None),
            Err(e) => return Err(zk_error(e, "inspect")),
        };
        match self.bounded(client.delete(&path, None)).await {
            Ok(()) => {
                let owner = owner_of(first).unwrap_or(OwnerToken::from_u128(0));
                Ok(Some(LockInfo::new(owner, fencing_token(stat.czxid)?, None)))
            }
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(zk_error(e, "force_release")),
        }
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        validate_name(name)?;
        self.holder(&self.client(), &self.lock_dir(name)).await
    }
}

impl ZkBackend {
    /// The holder of the lock in `dir`: the first node of its queue.
    async fn holder(&self, client: &zk::Client, dir: &str) -> Result<Option<LockInfo>> {
        for _ in 0..3 {
            let (queue, hold) = self.queue(client, dir).await?;
            // During a hold, the node at the front only waits for it.
            if hold && let Some(info) = self.read_hold(client, dir).await?.and_then(|h| h.info()) {
                return Ok(Some(info));
            }
            let Some(first) = queue.first() else {
                return Ok(None);
            };
            match self
                .bounded(client.check_stat(&format!("{dir}/{first}")))
                .await
            {
                Ok(Some(stat)) => {
                    let owner = owner_of(first).unwrap_or(OwnerToken::from_u128(0));
                    return Ok(Some(LockInfo::new(owner, fencing_token(stat.czxid)?, None)));
                }
                // Released between the two reads: look again.
                Ok(None) => {}
                Err(e) => return Err(zk_error(e, "inspect")),
            }
        }
        Err(Error::Backend {
            backend: NAME,
            message: format!("the queue of {dir} keeps changing"),
            source: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_positive_czxids_are_fencing_tokens() {
        assert_eq!(fencing_token(42).ok(), Some(42));
        for bad in [-1, 0, i64::MIN] {
            assert!(
                matches!(fencing_token(bad), Err(Error::Backend { .. })),
                "{bad}"
            );
        }
    }
}
