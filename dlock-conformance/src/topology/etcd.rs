//! A 3-node (or any size) etcd cluster.

use super::{Topology, create_network, start_node, write_file};
use crate::harness::{Service, ask, on_harness, wait_ready};

/// An etcd cluster of `size` members, each in its own container, with its
/// data in memory (a member killed comes back empty: see
/// [`etcd_cluster_on_disk`]), as the single
/// test server's: writes that wait for three disks would make the suite's
/// stress cases a test of the disk. Elections time out after 600 ms
/// (etcd's default is 1 s), so that leases as short as the single test
/// server's (1 s: 1.5 election timeouts, rounded up) are granted as asked.
///
/// # Panics
/// When Docker cannot be reached or the cluster does not form.
pub async fn etcd_cluster(size: usize) -> Topology {
    etcd_cluster_with(size, "").await
}

/// [`etcd_cluster`] with each member's data on its container's disk, so
/// that a member killed and started again ([`super::Node::start`]) comes
/// back with its log, as a member whose process died would.
///
/// # Panics
/// When Docker cannot be reached or the cluster does not form.
pub async fn etcd_cluster_on_disk(size: usize) -> Topology {
    etcd_cluster_with(size, " --data-dir /var/lib/dlock-etcd").await
}

async fn etcd_cluster_with(size: usize, extra: &'static str) -> Topology {
    on_harness(async move {
        let network = create_network()?;
        // Members are named by address, which is known once each container
        // runs: each waits for its settings, written once all have theirs.
        let wait_for_peers = format!(
            "while [ ! -s /tmp/etcd.env ]; do sleep 0.05; done; \
             . /tmp/etcd.env; \
             exec dlock-etcd --heartbeat-interval 100 --election-timeout 600{extra}"
        );
        let mut nodes = Vec::new();
        for i in 1..=size {
            let cmd = vec!["sh".to_owned(), "-c".to_owned(), wait_for_peers.clone()];
            let name = format!("{network}-etcd{i}");
            nodes.push(start_node(&network, &name, cmd, Vec::new(), &[], 2379).await?);
        }
        let initial: Vec<String> = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| format!("e{}=http://{}:2380", i + 1, node.ip))
            .collect();
        // One thread each (GOMAXPROCS=1): three members on two cores.
        for (i, node) in nodes.iter().enumerate() {
            let env = format!(
                "export GOMAXPROCS=1 ETCD_NAME=e{n} ETCD_INITIAL_CLUSTER={cluster} \
                 ETCD_INITIAL_CLUSTER_STATE=new ETCD_INITIAL_CLUSTER_TOKEN={network} \
                 ETCD_INITIAL_ADVERTISE_PEER_URLS=http://{ip}:2380 \
                 ETCD_ADVERTISE_CLIENT_URLS=http://{ip}:2379\n",
                n = i + 1,
                cluster = initial.join(","),
                ip = node.ip,
            );
            write_file(&node.name, "/tmp/etcd.env", env.as_bytes())?;
        }
        let topology = Topology { network, nodes };
        for node in &topology.nodes {
            wait_ready(Service::Etcd, &node.addr()).await?;
        }
        Ok::<_, String>(topology)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

impl Topology {
    /// An `etcd://` URL naming the members at `indexes`.
    pub fn etcd_url(&self, indexes: &[usize]) -> String {
        format!("etcd://{}", self.connect_string(indexes))
    }

    /// Index of the etcd member that reports itself the leader, if one does.
    pub async fn etcd_leader(&self) -> Option<usize> {
        for (i, node) in self.nodes.iter().enumerate() {
            if let Some((member, leader)) = etcd_status(&node.addr()).await
                && member == leader
            {
                return Some(i);
            }
        }
        None
    }
}

/// A member's id and its leader's, from its status (etcd's JSON gateway;
/// ids are decimal strings there). `None` if it does not answer or knows
/// no leader.
async fn etcd_status(addr: &str) -> Option<(String, String)> {
    let request = "POST /v3/maintenance/status HTTP/1.1\r\nHost: etcd\r\n\
                   Content-Type: application/json\r\nContent-Length: 2\r\n\
                   Connection: close\r\n\r\n{}";
    let reply = ask(addr, request).await.ok()?;
    let field = |name: &str| {
        let at = reply.find(&format!("\"{name}\":\""))? + name.len() + 4;
        let len = reply[at..].find('"')?;
        Some(reply[at..at + len].to_owned())
    };
    let (member, leader) = (field("member_id")?, field("leader")?);
    (leader != "0").then_some((member, leader))
}
