//! Redis-specific behaviour: key layout, fencing across a restart without
//! persistence, script reload, wake-up by pub/sub, configuration errors.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock_conformance::harness::{ServerOptions, Service, shared, start, unused_port, wait_ready};
use dlock_conformance::proxy::Fault;
use dlock_conformance::support::{
    Waited, long, must_acquire, release_wakes, unique_name, wait_on_task,
};
use dlock_core::{Backend, Error, LockOptions};
use dlock_redis::RedisBackend;
use dlock_redis::redis::{self, AsyncCommands};
use tokio::time::Instant;

use crate::support;
use crate::support::{polling_every, proxy_to};

async fn backend() -> RedisBackend {
    RedisBackend::connect(shared(Service::Redis).await.url())
        .await
        .unwrap()
}

#[tokio::test]
async fn keys_follow_the_documented_layout() {
    let b = backend().await;
    let name = format!("}}layout/{}", unique_name("x"));
    // The PTTL below is checked against this TTL.
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let lease = must_acquire(&b, &name, &opts).await;
    let escaped = name.replace('%', "%25").replace('}', "%7D");
    let lock_key = format!("dlock:{{{escaped}}}");
    let mut conn = b.connection();
    let value: String = conn.get(&lock_key).await.unwrap();
    assert_eq!(value, format!("{}{}", lease.owner(), lease.holder()));
    let pttl: i64 = conn.pttl(&lock_key).await.unwrap();
    assert!(pttl > 29_000 && pttl <= 30_000, "{pttl}");
    let fence: u64 = conn.get(format!("{lock_key}:fence")).await.unwrap();
    assert_eq!(fence, lease.fencing_token());
    b.release(&lease).await.unwrap();
    let gone: Option<String> = conn.get(&lock_key).await.unwrap();
    assert_eq!(gone, None);
}

/// A lock taken by an older release (its key's value the bare owner
/// token) reads with no holder description, and a lease of the same
/// grant, with no description, releases it.
#[tokio::test]
async fn a_grant_of_an_older_release_reads_without_a_holder() {
    let b = backend().await;
    let name = unique_name("old");
    let owner = dlock_core::OwnerToken::random().unwrap();
    let mut conn = b.connection();
    let _: () = conn
        .pset_ex(format!("dlock:{{{name}}}"), owner.to_string(), 30_000)
        .await
        .unwrap();
    let info = b.inspect(&name).await.unwrap().unwrap();
    assert_eq!((info.owner, info.holder), (owner, None));
    let opts = long().holder("");
    let old = dlock_core::Lease::with_ttl(&name, owner, 1, &opts, Instant::now());
    b.release(&old).await.unwrap();
    assert!(b.inspect(&name).await.unwrap().is_none());
}

#[tokio::test]
async fn prefixes_keep_lock_spaces_apart() {
    let url = shared(Service::Redis).await.url();
    let a = RedisBackend::builder(url)
        .prefix("app-a")
        .connect()
        .await
        .unwrap();
    let b = RedisBackend::builder(url)
        .prefix("app-b")
        .connect()
        .await
        .unwrap();
    let name = unique_name("prefixes");
    let la = must_acquire(&a, &name, &long()).await;
    let lb = must_acquire(&b, &name, &long()).await;
    a.release(&la).await.unwrap();
    b.release(&lb).await.unwrap();
    let bad = RedisBackend::builder(url).prefix("a{b}").connect().await;
    assert!(matches!(
        bad,
        Err(Error::InvalidOption {
            option: "prefix",
            ..
        })
    ));
}

