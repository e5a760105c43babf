use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use dlock_core::undo::{UndoOnDrop, retry_for};
use dlock_core::wait::{Attempt, Backoff, Deadline, MIN_BACKOFF, on_arrival, wait_for_lock};
use dlock_core::{
    Backend, Capabilities, Error, HeldLock, Lease, LeaseKind, LockInfo, LockOptions, LockPage,
    OwnerToken, Result, async_trait, check_duration, check_hold, validate_name,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, IntoConnectionInfo, ProtocolVersion, PushInfo, RedisError};
use tokio::time::Instant;

use crate::conn::{Connection, Kind, PushConn, cluster_nodes};
use crate::keys::{Keys, keys, lock_pattern, name_of, validate_prefix};
use crate::notify::Notifications;
use crate::scripts::{
    EXTEND, EXTEND_MANY, FENCE_RETENTION_MS, HOLD, INSPECT, PLACE_HEARTBEATS, QueueScripts,
    SHARDED, SINGLE,
};
use crate::sentinel::{Sentinel, parse_url};

const NAME: &str = "redis";

/// A Redis lock backend. Cheap to clone; clones share connections.
///
/// Needs Redis 6 or later (RESP3 for the pub/sub connection). See the crate
/// docs for the key layout.
///
/// With a `redis+sentinel://` URL it asks the Sentinels for the primary,
/// and asks again whenever a request fails for want of a primary (the
/// connection drops, or the old primary answers `READONLY` as a replica),
/// so it follows a failover.
///
/// With a `redis+cluster://` URL it talks to a Redis Cluster (7 or later):
/// each lock's keys share one hash slot, scripts go to the slot's node,
/// `MOVED` and `ASK` redirections are followed, and wake-ups travel on
/// sharded channels (`SPUBLISH`), so a release message stays on the node
/// that holds the lock. [`Backend::list`] is not supported there.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    /// Replaced when Sentinel names a new primary.
    conn: RwLock<Connection>,
    /// Redis Cluster: sharded wake-up channels, one per waiting lock.
    cluster: bool,
    sentinel: Option<Sentinel>,
    /// The settings, for connections to a new primary among others.
    builder: RedisBuilder,
    pushes: tokio::sync::mpsc::UnboundedSender<PushInfo>,
    prefix: String,
    max_poll: Duration,
    request_timeout: Duration,
    notifications: Notifications,
    /// Identifies this client's waiters in the lock queues.
    client_id: String,
    /// `<prefix>:wake:`: with the client id, the channel a client's
    /// waiters are woken on.
    wake_prefix: String,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

/// Settings for [`RedisBackend`]; start from [`RedisBackend::builder`].
#[derive(Clone)]
pub struct RedisBuilder {
    url: String,
    prefix: String,
    request_timeout: Duration,
    connect_timeout: Duration,
    max_poll: Duration,
    tls_ca: Option<Vec<u8>>,
    durable: Option<(u32, Duration)>,
}

impl fmt::Debug for RedisBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBuilder")
            .field("url", &dlock_core::redact_url(&self.url))
            .field("prefix", &self.prefix)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_poll", &self.max_poll)
            .field("durable", &self.durable)
            .finish()
    }
}

impl RedisBuilder {
    /// The longest a waiter sleeps between attempts when no release message
    /// arrives (default 1 s). Release messages and the holder's expiry wake
    /// it sooner; this poll only covers lost messages.
    pub fn max_poll_interval(mut self, interval: Duration) -> Self {
        self.max_poll = interval;
        self
    }

