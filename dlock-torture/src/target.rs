//! What a campaign runs against: each backend as the Safety model's row
//! describes it, the faults the nemesis may throw at it, and what that row
//! predicts can break.

use std::time::Duration;

use dlock_conformance::harness::Service;
use serde::Serialize;

/// The ZooKeeper clients' session timeout.
pub const ZK_SESSION: Duration = Duration::from_secs(4);

/// What the load of a 2-core machine running servers, the campaign and its
/// clients may add to any bound judged.
pub const SLACK: Duration = Duration::from_secs(5);

/// A fault the nemesis can throw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// One client's link delays every byte.
    LinkDelay,
    /// One client's link forwards nothing (a hung peer).
    LinkStall,
    /// One client's link drops every connection.
    LinkCut,
    /// The server is frozen (`docker pause`).
    ServerPause,
    /// The server is killed (`kill -9`) and started again.
    ServerKill,
    /// A client process is stopped (SIGSTOP) past its TTL: the GC pause.
    ClientStop,
    /// A client process is killed (SIGKILL) and a new one started.
    ClientKill,
    /// One member of a cluster is frozen (`docker pause`): the leader, or
    /// a follower.
    NodePause,
    /// One member is cut off from its peers (blackhole routes both ways)
    /// while clients still reach it: a minority partition.
    NodePartition,
    /// One member is killed (`kill -9`) and started again at its address,
    /// with what it keeps on disk: a Redis data node comes back empty.
    NodeKill,
    /// The machine's wall clock stepped ahead of `CLOCK_MONOTONIC` (a VM
    /// paused and set right on resume). Never thrown: seen by
    /// [`crate::clock`], and recorded when it happens.
    ClockStep,
}

impl FaultKind {
    /// Every fault a single server takes.
    pub const SINGLE: [FaultKind; 7] = [
        FaultKind::LinkDelay,
        FaultKind::LinkStall,
        FaultKind::LinkCut,
        FaultKind::ServerPause,
        FaultKind::ServerKill,
        FaultKind::ClientStop,
        FaultKind::ClientKill,
    ];

    /// Every fault a cluster takes (members keep their addresses, so a
    /// killed one comes back as itself).
    pub const CLUSTER: [FaultKind; 5] = [
        FaultKind::NodePause,
        FaultKind::NodePartition,
        FaultKind::NodeKill,
        FaultKind::ClientStop,
        FaultKind::ClientKill,
    ];

    /// Every fault, in the timeline's legend.
    pub const ALL: [FaultKind; 11] = [
        FaultKind::LinkDelay,
        FaultKind::LinkStall,
        FaultKind::LinkCut,
        FaultKind::ServerPause,
        FaultKind::ServerKill,
        FaultKind::NodePause,
        FaultKind::NodePartition,
        FaultKind::NodeKill,
        FaultKind::ClientStop,
        FaultKind::ClientKill,
        FaultKind::ClockStep,
    ];

    /// Whether it faults the servers rather than one client.
    pub fn on_server(self) -> bool {
        matches!(
            self,
            FaultKind::ServerPause
                | FaultKind::ServerKill
                | FaultKind::NodePause
                | FaultKind::NodePartition
                | FaultKind::NodeKill
        )
    }

    /// Its label in tables.
    pub fn label(self) -> &'static str {
        match self {
            FaultKind::LinkDelay => "link-delay",
            FaultKind::LinkStall => "link-stall",
            FaultKind::LinkCut => "link-cut",
            FaultKind::ServerPause => "server-pause",
            FaultKind::ServerKill => "server-kill",
            FaultKind::ClientStop => "client-stop",
            FaultKind::ClientKill => "client-kill",
            FaultKind::NodePause => "node-pause",
            FaultKind::NodePartition => "node-partition",
            FaultKind::NodeKill => "node-kill",
            FaultKind::ClockStep => "clock-step",
        }
    }
}