#[tokio::test]
async fn fencing_survives_a_restart_without_persistence() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let server = start(
        Service::Redis,
        ServerOptions {
            fixed_port: true,
            ..ServerOptions::default()
        },
    )
    .await;
    let b = RedisBackend::connect(server.url()).await.unwrap();
    let name = unique_name("restart");
    let mut last = 0;
    for _ in 0..3 {
        let lease = must_acquire(&b, &name, &long()).await;
        last = lease.fencing_token();
        b.release(&lease).await.unwrap();
    }
    let container = server.container().unwrap();
    container.stop().await.unwrap();
    container.start().await.unwrap();
    wait_ready(Service::Redis, server.url()).await.unwrap();
    // The first request meets the broken connection; the manager reconnects.
    let started = Instant::now();
    let lease = loop {
        match b.try_acquire(&name, &long()).await {
            Ok(lease) => break lease.expect("the restarted server has no locks"),
            Err(e) if e.is_retryable() && started.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no reconnect after the restart: {e}"),
        }
    };
    // The data was lost with the restart, counter included.
    let mut conn = b.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 2, "only the new lock and its counter: {keys:?}");
    assert!(
        lease.fencing_token() > last,
        "after a restart the token went from {last} to {}",
        lease.fencing_token()
    );
}

/// The counter, not the clock, sets the token when the counter is ahead
/// (the clock stepped back, or a token drawn in the same microsecond).
#[tokio::test]
async fn a_counter_ahead_of_the_clock_still_rises_by_one() {
    let b = backend().await;
    let name = unique_name("ahead");
    // Far above the clock in µs, and below 2^53.
    let ahead: u64 = 9_000_000_000_000_000;
    let mut conn = b.connection();
    let _: () = conn
        .set(format!("dlock:{{{name}}}:fence"), ahead)
        .await
        .unwrap();
    for step in 1..=2 {
        let lease = must_acquire(&b, &name, &long()).await;
        assert_eq!(lease.fencing_token(), ahead + step);
        b.release(&lease).await.unwrap();
    }
}

/// On a server of its own: `SCRIPT FLUSH` empties the whole server's script
/// cache, and two flushes in a row fail a call of any client that was
/// reloading its script in between (the client reloads once).
#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() {
    let server = start(Service::Redis, ServerOptions::default()).await;
    let b = RedisBackend::connect(server.url()).await.unwrap();
    let name = unique_name("flush");
    let lease = must_acquire(&b, &name, &long()).await;
    let mut conn = b.connection();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    b.release(&lease).await.unwrap();
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    let lease = must_acquire(&b, &name, &long()).await;
    b.release(&lease).await.unwrap();
}

/// Starts `waiter` waiting up to 50 s for `name`.
fn wait_for(waiter: RedisBackend, name: &str) -> tokio::task::JoinHandle<Waited<RedisBackend>> {
    wait_on_task(waiter, name, long().wait(Duration::from_secs(50)))
}

/// With the fallback poll set to a minute, a waiter that gets the lock within
/// seconds of the release was woken by the release message.
#[tokio::test]
async fn a_release_wakes_a_waiter_in_another_process() {
    let url = shared(Service::Redis).await.url();
    let holder = RedisBackend::connect(url).await.unwrap();
    let waiter = polling_every(url, Duration::from_secs(60)).await;
    let name = unique_name("wake");
    let lease = must_acquire(&holder, &name, &long()).await;
    let task = wait_for(waiter, &name);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished());
    release_wakes(&holder, &lease, task).await;
}

#[tokio::test]
async fn malformed_url_is_an_invalid_option() {
    for url in ["not a url", "http://127.0.0.1:6379", "redis://:99999999"] {
        let r = RedisBackend::connect(url).await;
        assert!(
            matches!(r, Err(Error::InvalidOption { option: "url", .. })),
            "{url}: {r:?}"
        );
    }
}

#[tokio::test]
async fn refused_connection_is_a_connection_error() {
    let port = unused_port();
    let r = RedisBackend::connect(&format!("redis://127.0.0.1:{port}")).await;
    match r {
        Err(e @ Error::Connection { .. }) => assert!(e.is_retryable()),
        other => panic!("expected a connection error, got {other:?}"),
    }
}

