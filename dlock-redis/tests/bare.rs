//! The uncontended acquire in bare commands (`SET NX PX`, `INCR`): it
//! never takes a lock promised to the head of the queue, and a fencing
//! counter that is gone still gives a token above every earlier one.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use dlock_conformance::harness::{Service, shared};
use dlock_conformance::support::{long, must_acquire, unique_name};
use dlock_core::Backend;
use dlock_redis::RedisBackend;
use dlock_redis::redis::AsyncCommands;

async fn backend() -> RedisBackend {
    RedisBackend::connect(shared(Service::Redis).await.url())
        .await
        .unwrap()
}

/// A client that has drawn the name's counter: its next uncontended
/// acquire of `name` is the bare one.
async fn counted(name: &str) -> RedisBackend {
    let b = backend().await;
    let lease = must_acquire(&b, name, &long()).await;
    b.release(&lease).await.unwrap();
    b
}

/// A release that cannot hand the lock over (the head left no lock value,
/// as a waiter that takes no hand-overs) wakes the head and promises it
/// the lock until its place lapses: a newcomer's bare `SET NX` does not
/// take it. Once the head's place is gone, the promise is nobody's and the
/// newcomer is granted.
#[tokio::test]
async fn a_released_lock_stays_promised_to_the_head() {
    let name = unique_name("promised");
    let newcomer = counted(&name).await;
    let holder = backend().await;
    let held = must_acquire(&holder, &name, &long()).await;
    let key = format!("dlock:{{{name}}}");
    let mut conn = holder.connection();
    let head = format!("{:032x}elsewhere", 1);
    let _: () = conn.zadd(format!("{key}:q"), &head, 1).await.unwrap();
    // Its place lapses in 2286: kept throughout the test.
    let lapses: i64 = 9_999_999_999_999;
    let _: () = conn
        .zadd(format!("{key}:qexp"), &head, lapses)
        .await
        .unwrap();

    holder.release(&held).await.unwrap();
    let stolen = newcomer.try_acquire(&name, &long()).await.unwrap();
    assert!(
        stolen.is_none(),
        "a newcomer took the lock the release promised to the head"
    );
    let promise: String = conn.get(&key).await.unwrap();
    assert_eq!(promise, "~p");
    assert!(
        holder.inspect(&name).await.unwrap().is_none(),
        "a promise is no holder"
    );

    let _: () = conn.zrem(format!("{key}:q"), &head).await.unwrap();
    let _: () = conn.zrem(format!("{key}:qexp"), &head).await.unwrap();
    let lease = newcomer
        .try_acquire(&name, &long())
        .await
        .unwrap()
        .expect("granted once nobody waits");
    newcomer.release(&lease).await.unwrap();
}

/// The counter of a counted name is deleted (evicted, expired, flushed)
/// or brought back older (a restart from a snapshot, a failover to a
/// replica that missed grants): a bare acquire still gives a token above
/// every earlier one (the server's clock, when that is higher), and its
/// release raises the counter to that token. An `INCR` that made the
/// counter gives it an expiry, even when the lock was held.
#[tokio::test]
async fn a_counter_gone_or_older_still_gives_a_token_above_the_last() {
    let name = unique_name("gone");
    let b = counted(&name).await;
    let holder = counted(&name).await;
    let fence_key = format!("dlock:{{{name}}}:fence");
    let mut conn = b.connection();

    let held = must_acquire(&holder, &name, &long()).await;
    let last = held.fencing_token();
    let _: () = conn.del(&fence_key).await.unwrap();
    assert!(b.try_acquire(&name, &long()).await.unwrap().is_none());
    let pttl: i64 = conn.pttl(&fence_key).await.unwrap();
    assert!(
        pttl > 0,
        "a counter made by a refused acquire never expires: {pttl}"
    );
    holder.release(&held).await.unwrap();
    let counter: u64 = conn.get(&fence_key).await.unwrap();
    assert_eq!(counter, last, "the release raises the counter to its token");

    // A second older: as a snapshot taken a second before.
    let _: () = conn.set(&fence_key, last - 1_000_000).await.unwrap();
    let lease = must_acquire(&b, &name, &long()).await;
    assert!(
        lease.fencing_token() > last,
        "after the counter went back, the token went from {last} to {}",
        lease.fencing_token()
    );
    let last = lease.fencing_token();
    b.release(&lease).await.unwrap();

    let _: () = conn.del(&fence_key).await.unwrap();
    let lease = must_acquire(&b, &name, &long()).await;
    assert!(
        lease.fencing_token() > last,
        "after the counter went, the token went from {last} to {}",
        lease.fencing_token()
    );
    b.release(&lease).await.unwrap();
}
