//! The two kinds of deployment a backend talks to, one server (given by
//! URL or found through Sentinel) or a Redis Cluster; how a server's two
//! connections are opened (its policy checked, a Sentinel's choice
//! confirmed as primary); and how a request runs on the command
//! connection: bounded, with the replicas' acknowledgement behind it when
//! grants are durable.

use std::future::Future;
use std::sync::Arc;

use dlock_core::{Error, Result};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, FromRedisValue, Pipeline, ProtocolVersion, RedisError, RedisFuture, RedisResult, Value,
};

use crate::backend::{NAME, RedisBackend};
use crate::builder::RedisBuilder;
use crate::error::{bad_url, redis_error};
use crate::eviction;
use crate::notify::Pushes;

/// The command connection of a [`RedisBackend`](crate::RedisBackend), to
/// run commands of one's own with the redis crate (`query_async`). Cheap to
/// clone; clones share the connection.
#[derive(Clone)]
pub struct Connection(pub(crate) Kind);

#[derive(Clone)]
pub(crate) enum Kind {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.0 {
            Kind::Single(c) => c.req_packed_command(cmd),
            Kind::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            Kind::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Kind::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            Kind::Single(c) => c.get_db(),
            Kind::Cluster(c) => c.get_db(),
        }
    }
}

/// The RESP3 connection that release messages arrive on: plain channels on
/// one server, sharded channels (`SSUBSCRIBE`) on a cluster, where each
/// goes to the node of its slot.
pub(crate) enum PushConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for PushConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PushConn::Single(_) => "PushConn::Single",
            PushConn::Cluster(_) => "PushConn::Cluster",
        })
    }
}

impl PushConn {
    /// Subscribes to each channel; returns those that failed. On a
    /// cluster one at a time: channels of different slots live on
    /// different nodes, one command may not span slots, and one node down
    /// fails only its own slots' channels.
    pub async fn subscribe(&mut self, channels: &[String]) -> Vec<String> {
        match self {
            PushConn::Single(c) => match c.subscribe(channels).await {
                Ok(()) => Vec::new(),
                Err(e) => {
                    tracing::debug!(error = %e, "subscribe failed");
                    channels.to_vec()
                }
            },
            PushConn::Cluster(c) => {
                let mut failed = Vec::new();
                for channel in channels {
                    if let Err(e) = c.ssubscribe(channel).await {
                        tracing::debug!(%channel, error = %e, "subscribe failed");
                        failed.push(channel.clone());
                    }
                }
                failed
            }
        }
    }

    pub async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            PushConn::Single(c) => c.unsubscribe(channel).await,
            PushConn::Cluster(c) => c.sunsubscribe(channel).await,
        }
    }
}

/// The node URLs of a `redis+cluster://[user:password@]host[:port][,host[:port]…]`
/// URL, `None` for other URLs. Any node of the cluster will do as a seed;
/// the client learns the rest from it.
pub(crate) fn cluster_nodes(url: &str) -> dlock_core::Result<Option<Vec<String>>> {
    let Some(rest) = url.strip_prefix("redis+cluster://") else {
        return Ok(None);
    };
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') {
        return Err(dlock_core::Error::invalid_option(
            "url",
            "a cluster has one database: expected redis+cluster://[user:password@]host[:port][,host[:port]...]",
        ));
    }
    let (credentials, hosts) = match rest.rsplit_once('@') {
        Some((credentials, hosts)) => (format!("{credentials}@"), hosts),
        None => (String::new(), rest),
    };
    hosts
        .split(',')
        .map(|host| {
            if host.is_empty() {
                return Err(dlock_core::Error::invalid_option("url", "empty host"));
            }
            let has_port = match host.rsplit_once(':') {
                Some((name, _)) => !name.starts_with('[') || name.ends_with(']'),
                None => false,
            };
            let port = if has_port { "" } else { ":6379" };
            Ok(format!("redis://{credentials}{host}{port}"))
        })
        .collect::<dlock_core::Result<Vec<_>>>()
        .map(Some)
}

