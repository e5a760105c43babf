//! Several servers on a private Docker network that the harness makes:
//! a ZooKeeper ensemble, an etcd cluster, a Redis primary with a replica
//! and Sentinels.
//!
//! Tests reach the nodes at their addresses on that network (the host
//! routes to a bridge network it created) and nowhere else. Nodes can be
//! killed, paused, and cut off from the network to make failovers and
//! partitions. The network and its containers carry the `dlock.harness`
//! label and are removed when the topology is dropped, or at the latest
//! when the test process exits.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | nodes, the network, and the Docker calls they take |
//! | `zookeeper.rs` | the ZooKeeper ensemble |
//! | `etcd.rs` | the etcd cluster |
//! | `redis.rs` | the Redis Cluster, and a primary with a replica and Sentinels |
//! | `standalone.rs` | one server of each service, for the benchmark |

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::Duration;

use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::harness::{register_for_cleanup, test_image};

mod etcd;
mod redis;
mod standalone;
mod zookeeper;

pub use etcd::{etcd_cluster, etcd_cluster_on_disk};
pub use redis::{SENTINEL_SERVICE, node_connection, redis_cluster, redis_sentinel};
pub use standalone::standalone;
pub use zookeeper::zookeeper_ensemble;

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

    /// Starts a killed server again, at the same address (members keep
    /// theirs: see [`Topology`]), with what its container kept on disk and
    /// nothing it held in memory.
    pub async fn start(&self) {
        docker_async(["start", &self.name]).await;
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
    /// one-way partition, while both keep running.
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

/// Servers on a network of their own. Each keeps its address for the
/// topology's life, so a member killed and started again comes back as
/// itself, where its peers look for it.
#[derive(Debug)]
pub struct Topology {
    network: Network,
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
}

impl Drop for Topology {
    fn drop(&mut self) {
        let names: Vec<String> = self.nodes.iter().map(|n| n.name.clone()).collect();
        let mut args = vec!["rm", "-f", "-v"];
        args.extend(names.iter().map(String::as_str));
        docker(&args);
        docker(&["network", "rm", &self.network.name]);
        let containers: Vec<_> = self
            .nodes
            .iter_mut()
            .filter_map(|n| n.container.take())
            .collect();
        // Already removed: dropping the handles only tidies testcontainers.
        crate::harness::RUNTIME.spawn(async move { drop(containers) });
    }
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

/// A bridge network the harness made, as Docker answered when it was
/// made: read once, for every member pinned on it.
#[derive(Debug)]
struct Network {
    name: String,
    /// Docker's id of it, whose first 12 digits name its bridge.
    id: String,
    /// Its subnet's first address and prefix length.
    base: Ipv4Addr,
    bits: u8,
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// Makes a bridge network for one topology, labelled for clean-up.
///
/// Docker gives a container an address of its own only on a network whose
/// subnet was given (`--ip`), and gives a killed container's address to
/// the next one that asks. So the network takes the subnet Docker would
/// have chosen (one that meets no other network or route of the machine),
/// given explicitly, with Docker's own choices kept to its first half;
/// members are then pinned in the second ([`pin`]).
fn create_network() -> Result<Network, String> {
    let name = format!(
        "dlock-{}-{:06x}",
        std::process::id(),
        fastrand::u32(..0x100_0000)
    );
    let label = format!("dlock.harness={}", std::process::id());
    let mut tries = 0;
    loop {
        docker_output(&["network", "create", "--label", &label, &name])?;
        let chosen = docker_output(&[
            "network",
            "inspect",
            "-f",
            "{{(index .IPAM.Config 0).Subnet}} {{(index .IPAM.Config 0).Gateway}}",
            &name,
        ]);
        docker_output(&["network", "rm", &name])?;
        let chosen = chosen?;
        let (subnet, gateway) = chosen
            .trim()
            .split_once(' ')
            .ok_or_else(|| format!("dlock harness: no subnet for {name}: {chosen:?}"))?;
        let (base, bits) = parse_subnet(subnet)?;
        let range = format!("{base}/{}", bits + 1);
        let made = docker_output(&[
            "network",
            "create",
            "--label",
            &label,
            "--subnet",
            subnet,
            "--gateway",
            gateway,
            "--ip-range",
            &range,
            &name,
        ]);
        match made {
            // `network create` prints the new network's id.
            Ok(printed) => {
                crate::harness::register_network_for_cleanup(&name);
                let id = printed.lines().last().unwrap_or_default().trim();
                if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "dlock harness: `docker network create {name}` printed no id: {printed:?}"
                    ));
                }
                return Ok(Network {
                    name,
                    id: id.to_owned(),
                    base,
                    bits,
                });
            }
            // Another process took the subnet in between: ask again.
            Err(e) if tries < 5 => {
                tries += 1;
                eprintln!("{e}; trying another subnet");
            }
            Err(e) => return Err(e),
        }
    }
}