    /// The prefix of every key (default `dlock`); it must not contain braces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long to wait for a reply before the request counts as failed
    /// (default 1 s). An acquire whose reply times out may still have taken
    /// the lock: the driver then releases it by its owner token, and its TTL
    /// frees it in any case.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Trust this CA certificate (PEM) for `rediss://` servers, instead of
    /// the usual web roots: for a server with a private CA.
    #[cfg(feature = "tls")]
    pub fn tls_ca_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca = Some(pem.into());
        self
    }

    /// Durable grants (off by default): a grant, an extension or a
    /// `release_after` counts only once `replicas` replicas have
    /// acknowledged it, with Redis's `WAIT replicas timeout` sent on the
    /// same connection right behind the script (one round trip). A grant
    /// not confirmed in time is released and reported as
    /// [`Error::Unavailable`] (waiting acquires try again); an extension
    /// not confirmed leaves the lease's deadline where it was.
    ///
    /// This narrows the failover window, it does not close it: replication
    /// stays asynchronous, a confirmed write can still be lost (a replica
    /// that acknowledged it may not be the one promoted, and without
    /// `appendfsync always` a restart loses it), and `WAIT` blocks this
    /// client's shared connection until the replicas answer (with a replica
    /// down, each durable request holds it for `timeout`). Fencing tokens
    /// are what protects a resource. With fewer than `replicas` replicas
    /// up, nothing can be granted. `timeout` must be below the response
    /// timeout.
    pub fn durable_grants(mut self, replicas: u32, timeout: Duration) -> Self {
        self.durable = Some((replicas, timeout));
        self
    }

    /// How long to wait for a connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Connects: one connection for commands, one for release notifications.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed URL or prefix,
    /// [`Error::Connection`] when the server cannot be reached,
    /// [`Error::Backend`] when it refuses us (wrong password, say).
    pub async fn connect(self) -> Result<RedisBackend> {
        validate_prefix(&self.prefix)?;
        let ms = Duration::from_millis(1);
        check_duration("max_poll_interval", self.max_poll, MIN_BACKOFF, MAX_SETTING)?;
        check_duration("request_timeout", self.request_timeout, ms, MAX_SETTING)?;
        check_duration("connect_timeout", self.connect_timeout, ms, MAX_SETTING)?;
        if let Some((replicas, timeout)) = self.durable
            && (replicas == 0 || timeout.is_zero() || timeout >= self.request_timeout)
        {
            return Err(Error::invalid_option(
                "durable_grants",
                format!(
                    "needs at least one replica and a timeout between 1 ms and the response \
                     timeout ({:?}), got {replicas} and {timeout:?}",
                    self.request_timeout
                ),
            ));
        }
        if let Some(nodes) = cluster_nodes(&self.url)? {
            return self.connect_cluster(nodes).await;
        }
        let sentinel = parse_url(&self.url)?
            .map(|url| Sentinel::new(&url, self.connect_timeout))
            .transpose()?;
        let info = match &sentinel {
            Some(sentinel) => sentinel.lookup().await?.get_connection_info().clone(),
            None => self
                .url
                .as_str()
                .into_connection_info()
                .map_err(|e| Error::invalid_option("url", format!("not a Redis URL: {e}")))?,
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (conn, push_conn) = self.open(info.clone(), &tx).await?;
        if let Some(sentinel) = &sentinel {
            sentinel.switch_to(info.addr());
        }
        self.backend(conn, push_conn, sentinel, false, (tx, rx))
    }

    fn backend(
        self,
        conn: Connection,
        push_conn: PushConn,
        sentinel: Option<Sentinel>,
        cluster: bool,
        (tx, rx): PushChannel,
    ) -> Result<RedisBackend> {
        let mut client_id = OwnerToken::random()?.to_string();
        client_id.truncate(16);
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                conn: RwLock::new(conn),
                cluster,
                sentinel,
                pushes: tx,
                wake_prefix: format!("{}:wake:", self.prefix),
                client_id,
                notifications: Notifications::start(push_conn, rx, self.prefix.clone()),
                prefix: self.prefix.clone(),
                max_poll: self.max_poll,
                request_timeout: self.request_timeout,
                builder: self,
            }),
        })
    }

    /// Connects to a Redis Cluster through any of its nodes.
    async fn connect_cluster(self, nodes: Vec<String>) -> Result<RedisBackend> {
        if self.durable.is_some() {
            return Err(Error::invalid_option(
                "durable_grants",
                "not supported on Redis Cluster yet (use Sentinel)",
            ));
        }
        if self.tls_ca.is_some() {
            return Err(Error::invalid_option(
                "tls_ca_certificates",
                "not supported on Redis Cluster yet",
            ));
        }
        let builder = || {
            redis::cluster::ClusterClientBuilder::new(nodes.clone())
                .connection_timeout(self.connect_timeout)
                .response_timeout(self.request_timeout)
                .retries(2)
        };
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let client = builder().build().map_err(|e| bad_url(&e))?;
        let push_client = builder()
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(tx.clone())
            .build()
            .map_err(|e| bad_url(&e))?;
        // The client tries its seeds in turn; bound the whole walk.
        let bound = self.connect_timeout * 2 + self.request_timeout;
        let connect = |client: redis::cluster::ClusterClient, doing: &'static str| async move {
            match tokio::time::timeout(bound, client.get_async_connection()).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(e)) => Err(redis_error(e, doing)),
                Err(_) => Err(Error::connection(
                    NAME,
                    doing,
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                )),
            }
        };
        let conn = connect(client, "connect to the cluster").await?;
        let push_conn = connect(push_client, "connect to the cluster for notifications").await?;
        self.backend(
            Connection(Kind::Cluster(conn)),
            PushConn::Cluster(push_conn),
            None,
            true,
            (tx, rx),
        )
    }

    /// Opens the command connection and the RESP3 one for notifications.
    async fn open(
        &self,
        info: redis::ConnectionInfo,
        pushes: &tokio::sync::mpsc::UnboundedSender<PushInfo>,
    ) -> Result<(Connection, PushConn)> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.request_timeout))
            .set_connection_timeout(Some(self.connect_timeout))
            .set_number_of_retries(2);
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let push_info = info.clone().set_redis_settings(settings);
        let client = self.client(info)?;
        let push_client = self.client(push_info)?;
        let conn = ConnectionManager::new_with_config(client, config.clone())
            .await
            .map_err(|e| redis_error(e, "connect"))?;
        let push_conn = ConnectionManager::new_with_config(
            push_client,
            config
                .clone()
                .set_push_sender(pushes.clone())
                .set_automatic_resubscription(),
        )
        .await
        .map_err(|e| redis_error(e, "connect for notifications"))?;
        Ok((Connection(Kind::Single(conn)), PushConn::Single(push_conn)))
    }
}

