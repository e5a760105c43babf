//! Redis Sentinel: find the primary of a service, and follow it when the
//! Sentinels switch it.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | asking the Sentinels, and what the backend believes of the primary |
//! | `follow.rs` | the task that follows the primary, and the switch |
//! | `url.rs` | the `redis+sentinel://` URL |

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_core::{Error, Result};
use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::{
    ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion, PushInfo,
    RedisConnectionInfo, RedisError, RedisResult,
};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::backend::NAME;

mod follow;
mod url;

use url::SentinelUrl;
pub(crate) use url::parse_url;

/// The Sentinels' channel announcing that a service has a new primary.
const SWITCH: &str = "+switch-master";

/// How often a primary refused for its eviction policy is looked at again.
const REFUSED_RECHECK: Duration = Duration::from_secs(10);

/// One Sentinel: where it is, and the connection it is asked on and heard
/// from (`+switch-master`), opened on first use and again after a failure.
struct Watchman {
    info: ConnectionInfo,
    conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

/// Where the Sentinels put the service's primary, in which epoch (each
/// failover has a greater one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Named {
    pub addr: ConnectionAddr,
    pub epoch: u64,
}

/// Why calls are refused while the Sentinels name a primary this backend
/// does not use.
enum Why {
    /// It may evict keys.
    Unsafe(String),
    /// It could not be reached, or did not confirm its role.
    Unreachable(String),
}

