//! A Redis Cluster, and a Redis primary with a replica and Sentinels.

use std::time::Duration;

use super::{Node, Topology, create_network, docker_output, start_node, wait_until};
use crate::harness::{Service, on_harness, wait_ready};

/// A Redis Cluster of three primaries (nodes 0 to 2 at the start) with
/// one replica each (nodes 3 to 5); a node that does not answer for 2 s is
/// failed.
///
/// # Panics
/// When Docker cannot be reached or the cluster does not form.
pub async fn redis_cluster() -> Topology {
    on_harness(async move {
        let network = create_network()?;
        let mut nodes = Vec::new();
        for i in 0..6 {
            // A snapshot a replica wrote in a full sync is removed first,
            // so a node killed and started again comes back empty.
            let cmd = [
                "sh",
                "-c",
                "rm -f /tmp/dump.rdb; exec dlock-redis --dir /tmp --cluster-enabled yes \
                 --cluster-config-file /tmp/nodes.conf --cluster-node-timeout 2000",
            ]
            .map(str::to_owned)
            .to_vec();
            let name = format!("{network}-redis{i}");
            nodes.push(start_node(&network, &name, cmd, Vec::new(), &[], 6379).await?);
        }
        for node in &nodes {
            wait_ready(Service::Redis, &format!("redis://{}", node.addr())).await?;
        }
        let mut create = vec!["exec", &nodes[0].name, "redis-cli", "--cluster", "create"];
        let addrs: Vec<String> = nodes.iter().map(Node::addr).collect();
        create.extend(addrs.iter().map(String::as_str));
        create.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        docker_output(&create)?;
        let topology = Topology { network, nodes };
        for node in &topology.nodes {
            wait_cluster_ok(&node.addr()).await?;
        }
        // Serving every slot comes before the replicas are known as such
        // and in sync: a failover case needs them to be.
        let first = topology.nodes[0].addr();
        wait_until(
            "every cluster node sees three replicas".to_owned(),
            || async {
                let nodes: Option<String> = ask(&first, redis::cmd("CLUSTER").arg("NODES")).await;
                nodes.is_some_and(|n| n.lines().filter(|l| l.contains("slave")).count() == 3)
            },
        )
        .await?;
        for node in &topology.nodes {
            let addr = node.addr();
            wait_until(format!("cluster node {addr}: replication up"), || async {
                let info: Option<String> = ask(&addr, redis::cmd("INFO").arg("replication")).await;
                info.is_some_and(|i| {
                    i.contains("role:master") && i.contains("connected_slaves:1")
                        || i.contains("master_link_status:up")
                })
            })
            .await?;
        }
        Ok::<_, String>(topology)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

async fn wait_cluster_ok(addr: &str) -> Result<(), String> {
    wait_until(
        format!("cluster node {addr} serving every slot"),
        || async move {
            let info: Option<String> = ask(addr, redis::cmd("CLUSTER").arg("INFO")).await;
            info.is_some_and(|i| {
                i.contains("cluster_state:ok") && i.contains("cluster_slots_ok:16384")
            })
        },
    )
    .await
}

/// Runs one command on the Redis server or Sentinel at `addr`, on a
/// connection of its own, bounded by 3 s: `None` when it does not answer.
async fn ask<T: redis::FromRedisValue>(addr: &str, cmd: &mut redis::Cmd) -> Option<T> {
    let run = async {
        let mut conn = node_connection(addr).await.ok()?;
        cmd.query_async::<T>(&mut conn).await.ok()
    };
    tokio::time::timeout(Duration::from_secs(3), run)
        .await
        .ok()
        .flatten()
}

/// A connection to one node of a topology, for tests' own commands. Its
/// replies may take up to 10 s (the client's default is 0.5 s, too short
/// for `WAIT` or `MIGRATE`).
///
/// # Errors
/// When the node cannot be reached.
pub async fn node_connection(addr: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://{addr}"))?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

impl Topology {
    /// The `redis+cluster://` URL of a [`redis_cluster`] topology, naming
    /// every node as a seed.
    pub fn cluster_url(&self) -> String {
        let nodes: Vec<String> = self.nodes.iter().map(Node::addr).collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// Asks a cluster node for its `CLUSTER NODES` view.
    pub async fn cluster_nodes(&self, index: usize) -> Option<String> {
        ask(
            &self.nodes[index].addr(),
            redis::cmd("CLUSTER").arg("NODES"),
        )
        .await
    }
}

/// Where a Sentinel topology's data node keeps its settings: Sentinel
/// rewrites them (`CONFIG REWRITE`) when it changes the node's role, so a
/// node killed and started again comes back in its last role, as one with
/// a config file does.
const DATA_CONFIG: &str = "/etc/dlock-redis-node.conf";

/// A data node's command: the test Redis's settings (no persistence), from
/// a file; a snapshot a replica wrote in a full sync is removed first, so
/// a node killed and started again comes back empty.
fn data_node() -> Vec<String> {
    let start = format!("rm -f /tmp/dump.rdb; exec redis-server {DATA_CONFIG}");
    vec!["sh".to_owned(), "-c".to_owned(), start]
}

fn data_config(extra: &str) -> (String, Vec<u8>) {
    let config = format!(
        "bind 0.0.0.0\nport 6379\nprotected-mode no\nsave \"\"\nappendonly no\ndir /tmp\n{extra}"
    );
    (DATA_CONFIG.to_owned(), config.into_bytes())
}

/// The Sentinel service name of [`redis_sentinel`].
pub const SENTINEL_SERVICE: &str = "dlock";

/// A Redis primary (node 0) with one replica (node 1) and three Sentinels
/// (nodes 2 to 4) watching it with a quorum of two. A primary that does
/// not answer for 1 s is failed over to the replica.
///
/// # Panics
/// When Docker cannot be reached or the servers do not come up.
pub async fn redis_sentinel() -> Topology {
    on_harness(async move {
        let network = create_network()?;
        let primary = start_node(
            &network,
            &format!("{network}-primary"),
            data_node(),
            vec![data_config("")],
            &[],
            6379,
        )
        .await?;
        wait_ready(Service::Redis, &format!("redis://{}", primary.addr())).await?;
        let replica = start_node(
            &network,
            &format!("{network}-replica"),
            data_node(),
            vec![data_config(&format!("replicaof {} 6379\n", primary.ip))],
            &[],
            6379,
        )
        .await?;
        wait_ready(Service::Redis, &format!("redis://{}", replica.addr())).await?;
        let config = format!(
            "port 26379\nbind 0.0.0.0\nprotected-mode no\n\
             sentinel monitor {SENTINEL_SERVICE} {} 6379 2\n\
             sentinel down-after-milliseconds {SENTINEL_SERVICE} 1000\n\
             sentinel failover-timeout {SENTINEL_SERVICE} 10000\n",
            primary.ip
        );
        let mut nodes = vec![primary, replica];
        for i in 1..=3 {
            let sentinel = start_node(
                &network,
                &format!("{network}-sentinel{i}"),
                ["redis-server", "/etc/sentinel.conf", "--sentinel"]
                    .map(str::to_owned)
                    .to_vec(),
                vec![("/etc/sentinel.conf".to_owned(), config.clone().into_bytes())],
                &[],
                26379,
            )
            .await?;
            nodes.push(sentinel);
        }
        let topology = Topology { network, nodes };
        for sentinel in &topology.nodes[2..] {
            wait_ready(Service::Redis, &format!("redis://{}", sentinel.addr())).await?;
        }
        // The replica must be in sync, and every Sentinel must know the
        // replica and the other Sentinels, before a test counts on a
        // failover.
        wait_replica_synced(&topology.nodes[1].addr()).await?;
        for sentinel in &topology.nodes[2..] {
            wait_sentinel_ready(&sentinel.addr()).await?;
        }
        Ok::<_, String>(topology)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

impl Topology {
    /// The `redis+sentinel://` URL of a [`redis_sentinel`] topology.
    pub fn sentinel_url(&self) -> String {
        let sentinels: Vec<String> = self.nodes[2..].iter().map(Node::addr).collect();
        format!(
            "redis+sentinel://{}/{SENTINEL_SERVICE}",
            sentinels.join(",")
        )
    }

    /// Waits until the replica of a [`redis_sentinel`] topology has every
    /// write the primary took so far: its replication offset reaches the
    /// primary's. (`WAIT` cannot tell: it counts acknowledgements of the
    /// asking connection's own writes, and a fresh connection has none, so
    /// it answers at once.)
    ///
    /// # Panics
    /// When it does not within 60 s.
    pub async fn wait_replicated(&self) {
        let primary: Option<String> =
            ask(&self.nodes[0].addr(), redis::cmd("INFO").arg("replication")).await;
        let target = primary
            .as_deref()
            .and_then(|info| info_field(info, "master_repl_offset"))
            .unwrap_or_else(|| panic!("the primary's replication offset: {primary:?}"));
        let replica = self.nodes[1].addr();
        let replica = replica.as_str();
        wait_until(
            format!("replica {replica} at offset {target}"),
            || async move {
                let info: Option<String> =
                    ask(replica, redis::cmd("INFO").arg("replication")).await;
                info.as_deref()
                    .and_then(|info| info_field(info, "slave_repl_offset"))
                    .is_some_and(|offset| offset >= target)
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// What the servers and Sentinels of a [`redis_sentinel`] topology say
    /// of replication and failovers, for a failing test's message: each
    /// one's role and offsets, and each Sentinel's failover epoch (0 until
    /// the first failover; a failover nobody asked for shows here).
    pub async fn sentinel_report(&self) -> String {
        let mut report = String::new();
        for node in &self.nodes[..2] {
            let info: Option<String> =
                ask(&node.addr(), redis::cmd("INFO").arg("replication")).await;
            let fields = info.as_deref().map(|info| {
                [
                    "role",
                    "master_host",
                    "master_link_status",
                    "master_repl_offset",
                    "slave_repl_offset",
                ]
                .iter()
                .filter_map(|k| info.lines().find(|l| l.starts_with(&format!("{k}:"))))
                .collect::<Vec<_>>()
                .join(" ")
            });
            report += &format!(
                "\n  {}: {}",
                node.name,
                fields.as_deref().unwrap_or("no answer")
            );
        }
        for sentinel in &self.nodes[2..] {
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("MASTER").arg(SENTINEL_SERVICE);
            let state: Option<std::collections::HashMap<String, String>> =
                ask(&sentinel.addr(), &mut cmd).await;
            let fields = state.map(|state| {
                ["ip", "flags", "config-epoch", "num-slaves"]
                    .iter()
                    .map(|k| format!("{k}={}", state.get(*k).map_or("?", String::as_str)))
                    .collect::<Vec<_>>()
                    .join(" ")
            });
            report += &format!(
                "\n  {}: {}",
                sentinel.name,
                fields.as_deref().unwrap_or("no answer")
            );
        }
        report
    }

    /// The address of the primary that the Sentinels name, asked of the
    /// first Sentinel that answers.
    pub async fn sentinel_primary(&self) -> Option<String> {
        for sentinel in &self.nodes[2..] {
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("get-master-addr-by-name").arg(SENTINEL_SERVICE);
            if let Some(addr) = ask::<Vec<String>>(&sentinel.addr(), &mut cmd).await {
                return Some(addr.join(":"));
            }
        }
        None
    }
}

async fn wait_sentinel_ready(addr: &str) -> Result<(), String> {
    wait_until(
        format!("Sentinel {addr} knows the replica and its peers"),
        || async move {
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("MASTER").arg(SENTINEL_SERVICE);
            let state: Option<std::collections::HashMap<String, String>> =
                ask(addr, &mut cmd).await;
            state.is_some_and(|state| {
                state.get("num-slaves").map(String::as_str) == Some("1")
                    && state.get("num-other-sentinels").map(String::as_str) == Some("2")
            })
        },
    )
    .await
}

/// A numeric field of an `INFO` reply.
fn info_field(info: &str, key: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
}

async fn wait_replica_synced(addr: &str) -> Result<(), String> {
    wait_until(format!("replica {addr} in sync"), || async move {
        let info: Option<String> = ask(addr, redis::cmd("INFO").arg("replication")).await;
        info.is_some_and(|i| i.contains("master_link_status:up"))
    })
    .await
}