/// How long one search for a new primary goes on; failed requests start
/// another.
const FOLLOW_FOR: Duration = Duration::from_secs(30);

/// Where the notification connection hands its messages over.
type PushChannel = (
    tokio::sync::mpsc::UnboundedSender<PushInfo>,
    tokio::sync::mpsc::UnboundedReceiver<PushInfo>,
);

/// The longest a duration setting may be: beyond a day it is surely a
/// mistake (and overflows the client library's arithmetic).
const MAX_SETTING: Duration = Duration::from_secs(24 * 60 * 60);

impl RedisBuilder {
    fn client(&self, info: redis::ConnectionInfo) -> Result<redis::Client> {
        // The redis crate asks rustls for the process's crypto provider,
        // and rustls panics rather than choose when the build has two (a
        // ZooKeeper client with TLS brings aws-lc-rs next to ring).
        #[cfg(feature = "tls")]
        let _ = rustls::crypto::ring::default_provider().install_default();
        #[cfg(feature = "tls")]
        if let Some(root) = &self.tls_ca {
            let certs = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root.clone()),
            };
            return redis::Client::build_with_tls(info, certs).map_err(|e| bad_url(&e));
        }
        if self.tls_ca.is_some() {
            return Err(Error::invalid_option(
                "tls_ca_certificates",
                "needs the `tls` feature",
            ));
        }
        redis::Client::open(info).map_err(|e| bad_url(&e))
    }
}

fn bad_url(e: &RedisError) -> Error {
    Error::invalid_option("url", e.to_string())
}