#[tokio::test]
async fn wrong_password_is_a_backend_error() {
    let server = shared(Service::Redis).await;
    let mut conn = backend().await.connection();
    let user = unique_name("user");
    let () = redis::cmd("ACL")
        .arg(&["SETUSER", &user, "on", ">right", "~*", "&*", "+@all"][..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let url = |pw: &str| {
        server
            .url()
            .replace("redis://", &format!("redis://{user}:{pw}@"))
    };
    let r = RedisBackend::connect(&url("wrong")).await;
    match r {
        Err(e @ Error::Backend { .. }) => {
            assert!(e.to_string().contains("authentication"), "{e}");
            assert!(!e.is_retryable());
        }
        other => panic!("expected an authentication error, got {other:?}"),
    }
    let ok = RedisBackend::connect(&url("right")).await.unwrap();
    let name = unique_name("acl");
    let lease = must_acquire(&ok, &name, &long()).await;
    ok.release(&lease).await.unwrap();
}

#[tokio::test]
async fn a_server_that_is_down_gives_errors_not_grants() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let server = start(Service::Redis, ServerOptions::default()).await;
    let b = RedisBackend::connect(server.url()).await.unwrap();
    let name = unique_name("down");
    let lease = must_acquire(&b, &name, &long()).await;
    server.container().unwrap().stop().await.unwrap();
    let r = b.try_acquire(&unique_name("down"), &long()).await;
    assert!(matches!(r, Err(Error::Connection { .. })), "{r:?}");
    let r = b.release(&lease).await;
    assert!(matches!(r, Err(Error::Connection { .. })), "{r:?}");
}

/// 1,000 acquires on distinct held names, each dropped at a random point
/// (before, during or after it queues): every one leaves its queue, and the
/// client keeps only its own wake-up channel, on the server and in its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waits_leave_no_queue_place_and_one_channel() {
    // Keeps the machine busy (a thousand acquires and cancels) and judges
    // time against a budget: alone.
    let _turn = dlock_conformance::support::alone();
    let server = start(Service::Redis, ServerOptions::default()).await;
    let holder = RedisBackend::connect(server.url()).await.unwrap();
    // Places that would last minutes: only leaving the queue removes them.
    let waiter = polling_every(server.url(), Duration::from_secs(60)).await;
    let names: Vec<String> = (0..1000).map(|_| unique_name("cancelled")).collect();
    let mut leases = Vec::new();
    for name in &names {
        leases.push(must_acquire(&holder, name, &long()).await);
    }
    let patient = long().wait(Duration::from_secs(30));
    for name in &names {
        let cut = Duration::from_micros(fastrand::u64(0..3000));
        let r = tokio::time::timeout(cut, waiter.acquire(name, &patient)).await;
        assert!(r.is_err(), "a waiter got a held lock");
    }
    // Leaving the queue runs in the background: give it a moment.
    let mut conn = holder.connection();
    let started = Instant::now();
    loop {
        let queued: Vec<String> = redis::cmd("KEYS")
            .arg("dlock:{cancelled-*}:q*")
            .query_async(&mut conn)
            .await
            .unwrap();
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query_async(&mut conn)
            .await
            .unwrap();
        let own = channels.len() <= 1 && channels.iter().all(|c| c.starts_with("dlock:wake:"));
        if queued.is_empty() && own && waiter.subscribed_channels() <= 1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{} queue keys left, channels {channels:?}, {} in the client",
            queued.len(),
            waiter.subscribed_channels()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for lease in &leases {
        holder.release(lease).await.unwrap();
    }
}

/// The waiter's links are cut while it waits, and the holder releases
/// during the cut: the release message is lost. Once the link is back, the
/// waiter must subscribe again and look again, getting the lock within a
/// few round trips instead of at its one-minute fallback poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_pubsub_outage_is_not_missed() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let url = shared(Service::Redis).await.url();
    let proxy = proxy_to(url).await;
    let holder = RedisBackend::connect(url).await.unwrap();
    let waiter = polling_every(format!("redis://{}", proxy.addr()), Duration::from_secs(60)).await;
    let name = unique_name("outage");
    let lease = must_acquire(&holder, &name, &long()).await;
    let task = wait_for(waiter, &name);
    // Long enough that the waiter's backoff has grown to seconds: only a
    // wake-up can bring it in quickly now.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    proxy.set(Fault::Cut);
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder.release(&lease).await.unwrap();
    // An outage of seconds: longer than a few quick retries can ride out.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(!task.is_finished(), "the waiter finished during the cut");
    let back = Instant::now();
    proxy.set(Fault::Pass);
    let (granted, at, waiter) = task.await.unwrap();
    let granted = granted.expect("the waiter gets the lock once its link is back");
    assert!(
        at - back < Duration::from_millis(1500),
        "the waiter missed the release made during the outage ({:?})",
        at - back
    );
    waiter.release(&granted).await.unwrap();
}

