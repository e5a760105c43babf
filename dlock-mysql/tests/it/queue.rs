//! The mutex's queue with wake-ups on: the lock goes to the first waiter
//! that queued, not to a releaser asking again; and a queued waiter whose
//! process died keeps nobody waiting.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use tokio::time::Instant;

use dlock_conformance::harness::{Service, shared};
use dlock_conformance::support::{long, must_acquire, unique_name, wait_on_task};
use dlock_core::Backend;
use dlock_mysql::MySqlBackend;

async fn url() -> &'static str {
    shared(Service::MariaDb).await.url()
}

/// A client whose waiters sleep in the server, polling at most once a
/// minute: a waiter served within seconds was woken.
async fn waking(url: &str) -> MySqlBackend {
    MySqlBackend::builder(url)
        .wake_ups(true)
        .max_poll_interval(Duration::from_secs(60))
        .connect()
        .await
        .unwrap()
}

/// Whether the mutex waiters queued for `name` are registered (their
/// sleeper connection holds their key), one entry per place.
async fn places(name: &str) -> Vec<bool> {
    let pool = sqlx::MySqlPool::connect(url().await).await.unwrap();
    let registered: Vec<Option<i64>> = sqlx::query_scalar(
        "SELECT CAST(IS_USED_LOCK(CONCAT('dlock-w:', SHA1(CONCAT(COALESCE(DATABASE(), ''),
           '.dlock_locks:', name, X'00', owner)))) AS SIGNED)
         FROM dlock_locks_holds WHERE name = ? AND waiting AND mode = 'x'",
    )
    .bind(name.as_bytes())
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    registered.into_iter().map(|id| id.is_some()).collect()
}

/// Waits (up to 20 s) until `name`'s queue is `want`.
async fn until_places(name: &str, want: &[bool]) {
    let start = Instant::now();
    while places(name).await != want {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the queue of {name} is {:?}, expected {want:?}",
            places(name).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A waiter in another process queues; the holder releases and asks
/// again at once: it does not get the lock back, the waiter does, woken
/// by the release (its polls are a minute apart).
#[tokio::test]
async fn a_releaser_asking_again_goes_behind_the_queued_waiter() {
    let holder = waking(url().await).await;
    let name = unique_name("queue");
    let lease = must_acquire(&holder, &name, &long()).await;
    let task = wait_on_task(
        waking(url().await).await,
        &name,
        long().wait(Duration::from_secs(50)),
    );
    until_places(&name, &[true]).await;
    let released = Instant::now();
    holder.release(&lease).await.unwrap();
    let again = holder.try_acquire(&name, &long()).await.unwrap();
    assert!(again.is_none(), "the releaser took the lock back");
    let (granted, at, waiter) = task.await.unwrap();
    let granted = granted.expect("the queued waiter gets the lock");
    assert!(
        at - released < Duration::from_secs(10),
        "the waiter polled instead of being woken ({:?})",
        at - released
    );
    waiter.release(&granted).await.unwrap();
}

/// A queued waiter's process dies (its runtime, connections and all, is
/// dropped without a word to the server): its place stays, but counts no
/// more, so the lock is free for the next acquire as soon as it is
/// released.
#[tokio::test]
async fn a_queued_waiter_whose_process_died_keeps_nobody_waiting() {
    let holder = waking(url().await).await;
    let name = unique_name("queue_gone");
    let lease = must_acquire(&holder, &name, &long()).await;
    let (die, dying) = tokio::sync::oneshot::channel::<()>();
    let (url, waited_for) = (url().await.to_owned(), name.clone());
    let process = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let waiter = waking(&url).await;
            let opts = long().wait(Duration::from_secs(50));
            tokio::spawn(async move { waiter.acquire(&waited_for, &opts).await });
            let _ = dying.await;
        });
        // Dropped here, on a thread with no other runtime: the wait's
        // own clean-up cannot run.
        drop(rt);
    });
    until_places(&name, &[true]).await;
    die.send(()).unwrap();
    process.join().unwrap();
    until_places(&name, &[false]).await;
    holder.release(&lease).await.unwrap();
    let next = holder.try_acquire(&name, &long()).await.unwrap();
    let next = next.expect("a dead waiter's place kept the lock from the next acquire");
    holder.release(&next).await.unwrap();
}
