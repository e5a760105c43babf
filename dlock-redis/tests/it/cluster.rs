//! Redis Cluster specifics: sharded wake-ups, names over every slot, and a
//! primary killed while it holds a lock. One cluster per case, each on a
//! network of its own.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::collections::HashMap;
use std::time::Duration;

use dlock_conformance::support::{long, must_acquire, unique_name};
use dlock_conformance::topology::{Topology, node_connection, redis_cluster};
use dlock_core::Backend;
use dlock_redis::RedisBackend;
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep};

use crate::support;

/// One six-node cluster at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

async fn client(cluster: &Topology) -> RedisBackend {
    RedisBackend::connect(&cluster.cluster_url()).await.unwrap()
}

/// Which node serves each slot range, from `CLUSTER SLOTS` via node 0.
async fn slot_owner(cluster: &Topology, key: &str) -> String {
    let mut conn = node_conn(&cluster.node(0).addr()).await;
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let nodes = cluster.cluster_nodes(0).await.unwrap();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !fields.get(2).is_some_and(|f| f.contains("master")) {
            continue;
        }
        for range in &fields[8..] {
            let (lo, hi) = range.split_once('-').unwrap_or((range, range));
            if let (Ok(lo), Ok(hi)) = (lo.parse::<u16>(), hi.parse::<u16>())
                && (lo..=hi).contains(&slot)
            {
                return fields[1].split('@').next().unwrap().to_owned();
            }
        }
    }
    panic!("no primary serves slot {slot}: {nodes}");
}

fn index_of(cluster: &Topology, addr: &str) -> usize {
    (0..cluster.nodes().len())
        .find(|&i| cluster.node(i).addr() == addr)
        .unwrap()
}