/// Maps a client error: transport trouble is a connection error (the
/// request may or may not have run), anything the server said is a backend
/// error.
fn redis_error(e: RedisError, doing: &str) -> Error {
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return Error::backend(NAME, format!("{doing}: authentication failed"), e);
    }
    // The server is there but cannot serve this moment: loading its data,
    // running a long script, a replica, or mid-failover. A pipeline's
    // error carries its first failed command's code.
    let code = e.code().map(str::to_owned).or_else(|| {
        let errors = e.clone().into_server_errors()?;
        errors.first().map(|(_, error)| error.code().to_owned())
    });
    if matches!(
        code.as_deref(),
        Some("LOADING" | "BUSY" | "READONLY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN")
    ) {
        return Error::unavailable(NAME, doing, e);
    }
    if e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
    {
        Error::connection(NAME, doing, e)
    } else {
        Error::backend(NAME, doing, e)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A grant or extension that too few replicas acknowledged in time.
fn unconfirmed(doing: &str) -> Error {
    Error::unavailable(
        NAME,
        doing,
        std::io::Error::other("too few replicas acknowledged it in time (durable grants)"),
    )
}

fn malformed(what: &str, reply: impl fmt::Debug) -> Error {
    Error::Backend {
        backend: NAME,
        message: format!("unexpected reply to {what}: {reply:?}"),
        source: None,
    }
}

impl RedisBackend {
    /// Connects with default settings.
    ///
    /// URLs: `redis://[user:password@]host[:port][/db]`, `rediss://…` for
    /// TLS (with the `tls` feature), `redis+unix:///path`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Settings, starting from a URL.
    pub fn builder(url: impl Into<String>) -> RedisBuilder {
        RedisBuilder {
            url: url.into(),
            prefix: "dlock".to_owned(),
            request_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(2),
            max_poll: Duration::from_secs(1),
            tls_ca: None,
            durable: None,
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    /// The command connection, for callers that want to look at the keys.
    pub fn connection(&self) -> Connection {
        self.inner
            .conn
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The primary's address, when Sentinel chose it.
    pub fn sentinel_primary(&self) -> Option<String> {
        let sentinel = self.inner.sentinel.as_ref()?;
        sentinel.primary().map(|addr| addr.to_string())
    }

    /// Maps a failed request's error, and with Sentinel, looks for a new
    /// primary when the failure may mean the old one is gone.
    fn fail(&self, e: RedisError, doing: &str) -> Error {
        let error = redis_error(e, doing);
        if matches!(error, Error::Connection { .. } | Error::Unavailable { .. })
            && let Some(sentinel) = &self.inner.sentinel
            && sentinel.lookup_due()
        {
            let backend = self.clone();
            tokio::spawn(async move { backend.follow_primary().await });
        }
        error
    }

    /// Asks the Sentinels for the primary and, when it moved, points the
    /// connections at it.
    async fn follow_primary(&self) {
        let Some(sentinel) = &self.inner.sentinel else {
            return;
        };
        // One at a time, from the lookup to the swap: a slower follower
        // with an older answer must not undo a newer one.
        let Some(_following) = sentinel.following() else {
            return;
        };
        // Mid-failover the Sentinels may name no primary, or one that does
        // not confirm its role yet: keep asking for a while, rather than
        // wait for the next failed request to ask again.
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let asking = Instant::now();
        let found = loop {
            match sentinel.lookup().await {
                Ok(client) => break client.get_connection_info().clone(),
                Err(e) if asking.elapsed() < FOLLOW_FOR => {
                    tracing::debug!(error = %e, "no primary from Sentinel yet");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no primary from Sentinel");
                    return;
                }
            }
        };
        if sentinel.primary().as_ref() == Some(found.addr()) {
            return;
        }
        let pushes = self.inner.pushes.clone();
        match self.inner.builder.open(found.clone(), &pushes).await {
            Ok((conn, push_conn)) => {
                *self
                    .inner
                    .conn
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = conn;
                self.inner.notifications.reconnect(push_conn);
                sentinel.switch_to(found.addr());
                tracing::info!(primary = %found.addr(), "following the new primary");
            }
            Err(e) => tracing::debug!(error = %e, "cannot reach the new primary yet"),
        }
    }

    /// Runs a script. With durable grants and `confirm`, the replicas'
    /// acknowledgement is asked for on the same connection right behind
    /// it; the flag says whether enough replicas acknowledged in time
    /// (always `true` otherwise).
    ///
    /// Bounded by the connection and request timeouts together: a request
    /// may wait for the connection manager to reconnect before it is sent.
    async fn run<T: FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        confirm: bool,
        doing: &str,
    ) -> Result<(T, bool)> {
        let bound = self.inner.builder.connect_timeout + self.inner.request_timeout;
        match tokio::time::timeout(bound, self.run_unbounded(invocation, confirm)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(self.fail(e, doing)),
            Err(_) => Err(self.fail(
                RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no reply within {bound:?}"),
                )),
                doing,
            )),
        }
    }

    async fn run_unbounded<T: FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        confirm: bool,
    ) -> redis::RedisResult<(T, bool)> {
        let mut conn = self.connection();
        let Some((replicas, timeout)) = self.inner.builder.durable.filter(|_| confirm) else {
            return Ok((invocation.invoke_async(&mut conn).await?, true));
        };
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation)
            .cmd("WAIT")
            .arg(replicas)
            .arg(millis(timeout));
        let mut reply = pipe.query_async::<(T, u32)>(&mut conn).await;
        if matches!(&reply, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript))
        {
            // A new primary, or a flushed script cache: load it, once.
            invocation.load_async(&mut conn).await?;
            reply = pipe.query_async(&mut conn).await;
        }
        let (value, acked) = reply?;
        Ok((value, acked >= replicas))
    }

    /// How many wake-up channels this client is subscribed to: its own one
    /// once it has waited for a lock, else none.
    pub fn subscribed_channels(&self) -> usize {
        self.inner.notifications.channels()
    }

    /// The scripts that wake waiters, as this deployment needs them.
    fn queue_scripts(&self) -> &'static QueueScripts {
        if self.inner.cluster {
            &SHARDED
        } else {
            &SINGLE
        }
    }

    fn keys(&self, name: &str) -> Keys {
        keys(&self.inner.prefix, name)
    }

    /// One acquire script: a grant, or the holder's remaining TTL. With a
    /// `waiter`, a caller not granted keeps (or takes) its place in the
    /// name's queue.
    async fn attempt(
        &self,
        name: &str,
        keys: &Keys,
        opts: &LockOptions,
        waiter: &str,
    ) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        // Armed until the reply is in: if the request fails or this future is
        // dropped mid-flight, the script may still run and take the lock for
        // a caller who never hears of it, so release it by its token.
        let mut cleanup = {
            let (backend, name, ttl) = (self.clone(), name.to_owned(), opts.ttl_value());
            UndoOnDrop::new(async move { backend.undo(&name, owner, ttl).await })
        };
        let mut invocation = self.queue_scripts().acquire.prepare_invoke();
        invocation
            .key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.queue_expiry)
            .arg(owner.to_string())
            .arg(millis(opts.ttl_value()));
        if !waiter.is_empty() {
            invocation.arg(waiter).arg(millis(self.place_lifetime()));
        }
        let (reply, confirmed) = self
            .run::<(i64, String)>(&invocation, true, "acquire")
            .await?;
        if reply.0 == 1 && !confirmed {
            // Granted on the primary only: the armed undo releases it.
            return Err(unconfirmed("acquire"));
        }
        let attempt = match reply {
            (1, fence) => {
                let fence = fence.parse().map_err(|_| malformed("acquire", &fence))?;
                on_arrival(self, Lease::with_ttl(name, owner, fence, opts, sent))
            }
            (0, pttl) => Attempt::Held {
                expires_in: pttl.parse::<u64>().ok().map(Duration::from_millis),
            },
            other => return Err(malformed("acquire", other)),
        };
        cleanup.disarm();
        Ok(attempt)
    }
}