/// A way the Safety model says a promise can break: a violation it
/// explains is predicted; any other fails the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hazard {
    /// A server restarted without persistence forgets held locks: a hold
    /// that spans a server kill (or a kill of a Redis data node: of its
    /// shard's on a cluster) may be granted again (exclusion).
    RestartForgets,
    /// A holder paused longer than its session still believes it holds
    /// (exclusion): a hold spanning a stop of its process of at least two
    /// thirds of the session timeout.
    PausedSessionHolder,
    /// A replica promoted after its primary failed may have missed a grant
    /// or an extension, and the old primary may go on granting until it is
    /// demoted (exclusion): a hold granted before the topology settled
    /// after a fault that moved the primary (on a cluster, the primary of
    /// the hold's shard), and believed after the fault began.
    FailoverForgets,
    /// A server that ends leases on its wall clock (Redis, MySQL,
    /// PostgreSQL) ends every one early by a forward step of that clock,
    /// while holders count on `CLOCK_MONOTONIC` (exclusion): a hold granted
    /// before a step ended and believed when it began, believed after the
    /// other's grant for no longer than the step.
    WallClockStep,
    /// The driver is a deliberately wrong one: every violation is expected.
    Mutant,
}

/// What a control must show, to prove the checker can see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    /// At least one exclusion violation.
    Exclusion,
    /// At least one fencing violation.
    Fencing,
}

/// One backend in one configuration.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Target {
    /// Its label in tables and on the command line.
    pub label: &'static str,
    /// The driver the clients use.
    pub driver: &'static str,
    /// The server, `None` for an in-process driver or a cluster.
    #[serde(skip)]
    pub service: Option<Service>,
    /// The cluster, if it runs on one.
    #[serde(skip)]
    pub topology: Option<Topo>,
    /// Arguments appended to the server's start script: the settings under
    /// which the Safety model's row promises exclusion.
    pub server_args: &'static [&'static str],
    /// The faults thrown at it.
    pub faults: &'static [FaultKind],
    /// The hazards its Safety model row names.
    pub hazards: &'static [Hazard],
    /// For a control: the violation it must show.
    pub expect: Option<Expect>,
    /// Client processes it runs with, when it cannot share a lock service
    /// across processes (an in-process driver: 1).
    pub processes: Option<u32>,
    /// Whether holds last up to a TTL (renewed) rather than 0–20 ms: a
    /// fault then finds most names held.
    pub long_holds: bool,
    /// The TTL it runs with, instead of the campaign's.
    #[serde(skip)]
    pub ttl: Option<Duration>,
}

impl Target {
    /// The longest a lease can outlive its holder: the TTL, or the session.
    pub fn lease_bound(&self, ttl: Duration) -> Duration {
        match self.driver {
            "zookeeper" => ZK_SESSION,
            // etcd rounds a lease up to whole seconds.
            "etcd" => Duration::from_secs(ttl.as_millis().div_ceil(1000) as u64),
            _ => ttl,
        }
    }

    /// How long a queued waiter whose process died (or stopped) keeps its
    /// place at the head of a name's queue, holding the free lock for
    /// itself, with the clients' settings: each driver's documented place
    /// lifetime. ZooKeeper's and etcd's waiters are nodes and keys of the
    /// session or lease, which [`Target::lease_bound`] covers.
    pub fn dead_waiter_bound(&self) -> Duration {
        match self.driver {
            // 3 × the longest poll (1 s) + 2 × (connect 2 s + request 1 s).
            "redis" => Duration::from_secs(9),
            // 3 × the longest poll (1 s) + 2 × the request timeout (2 s).
            "mysql" | "postgres" => Duration::from_secs(7),
            _ => Duration::ZERO,
        }
    }

    /// How soon after the last fault heals a name must be granted again:
    /// the lease of a holder that died in the fault ends, then the place of
    /// a waiter that died at the head of the queue lapses.
    pub fn liveness_bound(&self, ttl: Duration) -> Duration {
        self.lease_bound(ttl) + self.dead_waiter_bound() + SLACK
    }
}

/// A single server's row, run with every fault a single server takes.
const fn single(
    label: &'static str,
    driver: &'static str,
    service: Service,
    server_args: &'static [&'static str],
    hazards: &'static [Hazard],
) -> Target {
    Target {
        label,
        driver,
        service: Some(service),
        topology: None,
        server_args,
        faults: &FaultKind::SINGLE,
        hazards,
        expect: None,
        processes: None,
        long_holds: false,
        ttl: None,
    }
}

