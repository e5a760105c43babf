//! Settings, their validation, and connecting: to one server, to the
//! primary Sentinel names, or to a Redis Cluster.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dlock_core::driver::wait::MIN_BACKOFF;
use dlock_core::driver::{MAX_SETTING, UrlParams, check_duration};
use dlock_core::{Error, OwnerToken, Result};
use redis::{IntoConnectionInfo, ProtocolVersion};

use crate::backend::{Inner, NAME, RedisBackend};
use crate::conn::{Connection, Kind, PushConn, cluster_nodes};
use crate::error::{bad_url, redis_error};
use crate::eviction::{self, Trust};
use crate::keys::validate_prefix;
use crate::notify::{Notifications, Pushes};
use crate::sentinel::{Sentinel, parse_url};

/// Settings for [`RedisBackend`]; start from [`RedisBackend::builder`].
#[derive(Clone)]
pub struct RedisBuilder {
    params: UrlParams,
    /// The URL for the redis crate, once `connect` has taken the settings.
    url: String,
    prefix: String,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    max_poll: Duration,
    pub(crate) tls_ca: Option<Vec<u8>>,
    pub(crate) durable: Option<(u32, Duration)>,
    pub(crate) accept_eviction: bool,
    /// Where to connect, when it comes from a client rather than a URL.
    info: Option<redis::ConnectionInfo>,
    /// How often the Sentinels are polled, when a test says.
    #[cfg(feature = "_test-hooks")]
    sentinel_poll: Option<Duration>,
}

impl fmt::Debug for RedisBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBuilder")
            .field("url", &dlock_core::driver::redact_url(self.params.base()))
            .field("prefix", &self.prefix)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_poll", &self.max_poll)
            .field("durable", &self.durable)
            .field("accept_eviction", &self.accept_eviction)
            .field("from_client", &self.info.is_some())
            .finish()
    }
}

impl RedisBuilder {
    /// How often the Sentinels are asked for the primary besides their
    /// announcements (1 s). For this crate's tests only (feature
    /// `_test-hooks`), which follow a failover by announcements alone.
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub fn sentinel_poll_interval(mut self, interval: Duration) -> Self {
        self.sentinel_poll = Some(interval);
        self
    }

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
    /// same connection right behind the script (one round trip; on a
    /// cluster, to the node of the lock's slot, counting that shard's
    /// replicas). A grant
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

    /// Connect even to a server whose `maxmemory-policy` is not
    /// `noeviction` (off by default). Such a server deletes keys when its
    /// memory runs short — under `volatile-ttl` lock keys first — and then
    /// grants a held lock to a second client: mutual exclusion is lost, and
    /// only fencing tokens protect the resource. Without this, connecting
    /// (and following a Sentinel failover) to such a server fails with
    /// [`Error::UnsafeServer`], as it does when the policy cannot be read.
    pub fn accept_eviction_risk(mut self, accept: bool) -> Self {
        self.accept_eviction = accept;
        self
    }

    /// How long to wait for a connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Connects: one connection for commands, one for release notifications.
    /// Returns within twice the connect timeout plus the request timeout (a
    /// Sentinel lookup included); on a cluster, within three times that:
    /// each connection walks the seeds, and the eviction check asks every
    /// primary.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed URL or prefix,
    /// [`Error::Connection`] when the server cannot be reached,
    /// [`Error::Backend`] when it refuses us (wrong password, say),
    /// [`Error::UnsafeServer`] when it may evict lock keys (see
    /// [`accept_eviction_risk`](Self::accept_eviction_risk)).
    pub async fn connect(mut self) -> Result<RedisBackend> {
        self.url = self.params.finish(redis_params(self.params.base()))?;
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
        let mut bound = self.connect_timeout * 2 + self.request_timeout;
        if cluster_nodes(&self.url)?.is_some() {
            bound *= 3;
        }
        match tokio::time::timeout(bound, self.connect_checked()).await {
            Ok(done) => done,
            Err(_) => Err(Error::timed_out(
                NAME,
                format!("connect: not connected within {bound:?}"),
            )),
        }
    }

    /// [`RedisBuilder::connect`] once the settings are checked.
    async fn connect_checked(self) -> Result<RedisBackend> {
        if let Some(nodes) = cluster_nodes(&self.url)? {
            return self.connect_cluster(nodes).await;
        }
        let sentinel = parse_url(&self.url)?
            .map(|url| Sentinel::new(&url, self.connect_timeout))
            .transpose()?;
        let named = match &sentinel {
            Some(sentinel) => Some(sentinel.lookup().await?),
            None => None,
        };
        let info = match (&sentinel, &named, &self.info) {
            (Some(sentinel), Some(named), _) => sentinel.info_for(named)?,
            (_, _, Some(info)) => info.clone(),
            (_, _, None) => self
                .url
                .as_str()
                .into_connection_info()
                .map_err(|e| Error::invalid_option("url", format!("not a Redis URL: {e}")))?,
        };
        let pushes = Pushes::new(self.prefix.clone());
        let (conn, push_conn) = if sentinel.is_some() {
            self.open_primary(info.clone(), &pushes).await?
        } else {
            self.open(info.clone(), &pushes).await?
        };
        if let (Some(sentinel), Some(named)) = (&sentinel, named) {
            sentinel.switch_to(named);
        }
        #[cfg(feature = "_test-hooks")]
        let poll = self.sentinel_poll;
        #[cfg(not(feature = "_test-hooks"))]
        let poll = None;
        let backend = self.backend(conn, push_conn, sentinel, false, pushes)?;
        backend.watch_sentinels(poll);
        Ok(backend)
    }

