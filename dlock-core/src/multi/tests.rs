use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::*;
use crate::MemoryBackend;

/// Two tasks lock `[a, b]` and `[b, a]`, each through its own locker (two
/// nodes), a thousand times, waiting as long as it takes: neither ever
/// waits for the other in a cycle, and no name has two holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_orders_never_deadlock_or_overlap() {
    let backend = Arc::new(MemoryBackend::new());
    let held: Arc<[AtomicBool; 2]> = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let rounds = |names: [&'static str; 2]| {
        let locker = Locker::from_arc(backend.clone());
        let held = held.clone();
        tokio::spawn(async move {
            for _ in 0..1000 {
                let both = locker
                    .acquire_all(&names, &LockOptions::new())
                    .await
                    .unwrap();
                for flag in held.iter() {
                    assert!(!flag.swap(true, Ordering::SeqCst), "two holders");
                }
                tokio::task::yield_now().await;
                for flag in held.iter() {
                    flag.store(false, Ordering::SeqCst);
                }
                both.release().await.unwrap();
            }
        })
    };
    let (one, other) = (rounds(["a", "b"]), rounds(["b", "a"]));
    tokio::time::timeout(Duration::from_secs(60), async {
        one.await.unwrap();
        other.await.unwrap();
    })
    .await
    .expect("deadlocked");
}

/// All or nothing: with `b` held elsewhere, `[a, b]` times out (naming
/// `b`) and leaves `a` free; a try gives `None` and leaves `a` free too.
#[tokio::test(start_paused = true)]
async fn a_held_name_leaves_the_others_free() {
    let backend = Arc::new(MemoryBackend::new());
    let (mine, theirs) = (Locker::from_arc(backend.clone()), Locker::from_arc(backend));
    let b = theirs.acquire("b", &LockOptions::new()).await.unwrap();
    let opts = LockOptions::new().wait(Duration::from_millis(300));
    let r = mine.acquire_all(&["b", "a"], &opts).await;
    assert!(
        matches!(&r, Err(Error::Timeout { name, waited }) if name == "b" && *waited >= Duration::from_millis(300)),
        "{r:?}"
    );
    assert!(
        theirs
            .try_acquire("a", &LockOptions::new())
            .await
            .unwrap()
            .is_some()
    );
    let tried = mine
        .try_acquire_all(&["c", "b"], &LockOptions::new())
        .await
        .unwrap();
    assert!(tried.is_none());
    let c = theirs.try_acquire("c", &LockOptions::new()).await.unwrap();
    assert!(c.is_some(), "a failed try kept c");
    b.release().await.unwrap();
}

/// A dropped `acquire_all` gives back what it took; tokens are per name;
/// `lost()` fires when any lease ends; bad sets are refused.
#[tokio::test(start_paused = true)]
async fn dropped_lost_tokens_and_bad_sets() {
    let backend = Arc::new(MemoryBackend::new());
    let (mine, theirs) = (Locker::from_arc(backend.clone()), Locker::from_arc(backend));
    let b = theirs.acquire("b", &LockOptions::new()).await.unwrap();
    let waiting = tokio::time::timeout(
        Duration::from_millis(100),
        mine.acquire_all(&["a", "b"], &LockOptions::new()),
    )
    .await;
    assert!(waiting.is_err(), "b is held: the set waits");
    let a = theirs
        .acquire("a", &LockOptions::new().wait(Duration::from_secs(5)))
        .await;
    assert!(a.is_ok(), "the dropped acquire kept a: {a:?}");
    drop((a, b));
    let set = mine
        .acquire_all(&["y", "x"], &LockOptions::new())
        .await
        .unwrap();
    let names: Vec<&str> = set.guards().iter().map(Guard::name).collect();
    assert_eq!(names, ["x", "y"]);
    assert!(set.fencing_token("x").is_some() && set.fencing_token("z").is_none());
    set.release().await.unwrap();
    // `x` runs out after a second, `y` after a minute: `lost()` is the
    // first loss, not the last.
    let ttl = |secs| {
        LockOptions::new()
            .ttl(Duration::from_secs(secs))
            .renew(false)
    };
    let set = MultiGuard {
        guards: vec![
            mine.acquire("x", &ttl(1)).await.unwrap(),
            mine.acquire("y", &ttl(60)).await.unwrap(),
        ],
    };
    let started = tokio::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(5), set.lost())
        .await
        .expect("lost() fires when the first lease ends");
    assert!(started.elapsed() <= Duration::from_secs(1));
    assert!(!set.is_valid());
    let twice = mine.acquire_all(&["x", "x"], &LockOptions::new()).await;
    assert!(matches!(twice, Err(Error::InvalidName { .. })), "{twice:?}");
    let none: [&str; 0] = [];
    let empty = mine.acquire_all(&none, &LockOptions::new()).await;
    assert!(
        matches!(
            empty,
            Err(Error::InvalidOption {
                option: "names",
                ..
            })
        ),
        "{empty:?}"
    );
}