impl RedisBackend {
    /// How long a queued waiter keeps its place without asking again.
    fn place_lifetime(&self) -> Duration {
        self.inner.max_poll * PLACE_HEARTBEATS
    }

    /// Acquire's wait: one attempt, then a place in the name's queue and
    /// wake-ups on this client's channel when the place comes first.
    async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease> {
        let keys = self.keys(name);
        let notifications = &self.inner.notifications;
        // Until this client first waits, the uncontended case costs one
        // round trip: subscribe and queue only once the lock turns out to
        // be held (or the attempt failed in a way worth another try, which
        // the wait loop makes). From then on the channel is kept, and the
        // first attempt queues at once, unless the wait is too short to
        // be worth a place (a place left behind would hold the queue up
        // until it is given back).
        //
        // On a cluster each lock has its own channel per client, in the
        // lock's slot: it is subscribed for the wait only.
        let worth_queueing = deadline.cap(self.inner.request_timeout) >= self.inner.request_timeout;
        let cluster = self.inner.cluster;
        if cluster || !notifications.is_kept() || !worth_queueing {
            match self.attempt(name, &keys, opts, "").await {
                Ok(Attempt::Acquired(lease)) => return Ok(lease),
                Ok(Attempt::Held { .. }) => {}
                Err(e) if e.is_retryable() => {}
                Err(e) => return Err(e),
            }
            if deadline.is_past() {
                return Err(deadline.timeout_error(name));
            }
        }
        // Without a subscription, a place at the head would never hear its
        // wake-up: poll without one instead. The subscriber may be busy
        // resubscribing to a node that is down: wait for it only so long.
        let limit = deadline.cap(self.inner.request_timeout * 2);
        let (_interest, subscribed) = if cluster {
            let channel = format!("{}:wake:{}", keys.lock, self.inner.client_id);
            let (interest, subscribed) = notifications.interest(&channel, limit).await;
            (Some(interest), subscribed)
        } else {
            let channel = format!("{}{}", self.inner.wake_prefix, self.inner.client_id);
            (None, notifications.keep(&channel, limit).await)
        };
        let waiter = if subscribed {
            format!("{}{}", OwnerToken::random()?, self.inner.client_id)
        } else {
            String::new()
        };
        // However the wait ends without a grant (timeout, error, dropped),
        // give the place up, so that the next waiter need not wait for it
        // to lapse. A grant took it out of the queue already; a wait that
        // never queued has no place to give up.
        let mut leave = (!waiter.is_empty()).then(|| {
            let (backend, name, waiter) = (self.clone(), name.to_owned(), waiter.clone());
            UndoOnDrop::new(async move { backend.abandon(&name, &waiter).await })
        });
        // Heartbeats no longer apart than `max_poll` keep the place.
        let max_poll = self.inner.max_poll;
        let backoff = Backoff::new(max_poll.min(Duration::from_millis(100)), max_poll);
        let lease = wait_for_lock(
            name,
            deadline,
            Some(&notifications.wakeups),
            backoff,
            || self.attempt(name, &keys, opts, &waiter),
        )
        .await?;
        if let Some(leave) = &mut leave {
            leave.disarm();
        }
        Ok(lease)
    }

