//! Failovers on the Redis topologies. Their Safety model rows predict a
//! double grant only across a failover, and only until the old primary has
//! been demoted; so for each fault of a data node the nemesis records
//! whether it was the primary, and once the fault heals, when the topology
//! settled and whether the primary moved.

use std::net::SocketAddr;
use std::time::Duration;

use dlock_conformance::topology::{SENTINEL_SERVICE, node_connection};
use tokio::time::{Instant, sleep, timeout};

use crate::target::Topo;

/// How long a topology may take to settle after a heal. A Sentinel demotes
/// an old primary only at its next `INFO` to it, 10 s apart, once the old
/// primary has reported its role for 8 s; a loaded machine adds more.
const SETTLE_LIMIT: Duration = Duration::from_secs(45);

/// How often the nodes are asked while the topology settles.
const POLL: Duration = Duration::from_millis(200);

/// Runs `cmd` on the node at `addr`, on a connection of its own, bounded
/// by 1 s: `None` when it does not answer in time.
async fn ask<T: redis::FromRedisValue>(addr: SocketAddr, cmd: &redis::Cmd) -> Option<T> {
    let run = async {
        let mut conn = node_connection(&addr.to_string()).await.ok()?;
        cmd.query_async::<T>(&mut conn).await.ok()
    };
    timeout(Duration::from_secs(1), run).await.ok().flatten()
}

/// Whether the Redis server at `addr` is a primary; `None` when it does not
/// answer.
pub async fn is_primary(addr: SocketAddr) -> Option<bool> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("replication");
    let info: String = ask(addr, &cmd).await?;
    Some(info.lines().any(|l| l.trim() == "role:master"))
}

/// Waits until `topo` has settled after a fault of member `node` healed,
/// and returns whether `node` is a primary then.
///
/// Settled means, on Sentinel, that one data node is primary and a
/// majority of the Sentinels name it (a Sentinel that was paused sits in
/// TILT mode for 30 s, and may answer with what it knew before); on a
/// cluster, that every node reports `cluster_state:ok`.
///
/// # Errors
/// When it does not settle within [`SETTLE_LIMIT`].
pub async fn settle(topo: Topo, members: &[SocketAddr], node: usize) -> Result<bool, String> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        if let Some(primary) = settled(topo, members, node).await {
            return Ok(primary);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{topo:?}: not settled {SETTLE_LIMIT:?} after the fault of member {node} healed"
            ));
        }
        sleep(POLL).await;
    }
}

async fn settled(topo: Topo, members: &[SocketAddr], node: usize) -> Option<bool> {
    match topo {
        Topo::RedisSentinel => {
            let roles = [is_primary(members[0]).await?, is_primary(members[1]).await?];
            let primary = match roles {
                [true, false] => 0,
                [false, true] => 1,
                _ => return None,
            };
            let named = members[primary].to_string();
            let mut cmd = redis::cmd("SENTINEL");
            cmd.arg("get-master-addr-by-name").arg(SENTINEL_SERVICE);
            let mut naming = 0;
            for sentinel in &members[2..] {
                if let Some(addr) = ask::<Vec<String>>(*sentinel, &cmd).await {
                    naming += usize::from(addr.join(":") == named);
                }
            }
            (naming * 2 > members.len() - 2).then_some(primary == node)
        }
        Topo::RedisCluster => {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("INFO");
            for member in members {
                let info: String = ask(*member, &cmd).await?;
                if !info.contains("cluster_state:ok") {
                    return None;
                }
            }
            is_primary(members[node]).await
        }
        Topo::ZooKeeperEnsemble | Topo::EtcdCluster => Some(false),
    }
}
