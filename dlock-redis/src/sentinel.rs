//! Redis Sentinel: find the primary of a service, and follow it when the
//! Sentinels switch it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::{Error, Result};
use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::{
    ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion, PushInfo, PushKind,
    RedisConnectionInfo, RedisError, RedisResult, Value,
};
use tokio::sync::{Notify, mpsc};
use tokio::time::{Instant, MissedTickBehavior};

use crate::backend::{NAME, RedisBackend};

/// The default Sentinel port.
const SENTINEL_PORT: u16 = 26379;

/// How often the primary may be looked up again: a primary that is down
/// makes every request fail, and each failure asks for a lookup.
const LOOKUP_INTERVAL: Duration = Duration::from_millis(100);

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

/// The Sentinels' channel announcing that a service has a new primary.
const SWITCH: &str = "+switch-master";

/// How often the Sentinels are asked for the primary when none announces a
/// switch: a Sentinel cut off from us cannot announce, and a client that
/// waited for its own requests to fail would go on using a cut-off primary
/// that still answers it (until Sentinel demotes it, after the heal).
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// How often a primary refused for its eviction policy is looked at again.
const REFUSED_RECHECK: Duration = Duration::from_secs(10);

/// One Sentinel: where it is, and the connection it is asked on and heard
/// from (`+switch-master`), opened on first use and again after a failure.
struct Watchman {
    info: ConnectionInfo,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

/// A Sentinel's answer: where the service's primary is, in which epoch.
struct Named {
    addr: ConnectionAddr,
    epoch: u64,
}

/// A primary that was named but refused (an evicting policy), and when.
struct Refusal {
    addr: ConnectionAddr,
    message: String,
    at: Instant,
}

/// Finds the current primary of a service by asking its Sentinels, and
/// hears when they switch it.
pub(crate) struct Sentinel {
    watchmen: Vec<Watchman>,
    service: String,
    /// Database and credentials of the data nodes.
    node: RedisConnectionInfo,
    /// Where every Sentinel connection hands its announcements.
    switches: mpsc::UnboundedSender<PushInfo>,
    /// Taken by the watch task that [`RedisBackend::watch_sentinels`] starts.
    heard: Mutex<Option<mpsc::UnboundedReceiver<PushInfo>>>,
    /// Asks the watch task to look now (a request failed).
    nudge: Arc<Notify>,
    /// The primary the connections go to now.
    primary: Mutex<Option<ConnectionAddr>>,
    refused: Mutex<Option<Refusal>>,
    /// Held from a lookup to the switch it leads to.
    following: tokio::sync::Mutex<()>,
    timeout: Duration,
}

impl Sentinel {
    pub fn new(url: &SentinelUrl, timeout: Duration) -> Result<Self> {
        let resp3 = RedisConnectionInfo::default().set_protocol(ProtocolVersion::RESP3);
        let watchmen = url
            .sentinels
            .iter()
            .map(|(host, port)| {
                let info = ConnectionAddr::Tcp(host.clone(), *port)
                    .into_connection_info()
                    .map_err(|e| Error::invalid_option("url", e.to_string()))?
                    .set_redis_settings(resp3.clone());
                Ok(Watchman {
                    info,
                    conn: tokio::sync::Mutex::new(None),
                })
            })
            .collect::<Result<_>>()?;
        let mut node = RedisConnectionInfo::default().set_db(url.db);
        if let Some(user) = &url.username {
            node = node.set_username(user);
        }
        if let Some(password) = &url.password {
            node = node.set_password(password);
        }
        let (switches, heard) = mpsc::unbounded_channel();
        Ok(Sentinel {
            watchmen,
            service: url.service.clone(),
            node,
            switches,
            heard: Mutex::new(Some(heard)),
            nudge: Arc::new(Notify::new()),
            primary: Mutex::new(None),
            refused: Mutex::new(None),
            following: tokio::sync::Mutex::new(()),
            timeout,
        })
    }

    /// Asks every Sentinel at once where the primary is, and takes the
    /// answer of the newest epoch: a Sentinel on the losing side of a
    /// partition still names the old primary, in an older epoch.
    pub async fn lookup(&self) -> Result<ConnectionInfo> {
        let answers = join_all(self.watchmen.iter().map(|w| self.ask(w))).await;
        let mut errors = Vec::new();
        let mut best: Option<Named> = None;
        for answer in answers {
            match answer {
                Ok(named) if best.as_ref().is_none_or(|b| named.epoch > b.epoch) => {
                    best = Some(named);
                }
                Ok(_) => {}
                Err(e) => errors.push(e),
            }
        }
        match best {
            Some(named) => Ok(named
                .addr
                .into_connection_info()
                .map_err(|e| Error::unavailable("redis", "find the primary", e))?
                .set_redis_settings(self.node.clone())),
            None => Err(Error::unavailable(
                "redis",
                "find the primary",
                std::io::Error::other(format!(
                    "no Sentinel named a primary for {:?}: {}",
                    self.service,
                    errors.join("; ")
                )),
            )),
        }
    }