    /// Takes `waiter` out of the queue of `name`, waking the next waiter if
    /// it was first and the lock is free.
    async fn abandon(&self, name: &str, waiter: &str) {
        let keys = self.keys(name);
        let mut invocation = self.queue_scripts().abandon.prepare_invoke();
        invocation
            .key(&keys.lock)
            .key(&keys.queue)
            .key(&keys.queue_expiry)
            .arg(waiter);
        let left = retry_for(self.inner.request_timeout * 2, || async {
            self.run::<i64>(&invocation, false, "leave the queue").await
        })
        .await;
        // Otherwise the place lapses by itself.
        tracing::debug!(name, ?left, "left the queue");
    }

    /// The release script for `owner`'s hold on the lock of `keys`; it
    /// wakes the head of the queue.
    fn release_script<'a>(
        &'a self,
        keys: &'a Keys,
        owner: OwnerToken,
    ) -> redis::ScriptInvocation<'a> {
        let mut invocation = self.queue_scripts().release.prepare_invoke();
        invocation
            .key(&keys.lock)
            .key(&keys.queue)
            .key(&keys.queue_expiry)
            .arg(owner.to_string());
        invocation
    }

    /// Releases `name` if `owner` holds it, retrying while the server is
    /// out of reach, until it answers or the TTL has freed the lock anyway.
    /// Publishes like any release, so that waiters wake.
    async fn undo(&self, name: &str, owner: OwnerToken, ttl: Duration) {
        let keys = self.keys(name);
        let invocation = self.release_script(&keys, owner);
        let released = retry_for(ttl, || async {
            self.run::<i64>(&invocation, false, "undo an acquire").await
        })
        .await;
        tracing::debug!(name, ?released, "undid an acquire of unknown outcome");
    }

    /// `extend_many` on a cluster: a script may touch one slot only, so one
    /// `EXTEND_MANY` per slot, all in flight at once (the cluster
    /// connection pipelines those bound for one node).
    async fn extend_by_slot(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let mut by_slot: std::collections::HashMap<u16, Vec<usize>> = Default::default();
        for (i, lease) in leases.iter().enumerate() {
            by_slot.entry(slot(lease.name())).or_default().push(i);
        }
        let sent = Instant::now();
        let groups: Vec<Vec<usize>> = by_slot.into_values().collect();
        let replies = futures_util::future::join_all(groups.iter().map(|group| {
            let mut invocation = EXTEND_MANY.prepare_invoke();
            invocation.arg(FENCE_RETENTION_MS);
            for &i in group {
                let keys = self.keys(leases[i].name());
                invocation.key(keys.lock).key(keys.fence);
                invocation
                    .arg(leases[i].owner().to_string())
                    .arg(millis(leases[i].ttl().unwrap_or_default()));
            }
            async move {
                self.run::<Vec<i64>>(&invocation, false, "extend")
                    .await
                    .map(|(held, _)| held)
            }
        }))
        .await;
        let mut held = vec![false; leases.len()];
        let mut failure = None;
        for (group, reply) in groups.iter().zip(replies) {
            match reply {
                Ok(reply) if reply.len() == group.len() => {
                    for (&i, h) in group.iter().zip(reply) {
                        held[i] = h == 1;
                        if held[i] {
                            leases[i].extended(sent);
                        }
                    }
                }
                Ok(reply) => failure = Some(malformed("extend_many", reply)),
                Err(e) => failure = Some(e),
            }
        }
        // One slot's node unreachable fails the batch, which the renewal
        // retries; the slots that answered have their leases extended
        // already, so a shard down does not cost the others theirs.
        match failure {
            Some(e) => Err(e),
            None => Ok(held),
        }
    }
}