/// The backends' rows, each run with every fault.
pub const BACKENDS: [Target; 5] = [
    // The row's condition: no restart without persistence.
    single(
        "redis",
        "redis",
        Service::Redis,
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            "/tmp",
        ],
        &[Hazard::WallClockStep],
    ),
    single(
        "mariadb",
        "mysql",
        Service::MariaDb,
        &["--innodb-flush-log-at-trx-commit=1"],
        &[Hazard::WallClockStep],
    ),
    single(
        "postgres",
        "postgres",
        Service::Postgres,
        &["-c", "fsync=on", "-c", "synchronous_commit=on"],
        &[Hazard::WallClockStep],
    ),
    single(
        "zookeeper",
        "zookeeper",
        Service::ZooKeeper,
        &[],
        &[Hazard::PausedSessionHolder],
    ),
    // On disk: the row's condition is a restart that keeps the data.
    single(
        "etcd",
        "etcd",
        Service::Etcd,
        &["--data-dir", "/var/lib/dlock-etcd"],
        &[],
    ),
];

/// A cluster the harness can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topo {
    /// Three ZooKeeper nodes.
    ZooKeeperEnsemble,
    /// Three etcd members.
    EtcdCluster,
    /// A Redis primary and its replica (nodes 0 and 1), watched by three
    /// Sentinels (nodes 2 to 4).
    RedisSentinel,
    /// Three Redis Cluster primaries, each with a replica.
    RedisCluster,
}

impl Topo {
    /// Whether a fault of member `i` may fail the primary over: the
    /// nemesis then records when the topology settled (see
    /// [`crate::failover`]).
    pub fn fails_over(self, i: usize) -> bool {
        match self {
            Topo::RedisSentinel => i < 2,
            Topo::RedisCluster => true,
            Topo::ZooKeeperEnsemble | Topo::EtcdCluster => false,
        }
    }

    /// The member a fault hits, of `members`. On Sentinel three faults in
    /// four hit a data node, so that failovers happen as often as
    /// Sentinels lose their peers.
    pub fn pick(self, rng: &mut fastrand::Rng, members: usize) -> usize {
        match self {
            Topo::RedisSentinel if members > 2 && rng.usize(0..4) > 0 => rng.usize(0..2),
            _ => rng.usize(0..members),
        }
    }
}

/// A cluster's row: the single server's, on three members, with the
/// faults a cluster takes.
const fn cluster(label: &'static str, topology: Topo, of: Target) -> Target {
    Target {
        label,
        service: None,
        topology: Some(topology),
        faults: &FaultKind::CLUSTER,
        ..of
    }
}

/// Redis on a cluster: the faults of a data node may fail over, which its
/// Safety model row says may forget a grant, and a data node killed comes
/// back empty (no persistence, as the single server's row).
const fn redis_on(label: &'static str, topology: Topo) -> Target {
    Target {
        server_args: &[],
        hazards: &[
            Hazard::FailoverForgets,
            Hazard::RestartForgets,
            Hazard::WallClockStep,
        ],
        ..cluster(label, topology, BACKENDS[0])
    }
}

/// The clusters' rows.
pub const TOPOLOGIES: [Target; 4] = [
    cluster("zookeeper-ensemble", Topo::ZooKeeperEnsemble, BACKENDS[3]),
    cluster("etcd-cluster", Topo::EtcdCluster, BACKENDS[4]),
    redis_on("redis-sentinel", Topo::RedisSentinel),
    redis_on("redis-cluster", Topo::RedisCluster),
];

/// An in-process driver that breaks a promise, which the checker must see.
const fn simulated(label: &'static str, driver: &'static str, expect: Expect) -> Target {
    Target {
        label,
        driver,
        service: None,
        topology: None,
        server_args: &[],
        faults: &[],
        hazards: &[Hazard::Mutant],
        expect: Some(expect),
        // Its lock space lives in one process.
        processes: Some(1),
        long_holds: false,
        ttl: None,
    }
}

/// The controls: configurations that must show violations.
pub const CONTROLS: [Target; 3] = [
    Target {
        label: "control: redis without persistence, killed",
        faults: &[FaultKind::ServerKill],
        hazards: &[Hazard::RestartForgets, Hazard::WallClockStep],
        expect: Some(Expect::Exclusion),
        long_holds: true,
        // Holders believe well past the restart, whatever its length.
        ttl: Some(Duration::from_secs(8)),
        ..single("", "redis", Service::Redis, &[], &[])
    },
    simulated(
        "control: simulated split brain",
        "sim-split-brain",
        Expect::Exclusion,
    ),
    simulated(
        "control: simulated stale tokens",
        "sim-stale-token",
        Expect::Fencing,
    ),
];
