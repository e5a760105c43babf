//! The nemesis: seeded batches of one or two overlapping faults, each
//! healed after a random time, with quiet periods between batches in
//! which recovery is measured.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::harness::{Service, wait_ready};
use dlock_conformance::proxy::Fault;
use nix::sys::signal::Signal;
use serde::Serialize;
use tokio::time::sleep;

use crate::clients::Clients;
use crate::failover;
use crate::history::now_ns;
use crate::target::{FaultKind, Topo};

/// One fault thrown, from its start to its heal.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    /// What.
    pub kind: FaultKind,
    /// The client process it hit, `None` for the server.
    pub client: Option<u32>,
    /// The cluster member it hit, by its index in the topology.
    pub node: Option<usize>,
    /// Whether it hit a Redis primary that was no longer primary once the
    /// topology settled.
    pub failed_over: bool,
    /// For a fault of a Redis data node, when the topology had settled
    /// after the heal (ns): the old primary demoted, or still primary.
    pub settled: Option<u64>,
    /// When it started (ns).
    pub start: u64,
    /// When it healed (ns): for a server kill, once the server answers again.
    pub end: u64,
    /// For a step of the wall clock (seen, not thrown), how far it jumped
    /// (ns; negative: back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_ns: Option<i64>,
    /// For a fault of a Redis data node, the slot ranges it served as a
    /// primary when the fault began (all of them for Sentinel's primary,
    /// none for a replica): the names it can touch (`None`: every name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots: Option<Vec<(u16, u16)>>,
}

impl FaultRecord {
    /// Whether the fault can touch the lock `name`: on a Redis Cluster,
    /// only the names of the slots its member served.
    pub fn touches(&self, name: &str) -> bool {
        let slot = dlock::redis::cluster_slot(name);
        self.slots
            .as_ref()
            .is_none_or(|ranges| ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot)))
    }
}

/// What the nemesis did.
#[derive(Debug, Default, Serialize)]
pub struct Record {
    /// Every fault.
    pub faults: Vec<FaultRecord>,
    /// When each batch had healed entirely (ns).
    pub heals: Vec<u64>,
    /// When each batch started (ns).
    pub batches: Vec<u64>,
}

/// The servers a run faults.
#[derive(Debug, Clone)]
pub enum Servers {
    /// One server in a container.
    One {
        /// Its kind.
        service: Service,
        /// Its URL, for the readiness probe.
        url: String,
        /// Its container.
        container: String,
    },
    /// A cluster.
    Cluster {
        /// Which.
        topo: Topo,
        /// Its members: container name, and server address on its network.
        members: Vec<(String, SocketAddr)>,
    },
}

/// How long one Docker command may take: a stuck daemon must not hang the
/// campaign.
const DOCKER_TIMEOUT: Duration = Duration::from_secs(60);