/// The cluster hash slot of a lock's keys: CRC16 of the hash tag, which
/// is the escaped name.
fn slot(name: &str) -> u16 {
    let lock = keys("", name).lock;
    let tag = lock
        .strip_prefix(":{")
        .and_then(|rest| rest.strip_suffix('}'))
        .unwrap_or(&lock);
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16384
}

#[async_trait]
impl Backend for RedisBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Ttl);
        caps.fencing = true;
        caps.fencing_survives_restart = true;
        caps.notify = true;
        caps.fifo = true;
        caps.distributed = true;
        caps.cleanup = true;
        caps.delayed_release = true;
        caps.batch_extend = true;
        caps
    }

    fn driver(&self) -> &'static str {
        NAME
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        validate_name(name)?;
        opts.validate()?;
        Ok(self
            .attempt(name, &self.keys(name), opts, "")
            .await?
            .into_lease())
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        validate_name(name)?;
        opts.validate()?;
        let deadline = Deadline::after(opts.wait_value());
        let wait = self.wait(name, opts, deadline);
        deadline.bound(name, self.inner.request_timeout, wait).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        let keys = self.keys(lease.name());
        let (released, _) = self
            .run::<i64>(&self.release_script(&keys, lease.owner()), false, "release")
            .await?;
        if released != 1 {
            return Err(Error::NotHeld {
                name: lease.name().to_owned(),
            });
        }
        Ok(())
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        check_hold(hold)?;
        // Rounded up: the hold is a minimum.
        let hold_ms = millis(hold.saturating_add(Duration::from_nanos(999_999)));
        if hold_ms == 0 {
            return self.release(lease).await;
        }
        // The key gets the hold's owner and expires on the server's clock.
        // No publish: waiters poll against the remaining TTL, which the
        // server reports.
        let keys = self.keys(lease.name());
        let mut invocation = HOLD.prepare_invoke();
        invocation
            .key(&keys.lock)
            .arg(lease.owner().to_string())
            .arg(lease.owner().for_hold().to_string())
            .arg(hold_ms);
        let (held, confirmed) = self.run::<i64>(&invocation, true, "release_after").await?;
        if held == 1 && !confirmed {
            return Err(unconfirmed("release_after"));
        }
        if held != 1 {
            return Err(Error::NotHeld {
                name: lease.name().to_owned(),
            });
        }
        Ok(())
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        let keys = self.keys(lease.name());
        let ttl = lease.ttl().unwrap_or_default();
        let sent = Instant::now();
        let mut invocation = EXTEND.prepare_invoke();
        invocation
            .key(&keys.lock)
            .key(&keys.fence)
            .arg(lease.owner().to_string())
            .arg(millis(ttl))
            .arg(FENCE_RETENTION_MS);
        let (extended, confirmed) = self.run::<i64>(&invocation, true, "extend").await?;
        if extended == 1 && !confirmed {
            // The promoted replica may hold only the old deadline.
            return Err(unconfirmed("extend"));
        }
        if extended != 1 {
            return Err(Error::NotHeld {
                name: lease.name().to_owned(),
            });
        }
        lease.extended(sent);
        Ok(())
    }

    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        if self.inner.cluster {
            return self.extend_by_slot(leases).await;
        }
        // One script run for the batch: on a single server, keys of many
        // slots may meet in one script.
        let mut invocation = EXTEND_MANY.prepare_invoke();
        invocation.arg(FENCE_RETENTION_MS);
        for lease in leases.iter() {
            let keys = self.keys(lease.name());
            invocation.key(keys.lock).key(keys.fence);
            invocation
                .arg(lease.owner().to_string())
                .arg(millis(lease.ttl().unwrap_or_default()));
        }
        let sent = Instant::now();
        let (held, confirmed) = self.run::<Vec<i64>>(&invocation, true, "extend").await?;
        if !confirmed {
            return Err(unconfirmed("extend"));
        }
        if held.len() != leases.len() {
            return Err(malformed("extend_many", held));
        }
        Ok(leases
            .iter_mut()
            .zip(held)
            .map(|(lease, held)| {
                if held == 1 {
                    lease.extended(sent);
                }
                held == 1
            })
            .collect())
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        if self.inner.cluster {
            // SCAN walks one node; a cluster-wide walk needs a cursor per
            // primary.
            return Err(Error::Unsupported {
                backend: NAME,
                operation: "list on Redis Cluster",
            });
        }
        let mut scan: u64 = match cursor {
            None => 0,
            Some(c) => c
                .parse()
                .map_err(|_| Error::invalid_option("cursor", "not a cursor this driver gave"))?,
        };
        let pattern = lock_pattern(&self.inner.prefix, prefix);
        let mut conn = self.connection();
        let mut found = Vec::new();
        // A few SCAN steps per page: each is bounded work for the server,
        // and a sparse prefix still fills a page.
        for _ in 0..10 {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(scan)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.fail(e, "list"))?;
            found.extend(keys);
            scan = next;
            if scan == 0 || found.len() >= limit {
                break;
            }
        }
        let names: Vec<String> = found
            .iter()
            .filter_map(|key| name_of(&self.inner.prefix, key))
            .collect();
        // Every holder in one round trip, each read consistently.
        let mut pipe = redis::pipe();
        pipe.atomic();
        for name in &names {
            let keys = self.keys(name);
            pipe.get(&keys.lock).pttl(&keys.lock).get(&keys.fence);
        }
        let replies: Vec<redis::Value> = if names.is_empty() {
            Vec::new()
        } else {
            pipe.query_async(&mut conn)
                .await
                .map_err(|e| self.fail(e, "list"))?
        };
        let mut locks = Vec::new();
        for (name, reply) in names.into_iter().zip(replies.chunks(3)) {
            let [owner, pttl, fence] = reply else {
                return Err(malformed("list", reply));
            };
            let (Ok(Some(owner)), Ok(pttl)) = (
                redis::from_redis_value_ref::<Option<String>>(owner),
                redis::from_redis_value_ref::<i64>(pttl),
            ) else {
                continue; // released between SCAN and the read
            };
            let owner = owner
                .parse()
                .map_err(|_| malformed("list (owner)", &owner))?;
            let fence = redis::from_redis_value_ref::<Option<String>>(fence)
                .ok()
                .flatten()
                .and_then(|f| f.parse().ok())
                .unwrap_or(0);
            let expires_in = u64::try_from(pttl).ok().map(Duration::from_millis);
            locks.push(HeldLock::new(name, LockInfo::new(owner, fence, expires_in)));
        }
        Ok(LockPage::new(locks, (scan != 0).then(|| scan.to_string())))
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        validate_name(name)?;
        let keys = self.keys(name);
        let mut invocation = INSPECT.prepare_invoke();
        invocation.key(&keys.lock).key(&keys.fence);
        let (reply, _) = self
            .run::<Vec<String>>(&invocation, false, "inspect")
            .await?;
        let [owner, pttl, fence] = reply.as_slice() else {
            return if reply.is_empty() {
                Ok(None)
            } else {
                Err(malformed("inspect", reply))
            };
        };
        let owner = owner
            .parse()
            .map_err(|_| malformed("inspect (owner)", owner))?;
        let fence = fence
            .parse()
            .map_err(|_| malformed("inspect (fence)", fence))?;
        let expires_in = pttl.parse::<u64>().ok().map(Duration::from_millis);
        Ok(Some(LockInfo::new(owner, fence, expires_in)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_cluster_slots() {
        // The example of the cluster specification.
        assert_eq!(slot("123456789"), 12739);
        // Escaped like the keys: `}` cannot end the tag early, so `a}b`
        // hashes as `a%7Db`, not as `a`.
        let crc = |tag: &str| crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16384;
        assert_eq!(slot("a}b"), crc("a%7Db"));
        assert_ne!(slot("a}b"), crc("a"));
    }

    #[test]
    fn transient_server_states_are_retryable() {
        for code in [
            "LOADING",
            "BUSY",
            "READONLY",
            "MASTERDOWN",
            "TRYAGAIN",
            "CLUSTERDOWN",
        ] {
            let e = redis::make_extension_error(code.to_owned(), Some("try later".to_owned()));
            let mapped = redis_error(e, "acquire");
            assert!(
                matches!(mapped, Error::Unavailable { .. }) && mapped.is_retryable(),
                "{code}: {mapped:?}"
            );
        }
        let e = redis::make_extension_error("ERR".to_owned(), Some("bad".to_owned()));
        assert!(!redis_error(e, "acquire").is_retryable());
    }
}