    /// Asks one Sentinel, within the bound, on its connection (opened and
    /// subscribed to switches first when it has none).
    async fn ask(&self, watchman: &Watchman) -> std::result::Result<Named, String> {
        let addr = watchman.info.addr().to_string();
        let mut slot = watchman.conn.lock().await;
        let asked = tokio::time::timeout(self.timeout, async {
            if slot.is_none() {
                *slot = Some(self.open(watchman).await?);
            }
            let Some(conn) = slot.as_mut() else {
                return Err(RedisError::from(std::io::Error::other("no connection")));
            };
            redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.service)
                .query_async::<HashMap<String, String>>(conn)
                .await
        })
        .await;
        let fields = match asked {
            Ok(Ok(fields)) => fields,
            Ok(Err(e)) => {
                *slot = None;
                return Err(format!("{addr}: {e}"));
            }
            Err(_) => {
                *slot = None;
                return Err(format!("{addr}: no answer within {:?}", self.timeout));
            }
        };
        let field = |key: &str| {
            fields
                .get(key)
                .ok_or_else(|| format!("{addr}: no {key} in SENTINEL MASTER"))
        };
        let port = field("port")?
            .parse()
            .map_err(|_| format!("{addr}: bad port in SENTINEL MASTER"))?;
        let epoch = field("config-epoch")?
            .parse()
            .map_err(|_| format!("{addr}: bad config-epoch in SENTINEL MASTER"))?;
        Ok(Named {
            addr: ConnectionAddr::Tcp(field("ip")?.clone(), port),
            epoch,
        })
    }

    /// A connection to one Sentinel that hears its switches.
    async fn open(&self, watchman: &Watchman) -> RedisResult<MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_push_sender(self.switches.clone());
        let mut conn = redis::Client::open(watchman.info.clone())?
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        conn.subscribe(SWITCH).await?;
        Ok(conn)
    }

    /// Asks the watch task to look for the primary now.
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// Records `addr` as the primary the connections go to.
    pub fn switch_to(&self, addr: &ConnectionAddr) {
        *self.primary.lock().unwrap_or_else(PoisonError::into_inner) = Some(addr.clone());
        *self.refused.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The primary the connections go to now.
    pub fn primary(&self) -> Option<ConnectionAddr> {
        self.primary
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the Sentinels' primary is one this backend refused, which
    /// every call reports until they name another or it is found safe.
    pub fn refusal(&self) -> Option<Error> {
        let refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused.as_ref().map(|r| Error::UnsafeServer {
            backend: NAME,
            message: format!("the new primary {}: {}", r.addr, r.message),
        })
    }

    /// Whether `addr`, just named, was refused recently enough not to be
    /// connected to again yet.
    fn recently_refused(&self, addr: &ConnectionAddr) -> bool {
        let refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        refused
            .as_ref()
            .is_some_and(|r| &r.addr == addr && r.at.elapsed() < REFUSED_RECHECK)
    }

    fn refuse(&self, addr: &ConnectionAddr, e: &Error) {
        let message = match e {
            Error::UnsafeServer { message, .. } => message.clone(),
            other => other.to_string(),
        };
        *self.refused.lock().unwrap_or_else(PoisonError::into_inner) = Some(Refusal {
            addr: addr.clone(),
            message,
            at: Instant::now(),
        });
    }
}

/// Whether an announcement is a switch of `service`'s primary.
fn is_switch(push: &PushInfo, service: &str) -> bool {
    match (&push.kind, push.data.as_slice()) {
        (PushKind::Message, [_, Value::BulkString(payload)]) => payload
            .split(|&b| b == b' ')
            .next()
            .is_some_and(|name| name == service.as_bytes()),
        // A Sentinel connection dropped: look now, which reopens it.
        (PushKind::Disconnection, _) => true,
        _ => false,
    }
}

impl RedisBackend {
    /// Starts the task that follows the Sentinels' primary: at each
    /// announced switch, at each nudge of a failed request, and every
    /// [`POLL_INTERVAL`]. It ends with the backend.
    pub(crate) fn watch_sentinels(&self) {
        let Some(sentinel) = &self.inner.sentinel else {
            return;
        };
        let Some(mut heard) = sentinel
            .heard
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        else {
            return;
        };
        // The task keeps no backend alive while it waits.
        let backend = Arc::downgrade(&self.inner);
        let (nudge, service) = (sentinel.nudge.clone(), sentinel.service.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL_INTERVAL);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    push = heard.recv() => match push {
                        Some(push) if is_switch(&push, &service) => {}
                        Some(_) => continue,
                        None => return,
                    },
                    () = nudge.notified() => {}
                    _ = tick.tick() => {}
                }
                let Some(inner) = backend.upgrade() else {
                    return;
                };
                RedisBackend { inner }.follow_primary().await;
                // A burst of failed requests asks once.
                tokio::time::sleep(LOOKUP_INTERVAL).await;
            }
        });
    }

    /// Asks the Sentinels for the primary and, when it moved, points the
    /// connections at it once it confirms its role.
    pub(crate) async fn follow_primary(&self) {
        let Some(sentinel) = &self.inner.sentinel else {
            return;
        };
        // One at a time, from the lookup to the swap: a slower follower
        // with an older answer must not undo a newer one.
        let Ok(_following) = sentinel.following.try_lock() else {
            return;
        };
        let found = match sentinel.lookup().await {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(error = %e, "no primary from Sentinel");
                return;
            }
        };
        let addr = found.addr().clone();
        if sentinel.primary().as_ref() == Some(&addr) || sentinel.recently_refused(&addr) {
            return;
        }
        let pushes = self.inner.pushes.clone();
        match self.inner.builder.open_primary(found, &pushes).await {
            Ok((conn, push_conn)) => {
                *self
                    .inner
                    .conn
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = conn;
                self.inner.notifications.reconnect(push_conn);
                sentinel.switch_to(&addr);
                tracing::info!(primary = %addr, "following the new primary");
            }
            Err(e @ Error::UnsafeServer { .. }) => {
                tracing::warn!(error = %e, "not following the new primary");
                sentinel.refuse(&addr, &e);
            }
            // Mid-failover the named primary may not confirm its role yet:
            // the next look tries again.
            Err(e) => tracing::debug!(error = %e, "cannot use the new primary yet"),
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