/// How many sharded messages the node at `addr` has published.
async fn spublished(addr: &str) -> u64 {
    let [calls] = support::command_calls(&mut node_conn(addr).await, ["spublish"]).await;
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_on_a_sharded_channel() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = redis_cluster().await;
    let holder = client(&cluster).await;
    // Polls seconds apart once it has waited a while: a quick hand-off
    // then comes from the wake-up.
    let waiter = RedisBackend::builder(cluster.cluster_url())
        .max_poll_interval(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let name = unique_name("sharded-wake");
    let lock_key = format!("dlock:{{{name}}}");
    let owner = slot_owner(&cluster, &lock_key).await;
    let lease = must_acquire(&holder, &name, &long()).await;
    let waiting = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move {
            let lease = waiter
                .acquire(&name, &long().wait(Duration::from_secs(20)))
                .await
                .unwrap();
            (Instant::now(), lease)
        }
    });
    // The waiter's channel is subscribed on the node of the lock's slot.
    let mut conn = node_conn(&owner).await;
    let started = Instant::now();
    loop {
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .arg(format!("{lock_key}:wake:*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        let queued: usize = redis::cmd("ZCARD")
            .arg(format!("{lock_key}:q"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if channels.len() == 1 && queued == 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no sharded subscription on {owner}: {channels:?}"
        );
        sleep(Duration::from_millis(20)).await;
    }
    // Past its first polls: from 3.1 s on they are 1.6 s apart or more.
    sleep(Duration::from_millis(3200)).await;
    let published = spublished(&owner).await;
    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let (granted, next) = waiting.await.unwrap();
    let handoff = granted - released;
    eprintln!("cluster: hand-off on a sharded wake-up took {handoff:?}");
    assert!(
        handoff < Duration::from_millis(150),
        "the waiter polled instead of hearing the release: {handoff:?}"
    );
    assert_eq!(
        spublished(&owner).await,
        published + 1,
        "one sharded message per release"
    );
    assert!(next.fencing_token() > lease.fencing_token());
    assert_eq!(
        waiter.subscribed_channels(),
        0,
        "the wait's channel is given up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_names_spread_over_every_primary() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = redis_cluster().await;
    let backend = client(&cluster).await;
    let mut leases = Vec::new();
    for i in 0..1000 {
        let name = format!("{}-{i}", unique_name("spread"));
        leases.push(must_acquire(&backend, &name, &long()).await);
    }
    // Every primary holds some of them.
    let mut per_primary: HashMap<String, usize> = HashMap::new();
    for node in cluster.nodes() {
        let mut conn = node_conn(&node.addr()).await;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
        if redis::from_redis_value_ref::<String>(&role[0]).unwrap() == "master" {
            let keys: usize = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
            per_primary.insert(node.addr(), keys);
        }
    }
    assert_eq!(per_primary.len(), 3, "{per_primary:?}");
    assert!(
        per_primary.values().all(|&keys| keys > 100),
        "{per_primary:?}"
    );
    let extended = backend.extend_many(&mut leases).await.unwrap();
    assert!(extended.iter().all(|&e| e), "every lease extended");
    for lease in &leases {
        backend.release(lease).await.unwrap();
    }
    for lease in &leases[..10] {
        assert!(backend.inspect(lease.name()).await.unwrap().is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_mid_hold_keeps_a_replicated_lock() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = redis_cluster().await;
    let holder = client(&cluster).await;
    let name = unique_name("cluster-kill");
    let mut lease = must_acquire(&holder, &name, &long()).await;
    let key = format!("dlock:{{{name}}}");
    let primary = index_of(&cluster, &slot_owner(&cluster, &key).await);
    // Held by the replica too before the primary dies (replication is
    // asynchronous; the Sentinel tests show what happens otherwise).
    let started = Instant::now();
    loop {
        let mut replicated = false;
        for node in cluster.nodes() {
            let mut conn = node_conn(&node.addr()).await;
            let _: () = redis::cmd("READONLY").query_async(&mut conn).await.unwrap();
            let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
            let is_replica = redis::from_redis_value_ref::<String>(&role[0]).unwrap() == "slave";
            let has: Result<Option<String>, _> =
                redis::cmd("GET").arg(&key).query_async(&mut conn).await;
            replicated |= is_replica && matches!(has, Ok(Some(_)));
        }
        if replicated {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never replicated"
        );
        sleep(Duration::from_millis(50)).await;
    }

    let killed = Instant::now();
    let (other, answered) = kill_and_find_held(&cluster, primary, &name).await;
    let extended = loop {
        match holder.extend(&mut lease).await {
            Ok(()) => break killed.elapsed(),
            Err(e) => {
                assert!(e.is_retryable(), "{e:?}");
                assert!(killed.elapsed() < Duration::from_secs(60), "{e:?}");
                sleep(Duration::from_millis(50)).await;
            }
        }
    };
    holder.release(&lease).await.unwrap();
    let next = must_acquire(&other, &name, &long()).await;
    assert!(next.fencing_token() > lease.fencing_token());
    eprintln!(
        "cluster: primary killed; the slot answered again after {answered:?} (still held), \
         the holder extended after {extended:?}"
    );
}

/// Kills the node at `primary` and asks a new client for `name` until the
/// slot answers again (its replica took over): requests fail (retryable)
/// until then, and at no point may the name be granted again. The client,
/// and how long after the kill the slot answered.
async fn kill_and_find_held(
    cluster: &Topology,
    primary: usize,
    name: &str,
) -> (RedisBackend, Duration) {
    let killed = Instant::now();
    cluster.node(primary).kill().await;
    let other = client(cluster).await;
    loop {
        match other.try_acquire(name, &long()).await {
            Ok(None) => return (other, killed.elapsed()),
            Ok(Some(_)) => panic!("{name} granted again after its primary died"),
            Err(e) => {
                assert!(e.is_retryable(), "{e:?}");
                assert!(
                    killed.elapsed() < Duration::from_secs(60),
                    "no failover: {e:?}"
                );
                sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The replica of the primary at `primary`, from `CLUSTER NODES`.
async fn replica_of(cluster: &Topology, primary: &str) -> usize {
    let nodes = cluster.cluster_nodes(0).await.unwrap();
    let lines: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let addr = |f: &[&str]| f[1].split('@').next().unwrap().to_owned();
    let id = lines.iter().find(|f| addr(f) == primary).unwrap()[0];
    let replica = lines
        .iter()
        .find(|f| f[2].contains("slave") && f[3] == id)
        .unwrap_or_else(|| panic!("no replica of {primary}: {nodes}"));
    index_of(cluster, &addr(replica))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_durable_grants_a_confirmed_grant_survives_its_primary() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = redis_cluster().await;
    let durable = RedisBackend::builder(cluster.cluster_url())
        .durable_grants(1, Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let kept = unique_name("cluster-durable");
    let owner = slot_owner(&cluster, &format!("dlock:{{{kept}}}")).await;
    // A second name of the same shard, for the grant its replica cannot
    // acknowledge.
    let refused = loop {
        let name = unique_name("cluster-durable-refused");
        if slot_owner(&cluster, &format!("dlock:{{{name}}}")).await == owner {
            break name;
        }
    };
    let (primary, replica) = (
        index_of(&cluster, &owner),
        replica_of(&cluster, &owner).await,
    );
    // Confirmed by the shard's replica: a grant whose acknowledgement
    // missed the 300 ms window (a loaded machine) is refused and given
    // back, as it must be; ask again.
    let started = Instant::now();
    let held = loop {
        match durable.try_acquire(&kept, &long()).await {
            Ok(held) => break held.expect("the name is free"),
            Err(e) => {
                assert!(e.is_retryable(), "{e:?}");
                assert!(started.elapsed() < Duration::from_secs(30), "{e:?}");
            }
        }
    };
    // From here on the replica hears nothing from its primary: a grant it
    // cannot acknowledge is refused, and given back.
    cluster
        .node(primary)
        .stop_sending_to(cluster.node(replica))
        .await;
    let refusal = durable.try_acquire(&refused, &long()).await;
    assert!(
        matches!(refusal, Err(dlock_core::Error::Unavailable { .. })),
        "{refusal:?}"
    );
    // The primary dies right after: no time for anything more to reach
    // the replica, which takes over with what it acknowledged.
    let (other, answered) = kill_and_find_held(&cluster, primary, &kept).await;
    assert_eq!(
        other.inspect(&kept).await.unwrap().unwrap().owner,
        held.owner()
    );
    let mut conn = node_conn(&cluster.node(replica).addr()).await;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
    assert_eq!(
        redis::from_redis_value_ref::<String>(&role[0]).unwrap(),
        "master",
        "the replica took the shard over"
    );
    // Nobody believed they held the refused name.
    let _granted = must_acquire(&other, &refused, &long()).await;
    eprintln!(
        "cluster, durable grants: the shard's primary killed; its replica answered {answered:?} \
         after, with the confirmed grant"
    );
}

async fn node_conn(addr: &str) -> redis::aio::MultiplexedConnection {
    node_connection(addr).await.unwrap()
}

/// Moves the keys of `slot` whose names pass `which` from `from` to `to`
/// (`MIGRATE`), leaving the slot migrating.
async fn migrate_keys(from: &str, to: &str, slot: u16, which: impl Fn(&str) -> bool) {
    let mut src = node_conn(from).await;
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(100)
        .query_async(&mut src)
        .await
        .unwrap();
    let keys: Vec<String> = keys.into_iter().filter(|k| which(k)).collect();
    if keys.is_empty() {
        return;
    }
    let (host, port) = to.split_once(':').unwrap();
    let _: () = redis::cmd("MIGRATE")
        .arg(host)
        .arg(port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&keys)
        .query_async(&mut src)
        .await
        .unwrap();
}

/// A slot moved to another primary while a lock in it is held and used:
/// `ASK` and `TRYAGAIN` mid-migration, `MOVED` after, all followed; never a
/// second grant, and the holder keeps its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_a_held_lock_keeps_it() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = redis_cluster().await;
    let holder = client(&cluster).await;
    let other = client(&cluster).await;
    let name = unique_name("reshard");
    let key = format!("dlock:{{{name}}}");
    let mut lease = must_acquire(&holder, &name, &long()).await;
    let from = slot_owner(&cluster, &key).await;
    let to = {
        let nodes = cluster.cluster_nodes(0).await.unwrap();
        nodes
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f[2].contains("master") && f.len() > 8)
            .map(|f| f[1].split('@').next().unwrap().to_owned())
            .find(|addr| *addr != from)
            .unwrap()
    };
    let id = async |addr: &str| -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(&mut node_conn(addr).await)
            .await
            .unwrap()
    };
    let (from_id, to_id) = (id(&from).await, id(&to).await);
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&key)
        .query_async(&mut node_conn(&from).await)
        .await
        .unwrap();

    // The lock in use all through the move.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let user = tokio::spawn({
        let (holder, other, name, done) =
            (holder.clone(), other.clone(), name.clone(), done.clone());
        async move {
            let (mut extended, mut refused, mut errors) = (0, 0, 0);
            // Until the move is done and both calls went through at least
            // once: decided on counts, not on the half-second windows of
            // the move (on a loaded machine every call in them can meet
            // TRYAGAIN or a topology refresh).
            let mut since_done = None;
            loop {
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    let since = *since_done.get_or_insert_with(Instant::now);
                    if (extended > 0 && refused > 0) || since.elapsed() > Duration::from_secs(30) {
                        break;
                    }
                }
                match holder.extend(&mut lease).await {
                    Ok(()) => extended += 1,
                    Err(e) => {
                        assert!(e.is_retryable(), "extend: {e:?}");
                        errors += 1;
                    }
                }
                match other.try_acquire(&name, &long()).await {
                    Ok(None) => refused += 1,
                    Ok(Some(_)) => panic!("granted twice while the slot moved"),
                    Err(e) => {
                        assert!(e.is_retryable(), "try_acquire: {e:?}");
                        errors += 1;
                    }
                }
                sleep(Duration::from_millis(20)).await;
            }
            (lease, extended, refused, errors)
        }
    });

    let setslot = async |addr: &str, args: &[&str]| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(args)
            .query_async(&mut node_conn(addr).await)
            .await
            .unwrap();
    };
    setslot(&to, &["IMPORTING", &from_id]).await;
    setslot(&from, &["MIGRATING", &to_id]).await;
    // Half moved: scripts over the lock's keys meet TRYAGAIN or ASK.
    migrate_keys(&from, &to, slot, |k| k.ends_with(":fence")).await;
    sleep(Duration::from_millis(500)).await;
    migrate_keys(&from, &to, slot, |_| true).await;
    sleep(Duration::from_millis(500)).await;
    // Done: every primary learns the new owner; clients get MOVED.
    for node in cluster.nodes() {
        let mut conn = node_conn(&node.addr()).await;
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await.unwrap();
        if redis::from_redis_value_ref::<String>(&role[0]).unwrap() == "master" {
            setslot(&node.addr(), &["NODE", &to_id]).await;
        }
    }
    sleep(Duration::from_millis(500)).await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut lease, extended, refused, errors) = user.await.unwrap();
    assert_eq!(slot_owner(&cluster, &key).await, to);
    holder.extend(&mut lease).await.unwrap();
    assert_eq!(
        other.inspect(&name).await.unwrap().unwrap().owner,
        lease.owner()
    );
    holder.release(&lease).await.unwrap();
    let next = must_acquire(&other, &name, &long()).await;
    assert!(next.fencing_token() > lease.fencing_token());
    eprintln!(
        "cluster: slot moved under a held lock: {extended} extensions and {refused} refusals \
         went through, {errors} retryable errors"
    );
    assert!(
        extended > 0 && refused > 0,
        "30 s after the move, {extended} extensions and {refused} refusals had gone through"
    );
}

/// One primary serving every slot, announced at a fault proxy in front of
/// it, so that the cluster client's every connection crosses the proxy.
async fn one_node_cluster_behind_a_proxy() -> (
    dlock_conformance::harness::Server,
    dlock_conformance::proxy::FaultProxy,
) {
    use dlock_conformance::harness::{ServerOptions, Service, start};
    let args = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "/tmp/nodes.conf",
    ];
    let server = start(
        Service::Redis,
        ServerOptions {
            args: args.map(str::to_owned).to_vec(),
            ..ServerOptions::default()
        },
    )
    .await;
    let proxy = support::proxy_to(server.url()).await;
    let mut conn = node_conn(&format!("127.0.0.1:{}", server.port().unwrap())).await;
    for (setting, value) in [
        ("cluster-announce-ip", "127.0.0.1".to_owned()),
        ("cluster-announce-port", proxy.addr().port().to_string()),
    ] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(setting)
            .arg(value)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query_async(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut conn)
            .await
            .unwrap();
        if info.contains("cluster_state:ok") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{info}");
        sleep(Duration::from_millis(50)).await;
    }
    (server, proxy)
}