impl RedisBackend {
    /// Runs a script. With durable grants and `confirm`, the replicas'
    /// acknowledgement is asked for on the same connection right behind
    /// it; the flag says whether enough replicas acknowledged in time
    /// (always `true` otherwise).
    ///
    /// Bounded by the request timeout, whatever the request waits for
    /// (the connection manager's reconnect, a script load after `NOSCRIPT`).
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        confirm: bool,
        doing: &str,
    ) -> Result<(T, bool)> {
        // A script that grants or extends (the ones durable grants confirm)
        // is refused while the server in use is not to be trusted with
        // one; releases go through, so names are freed.
        if confirm {
            let refused = self.inner.sentinel.as_ref().and_then(|s| s.refusal());
            if let Some(refused) = refused.or_else(|| self.inner.trust.refusal()) {
                return Err(refused);
            }
        }
        self.bounded(doing, self.run_unbounded(invocation, confirm))
            .await
    }

    /// Runs a call's requests, `requests`, within the request timeout:
    /// each public call has that one bound, however many requests it makes.
    pub(crate) async fn bounded<T>(
        &self,
        doing: &str,
        requests: impl Future<Output = RedisResult<T>>,
    ) -> Result<T> {
        let bound = self.inner.request_timeout;
        match tokio::time::timeout(bound, requests).await {
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

    /// [`RedisBackend::run`] without its bound.
    async fn run_unbounded<T: FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        confirm: bool,
    ) -> RedisResult<(T, bool)> {
        let mut conn = self.connection();
        let Some((replicas, timeout)) = self.inner.builder.durable.filter(|_| confirm) else {
            return Ok((invocation.invoke_async(&mut conn).await?, true));
        };
        let mut pipe = redis::pipe();
        pipe.invoke_script(invocation)
            .cmd("WAIT")
            .arg(replicas)
            // Rounded down (at least 1: 0 waits forever): the builder
            // checked the timeout is below the request timeout, and the
            // rounded one must stay below it too.
            .arg(
                u64::try_from(timeout.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
            );
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
}

impl RedisBuilder {
    /// Opens the command connection and the RESP3 one for notifications.
    pub(crate) async fn open(
        &self,
        info: redis::ConnectionInfo,
        pushes: &Arc<Pushes>,
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
        let mut conn = ConnectionManager::new_with_config(client, config.clone())
            .await
            .map_err(|e| redis_error(e, "connect"))?;
        if !self.accept_eviction {
            eviction::check(&mut conn, self.request_timeout).await?;
        }
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

    /// [`RedisBuilder::open`] on a server the Sentinels named, which must
    /// say it is a primary: mid-failover they may name one that is not yet.
    pub(crate) async fn open_primary(
        &self,
        info: redis::ConnectionInfo,
        pushes: &Arc<Pushes>,
    ) -> Result<(Connection, PushConn)> {
        let addr = info.addr().to_string();
        let (mut conn, push_conn) = self.open(info, pushes).await?;
        let role = tokio::time::timeout(
            self.request_timeout,
            redis::cmd("ROLE").query_async::<Vec<Value>>(&mut conn),
        )
        .await
        .map_err(|_| Error::timed_out(NAME, "ask the named primary its role"))?
        .map_err(|e| redis_error(e, "ask the named primary its role"))?;
        match role.first() {
            Some(Value::BulkString(role)) if role.as_slice() == b"master" => Ok((conn, push_conn)),
            Some(Value::SimpleString(role)) if role == "master" => Ok((conn, push_conn)),
            _ => Err(Error::unavailable(
                NAME,
                "find the primary",
                std::io::Error::other(format!(
                    "the Sentinels name {addr}, which is not a primary (yet)"
                )),
            )),
        }
    }

    /// A client for `info`, trusting the CA given for `rediss://`.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_urls() {
        assert_eq!(
            cluster_nodes("redis+cluster://u:p@a:1,b,[::1]:3/")
                .unwrap()
                .unwrap(),
            vec![
                "redis://u:p@a:1",
                "redis://u:p@b:6379",
                "redis://u:p@[::1]:3"
            ]
        );
        assert!(cluster_nodes("redis://a").unwrap().is_none());
        assert!(cluster_nodes("redis+cluster://a/0").is_err());
        assert!(cluster_nodes("redis+cluster://a,,b").is_err());
    }
}