struct Blocked {
    named: Named,
    why: Why,
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
    /// Taken by the task `follow.rs` starts.
    heard: Mutex<Option<mpsc::UnboundedReceiver<PushInfo>>>,
    /// Asks that task to look now (a request failed).
    nudge: Arc<Notify>,
    /// The primary the connections go to now.
    primary: Mutex<Option<Named>>,
    blocked: Mutex<Option<Blocked>>,
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
            blocked: Mutex::new(None),
            following: tokio::sync::Mutex::new(()),
            timeout,
        })
    }

    /// Asks every Sentinel at once where the primary is, and takes the
    /// answer of the newest epoch: a Sentinel on the losing side of a
    /// partition still names the old primary, in an older one.
    pub async fn lookup(&self) -> Result<Named> {
        let answers = join_all(self.watchmen.iter().map(|w| self.ask(w))).await;
        let (mut named, mut errors, mut unknown) = (Vec::new(), Vec::new(), 0);
        for answer in answers {
            match answer {
                Ok(one) => named.push(one),
                Err((message, is_unknown)) => {
                    unknown += usize::from(is_unknown);
                    errors.push(message);
                }
            }
        }
        if let Some(newest) = newest(named) {
            return Ok(newest);
        }
        if unknown == self.watchmen.len() {
            return Err(Error::invalid_option(
                "url",
                format!("no Sentinel knows a service named {:?}", self.service),
            ));
        }
        Err(Error::unavailable(
            NAME,
            "find the primary",
            std::io::Error::other(format!(
                "no Sentinel named a primary for {:?}: {}",
                self.service,
                errors.join("; ")
            )),
        ))
    }

    /// What to connect to for `named`: its address, with the data nodes'
    /// database and credentials.
    pub fn info_for(&self, named: &Named) -> Result<ConnectionInfo> {
        Ok(named
            .addr
            .clone()
            .into_connection_info()
            .map_err(|e| Error::unavailable(NAME, "find the primary", e))?
            .set_redis_settings(self.node.clone()))
    }

    /// Asks one Sentinel, within the bound, on its connection (opened and
    /// subscribed to switches first when it has none). The epoch comes
    /// from `SENTINEL MASTER`, the address from
    /// `SENTINEL GET-MASTER-ADDR-BY-NAME`: while a failover's leader
    /// reconfigures the replicas, the first still shows the old address in
    /// the new epoch, the second the promoted one. An error says whether
    /// the Sentinel does not know the service.
    async fn ask(&self, watchman: &Watchman) -> std::result::Result<Named, (String, bool)> {
        let addr = watchman.info.addr().to_string();
        let mut slot = watchman.conn.lock().await;
        let asked = tokio::time::timeout(self.timeout, async {
            if slot.is_none() {
                *slot = Some(self.open(watchman).await?);
            }
            let Some(conn) = slot.as_mut() else {
                return Err(RedisError::from(std::io::Error::other("no connection")));
            };
            redis::pipe()
                .cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.service)
                .cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.service)
                .query_async::<(HashMap<String, String>, Vec<String>)>(conn)
                .await
        })
        .await;
        let (fields, named) = match asked {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                // A refusal (an unknown service) leaves the connection good.
                if !matches!(e.kind(), redis::ErrorKind::Server(_)) {
                    *slot = None;
                }
                let unknown = e.to_string().contains("No such master");
                return Err((format!("{addr}: {e}"), unknown));
            }
            Err(_) => {
                *slot = None;
                return Err((
                    format!("{addr}: no answer within {:?}", self.timeout),
                    false,
                ));
            }
        };
        let malformed = |what: &str| (format!("{addr}: {what} in its answer"), false);
        let epoch = fields
            .get("config-epoch")
            .and_then(|e| e.parse().ok())
            .ok_or_else(|| malformed("no config-epoch"))?;
        let [ip, port] = named.as_slice() else {
            return Err(malformed("no address"));
        };
        let port = port.parse().map_err(|_| malformed("a bad port"))?;
        Ok(Named {
            addr: ConnectionAddr::Tcp(ip.clone(), port),
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

    /// Asks the follower task to look for the primary now.
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }

    /// Records `named` as the primary the connections go to.
    pub fn switch_to(&self, named: Named) {
        *self.primary.lock().unwrap_or_else(PoisonError::into_inner) = Some(named);
        *self.blocked.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Keeps the primary in use, which `named` names again: its epoch may
    /// have moved on (a failover and back), and a primary the Sentinels
    /// moved away from and back to is no longer refused.
    fn stay(&self, named: Named) {
        let mut primary = self.primary.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(current) = primary.as_mut() {
            current.epoch = current.epoch.max(named.epoch);
        }
        self.unblock();
    }

    /// The primary the connections go to now.
    pub fn primary(&self) -> Option<ConnectionAddr> {
        self.current().map(|named| named.addr)
    }

    fn current(&self) -> Option<Named> {
        self.primary
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The error every grant and extension gets while the Sentinels name a
    /// primary this backend does not use: the one it uses is not the
    /// primary any more.
    pub fn refusal(&self) -> Option<Error> {
        let blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
        blocked.as_ref().map(|b| match &b.why {
            Why::Unsafe(message) => Error::UnsafeServer {
                backend: NAME,
                message: format!("the new primary {}: {message}", b.named.addr),
            },
            Why::Unreachable(message) => Error::unavailable(
                NAME,
                "reach the new primary",
                std::io::Error::other(format!(
                    "the Sentinels name {} (epoch {}): {message}",
                    b.named.addr, b.named.epoch
                )),
            ),
        })
    }

    /// Whether `named` was refused as unsafe recently enough not to be
    /// connected to again yet.
    fn recently_refused(&self, named: &Named) -> bool {
        let blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
        blocked.as_ref().is_some_and(|b| {
            &b.named == named && matches!(b.why, Why::Unsafe(_)) && b.at.elapsed() < REFUSED_RECHECK
        })
    }

    fn block(&self, named: Named, why: Why) {
        *self.blocked.lock().unwrap_or_else(PoisonError::into_inner) = Some(Blocked {
            named,
            why,
            at: Instant::now(),
        });
    }

    /// The newest epoch seen: the primary in use's, or a newer one named
    /// but not used.
    fn floor(&self) -> u64 {
        let current = self.current().map_or(0, |c| c.epoch);
        let blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
        current.max(blocked.as_ref().map_or(0, |b| b.named.epoch))
    }

    fn unblock(&self) {
        *self.blocked.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// The answer of the newest epoch (the first of equals).
fn newest(answers: Vec<Named>) -> Option<Named> {
    answers
        .into_iter()
        .reduce(|best, one| if one.epoch > best.epoch { one } else { best })
}

/// What to do with the Sentinels' answer `named`, using `current`.
#[derive(Debug, PartialEq, Eq)]
enum Move {
    /// It is the primary in use: nothing to do.
    Stay,
    /// An older epoch's answer (a Sentinel that has not heard of a
    /// failover), or a different primary in the same epoch: never acted on.
    Ignore,
    /// A newer epoch's primary: move there.
    Switch,
}

/// `floor` is the newest epoch seen: the primary in use's, or a newer one
/// named but not reached. An answer below it is never acted on, not even
/// to stay: a Sentinel on the old primary's side of a partition would
/// otherwise lift the block the majority's newer answer set.
fn judge(current: Option<&Named>, floor: u64, named: &Named) -> Move {
    match current {
        None => Move::Switch,
        Some(_) if named.epoch < floor => Move::Ignore,
        Some(c) if c.addr == named.addr => Move::Stay,
        Some(c) if named.epoch > c.epoch => Move::Switch,
        Some(_) => Move::Ignore,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(host: &str, epoch: u64) -> Named {
        Named {
            addr: ConnectionAddr::Tcp(host.to_owned(), 6379),
            epoch,
        }
    }

    #[test]
    fn the_newest_epoch_wins_and_an_older_one_never_moves_back() {
        let answers = vec![named("a", 3), named("b", 4), named("c", 4)];
        assert_eq!(newest(answers), Some(named("b", 4)));
        assert_eq!(newest(Vec::new()), None);
        let on_b = named("b", 4);
        assert_eq!(judge(Some(&on_b), 4, &named("b", 4)), Move::Stay);
        // A Sentinel cut off with the old primary still names it.
        assert_eq!(judge(Some(&on_b), 4, &named("a", 3)), Move::Ignore);
        assert_eq!(judge(Some(&on_b), 4, &named("a", 4)), Move::Ignore);
        assert_eq!(judge(Some(&on_b), 4, &named("c", 5)), Move::Switch);
        assert_eq!(judge(None, 0, &named("a", 0)), Move::Switch);
        // On b, blocked on an unreachable c of epoch 5: b named again in
        // epoch 4 (a minority's answer) neither stays nor unblocks.
        assert_eq!(judge(Some(&on_b), 5, &named("b", 4)), Move::Ignore);
        assert_eq!(judge(Some(&on_b), 5, &named("b", 6)), Move::Stay);
        assert_eq!(judge(Some(&on_b), 5, &named("c", 5)), Move::Switch);
    }
}