/// The cluster client sends a request again when its connection dropped
/// after sending, and the first run may have done the work: here every
/// release and hold runs on the server, and its reply drops the connection
/// instead of arriving. The replay must report what happened (released,
/// held), not "not held"; a second call of the caller's own is still "not
/// held", and the name is as the first run left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_release_reports_what_the_first_run_did() {
    // A topology of several containers, faulted: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    use dlock_conformance::proxy::Fault;
    use dlock_core::Error;
    let (_server, proxy) = one_node_cluster_behind_a_proxy().await;
    let b = RedisBackend::connect(&format!(
        "redis+cluster://127.0.0.1:{}",
        proxy.addr().port()
    ))
    .await
    .unwrap();

    // The server has the scripts: a first run that only answers NOSCRIPT
    // would change nothing.
    for hold in [Duration::ZERO, Duration::from_millis(1)] {
        let warm = must_acquire(&b, &unique_name("warm"), &long()).await;
        b.release_after(&warm, hold).await.unwrap();
    }

    let name = unique_name("replayed-release");
    let lease = must_acquire(&b, &name, &long()).await;
    proxy.set_open_connections(Fault::CutOnReply);
    b.release(&lease)
        .await
        .expect("a release whose reply was lost, replayed, is a release");
    proxy.set(Fault::Pass);
    assert!(matches!(
        b.release(&lease).await,
        Err(Error::NotHeld { .. })
    ));
    assert_eq!(b.inspect(&name).await.unwrap(), None);

    let name = unique_name("replayed-hold");
    let lease = must_acquire(&b, &name, &long()).await;
    proxy.set_open_connections(Fault::CutOnReply);
    b.release_after(&lease, Duration::from_secs(30))
        .await
        .expect("a hold whose reply was lost, replayed, is a hold");
    proxy.set(Fault::Pass);
    assert!(matches!(
        b.release_after(&lease, Duration::from_secs(30)).await,
        Err(Error::NotHeld { .. })
    ));
    let held = b.inspect(&name).await.unwrap().expect("the hold");
    assert_eq!(held.owner, lease.owner().for_hold());
}
