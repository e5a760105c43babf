//! Redis Sentinel: find the primary of a service, and find it again after
//! a failover.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use dlock_core::driver::wait::Backoff;
use dlock_core::{Error, Result};
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};
use tokio::time::Instant;

use crate::backend::RedisBackend;

/// The default Sentinel port.
const SENTINEL_PORT: u16 = 26379;

/// How often the primary may be looked up again: a primary that is down
/// makes every request fail, and each failure asks for a lookup.
const LOOKUP_INTERVAL: Duration = Duration::from_millis(100);

/// How long one search for a new primary goes on; failed requests start
/// another.
const FOLLOW_FOR: Duration = Duration::from_secs(30);

/// A parsed `redis+sentinel://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    pub sentinels: Vec<(String, u16)>,
    pub service: String,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// Parses `redis+sentinel://[user:password@]host[:port][,host[:port]…]/service[/db]`.
/// The credentials are the data nodes' (Sentinels are asked without).
pub(crate) fn parse_url(url: &str) -> Result<Option<SentinelUrl>> {
    let Some(rest) = url.strip_prefix("redis+sentinel://") else {
        return Ok(None);
    };
    let bad = |why: &str| {
        Error::invalid_option(
            "url",
            format!(
                "{why}: expected redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db]"
            ),
        )
    };
    let (authority, path) = rest.split_once('/').ok_or_else(|| bad("no service name"))?;
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => (Some(credentials), hosts),
        None => (None, authority),
    };
    let (username, password) = match credentials {
        None => (None, None),
        Some(c) => match c.split_once(':') {
            Some((user, password)) => (
                (!user.is_empty()).then(|| decode(user)).transpose()?,
                Some(decode(password)?),
            ),
            None => (Some(decode(c)?), None),
        },
    };
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        // `[::1]` has no port, `[::1]:3` and `a:3` have one.
        let (name, port) = match host.rsplit_once(':') {
            Some((name, port)) if !name.starts_with('[') || name.ends_with(']') => (
                name,
                port.parse()
                    .map_err(|_| bad(&format!("bad port in {host:?}")))?,
            ),
            _ => (host, SENTINEL_PORT),
        };
        let name = name.trim_start_matches('[').trim_end_matches(']');
        if name.is_empty() {
            return Err(bad("empty host"));
        }
        sentinels.push((name.to_owned(), port));
    }
    let (service, db) = match path.split_once('/') {
        Some((service, db)) => (
            service,
            db.parse()
                .map_err(|_| bad(&format!("bad database {db:?}")))?,
        ),
        None => (path, 0),
    };
    if service.is_empty() {
        return Err(bad("no service name"));
    }
    Ok(Some(SentinelUrl {
        sentinels,
        service: decode(service)?,
        db,
        username,
        password,
    }))
}

fn decode(s: &str) -> Result<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| Error::invalid_option("url", "percent-encoding that is not UTF-8"))
}

/// Finds the current primary of a service by asking its Sentinels.
pub(crate) struct Sentinel {
    client: tokio::sync::Mutex<SentinelClient>,
    /// The primary the connections go to now.
    primary: Mutex<Option<ConnectionAddr>>,
    last_lookup: Mutex<Option<Instant>>,
    /// Held from a lookup to the switch it leads to.
    following: tokio::sync::Mutex<()>,
    timeout: Duration,
}

impl Sentinel {
    pub fn new(url: &SentinelUrl, timeout: Duration) -> Result<Self> {
        let sentinels: Vec<ConnectionInfo> = url
            .sentinels
            .iter()
            .map(|(host, port)| {
                ConnectionAddr::Tcp(host.clone(), *port)
                    .into_connection_info()
                    .map_err(|e| Error::invalid_option("url", e.to_string()))
            })
            .collect::<Result<_>>()?;
        let mut node = RedisConnectionInfo::default().set_db(url.db);
        if let Some(user) = &url.username {
            node = node.set_username(user);
        }
        if let Some(password) = &url.password {
            node = node.set_password(password);
        }
        let info = SentinelNodeConnectionInfo::default().set_redis_connection_info(node);
        let client = SentinelClient::build(
            sentinels,
            url.service.clone(),
            Some(info),
            SentinelServerType::Master,
        )
        .map_err(|e| Error::invalid_option("url", e.to_string()))?;
        Ok(Sentinel {
            client: tokio::sync::Mutex::new(client),
            primary: Mutex::new(None),
            last_lookup: Mutex::new(None),
            following: tokio::sync::Mutex::new(()),
            // The client checks a named primary's role with its own 1 s
            // connect bound, Sentinel by Sentinel: leave room for one.
            timeout: timeout.max(Duration::from_secs(1)) + Duration::from_secs(1),
        })
    }

    /// Asks the Sentinels for the primary, which must confirm its role.
    pub async fn lookup(&self) -> Result<redis::Client> {
        let mut client = self.client.lock().await;
        *self
            .last_lookup
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        let found = tokio::time::timeout(self.timeout, client.async_get_client())
            .await
            .map_err(|_| {
                Error::unavailable(
                    "redis",
                    "find the primary",
                    std::io::Error::from(std::io::ErrorKind::TimedOut),
                )
            })?
            .map_err(|e| Error::unavailable("redis", "find the primary", e))?;
        Ok(found)
    }

    /// Whether a lookup is due: none is running, and the last one is
    /// [`LOOKUP_INTERVAL`] old.
    pub fn lookup_due(&self) -> bool {
        let last = *self
            .last_lookup
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.following.try_lock().is_ok() && last.is_none_or(|at| at.elapsed() >= LOOKUP_INTERVAL)
    }

    /// The right to look up and switch, if no one else has it now.
    pub fn following(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.following.try_lock().ok()
    }

    /// Records `addr` as the primary the connections go to.
    pub fn switch_to(&self, addr: &ConnectionAddr) {
        *self.primary.lock().unwrap_or_else(PoisonError::into_inner) = Some(addr.clone());
    }

    /// The primary the connections go to now.
    pub fn primary(&self) -> Option<ConnectionAddr> {
        self.primary
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl RedisBackend {
    /// Asks the Sentinels for the primary and, when it moved, points the
    /// connections at it.
    pub(crate) async fn follow_primary(&self) {
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
            Err(e @ Error::UnsafeServer { .. }) => {
                tracing::warn!(error = %e, "not following the new primary");
            }
            Err(e) => tracing::debug!(error = %e, "cannot reach the new primary yet"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("redis+sentinel://a:1,b,[::1]:3/svc/2")
            .unwrap()
            .unwrap();
        assert_eq!(
            u.sentinels,
            vec![
                ("a".to_owned(), 1),
                ("b".to_owned(), SENTINEL_PORT),
                ("::1".to_owned(), 3)
            ]
        );
        assert_eq!((u.service.as_str(), u.db), ("svc", 2));
        let u = parse_url("redis+sentinel://[::1]/svc").unwrap().unwrap();
        assert_eq!(u.sentinels, vec![("::1".to_owned(), SENTINEL_PORT)]);
        let u = parse_url("redis+sentinel://me:p%40ss@h/svc")
            .unwrap()
            .unwrap();
        assert_eq!(u.username.as_deref(), Some("me"));
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        let u = parse_url("redis+sentinel://:pw@h/svc").unwrap().unwrap();
        assert_eq!((u.username, u.password.as_deref()), (None, Some("pw")));
        assert!(parse_url("redis://h").unwrap().is_none());
        for bad in [
            "redis+sentinel://h",
            "redis+sentinel://h/",
            "redis+sentinel://h:x/svc",
            "redis+sentinel://,h/svc",
            "redis+sentinel://h/svc/x",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
