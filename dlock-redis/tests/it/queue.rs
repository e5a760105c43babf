//! The waiter queue: places that lapsed never hide the live head, and a
//! waiter that cannot subscribe still gets its turn.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_conformance::harness::{ServerOptions, Service, start};
use dlock_conformance::proxy::Fault;
use dlock_conformance::support::{long, must_acquire, unique_name, wait_on_task};
use dlock_core::Backend;
use dlock_redis::RedisBackend;
use dlock_redis::redis::{self, AsyncCommands};
use tokio::time::sleep;

use crate::support::{command_calls, polling_every, proxy_to};

/// Forty lapsed places ahead of a live waiter (waiters whose processes
/// died): the release still wakes the live one (one PUBLISH, counted
/// rather than timed) instead of promising the free lock to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_places_do_not_hide_the_head() {
    let server = start(Service::Redis, ServerOptions::default()).await;
    let holder = RedisBackend::connect(server.url()).await.unwrap();
    let waiter = polling_every(server.url(), Duration::from_secs(60)).await;
    let name = unique_name("lapsed");
    let held = must_acquire(&holder, &name, &long()).await;
    let task = wait_on_task(waiter, &name, long().wait(Duration::from_secs(50)));

    // Once the waiter has its place, put 40 dead ones ahead of it.
    let key = format!("dlock:{{{name}}}");
    let mut conn = holder.connection();
    let first = loop {
        let queued: Vec<(String, f64)> = conn
            .zrange_withscores(format!("{key}:q"), 0, 0)
            .await
            .unwrap();
        if let Some(first) = queued.into_iter().next() {
            break first;
        }
        sleep(Duration::from_millis(10)).await;
    };
    for i in 0..40 {
        let dead = format!("{i:032x}dead");
        let arrived = first.1 - 1000.0 + f64::from(i);
        let _: () = conn.zadd(format!("{key}:q"), &dead, arrived).await.unwrap();
        let _: () = conn.zadd(format!("{key}:qexp"), &dead, 1).await.unwrap();
    }

    let [before] = command_calls(&mut conn, ["publish"]).await;
    holder.release(&held).await.unwrap();
    let [after] = command_calls(&mut conn, ["publish"]).await;
    assert_eq!(
        after - before,
        1,
        "the release woke nobody: the lapsed places hid the live head"
    );
    let (granted, _, waiter) = task.await.unwrap();
    let granted = granted.expect("the live waiter gets the lock");
    waiter.release(&granted).await.unwrap();
}

/// An ACL user without channel rights (Redis 7's default for new users:
/// it may neither SUBSCRIBE nor, from scripts, PUBLISH) waits while three
/// others pass the lock round through the queue for seconds: it queues
/// too (and polls for its turn), so it is granted, instead of being
/// refused whenever anyone else waits; and its release, with others
/// queued, succeeds without the right to wake them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_without_subscribe_gets_its_turn() {
    let server = start(Service::Redis, ServerOptions::default()).await;
    let mut admin = RedisBackend::connect(server.url())
        .await
        .unwrap()
        .connection();
    let user = unique_name("nosub");
    let () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                &user,
                "on",
                ">pw",
                "~*",
                "resetchannels",
                "+@all",
            ][..],
        )
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = server
        .url()
        .replace("redis://", &format!("redis://{user}:pw@"));
    let name = unique_name("nosub");

    let stop = Arc::new(AtomicBool::new(false));
    let mut cyclers = Vec::new();
    for _ in 0..3 {
        let client = polling_every(server.url(), Duration::from_millis(50)).await;
        let (name, stop) = (name.clone(), stop.clone());
        cyclers.push(tokio::spawn(async move {
            let opts = long().wait(Duration::from_secs(20));
            while !stop.load(Ordering::Relaxed) {
                let lease = client.acquire(&name, &opts).await.unwrap();
                sleep(Duration::from_millis(20)).await;
                client.release(&lease).await.unwrap();
            }
        }));
    }
    sleep(Duration::from_millis(200)).await;
    let unsubscribed = polling_every(url.as_str(), Duration::from_millis(50)).await;
    let got = unsubscribed
        .acquire(&name, &long().wait(Duration::from_secs(10)))
        .await;
    stop.store(true, Ordering::Relaxed);
    let lease = got.expect("the waiter without SUBSCRIBE is granted within 10 s");
    unsubscribed.release(&lease).await.unwrap();
    for cycler in cyclers {
        cycler.await.unwrap();
    }
}

