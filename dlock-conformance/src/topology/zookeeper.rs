//! A ZooKeeper ensemble.

use super::{Topology, create_network, start_node, write_file};
use crate::harness::{Service, four_letter_word, on_harness, wait_ready};

/// The ZooKeeper settings of an ensemble, beyond the standalone ones.
const ENSEMBLE_TICK_MS: u32 = 500;

/// A ZooKeeper ensemble of `size` nodes (tick 500 ms, so sessions of 1 to
/// 10 s), each in its own container with a 256 MiB heap.
///
/// # Panics
/// When Docker cannot be reached or the ensemble does not form.
pub async fn zookeeper_ensemble(size: usize) -> Topology {
    on_harness(async move {
        let network = create_network()?;
        // Peers are named by address, not host name: a dead peer's name
        // goes to the outside resolvers, whose timeouts stall an election
        // for seconds. So each node waits for its peer list, written once
        // every node has its address.
        let wait_for_peers = "while [ ! -s /tmp/zoo-extra.cfg ]; do sleep 0.05; done; \
                              exec dlock-zookeeper";
        let mut nodes = Vec::new();
        for i in 1..=size {
            let myid = (
                "/var/lib/zookeeper/data/myid".to_owned(),
                format!("{i}\n").into_bytes(),
            );
            let env = [
                ("ZK_HEAP", "256m".to_owned()),
                ("ZK_TICK_MS", ENSEMBLE_TICK_MS.to_string()),
            ];
            let cmd = vec!["sh".to_owned(), "-c".to_owned(), wait_for_peers.to_owned()];
            let name = format!("{network}-zk{i}");
            nodes.push(start_node(&network, &name, cmd, vec![myid], &env, 2181).await?);
        }
        let servers: String = nodes
            .iter()
            .enumerate()
            .map(|(i, node)| format!("server.{}={}:2888:3888\n", i + 1, node.ip))
            // A dead peer's address answers nothing: without a short
            // connect timeout (5 s by default) an election waits on it.
            .chain(["cnxTimeout=500\n".to_owned()])
            .collect();
        for node in &nodes {
            write_file(&node.name, "/tmp/zoo-extra.cfg", servers.as_bytes())?;
        }
        let topology = Topology { network, nodes };
        for node in &topology.nodes {
            wait_ready(Service::ZooKeeper, &node.addr()).await?;
        }
        Ok::<_, String>(topology)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

impl Topology {
    /// A ZooKeeper connect string naming the nodes at `indexes`.
    pub fn connect_string(&self, indexes: &[usize]) -> String {
        indexes
            .iter()
            .map(|&i| self.nodes[i].addr())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Index of the ZooKeeper node that reports `Mode: leader`, if one does.
    pub async fn zookeeper_leader(&self) -> Option<usize> {
        for (i, node) in self.nodes.iter().enumerate() {
            if let Ok(reply) = four_letter_word(&node.addr(), "srvr").await
                && reply.contains("Mode: leader")
            {
                return Some(i);
            }
        }
        None
    }
}
