//! Settings, their checks, and the connect.

use std::fmt;
use std::time::Duration;

use dlock_core::driver::{MAX_SETTING, UrlParams, check_duration};
use dlock_core::{Error, Result};
use percent_encoding::percent_decode_str;
#[cfg(feature = "tls")]
use tonic::transport::{Certificate, ClientTlsConfig, Identity};
use tonic::transport::{Channel, Endpoint};

use crate::backend::{EtcdBackend, Inner};
use crate::client::Client;

/// Settings for [`EtcdBackend`]; start from [`EtcdBackend::builder`].
#[derive(Clone)]
pub struct EtcdBuilder {
    /// The URL, its settings not taken yet (an error at connect).
    params: UrlParams,
    prefix: Option<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    tls_ca: Option<String>,
    tls_identity: Option<(String, String)>,
    /// A channel the application made, used instead of the URL's hosts.
    channel: Option<Channel>,
    #[cfg(feature = "_test-hooks")]
    pause_after_join: Option<Duration>,
}

// By hand: the URL may hold a password.
impl fmt::Debug for EtcdBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBuilder")
            .field("url", &dlock_core::driver::redact_url(self.params.base()))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("tls_ca", &self.tls_ca.is_some())
            .field("tls_identity", &self.tls_identity.is_some())
            .field("channel", &self.channel.is_some())
            .finish()
    }
}

/// A URL taken apart.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    /// `etcds://`: TLS to every member.
    tls: bool,
    endpoints: Vec<String>,
    credentials: Option<(String, String)>,
    prefix: Option<String>,
}

impl EtcdBackend {
    /// Connects with default settings to
    /// `etcd://[user:password@]host:port[,host:port...][/prefix]`, or
    /// `etcds://` for TLS (the `tls` feature).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Settings, starting from a URL as [`EtcdBackend::connect`] takes it,
    /// whose query may give them under their setters' names
    /// (`?prefix=app/&request_timeout=500ms`; a setter called later wins);
    /// any other parameter is refused at connect.
    pub fn builder(url: impl Into<String>) -> EtcdBuilder {
        let mut p = UrlParams::parse(&url.into());
        EtcdBuilder {
            prefix: p.text("prefix"),
            connect_timeout: p.duration_or("connect_timeout", Duration::from_secs(5)),
            request_timeout: p.duration_or("request_timeout", Duration::from_secs(2)),
            tls_ca: None,
            tls_identity: None,
            channel: None,
            #[cfg(feature = "_test-hooks")]
            pause_after_join: None,
            params: p,
        }
    }
}

impl EtcdBuilder {
    /// The prefix of every key this backend writes (default `dlock/`, or
    /// the URL's path). Backends that share a prefix share their locks.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// How long `connect` waits for a member to answer (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one request may wait for its reply before it counts as
    /// failed, its effect unknown (default 2 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// With an `etcds://` URL, trusts these CA certificates (PEM) instead
    /// of the public roots. The members' certificates must name the hosts
    /// of the URL.
    #[cfg(feature = "tls")]
    pub fn tls_ca_certificates(mut self, pem: impl Into<String>) -> Self {
        self.tls_ca = Some(pem.into());
        self
    }

    /// With an `etcds://` URL, shows this client certificate and key (PEM)
    /// to members that ask for one (etcd's `--client-cert-auth`).
    #[cfg(feature = "tls")]
    pub fn tls_client_identity(
        mut self,
        certificate: impl Into<String>,
        key: impl Into<String>,
    ) -> Self {
        self.tls_identity = Some((certificate.into(), key.into()));
        self
    }

    /// Talks to etcd over `channel`, one the application made already
    /// (its endpoints, TLS, load balancing and keep-alive are then the
    /// channel's), instead of connecting to the URL's hosts; the URL still
    /// gives the credentials and the prefix. Keep HTTP/2 keep-alive pings
    /// at least 5 s apart: etcd answers more frequent ones with a GOAWAY
    /// that ends every watch.
    pub fn channel(mut self, channel: Channel) -> Self {
        self.channel = Some(channel);
        self
    }

