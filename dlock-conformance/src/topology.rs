//! Several servers on a private Docker network that the harness makes:
//! a ZooKeeper ensemble, a Redis primary with a replica and Sentinels.
//!
//! Tests reach the nodes at their addresses on that network (the host
//! routes to a bridge network it created) and nowhere else. Nodes can be
//! killed, paused, and cut off from the network to make failovers and
//! partitions. The network and its containers carry the `dlock.harness`
//! label and are removed when the topology is dropped, or at the latest
//! when the test process exits.

use std::net::IpAddr;
use std::process::Command;
use std::time::Duration;

use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::harness::{Service, on_harness, register_for_cleanup, test_image, wait_ready};

/// One server of a topology.
#[derive(Debug)]
pub struct Node {
    name: String,
    network: String,
    ip: IpAddr,
    port: u16,
    container: Option<ContainerAsync<GenericImage>>,
}

impl Node {
    /// The container's name, which is also its host name on the network.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its address on the topology's network.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// `ip:port` of the server.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    /// Kills the server at once (SIGKILL): no goodbye to clients or peers.
    pub async fn kill(&self) {
        docker_async(["kill", &self.name]).await;
    }

    /// Freezes the server: it keeps its connections but answers nothing.
    pub async fn pause(&self) {
        docker_async(["pause", &self.name]).await;
    }

    /// Thaws a paused server.
    pub async fn unpause(&self) {
        docker_async(["unpause", &self.name]).await;
    }

    /// Drops everything this node sends to `other` (a blackhole route in
    /// its network namespace): `other` stops hearing from it, as behind a
    /// one-way partition, while both keep running. Redis nodes only.
    pub async fn stop_sending_to(&self, other: &Node) {
        let target = format!("{}/32", other.ip);
        docker_async([
            "exec",
            &self.name,
            "ip",
            "route",
            "add",
            "blackhole",
            &target,
        ])
        .await;
    }

    /// Cuts the server off the network: from its peers and from clients.
    pub async fn disconnect(&self) {
        docker_async([
            "network",
            "disconnect",
            "--force",
            &self.network,
            &self.name,
        ])
        .await;
    }
}

/// Servers on a network of their own.
#[derive(Debug)]
pub struct Topology {
    network: String,
    nodes: Vec<Node>,
}