async fn docker(args: &[&str]) -> Result<(), String> {
    let run = tokio::process::Command::new("docker")
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(DOCKER_TIMEOUT, run)
        .await
        .map_err(|_| format!("docker {}: no answer in {DOCKER_TIMEOUT:?}", args.join(" ")))?
        .map_err(|e| format!("docker {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "docker {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `docker pause`, tried again when the kernel could not freeze the
/// container's processes in runc's time ("unable to freeze": one busy in
/// the kernel on a loaded machine). runc thaws the container back then, so
/// nothing was paused and trying again is safe.
async fn pause(container: &str) -> Result<(), String> {
    let mut tries = 0;
    loop {
        match docker(&["pause", container]).await {
            Err(e) if e.contains("unable to freeze") && tries < FREEZE_TRIES => {
                tries += 1;
                sleep(Duration::from_millis(50 * u64::from(tries))).await;
            }
            done => return done,
        }
    }
}

/// How many times a pause that could not freeze is tried again.
const FREEZE_TRIES: u32 = 5;

/// Adds (`add`) or removes (`del`) blackhole routes between member `i`
/// and every other, both ways. Every route is tried, so a partial failure
/// to add is healed in full; the first error is returned.
async fn partition(members: &[(String, SocketAddr)], i: usize, verb: &str) -> Result<(), String> {
    let (name, addr) = &members[i];
    let mut first_error = Ok(());
    for (other, other_addr) in members.iter().filter(|m| m.0 != *name) {
        for (from, to) in [(name, other_addr), (other, addr)] {
            let target = format!("{}/32", to.ip());
            let done = docker(&["exec", from, "ip", "route", verb, "blackhole", &target]).await;
            first_error = first_error.and(done);
        }
    }
    first_error
}

/// Throws faults of `kinds` at `clients` and `server` until `until_ns`.
/// Every other quiet period lasts `judged_quiet`, so that the checker can
/// judge recovery after it (a name granted again within its bound);
/// the others last 2–6 s, so that faults also meet a system still
/// recovering.
pub async fn run(
    kinds: &[FaultKind],
    clients: Arc<Clients>,
    server: Option<Servers>,
    ttl: Duration,
    seed: u64,
    until_ns: u64,
    judged_quiet: Duration,
) -> Result<Record, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut record = Record::default();
    let usable: Vec<FaultKind> = kinds
        .iter()
        .copied()
        .filter(|k| server.is_some() || !k.on_server())
        .collect();
    if usable.is_empty() {
        return Ok(record);
    }
    // Clients first connect and warm up.
    sleep(Duration::from_secs(2)).await;
    while now_ns() < until_ns {
        record.batches.push(now_ns());
        let first = usable[rng.usize(0..usable.len())];
        // One server fault at a time; two client faults hit two clients.
        let others: Vec<FaultKind> = usable
            .iter()
            .copied()
            .filter(|k| !(k.on_server() && first.on_server()))
            .collect();
        let second = (rng.bool() && clients.len() > 1 && !others.is_empty())
            .then(|| others[rng.usize(0..others.len())]);
        let slots = clients.len().max(1);
        let a = rng.usize(0..slots);
        let b = (a + 1 + rng.usize(0..slots.saturating_sub(1).max(1))) % slots;
        let seeds = (rng.u64(..), rng.u64(..));
        let lag = Duration::from_millis(rng.u64(0..2000));
        let one = throw(first, a, &clients, server.as_ref(), ttl, seeds.0);
        let two = async {
            match second {
                Some(kind) => {
                    sleep(lag).await;
                    Some(throw(kind, b, &clients, server.as_ref(), ttl, seeds.1).await)
                }
                None => None,
            }
        };
        let (one, two) = tokio::join!(one, two);
        let one = one?;
        // Healed when the last fault was undone, not once a topology settled.
        let mut healed = one.end;
        record.faults.push(one);
        if let Some(two) = two {
            let two = two?;
            healed = healed.max(two.end);
            record.faults.push(two);
        }
        record.heals.push(healed);
        let quiet = match record.heals.len() % 2 {
            0 => judged_quiet,
            _ => Duration::from_millis(rng.u64(2000..6000)),
        };
        sleep(quiet).await;
    }
    Ok(record)
}

/// Throws one fault and heals it.
async fn throw(
    kind: FaultKind,
    slot: usize,
    clients: &Clients,
    server: Option<&Servers>,
    ttl: Duration,
    seed: u64,
) -> Result<FaultRecord, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let lasting = Duration::from_millis(rng.u64(500..4000));
    let start = now_ns();
    let client = clients.id(slot).filter(|_| !kind.on_server());
    match kind {
        FaultKind::LinkDelay | FaultKind::LinkStall | FaultKind::LinkCut => {
            let fault = match kind {
                FaultKind::LinkDelay => Fault::Delay(Duration::from_millis(rng.u64(20..400))),
                FaultKind::LinkStall => Fault::Stall,
                _ => Fault::Cut,
            };
            clients.set_link(slot, fault);
            sleep(lasting).await;
            clients.set_link(slot, Fault::Pass);
        }
        FaultKind::ServerPause | FaultKind::ServerKill => {
            let Some(Servers::One {
                service,
                url,
                container,
            }) = server
            else {
                return Err("no single server to fault".to_owned());
            };
            if kind == FaultKind::ServerPause {
                pause(container).await?;
                sleep(lasting).await;
                docker(&["unpause", container]).await?;
            } else {
                docker(&["kill", container]).await?;
                sleep(Duration::from_millis(rng.u64(0..2000))).await;
                docker(&["start", container]).await?;
                wait_ready(*service, url)
                    .await
                    .map_err(|e| format!("the server did not come back: {e}"))?;
            }
        }
        FaultKind::NodePause | FaultKind::NodePartition | FaultKind::NodeKill => {
            let Some(Servers::Cluster { topo, members }) = server else {
                return Err("no cluster to fault".to_owned());
            };
            return node_fault(kind, *topo, members, &mut rng, lasting).await;
        }
        FaultKind::ClientStop => {
            // Past the TTL, so that the holder's lease ends while it sleeps.
            let stopped = ttl + Duration::from_millis(rng.u64(500..3000));
            clients.signal(slot, Signal::SIGSTOP);
            sleep(stopped).await;
            clients.signal(slot, Signal::SIGCONT);
        }
        FaultKind::ClockStep => return Err("a clock step is seen, never thrown".to_owned()),
        FaultKind::ClientKill => {
            let pause = Duration::from_millis(rng.u64(0..1000));
            if let Some((id, at)) = clients.kill_and_replace(slot, pause).await {
                return Ok(FaultRecord {
                    kind,
                    client: Some(id),
                    node: None,
                    failed_over: false,
                    settled: None,
                    start: at,
                    end: now_ns(),
                    step_ns: None,
                    slots: None,
                });
            }
        }
    }
    Ok(FaultRecord {
        kind,
        client,
        node: None,
        failed_over: false,
        settled: None,
        start,
        end: now_ns(),
        step_ns: None,
        slots: None,
    })
}

/// Freezes or cuts off one member, heals it, and on a Redis topology waits
/// until it settled, to record whether the fault moved the primary.
async fn node_fault(
    kind: FaultKind,
    topo: Topo,
    members: &[(String, SocketAddr)],
    rng: &mut fastrand::Rng,
    lasting: Duration,
) -> Result<FaultRecord, String> {
    let i = topo.pick(rng, members.len());
    let addrs: Vec<SocketAddr> = members.iter().map(|m| m.1).collect();
    let tracked = topo.fails_over(i);
    // Not knowing counts as a primary: the fault may then explain more,
    // never less, than it should.
    let was_primary = tracked && failover::is_primary(addrs[i]).await.unwrap_or(true);
    // Not knowing counts as every slot, for the same reason; a Sentinel
    // topology's primary serves them all.
    let slots = match topo {
        Topo::RedisCluster => failover::served_slots(addrs[i]).await,
        Topo::RedisSentinel if tracked => Some(match was_primary {
            true => vec![(0, 16383)],
            false => Vec::new(),
        }),
        _ => None,
    };
    let start = now_ns();
    if kind == FaultKind::NodePause {
        pause(&members[i].0).await?;
        sleep(lasting).await;
        docker(&["unpause", &members[i].0]).await?;
    } else if kind == FaultKind::NodeKill {
        docker(&["kill", &members[i].0]).await?;
        sleep(Duration::from_millis(rng.u64(0..2000))).await;
        docker(&["start", &members[i].0]).await?;
        let (service, url) = match topo {
            Topo::ZooKeeperEnsemble => (Service::ZooKeeper, addrs[i].to_string()),
            Topo::EtcdCluster => (Service::Etcd, addrs[i].to_string()),
            Topo::RedisSentinel | Topo::RedisCluster => {
                (Service::Redis, format!("redis://{}", addrs[i]))
            }
        };
        wait_ready(service, &url)
            .await
            .map_err(|e| format!("member {i} did not come back: {e}"))?;
    } else {
        let cut = partition(members, i, "add").await;
        if cut.is_ok() {
            sleep(lasting).await;
        }
        let healed = partition(members, i, "del").await;
        cut.and(healed)?;
    }
    let end = now_ns();
    let (failed_over, settled) = match tracked {
        true => {
            let (primary, since) = failover::settle(topo, &addrs, i).await?;
            (was_primary && !primary, Some(since))
        }
        false => (false, None),
    };
    Ok(FaultRecord {
        kind,
        client: None,
        node: Some(i),
        failed_over,
        settled,
        start,
        end,
        step_ns: None,
        slots,
    })
}
