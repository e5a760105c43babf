//! `#[locked]` expands to acquire → body → release, on the in-memory
//! backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock::{Error, Locker, MemoryBackend};

#[derive(Debug)]
enum ShipError {
    // Read by `Debug`, in failure messages.
    #[allow(dead_code)]
    Lock(Error),
    OutOfStock,
}

impl From<Error> for ShipError {
    fn from(e: Error) -> Self {
        ShipError::Lock(e)
    }
}

struct Order {
    id: u64,
}

struct Shop {
    locker: Locker,
    inside: AtomicUsize,
    most_inside: AtomicUsize,
}

impl Shop {
    fn new(locker: Locker) -> Self {
        Shop {
            locker,
            inside: AtomicUsize::new(0),
            most_inside: AtomicUsize::new(0),
        }
    }

    #[dlock::locked(locker = self.locker, name = "order:{order.id}", wait = "5s", ttl = "2s", guard = lease)]
    async fn ship(&self, order: &Order, fail: bool) -> Result<u64, ShipError> {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_inside.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
        if fail {
            return Err(ShipError::OutOfStock);
        }
        Ok(lease.fencing_token())
    }

    #[dlock::locked(locker = self.locker, name = "user:{user}", wait = "0s")]
    async fn once(&self, user: &str) -> Result<(), Error> {
        tokio::time::sleep(Duration::from_millis(200)).await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_with_one_key_never_overlap_and_get_increasing_tokens() {
    let shop = Arc::new(Shop::new(Locker::new(MemoryBackend::new())));
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let shop = shop.clone();
            tokio::spawn(async move { shop.ship(&Order { id: 7 }, false).await })
        })
        .collect();
    let mut tokens = Vec::new();
    for call in calls {
        tokens.push(call.await.unwrap().unwrap());
    }
    assert_eq!(
        shop.most_inside.load(Ordering::SeqCst),
        1,
        "two calls overlapped"
    );
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 8, "each call had its own grant");
}

#[tokio::test]
async fn the_body_error_is_returned_and_the_lock_released() {
    let shop = Shop::new(Locker::new(MemoryBackend::new()));
    let r = shop.ship(&Order { id: 1 }, true).await;
    assert!(matches!(r, Err(ShipError::OutOfStock)), "{r:?}");
    assert!(shop.locker.inspect("order:1").await.unwrap().is_none());
}

#[tokio::test]
async fn a_held_name_with_no_wait_is_a_timeout_error() {
    let locker = Locker::new(MemoryBackend::new());
    let shop = Arc::new(Shop::new(locker));
    let first = {
        let shop = shop.clone();
        tokio::spawn(async move { shop.once("ann").await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = shop.once("ann").await;
    assert!(matches!(second, Err(Error::Timeout { .. })), "{second:?}");
    assert!(shop.once("bob").await.is_ok(), "another key is not held");
    first.await.unwrap().unwrap();
}

#[dlock::locked(locker = locker, name = "free:{n:03}")]
async fn free_fn(locker: &Locker, n: u32) -> Result<String, Error> {
    Ok(format!("ran {n}"))
}

#[tokio::test]
async fn free_functions_take_the_locker_as_an_argument() {
    let locker = Locker::new(MemoryBackend::new());
    assert_eq!(free_fn(&locker, 5).await.unwrap(), "ran 5");
    // The name used the format spec.
    let guard = locker
        .try_acquire("free:005", &dlock::LockOptions::new())
        .await
        .unwrap();
    assert!(guard.is_some());
}

#[dlock::locked(locker = locker, name = "pool", permits = 2, guard = permit)]
async fn in_pool(locker: &Locker) -> Result<dlock::Mode, Error> {
    Ok(permit.mode())
}

#[dlock::locked(locker = locker, name = "config", mode = "read", wait = "0s")]
async fn read_config(locker: &Locker) -> Result<(), Error> {
    Ok(())
}

#[tokio::test]
async fn permits_and_modes_take_the_shared_kinds() {
    let locker = Locker::new(MemoryBackend::new());
    assert_eq!(in_pool(&locker).await.unwrap(), dlock::Mode::Permit(2));
    // One permit of two held elsewhere: the body still runs.
    let other = locker
        .semaphore("pool", 2)
        .acquire(&dlock::LockOptions::new())
        .await
        .unwrap();
    assert_eq!(in_pool(&locker).await.unwrap(), dlock::Mode::Permit(2));
    other.release().await.unwrap();
    // Readers share; a writer keeps them out.
    let reader = locker
        .read("config", &dlock::LockOptions::new())
        .await
        .unwrap();
    read_config(&locker).await.unwrap();
    reader.release().await.unwrap();
    let writer = locker
        .write("config", &dlock::LockOptions::new())
        .await
        .unwrap();
    let elsewhere = tokio::spawn({
        let locker = locker.clone();
        async move { read_config(&locker).await }
    });
    assert!(matches!(
        elsewhere.await.unwrap(),
        Err(Error::Timeout { .. })
    ));
    // The writer's own task would wait for itself: refused at once.
    assert!(matches!(
        read_config(&locker).await,
        Err(Error::Reentrant { .. })
    ));
    writer.release().await.unwrap();
}

#[dlock::locked(locker = locker, name = "report", ttl = "1s")]
async fn report(locker: &Locker, started: &tokio::sync::Notify) -> Result<(), Error> {
    started.notify_one();
    tokio::time::sleep(Duration::from_secs(600)).await;
    panic!("the body ran on after its lease was lost");
}

#[tokio::test]
async fn a_lost_lease_cancels_the_body() {
    let locker = Locker::new(MemoryBackend::new());
    let started = tokio::sync::Notify::new();
    let call = report(&locker, &started);
    let take_away = async {
        started.notified().await;
        // As an operator's `dlock release` would: the next renewal finds
        // the lease gone.
        let freed = locker.backend().force_release("report").await;
        assert!(matches!(freed, Ok(Some(_))), "{freed:?}");
    };
    let bound = Duration::from_secs(60);
    let (r, ()) = tokio::time::timeout(bound, async { tokio::join!(call, take_away) })
        .await
        .expect("the body was not cancelled");
    assert!(matches!(r, Err(Error::NotHeld { .. })), "{r:?}");
}