/// A server that cannot take writes (here: a replica) gives a retryable
/// `Unavailable` error, not a fatal one, and serves again once it can.
#[tokio::test]
async fn a_read_only_server_is_unavailable_not_broken() {
    let server = start(Service::Redis, ServerOptions::default()).await;
    let b = RedisBackend::connect(server.url()).await.unwrap();
    let mut conn = b.connection();
    // A primary that does not exist, on the container's own loopback.
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let r = b.try_acquire(&unique_name("read_only"), &long()).await;
    match r {
        Err(e @ Error::Unavailable { .. }) => assert!(e.is_retryable(), "{e}"),
        other => panic!("expected Unavailable from a replica, got {other:?}"),
    }
    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut conn)
        .await
        .unwrap();
    let name = unique_name("read_only");
    let lease = must_acquire(&b, &name, &long()).await;
    b.release(&lease).await.unwrap();
}

#[tokio::test]
async fn zero_or_huge_durations_are_invalid_options() {
    let url = shared(Service::Redis).await.url();
    for (option, builder) in [
        (
            "max_poll_interval",
            RedisBackend::builder(url).max_poll_interval(Duration::ZERO),
        ),
        (
            "request_timeout",
            RedisBackend::builder(url).request_timeout(Duration::ZERO),
        ),
        (
            "connect_timeout",
            RedisBackend::builder(url).connect_timeout(Duration::MAX),
        ),
    ] {
        match builder.connect().await {
            Err(Error::InvalidOption { option: o, .. }) => assert_eq!(o, option),
            other => panic!("{option}: expected InvalidOption, got {other:?}"),
        }
    }
}

/// Sixteen clients queue for one name and pass it on: each gets it in the
/// order it arrived, each release wakes one waiter (one message), and the
/// server runs a bounded number of scripts per hand-off, not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_served_in_arrival_order_one_wake_up_per_release() {
    let server = start(Service::Redis, ServerOptions::default()).await;
    let holder = RedisBackend::connect(server.url()).await.unwrap();
    let name = unique_name("queue");
    let lease = must_acquire(&holder, &name, &long()).await;
    let waiters = 16;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..waiters {
        // Heartbeats minutes apart: only wake-ups move the queue.
        let b = polling_every(server.url(), Duration::from_secs(60)).await;
        let (name, order) = (name.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let lease = b
                .acquire(&name, &long().wait(Duration::from_secs(50)))
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            b.release(&lease).await.unwrap();
        }));
        // Long enough for its first attempt and its place in the queue.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Past the waiters' early retries (100 ms, doubling).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut conn = holder.connection();
    let [publish_before, scripts_before] =
        support::command_calls(&mut conn, ["publish", "evalsha"]).await;
    holder.release(&lease).await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("every waiter is served within seconds")
            .unwrap();
    }
    let [publish_after, scripts_after] =
        support::command_calls(&mut conn, ["publish", "evalsha"]).await;
    assert_eq!(*order.lock().unwrap(), (0..waiters).collect::<Vec<_>>());
    let published = publish_after - publish_before;
    let scripts = scripts_after - scripts_before;
    // One wake-up per release with a waiter behind it (the last has none).
    assert!(
        (waiters..=waiters + 2).contains(&published),
        "{published} messages for {waiters} hand-offs"
    );
    // A grant and a release per hand-off, and a few heartbeats: a herd
    // would make it grow with the square of the waiters.
    assert!(
        scripts <= 3 * waiters,
        "{scripts} scripts for {waiters} hand-offs"
    );
}