    /// The backend over connections just made; it keeps the settings to
    /// connect again when Sentinel names a new primary.
    fn backend(
        self,
        conn: Connection,
        push_conn: PushConn,
        sentinel: Option<Sentinel>,
        cluster: bool,
        pushes: Arc<Pushes>,
    ) -> Result<RedisBackend> {
        let mut client_id = OwnerToken::random()?.to_string();
        client_id.truncate(16);
        let backend = RedisBackend {
            inner: Arc::new(Inner {
                conn: RwLock::new(conn),
                cluster,
                sentinel,
                notifications: Notifications::start(push_conn, &pushes),
                pushes,
                wake_prefix: format!("{}:wake:", self.prefix),
                client_id,
                prefix: self.prefix.clone(),
                max_poll: self.max_poll,
                request_timeout: self.request_timeout,
                trust: Trust::default(),
                builder: self,
            }),
        };
        backend.watch_eviction();
        Ok(backend)
    }

    /// Connects to a Redis Cluster through any of its nodes.
    async fn connect_cluster(self, nodes: Vec<String>) -> Result<RedisBackend> {
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
        let pushes = Pushes::new(self.prefix.clone());
        let client = builder().build().map_err(|e| bad_url(&e))?;
        let push_client = builder()
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(pushes.clone())
            .build()
            .map_err(|e| bad_url(&e))?;
        // The client tries its seeds in turn; bound the whole walk.
        let bound = self.connect_timeout * 2 + self.request_timeout;
        let connect = |client: redis::cluster::ClusterClient, doing: &'static str| async move {
            match tokio::time::timeout(bound, client.get_async_connection()).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(e)) => Err(redis_error(e, doing)),
                Err(_) => Err(Error::timed_out(NAME, doing)),
            }
        };
        let mut conn = connect(client, "connect to the cluster").await?;
        if !self.accept_eviction {
            eviction::check(&mut conn, bound).await?;
        }
        let push_conn = connect(push_client, "connect to the cluster for notifications").await?;
        self.backend(
            Connection(Kind::Cluster(conn)),
            PushConn::Cluster(push_conn),
            None,
            true,
            pushes,
        )
    }
}

/// The URL parameters the redis crate reads in a URL like `url`: `protocol`
/// over TCP, and `db`, `user` and `pass` too over a Unix socket; none in a
/// Sentinel or Cluster URL, which this driver reads itself.
fn redis_params(url: &str) -> &'static [&'static str] {
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("redis+unix" | "unix") => &["protocol", "db", "user", "pass"],
        Some("redis" | "rediss") => &["protocol"],
        _ => &[],
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

    /// Settings, starting from a URL, whose query may give them under
    /// their setters' names (`?accept_eviction_risk=true&request_timeout=500ms`,
    /// `durable_grants=1,250ms`, `prefix=app`; a setter called later
    /// wins); the redis crate's own (`protocol`; over a Unix socket also
    /// `db`, `user`, `pass`) pass through, and any other is refused at
    /// connect. See the README's table.
    pub fn builder(url: impl Into<String>) -> RedisBuilder {
        let mut p = UrlParams::parse(&url.into());
        RedisBuilder {
            prefix: p.text("prefix").unwrap_or_else(|| "dlock".to_owned()),
            request_timeout: p.duration_or("request_timeout", Duration::from_secs(1)),
            connect_timeout: p.duration_or("connect_timeout", Duration::from_secs(2)),
            max_poll: p.duration_or("max_poll_interval", Duration::from_secs(1)),
            tls_ca: None,
            durable: p.parsed("durable_grants", "replicas,timeout (e.g. 1,250ms)", |v| {
                let (replicas, timeout) = v.split_once(',')?;
                Some((
                    replicas.parse().ok()?,
                    humantime::parse_duration(timeout).ok()?,
                ))
            }),
            accept_eviction: p.flag("accept_eviction_risk").unwrap_or(false),
            url: String::new(),
            params: p,
            info: None,
            #[cfg(feature = "_test-hooks")]
            sentinel_poll: None,
        }
    }

    /// Settings for the server an application's redis client connects to:
    /// its address, credentials, database, protocol and TLS come from
    /// [`Client::get_connection_info`](redis::Client::get_connection_info),
    /// the rest are the defaults, changed by the setters. One server only:
    /// Sentinel and Cluster take a URL.
    ///
    /// The backend opens connections of its own from it, as it does from
    /// a URL: one for commands, with its own response timeout, so that a
    /// renewal never queues behind the application's slow commands, and
    /// one for release messages, which must speak RESP3.
    ///
    /// ```no_run
    /// # async fn f() -> dlock_core::Result<()> {
    /// use dlock_redis::{RedisBackend, redis};
    /// let client = redis::Client::open("redis://127.0.0.1/").expect("a URL");
    /// let backend = RedisBackend::builder_from_client(&client)
    ///     .prefix("app")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder_from_client(client: &redis::Client) -> RedisBuilder {
        RedisBuilder {
            info: Some(client.get_connection_info().clone()),
            ..Self::builder("")
        }
    }
}
