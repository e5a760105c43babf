//! Settings, their checks, and the connect (TLS included).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use dlock_core::driver::{UrlParams, check_duration};
use dlock_core::{Error, Result};
use zookeeper_client as zk;

use crate::backend::{NAME, ZkBackend};
use crate::error::zk_error;

/// The bound of every duration setting: ZooKeeper counts in i32
/// milliseconds, and an hour is far beyond any server's session bound
/// anyway (so not `dlock_core::driver::MAX_SETTING`'s day).
const MAX_SETTING: Duration = Duration::from_secs(3600);

/// Settings for [`ZkBackend`]; start from [`ZkBackend::builder`].
#[derive(Clone)]
pub struct ZkBuilder {
    /// The connect string: the URL without its query.
    connect: String,
    /// The URL's settings not taken (an error at connect).
    params: UrlParams,
    root: String,
    pub(crate) session_timeout: Duration,
    connect_timeout: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) auth: Option<(String, String)>,
    tls_ca: Option<String>,
    keep_while_reconnecting: bool,
    #[cfg(feature = "_test-hooks")]
    grace_override: Option<Duration>,
    #[cfg(feature = "_test-hooks")]
    give_up_override: Option<Duration>,
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

impl ZkBackend {
    /// Connects with default settings to `zk://host:port[,host:port...][/chroot]`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Settings, starting from a connect string (`zk://` prefix optional).
    ///
    /// The URL's query may give the settings under their setters' names
    /// (`?root=/app&session_timeout=6s&keep_leases_while_reconnecting=true`;
    /// a setter called later wins); any other parameter is refused at
    /// connect.
    pub fn builder(url: impl Into<String>) -> ZkBuilder {
        let mut p = UrlParams::parse(&url.into());
        ZkBuilder {
            connect: p.base().to_owned(),
            root: p.text("root").unwrap_or_else(|| "/dlock".to_owned()),
            session_timeout: p.duration_or("session_timeout", Duration::from_secs(10)),
            connect_timeout: p.duration_or("connect_timeout", Duration::from_secs(5)),
            request_timeout: p.duration_or("request_timeout", Duration::from_secs(2)),
            auth: None,
            tls_ca: None,
            keep_while_reconnecting: p.flag("keep_leases_while_reconnecting").unwrap_or(false),
            params: p,
            #[cfg(feature = "_test-hooks")]
            grace_override: None,
            #[cfg(feature = "_test-hooks")]
            give_up_override: None,
        }
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
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub fn reconnect_grace_for_tests(mut self, grace: Duration) -> Self {
        self.keep_while_reconnecting = true;
        self.grace_override = Some(grace);
        self
    }

    /// Lock nodes given up sooner than the server may expire the session:
    /// only for tests that need a server that keeps a session its client
    /// gave up.
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub fn give_up_after_for_tests(mut self, after: Duration) -> Self {
        self.give_up_override = Some(after);
        self
    }

    /// How long after a disconnect the nodes of the session's leases are
    /// given up (deleted on reconnect), for a session whose negotiated
    /// timeout is `session`: once the server may have expired it, and
    /// never before the leases' grace period ends.
    pub(crate) fn give_up_after(&self, session: Duration) -> Duration {
        #[cfg(feature = "_test-hooks")]
        if let Some(after) = self.give_up_override {
            return after;
        }
        self.may_expire_after(session)
            .max(self.reconnect_grace(session))
    }

    /// How long leases outlive a disconnect of a session whose negotiated
    /// timeout is `session`: until the server could have expired it.
    pub(crate) fn reconnect_grace(&self, session: Duration) -> Duration {
        if !self.keep_while_reconnecting {
            return Duration::ZERO;
        }
        #[cfg(feature = "_test-hooks")]
        if let Some(grace) = self.grace_override {
            return grace;
        }
        self.may_expire_after(session)
    }

    /// How long after the client reports a disconnect of a session whose
    /// negotiated timeout is `session` the server may have expired it.
    /// Mirrors zookeeper-client, which pings once nothing was sent for 3
    /// ticks and reports a silent connection lost once nothing was received
    /// for 8 ticks, checked each tick (a tick is its connect timeout / 8,
    /// or session / 20 when the connect timeout exceeds 3/5 of the
    /// session). The server may last have heard from the client 13 ticks
    /// (3 + 1 + 8 + 1) before the client reports the disconnect, and a tenth
    /// of the session is kept for clock rates and a late timer.
    fn may_expire_after(&self, session: Duration) -> Duration {
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

    /// Connects and starts watching the session. Returns within the
    /// connect timeout for each server of the connect string, plus a
    /// second.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed connect string or root,
    /// [`Error::Connection`] when no server answers,
    /// [`Error::Backend`] when authentication fails.
    pub async fn connect(self) -> Result<ZkBackend> {
        let root = self.validate()?;
        let client = self.open().await?;
        Ok(ZkBackend::start(self, root, client))
    }

    /// Checks the settings the connect string aside (the client library
    /// judges that); returns the root without trailing slashes.
    fn validate(&self) -> Result<String> {
        self.params.finish(&[])?;
        let root = self.root.trim_end_matches('/').to_owned();
        if !root.starts_with('/') || root.contains("//") {
            return Err(Error::invalid_option(
                "root",
                format!("must be an absolute path like /dlock, got {:?}", self.root),
            ));
        }
        let ms = Duration::from_millis(1);
        let session_min = Duration::from_millis(100);
        check_duration(
            "session_timeout",
            self.session_timeout,
            session_min,
            MAX_SETTING,
        )?;
        check_duration("connect_timeout", self.connect_timeout, ms, MAX_SETTING)?;
        check_duration("request_timeout", self.request_timeout, ms, MAX_SETTING)?;
        Ok(root)
    }

    /// A new session: at `connect`, and when the old one expired.
    pub(crate) async fn open(&self) -> Result<zk::Client> {
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

/// A connect in progress.
type Connecting<'a> = Pin<Box<dyn Future<Output = Result<zk::Client, zk::Error>> + Send + 'a>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_period_ends_before_the_server_can_expire_the_session() {
        let builder = |connect: u64, keep: bool| {
            ZkBackend::builder("zk://127.0.0.1:2181")
                .connect_timeout(Duration::from_secs(connect))
                .keep_leases_while_reconnecting(keep)
        };
        let session = Duration::from_secs(10);
        assert_eq!(builder(5, false).reconnect_grace(session), Duration::ZERO);
        // 10 − 13 × 5/8 − 1 and 10 − 13 × 2/8 − 1, as the docs say.
        assert_eq!(
            builder(5, true).reconnect_grace(session),
            Duration::from_millis(875)
        );
        assert_eq!(
            builder(2, true).reconnect_grace(session),
            Duration::from_millis(5750)
        );
        // A connect timeout past 3/5 of the session: ticks of session / 20.
        assert_eq!(
            builder(8, true).reconnect_grace(session),
            Duration::from_millis(2500)
        );
    }

    #[test]
    fn lock_nodes_are_given_up_once_the_server_may_have_expired_the_session() {
        let session = Duration::from_secs(10);
        for keep in [false, true] {
            let builder =
                ZkBackend::builder("zk://127.0.0.1:2181").keep_leases_while_reconnecting(keep);
            // The defaults: a 5 s connect timeout, ticks of 5/8 s.
            assert_eq!(
                builder.give_up_after(session),
                Duration::from_millis(875),
                "keep = {keep}"
            );
        }
    }
}