    /// A pause between a waiter's joining the queue and its first look at
    /// it: only for tests of a release that lands in that gap.
    #[cfg(feature = "_test-hooks")]
    #[doc(hidden)]
    pub fn pause_after_join_for_tests(mut self, pause: Duration) -> Self {
        self.pause_after_join = Some(pause);
        self
    }

    /// Connects, logs in when the URL has credentials, and checks that a
    /// member answers.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed URL or setting,
    /// [`Error::Connection`] when no member answers in the connect
    /// timeout, [`Error::Backend`] when the credentials are refused.
    pub async fn connect(self) -> Result<EtcdBackend> {
        let ms = Duration::from_millis(1);
        check_duration("connect_timeout", self.connect_timeout, ms, MAX_SETTING)?;
        check_duration("request_timeout", self.request_timeout, ms, MAX_SETTING)?;
        let target = parse_url(&self.params.finish(&[])?)?;
        let channel = match self.channel.clone() {
            Some(_) if self.tls_ca.is_some() || self.tls_identity.is_some() => {
                return Err(Error::invalid_option(
                    "channel",
                    "TLS settings belong to the channel given, not to the builder",
                ));
            }
            Some(channel) => channel,
            None => self.balanced(&target)?,
        };
        let prefix = self
            .prefix
            .or(target.prefix)
            .unwrap_or_else(|| "dlock/".to_owned());
        if prefix.contains('\0') {
            return Err(Error::invalid_option("prefix", "must not contain NUL"));
        }
        let client = Client::new(channel, target.credentials, self.request_timeout);
        let ready = async {
            client.authenticate().await?;
            client.status().await
        };
        tokio::time::timeout(self.connect_timeout + self.request_timeout, ready)
            .await
            .map_err(|_| crate::error::timed_out("connect"))??;
        Ok(EtcdBackend {
            inner: std::sync::Arc::new(Inner {
                client,
                prefix,
                sessions: crate::session::Sessions::default(),
                watches: crate::watches::Watches::default(),
                #[cfg(feature = "_test-hooks")]
                pause_after_join: self.pause_after_join,
            }),
        })
    }
}

