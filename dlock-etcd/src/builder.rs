//! Settings, their checks, and the connect.

use std::fmt;
use std::time::Duration;

use dlock_core::{Error, MAX_SETTING, Result, check_duration};
use percent_encoding::percent_decode_str;
use tonic::transport::{Channel, Endpoint};

use crate::backend::EtcdBackend;
use crate::client::Client;

/// Settings for [`EtcdBackend`]; start from [`EtcdBackend::builder`].
#[derive(Clone)]
pub struct EtcdBuilder {
    url: String,
    prefix: Option<String>,
    connect_timeout: Duration,
    request_timeout: Duration,
    #[cfg(feature = "_test-hooks")]
    pause_after_join: Option<std::time::Duration>,
}

// By hand: the URL may hold a password.
impl fmt::Debug for EtcdBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBuilder")
            .field("url", &dlock_core::redact_url(&self.url))
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

/// A URL taken apart.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    endpoints: Vec<String>,
    credentials: Option<(String, String)>,
    prefix: Option<String>,
}

impl EtcdBackend {
    /// Connects with default settings to
    /// `etcd://[user:password@]host:port[,host:port...][/prefix]`.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).connect().await
    }

    /// Settings, starting from a URL as [`EtcdBackend::connect`] takes it.
    pub fn builder(url: impl Into<String>) -> EtcdBuilder {
        EtcdBuilder {
            url: url.into(),
            prefix: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(2),
            #[cfg(feature = "_test-hooks")]
            pause_after_join: None,
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
        let target = parse_url(&self.url)?;
        let prefix = self
            .prefix
            .or(target.prefix)
            .unwrap_or_else(|| "dlock/".to_owned());
        if prefix.contains('\0') {
            return Err(Error::invalid_option("prefix", "must not contain NUL"));
        }
        let endpoints = target
            .endpoints
            .iter()
            .map(|host| {
                Endpoint::from_shared(format!("http://{host}"))
                    .map(|e| {
                        e.connect_timeout(self.connect_timeout)
                            .tcp_nodelay(true)
                            .http2_keep_alive_interval(Duration::from_secs(5))
                            .keep_alive_timeout(self.request_timeout)
                    })
                    .map_err(|e| Error::invalid_option("url", format!("bad host {host:?}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let channel = Channel::balance_list(endpoints.into_iter());
        let client = Client::new(channel, target.credentials, self.request_timeout);
        let ready = async {
            client.authenticate().await?;
            client.status().await
        };
        tokio::time::timeout(self.connect_timeout + self.request_timeout, ready)
            .await
            .map_err(|_| crate::error::timed_out("connect"))??;
        #[allow(unused_mut, reason = "set by a test hook")]
        let mut backend = EtcdBackend::new(client, prefix);
        #[cfg(feature = "_test-hooks")]
        if let Some(inner) = std::sync::Arc::get_mut(&mut backend.inner) {
            inner.pause_after_join = self.pause_after_join;
        }
        Ok(backend)
    }
}

/// Takes `etcd://[user:password@]host:port[,host:port...][/prefix]` apart.
fn parse_url(url: &str) -> Result<Target> {
    let bad = |why: &str| {
        Error::invalid_option(
            "url",
            format!(
                "{why}; expected etcd://[user:password@]host:port[,host:port...][/prefix], got {}",
                dlock_core::redact_url(url)
            ),
        )
    };
    let rest = match url.split_once("://") {
        Some(("etcd", rest)) => rest,
        Some(("etcds", _)) => return Err(bad("TLS (etcds://) is not supported yet")),
        _ => return Err(bad("the scheme must be etcd://")),
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
        let t = parse_url("etcd://127.0.0.1:2379").expect("parses");
        assert_eq!((t.credentials, t.prefix), (None, None));
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
            "etcds://a:1",
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