/// A waiter on a slow link (150 ms each way, where it asks again every
/// 10 ms at most) keeps its place at the head while its own round trips
/// run: the release goes to it, not to the fast waiter that queued after
/// it. Decided on order: which waiter holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_head_keeps_its_place() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let server = start(Service::Redis, ServerOptions::default()).await;
    let proxy = proxy_to(server.url()).await;
    let holder = RedisBackend::connect(server.url()).await.unwrap();
    let slow = polling_every(
        &format!("redis://{}", proxy.addr()),
        Duration::from_millis(10),
    )
    .await;
    let fast = polling_every(server.url(), Duration::from_millis(10)).await;
    proxy.set(Fault::Delay(Duration::from_millis(150)));
    let name = unique_name("slow-head");
    let held = must_acquire(&holder, &name, &long()).await;
    let patient = long().wait(Duration::from_secs(20));

    let slow_task = wait_on_task(slow, &name, patient.clone());
    let key = format!("dlock:{{{name}}}:q");
    let mut conn = holder.connection();
    while conn.zcard::<_, u64>(&key).await.unwrap() == 0 {
        sleep(Duration::from_millis(10)).await;
    }
    let fast_task = wait_on_task(fast, &name, patient);
    // Long enough for several of the slow waiter's round trips.
    sleep(Duration::from_secs(1)).await;
    holder.release(&held).await.unwrap();

    let (granted, _, slow) = tokio::time::timeout(Duration::from_secs(10), slow_task)
        .await
        .expect("the slow head was passed over: the fast waiter got the lock")
        .unwrap();
    let granted = granted.expect("the slow head gets the lock");
    assert!(!fast_task.is_finished(), "two waiters were granted at once");
    slow.release(&granted).await.unwrap();
    let (granted, _, fast) = fast_task.await.unwrap();
    fast.release(&granted.expect("then the fast waiter"))
        .await
        .unwrap();
}

/// A waiter whose client polls once an hour still asks again every few
/// seconds while it is queued, and its place is kept only for a few of
/// those: if its process dies, the name is not promised to it for hours.
/// Read from the place's expiry on the server (formerly three hours).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_place_lapses_whatever_the_poll_interval() {
    let server = start(Service::Redis, ServerOptions::default()).await;
    let holder = RedisBackend::connect(server.url()).await.unwrap();
    let waiter = polling_every(server.url(), Duration::from_secs(3600)).await;
    let name = unique_name("long-poll");
    let held = must_acquire(&holder, &name, &long()).await;
    let task = wait_on_task(waiter, &name, long().wait(Duration::from_secs(30)));
    let key = format!("dlock:{{{name}}}:qexp");
    let mut conn = holder.connection();
    let lapses_at = loop {
        let places: Vec<(String, f64)> = conn.zrange_withscores(&key, 0, 0).await.unwrap();
        if let Some((_, at)) = places.into_iter().next() {
            break at;
        }
        sleep(Duration::from_millis(10)).await;
    };
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let now_ms = (secs * 1_000_000 + micros) as f64 / 1000.0;
    let kept = Duration::from_secs_f64((lapses_at - now_ms).max(0.0) / 1000.0);
    assert!(
        kept <= Duration::from_secs(30),
        "a dead waiter would keep its place for {kept:?}"
    );
    holder.release(&held).await.unwrap();
    let (granted, _, waiter) = task.await.unwrap();
    waiter.release(&granted.unwrap()).await.unwrap();
}

/// A release hands the lock over to the head of the queue in the same
/// script, and the waiter takes it from the message. The server counts
/// that grant's TTL from the waiter's last ask, so the waiter must count
/// its validity from no later than when it sent that ask: here the ask is
/// at least 600 ms old when the release comes, and a waiter that counted
/// from the message would believe in its lease that much longer than the
/// server keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_lease_ends_no_later_than_on_the_server() {
    let server = start(Service::Redis, ServerOptions::default()).await;
    let holder = RedisBackend::connect(server.url()).await.unwrap();
    // Asks again at most every 5 s: the last ask ages between wake-ups.
    let waiter = polling_every(server.url(), Duration::from_secs(5)).await;
    let name = unique_name("handover");
    let opts = long().ttl(Duration::from_secs(8));
    let held = must_acquire(&holder, &name, &opts).await;
    let task = wait_on_task(waiter, &name, opts.wait(Duration::from_secs(50)));

    // The waiter leaves its TTL, its last ask (server ms) and its lock
    // value under its place; release once that ask is 600 ms old.
    let key = format!("dlock:{{{name}}}");
    let mut conn = holder.connection();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<String> = conn.hvals(format!("{key}:qv")).await.unwrap();
        let (now_s, now_us): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
        let now_ms = now_s * 1000 + now_us / 1000;
        let asked = left
            .first()
            .and_then(|v| v.split(':').nth(1))
            .and_then(|ms| ms.parse::<u64>().ok());
        if asked.is_some_and(|asked| now_ms.saturating_sub(asked) >= 600) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never left a 600 ms old ask under its place"
        );
        sleep(Duration::from_millis(20)).await;
    }
    holder.release(&held).await.unwrap();
    let (granted, _, waiter) = task.await.unwrap();
    let lease = granted.unwrap();
    let pttl: i64 = conn.pttl(&key).await.unwrap();
    let believed = lease
        .valid_until()
        .unwrap()
        .saturating_duration_since(tokio::time::Instant::now());
    assert!(
        pttl > 0 && believed.as_millis() <= u128::try_from(pttl).unwrap(),
        "the waiter believes in its lease for {believed:?}, the server keeps it {pttl} ms"
    );
    waiter.release(&lease).await.unwrap();
}