/// A queued waiter whose client vanishes (its link cut, its task gone, so
/// it cannot leave the queue) keeps its place only until the place lapses:
/// the waiter behind it is granted the lock within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_vanishes_loses_its_place() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let url = shared(Service::Redis).await.url();
    let proxy = proxy_to(url).await;
    let holder = RedisBackend::connect(url).await.unwrap();
    let name = unique_name("vanish");
    let lease = must_acquire(&holder, &name, &long()).await;
    // Its place lapses 3 heartbeats plus two round-trip bounds (here
    // 3 × 200 ms + 2 × (200 + 200) ms = 1.4 s) after its last attempt.
    let doomed = RedisBackend::builder(format!("redis://{}", proxy.addr()))
        .max_poll_interval(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .request_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let doomed = wait_for(doomed, &name);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let patient = polling_every(url, Duration::from_secs(2)).await;
    let next = wait_for(patient, &name);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The first place is the doomed waiter's, `<32 hex digits><client id>`.
    let mut conn = holder.connection();
    let queue = format!("dlock:{{{name}}}:q");
    let places: Vec<String> = conn.zrange(&queue, 0, 0).await.unwrap();
    let channel = format!("dlock:wake:{}", &places[0][32..]);
    proxy.set(Fault::Cut);
    doomed.abort();
    // Vanished: the server no longer has its connection. (One still open
    // is handed the lock, as a holder frozen then would keep it.)
    let gone_by = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(
            Instant::now() < gone_by,
            "the cut link's connection stayed open"
        );
        let (_, listening): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut conn)
            .await
            .unwrap();
        if listening == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let (granted, at, patient) = tokio::time::timeout(Duration::from_secs(20), next)
        .await
        .expect("the waiter behind a vanished one is not stuck")
        .unwrap();
    let granted = granted.expect("granted");
    assert!(
        at - released < Duration::from_secs(5),
        "the vanished waiter's place held the queue for {:?}",
        at - released
    );
    patient.release(&granted).await.unwrap();
}

/// A server that may evict keys under memory pressure is refused: with
/// `volatile-ttl` it deletes the shortest-lived keys first — lock keys —
/// and grants a held lock again. The control, connected with the risk
/// accepted, shows the double grant the refusal prevents.
#[tokio::test]
async fn a_server_that_may_evict_locks_is_refused() {
    let options = ServerOptions {
        args: ["--maxmemory", "2mb", "--maxmemory-policy", "volatile-ttl"]
            .map(String::from)
            .to_vec(),
        ..ServerOptions::default()
    };
    let server = start(Service::Redis, options).await;
    let refused = RedisBackend::connect(server.url()).await;
    assert!(
        matches!(&refused, Err(Error::UnsafeServer { message, .. }) if message.contains("volatile-ttl")),
        "{refused:?}"
    );

    // The risk accepted by the setter, and in the URL.
    let first = RedisBackend::builder(server.url())
        .accept_eviction_risk(true)
        .connect()
        .await
        .unwrap();
    let risky_url = format!("{}?accept_eviction_risk=true", server.url());
    let second = RedisBackend::connect(&risky_url).await.unwrap();
    let unknown = format!("{}?accept_eviction_risc=true", server.url());
    let refused = RedisBackend::connect(&unknown).await;
    assert!(
        matches!(&refused, Err(Error::InvalidOption { option: "url", reason }) if reason.contains("`accept_eviction_risc`")),
        "{refused:?}"
    );
    let name = unique_name("evicted");
    let held = must_acquire(&first, &name, &long()).await;
    // Longer-lived filler than the lock: volatile-ttl evicts the lock first.
    let mut filler = first.connection();
    let chunk = vec![b'x'; 64 * 1024];
    for i in 0..64 {
        let _: redis::RedisResult<()> = filler.set_ex(format!("filler:{i}"), &chunk, 3600).await;
    }
    assert!(held.is_valid(), "the first lease is still valid");
    let again = second.try_acquire(&name, &long()).await.unwrap();
    assert!(
        again.is_some(),
        "the control: an evicting server grants a held lock again"
    );
}