impl EtcdBuilder {
    /// A channel balanced over the URL's hosts, with the builder's TLS.
    fn balanced(&self, target: &Target) -> Result<Channel> {
        let tls = self.tls(target)?;
        let scheme = if target.tls { "https" } else { "http" };
        let endpoints = target
            .endpoints
            .iter()
            .map(|host| {
                let bad = |e: tonic::transport::Error| {
                    Error::invalid_option("url", format!("bad host {host:?}: {e}"))
                };
                let endpoint = Endpoint::from_shared(format!("{scheme}://{host}"))
                    .map_err(bad)?
                    .connect_timeout(self.connect_timeout)
                    .tcp_nodelay(true)
                    // etcd refuses pings more often than every 5 s
                    // (`--grpc-keepalive-min-time`) with a GOAWAY that would
                    // end every watch: twice that, for margin.
                    .http2_keep_alive_interval(Duration::from_secs(10))
                    .keep_alive_timeout(self.request_timeout);
                match &tls {
                    Some(tls) => secure(endpoint, tls)
                        .map_err(|e| Error::invalid_option("tls", e.to_string())),
                    None => Ok(endpoint),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Channel::balance_list(endpoints.into_iter()))
    }

    /// The TLS settings of an `etcds://` URL; `None` for `etcd://`.
    #[cfg(feature = "tls")]
    fn tls(&self, target: &Target) -> Result<Option<Tls>> {
        if !target.tls {
            return match (&self.tls_ca, &self.tls_identity) {
                (None, None) => Ok(None),
                (Some(_), _) => Err(Error::invalid_option(
                    "tls_ca_certificates",
                    "TLS settings need an etcds:// URL",
                )),
                (None, Some(_)) => Err(Error::invalid_option(
                    "tls_client_identity",
                    "TLS settings need an etcds:// URL",
                )),
            };
        }
        let config = ClientTlsConfig::new();
        let config = match &self.tls_ca {
            // A string with no certificate would trust nothing, and show
            // only as connections that never succeed.
            Some(pem) if !pem.contains("-----BEGIN CERTIFICATE-----") => {
                return Err(Error::invalid_option(
                    "tls_ca_certificates",
                    "no PEM certificate in it",
                ));
            }
            Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
            None => config.with_webpki_roots(),
        };
        Ok(Some(match &self.tls_identity {
            Some((cert, key)) => config.identity(Identity::from_pem(cert, key)),
            None => config,
        }))
    }

    #[cfg(not(feature = "tls"))]
    fn tls(&self, target: &Target) -> Result<Option<Tls>> {
        if target.tls {
            return Err(Error::invalid_option(
                "url",
                "etcds:// needs the `tls` feature of dlock-etcd (`etcd-tls` of dlock)",
            ));
        }
        Ok(None)
    }
}

/// TLS settings for every member.
#[cfg(feature = "tls")]
type Tls = ClientTlsConfig;
/// None can be made without the `tls` feature.
#[cfg(not(feature = "tls"))]
type Tls = std::convert::Infallible;

#[cfg(feature = "tls")]
fn secure(endpoint: Endpoint, tls: &Tls) -> std::result::Result<Endpoint, tonic::transport::Error> {
    endpoint.tls_config(tls.clone())
}

#[cfg(not(feature = "tls"))]
fn secure(_: Endpoint, tls: &Tls) -> std::result::Result<Endpoint, tonic::transport::Error> {
    match *tls {}
}

/// Takes `etcd[s]://[user:password@]host:port[,host:port...][/prefix]` apart.
fn parse_url(url: &str) -> Result<Target> {
    let bad = |why: &str| {
        Error::invalid_option(
            "url",
            format!(
                "{why}; expected etcd[s]://[user:password@]host:port[,host:port...][/prefix], got {}",
                dlock_core::driver::redact_url(url)
            ),
        )
    };
    let (tls, rest) = match url.split_once("://") {
        Some(("etcd", rest)) => (false, rest),
        Some(("etcds", rest)) => (true, rest),
        _ => return Err(bad("the scheme must be etcd:// or etcds://")),
    };
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let decode = |s: &str| {
        percent_decode_str(s)
            .decode_utf8()
            .map(|d| d.into_owned())
            .map_err(|_| bad("the credentials are not UTF-8 once percent-decoded"))
    };
    let credentials = match userinfo {
        None => None,
        Some(info) => {
            let (user, password) = info.split_once(':').unwrap_or((info, ""));
            if user.is_empty() {
                return Err(bad("the user name is empty"));
            }
            Some((decode(user)?, decode(password)?))
        }
    };
    let endpoints: Vec<String> = hosts.split(',').map(str::to_owned).collect();
    for host in &endpoints {
        let port = host.rsplit_once(':').map(|(_, p)| p);
        if host.is_empty() || port.is_none_or(|p| p.parse::<u16>().is_err()) {
            return Err(bad("each host needs a port"));
        }
    }
    let prefix = (!path.is_empty()).then(|| decode(path)).transpose()?;
    Ok(Target {
        tls,
        endpoints,
        credentials,
        prefix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_hosts_credentials_and_a_prefix() {
        let t = parse_url("etcd://u%40x:p%3Aw@a:1,b:2/locks/").expect("parses");
        assert_eq!(t.endpoints, ["a:1", "b:2"]);
        assert_eq!(t.credentials, Some(("u@x".to_owned(), "p:w".to_owned())));
        assert_eq!(t.prefix.as_deref(), Some("locks/"));
        assert!(!t.tls);
        let t = parse_url("etcds://127.0.0.1:2379").expect("parses");
        assert_eq!((t.tls, t.credentials, t.prefix), (true, None, None));
    }

    #[test]
    fn bad_urls_are_typed_errors_that_hide_the_password() {
        for url in [
            "redis://a:1",
            "etcd://",
            "etcd://a",
            "etcd://a:x",
            "etcd://a:1,",
            "etcd://:secret@a:1",
            "etcds://:secret@a:1",
            "etcd://u:%ff@a:1",
        ] {
            match parse_url(url) {
                Err(Error::InvalidOption {
                    option: "url",
                    reason,
                }) => {
                    assert!(!reason.contains("secret"), "{reason}");
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