/// An IPv4 subnet `a.b.c.d/n` of at least 256 addresses, as its first
/// address and `n`: [`pin`] puts members past the first 2 addresses of
/// its second half, up to 100 of them.
fn parse_subnet(subnet: &str) -> Result<(Ipv4Addr, u8), String> {
    let bad = || format!("dlock harness: not an IPv4 subnet of 256 addresses: {subnet:?}");
    let (base, bits) = subnet.split_once('/').ok_or_else(bad)?;
    let base: Ipv4Addr = base.parse().map_err(|_| bad())?;
    let bits: u8 = bits.parse().map_err(|_| bad())?;
    if bits > 24 {
        return Err(bad());
    }
    Ok((base, bits))
}

/// Moves a just-started container to a fixed address in the second half
/// of its network's subnet (see [`create_network`]), `index` past its
/// start: Docker then keeps that address for it across a kill.
fn pin(name: &str, network: &Network, index: u32) -> Result<IpAddr, String> {
    let half = 1u32 << (31 - u32::from(network.bits));
    let ip = Ipv4Addr::from(u32::from(network.base) + half + 2 + index);
    docker_output(&["network", "disconnect", "--force", &network.name, name])?;
    docker_output(&[
        "network",
        "connect",
        "--ip",
        &ip.to_string(),
        &network.name,
        name,
    ])?;
    Ok(IpAddr::V4(ip))
}

async fn start_node(
    network: &Network,
    name: &str,
    cmd: Vec<String>,
    files: Vec<(String, Vec<u8>)>,
    env: &[(&str, String)],
    port: u16,
) -> Result<Node, String> {
    let image = test_image()?;
    let (repo, tag) = image.split_once(':').unwrap_or((image.as_str(), "latest"));
    // The server starts once the container has its fixed address: one
    // that began at the first address would keep connections (a replica's
    // to its primary) bound to an address that is gone.
    let cmd: Vec<String> = [
        "sh",
        "-c",
        "while [ ! -e /tmp/dlock-pinned ]; do sleep 0.02; done; exec \"$@\"",
        "sh",
    ]
    .into_iter()
    .map(str::to_owned)
    .chain(cmd)
    .collect();
    let mut request = GenericImage::new(repo, tag)
        .with_wait_for(WaitFor::Nothing)
        .with_cmd(cmd)
        .with_network(network.name.as_str())
        .with_container_name(name)
        .with_hostname(name)
        .with_label("dlock.harness", std::process::id().to_string())
        // For `stop_sending_to`: routes in the node's own namespace.
        .with_cap_add("NET_ADMIN")
        // etcd members keep their data in /dev/shm, as the single test
        // server does; Docker's 64 MiB would not hold one log segment.
        .with_shm_size(1 << 30);
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
    let index = PINNED.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 100;
    let ip = pin(name, network, index)?;
    docker_output(&["exec", name, "touch", "/tmp/dlock-pinned"])?;
    Ok(Node {
        name: name.to_owned(),
        network: network.name.clone(),
        ip,
        port,
        container: Some(container),
    })
}

/// Members started so far: each network's members get distinct fixed
/// addresses (a topology has a dozen members at most).
static PINNED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

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