impl Topology {
    /// The nodes, in the order they were started.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The node at `index`.
    ///
    /// # Panics
    /// When there is no such node.
    pub fn node(&self, index: usize) -> &Node {
        &self.nodes[index]
    }

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
            if let Ok(reply) = crate::harness::four_letter_word(&node.addr(), "srvr").await
                && reply.contains("Mode: leader")
            {
                return Some(i);
            }
        }
        None
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        let mut args = vec!["rm", "-f", "-v"];
        args.extend(names.iter().map(String::as_str));
        docker(&args);
        docker(&["network", "rm", &self.network]);
        let containers: Vec<_> = self
            .nodes
            .iter_mut()
            .filter_map(|n| n.container.take())
            .collect();
        // Already removed: dropping the handles only tidies testcontainers.
        crate::harness::RUNTIME.spawn(async move { drop(containers) });
    }
}

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
            let cmd = [
                "dlock-redis",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "/tmp/nodes.conf",
                "--cluster-node-timeout",
                "2000",
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

/// Polls `check` until it holds, for at most a minute.
async fn wait_until<F, Fut>(what: String, mut check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    while !check().await {
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!("dlock harness: not so after 60 s: {what}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
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
            vec!["dlock-redis".into()],
            Vec::new(),
            &[],
            6379,
        )
        .await?;
        wait_ready(Service::Redis, &format!("redis://{}", primary.addr())).await?;
        let replica = start_node(
            &network,
            &format!("{network}-replica"),
            [
                "dlock-redis",
                "--replicaof",
                &primary.ip.to_string(),
                "6379",
            ]
            .map(str::to_owned)
            .to_vec(),
            Vec::new(),
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
    /// write the primary took so far (`WAIT 1` on the primary).
    ///
    /// # Panics
    /// When it does not within 10 s.
    pub async fn wait_replicated(&self) {
        let acked: Option<i64> =
            ask(&self.nodes[0].addr(), redis::cmd("WAIT").arg(1).arg(1500)).await;
        assert!(
            acked.is_some_and(|n| n >= 1),
            "the replica did not acknowledge: {acked:?}"
        );
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

async fn wait_replica_synced(addr: &str) -> Result<(), String> {
    wait_until(format!("replica {addr} in sync"), || async move {
        let info: Option<String> = ask(addr, redis::cmd("INFO").arg("replication")).await;
        info.is_some_and(|i| i.contains("master_link_status:up"))
    })
    .await
}

/// Writes a file into a running container, all at once (through a
/// rename), for a process there that waits for it.
fn write_file(container: &str, path: &str, contents: &[u8]) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("docker")
        .args(["exec", "-i", container, "sh", "-c"])
        .arg(format!("cat > {path}.part && mv {path}.part {path}"))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("dlock harness: cannot run docker: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(contents)
            .map_err(|e| format!("dlock harness: write {path} in {container}: {e}"))?;
    }
    let status = child
        .wait()
        .map_err(|e| format!("dlock harness: write {path} in {container}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "dlock harness: write {path} in {container}: {status}"
        ))
    }
}

/// Makes a bridge network for one topology, labelled for clean-up.
fn create_network() -> Result<String, String> {
    let name = format!(
        "dlock-{}-{:06x}",
        std::process::id(),
        fastrand::u32(..0x100_0000)
    );
    let label = format!("dlock.harness={}", std::process::id());
    docker_output(&["network", "create", "--label", &label, &name])?;
    crate::harness::register_network_for_cleanup(&name);
    Ok(name)
}

async fn start_node(
    network: &str,
    name: &str,
    cmd: Vec<String>,
    files: Vec<(String, Vec<u8>)>,
    env: &[(&str, String)],
    port: u16,
) -> Result<Node, String> {
    let image = test_image()?;
    let (repo, tag) = image.split_once(':').unwrap_or((image.as_str(), "latest"));
    let mut request = GenericImage::new(repo, tag)
        .with_wait_for(WaitFor::Nothing)
        .with_cmd(cmd)
        .with_network(network)
        .with_container_name(name)
        .with_hostname(name)
        .with_label("dlock.harness", std::process::id().to_string())
        // For `stop_sending_to`: routes in the node's own namespace.
        .with_cap_add("NET_ADMIN");
    for (key, value) in env {
        request = request.with_env_var(*key, value.clone());
    }
    for (path, contents) in files {
        request = request.with_copy_to(path, contents);
    }
    let container = request
        .start()
        .await
        .map_err(|e| format!("dlock harness: cannot start {name} from image {image}: {e}"))?;
    register_for_cleanup(container.id());
    let ip = inspect_ip(name, network)?;
    Ok(Node {
        name: name.to_owned(),
        network: network.to_owned(),
        ip,
        port,
        container: Some(container),
    })
}

fn inspect_ip(name: &str, network: &str) -> Result<IpAddr, String> {
    let format = format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}");
    docker_output(&["inspect", "-f", &format, name])?
        .trim()
        .parse()
        .map_err(|e| format!("dlock harness: no address for {name} on {network}: {e}"))
}

/// [`docker`] off the async threads, so a test's timers and tasks keep
/// running while the Docker CLI works.
async fn docker_async<const N: usize>(args: [&str; N]) {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let ran = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&args);
    })
    .await;
    if let Err(e) = ran {
        eprintln!("dlock harness: docker command did not finish: {e}");
    }
}

/// Runs a docker command whose failure a test notices by itself (a node
/// that should be down still answering, say): a failure is only reported.
fn docker(args: &[&str]) {
    if let Err(e) = docker_output(args) {
        eprintln!("{e}");
    }
}

/// Runs a docker command; its standard output, or what went wrong.
fn docker_output(args: &[&str]) -> Result<String, String> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .map_err(|e| format!("dlock harness: cannot run docker: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "dlock harness: docker {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