/// A policy set to evict at run time (`CONFIG SET`) ends the trust of the
/// holds granted before: a guard's `lost()` fires, its lease cannot be
/// extended, and calls answer `UnsafeServer` until the server is safe
/// again. On a server of its own.
#[tokio::test]
async fn a_server_set_to_evict_while_holding_ends_the_holds() {
    let server = start(Service::Redis, ServerOptions::default()).await;
    let backend = RedisBackend::connect(server.url()).await.unwrap();
    let locker = dlock_core::Locker::new(backend.clone());
    let guard = locker
        .try_acquire(&unique_name("evict-later"), &long())
        .await
        .unwrap()
        .unwrap();
    let mut lease = must_acquire(&backend, &unique_name("evict-later-raw"), &long()).await;
    let mut admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let policy = async |admin: &mut redis::aio::MultiplexedConnection, value: &str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(value)
            .query_async::<()>(admin)
            .await
            .unwrap();
    };
    policy(&mut admin, "allkeys-lru").await;
    // The guard's TTL is long (30 s): only the policy check can end it now.
    tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("the hold ends once the policy is read again");
    assert!(!lease.is_valid());
    let e = backend.extend(&mut lease).await.unwrap_err();
    assert!(matches!(e, Error::UnsafeServer { .. }), "{e:?}");
    let e = backend
        .try_acquire(&unique_name("evict-now"), &long())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::UnsafeServer { message, .. } if message.contains("allkeys-lru")),
        "{e:?}"
    );
    policy(&mut admin, "noeviction").await;
    let started = Instant::now();
    let after = loop {
        match backend
            .try_acquire(&unique_name("evict-no-more"), &long())
            .await
        {
            Ok(Some(after)) => break after,
            Err(Error::UnsafeServer { .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still refused after the policy was set back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(after.is_valid(), "a grant after the fix is trusted");
    backend.release(&after).await.unwrap();
    // The hold of before stays ended.
    let e = backend.extend(&mut lease).await.unwrap_err();
    assert!(matches!(e, Error::UnsafeServer { .. }), "{e:?}");
}

/// `list` has one bound, the request timeout, however many `SCAN` steps a
/// sparse prefix takes: over a slow link (300 ms each way, 1 s timeout) a
/// page that needs ten steps returns an error at the timeout. Bounding each
/// step alone took ten round trips, 6 s. On a server of its own, with
/// 20,000 other keys.
#[tokio::test]
async fn list_returns_within_the_request_timeout_however_many_steps_it_takes() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    const TIMEOUT: Duration = Duration::from_secs(1);
    const SLACK: Duration = Duration::from_millis(1250);
    let server = start(Service::Redis, ServerOptions::default()).await;
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    for chunk in 0..20 {
        let pairs: Vec<(String, u8)> = (0..1000)
            .map(|i| (format!("filler:{chunk}:{i}"), 0))
            .collect();
        let () = conn.mset(&pairs).await.unwrap();
    }
    let proxy = proxy_to(server.url()).await;
    let b = RedisBackend::builder(format!("redis://127.0.0.1:{}", proxy.addr().port()))
        .request_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let started = Instant::now();
    let listed = b.list("nothing-here", None, 10).await;
    let took = started.elapsed();
    assert!(
        listed.is_err(),
        "ten steps at 600 ms fit in {TIMEOUT:?}: {listed:?}"
    );
    assert!(
        took <= TIMEOUT + SLACK,
        "list returned after {took:?}; the request timeout is {TIMEOUT:?}"
    );
}

/// A call that finds the connection gone waits for the reconnect within
/// its one bound, the request timeout: the link was cut, then hangs, so the
/// new connection's handshake gets no answer. Bounding the call by the
/// connect and request timeouts together let it take 4 s here.
#[tokio::test]
async fn a_call_during_a_reconnect_returns_within_the_request_timeout() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    const TIMEOUT: Duration = Duration::from_secs(1);
    const SLACK: Duration = Duration::from_millis(1250);
    let proxy = proxy_to(shared(Service::Redis).await.url()).await;
    let b = RedisBackend::builder(format!("redis://127.0.0.1:{}", proxy.addr().port()))
        .request_timeout(TIMEOUT)
        .connect_timeout(Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    let name = unique_name("reconnect");
    b.inspect(&name).await.unwrap();
    proxy.set(Fault::Cut);
    assert!(b.inspect(&name).await.is_err(), "a cut link answered");
    proxy.set(Fault::Stall);
    let started = Instant::now();
    let inspected = b.inspect(&name).await;
    let took = started.elapsed();
    assert!(inspected.is_err(), "a hung link answered: {inspected:?}");
    assert!(
        took <= TIMEOUT + SLACK,
        "inspect returned after {took:?}; the request timeout is {TIMEOUT:?}"
    );
}

/// On one server the connection manager never sends a request again, so a
/// release whose reply is lost (its connection dropped after the server
/// ran it) is an error of unknown outcome, retryable, never "not held".
/// (On a cluster the client does send it again: `cluster.rs`.)
#[tokio::test]
async fn a_release_whose_reply_is_lost_is_an_error_not_a_not_held() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let proxy = proxy_to(shared(Service::Redis).await.url()).await;
    let b = RedisBackend::connect(&format!("redis://127.0.0.1:{}", proxy.addr().port()))
        .await
        .unwrap();
    let warm = must_acquire(&b, &unique_name("warm"), &long()).await;
    b.release(&warm).await.unwrap();
    let name = unique_name("lost-reply");
    let lease = must_acquire(&b, &name, &long()).await;
    proxy.set_open_connections(Fault::CutOnReply);
    match b.release(&lease).await {
        Err(e @ Error::Connection { .. }) => assert!(e.is_retryable(), "{e}"),
        other => panic!("expected a connection error, got {other:?}"),
    }
    proxy.set(Fault::Pass);
    assert_eq!(b.inspect(&name).await.unwrap(), None, "the release ran");
}

/// A backend built from an application's redis client connects where the
/// client does: its database (here 3) is the one locks are taken in.
#[tokio::test]
async fn a_redis_client_gives_where_to_connect() {
    let url = shared(Service::Redis).await.url().trim_end_matches('/');
    let client = redis::Client::open(format!("{url}/3")).unwrap();
    let from_client = RedisBackend::builder_from_client(&client)
        .connect()
        .await
        .unwrap();
    let name = unique_name("from-client");
    let lease = must_acquire(&from_client, &name, &long()).await;
    let db3 = RedisBackend::connect(&format!("{url}/3")).await.unwrap();
    let seen = db3.inspect(&name).await.unwrap();
    assert_eq!(seen.map(|i| i.owner), Some(lease.owner()));
    assert_eq!(backend().await.inspect(&name).await.unwrap(), None);
    from_client.release(&lease).await.unwrap();
}
