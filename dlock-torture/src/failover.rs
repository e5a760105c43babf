//! Failovers on the Redis topologies. Their Safety model rows predict a
//! double grant only across a failover, and only until the old primary has
//! been demoted; so for each fault of a data node the nemesis records
//! whether it was the primary, and once the fault heals, when the topology
//! settled and whether the primary moved.

use std::net::SocketAddr;
use std::time::Duration;

use dlock_conformance::topology::{SENTINEL_SERVICE, node_connection};
use tokio::time::{Instant, sleep, timeout};

use crate::history::now_ns;
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

/// The slot ranges the Redis Cluster node at `addr` serves as a primary
/// (none as a replica), from its own `CLUSTER NODES` line; `None` when it
/// does not answer.
pub async fn served_slots(addr: SocketAddr) -> Option<Vec<(u16, u16)>> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("NODES");
    let nodes: String = ask(addr, &cmd).await?;
    let mine = nodes.lines().find(|l| l.contains("myself"))?;
    let fields: Vec<&str> = mine.split_whitespace().collect();
    if !fields.get(2)?.contains("master") {
        return Some(Vec::new());
    }
    // Slots being migrated (`[…]`) are the other node's until they move.
    Some(
        fields
            .iter()
            .skip(8)
            .filter(|f| !f.starts_with('['))
            .filter_map(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                Some((lo.parse().ok()?, hi.parse().ok()?))
            })
            .collect(),
    )
}

/// How long the roles must stay the same for the topology to count as
/// settled: a failover begun before the heal (a Sentinel's, or a cluster
/// replica's election after its node timeout) may still promote a replica
/// seconds after the old primary answers again.
const STABLE: Duration = Duration::from_secs(6);

/// Waits until `topo` has settled after a fault of member `node` healed.
/// Returns whether `node` stayed the primary throughout, and since when
/// (ns) the roles have been what they are. It did not if at any poll it
/// answered as a replica, or on Sentinel the other data node answered as a
/// primary too: a Sentinel may fail over and back, ending where it began
/// with two primaries in between.
///
/// Settled means that the roles have not changed for [`STABLE`] and that,
/// on Sentinel, one data node is primary and a majority of the Sentinels
/// name it (a Sentinel that was paused sits in TILT mode for 30 s, and may
/// answer with what it knew before); on a cluster, that every node
/// reports `cluster_state:ok`.
///
/// # Errors
/// When it does not settle within [`SETTLE_LIMIT`].
pub async fn settle(
    topo: Topo,
    members: &[SocketAddr],
    node: usize,
) -> Result<(bool, u64), String> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    let stable = u64::try_from(STABLE.as_nanos()).unwrap_or(u64::MAX);
    let mut last: Option<(Vec<bool>, u64)> = None;
    let mut moved = false;
    loop {
        moved |= is_primary(members[node]).await == Some(false);
        if topo == Topo::RedisSentinel && node < 2 {
            moved |= is_primary(members[1 - node]).await == Some(true);
        }
        let roles = roles(topo, members).await;
        last = match (roles, last) {
            (Some(roles), Some(last)) if roles == last.0 => Some(last),
            (Some(roles), _) => Some((roles, now_ns())),
            (None, _) => None,
        };
        if let Some((roles, since)) = &last
            && now_ns().saturating_sub(*since) >= stable
        {
            let primary = roles.get(node).copied().unwrap_or(false);
            return Ok((primary && !moved, *since));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{topo:?}: not settled {SETTLE_LIMIT:?} after the fault of member {node} healed"
            ));
        }
        sleep(POLL).await;
    }
}

/// Whether each data member is a primary, when the topology agrees on it.
async fn roles(topo: Topo, members: &[SocketAddr]) -> Option<Vec<bool>> {
    match topo {
        Topo::RedisSentinel => {
            let roles = vec![is_primary(members[0]).await?, is_primary(members[1]).await?];
            let primary = match roles[..] {
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
            (naming * 2 > members.len() - 2).then_some(roles)
        }
        Topo::RedisCluster => {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("INFO");
            let mut roles = Vec::new();
            for member in members {
                let info: String = ask(*member, &cmd).await?;
                if !info.contains("cluster_state:ok") {
                    return None;
                }
                roles.push(is_primary(*member).await?);
            }
            Some(roles)
        }
        Topo::ZooKeeperEnsemble | Topo::EtcdCluster => Some(Vec::new()),
    }
}
