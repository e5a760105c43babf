//! Helpers for driver tests and the cases alike: fresh names, options,
//! an acquire that must succeed, a waiter on a task of its own.

use std::time::Duration;

use dlock_core::{Backend, Error, Guard, Lease, LockOptions, Locker, Result};
use tokio::time::Instant;

pub use crate::turns::{
    IN_TURN_AT_ONCE, STRESS_AT_ONCE, Turn, alone, beside_others, in_turn, stress,
};

/// A lock name no other test or run uses: `<case>-<random hex>`.
pub fn unique_name(case: &str) -> String {
    format!("{case}-{:016x}", fastrand::u64(..))
}

/// What [`wait_on_task`] gives back: the acquire's outcome, when it came,
/// and the backend.
pub type Waited<B> = (dlock_core::Result<Lease>, Instant, B);

/// Starts `backend` acquiring `name` with `opts` on a task of its own, for
/// tests that act while it waits.
pub fn wait_on_task<B: Backend + 'static>(
    backend: B,
    name: &str,
    opts: LockOptions,
) -> tokio::task::JoinHandle<Waited<B>> {
    let name = name.to_owned();
    tokio::spawn(async move {
        let lease = backend.acquire(&name, &opts).await;
        (lease, Instant::now(), backend)
    })
}

/// Releases `lease` with `holder`, and the waiter of `task` gets the lock
/// within seconds: woken by the release, for a waiter whose polls are far
/// slower than that.
///
/// # Panics
/// When the release fails, or the waiter gets no lock or gets it late.
pub async fn release_wakes<B: Backend + 'static>(
    holder: &dyn Backend,
    lease: &Lease,
    task: tokio::task::JoinHandle<Waited<B>>,
) {
    let released = Instant::now();
    holder.release(lease).await.expect("release");
    let (granted, at, waiter) = task.await.expect("the waiting task");
    let granted = granted.expect("the waiter gets the lock");
    assert!(
        at - released < Duration::from_secs(10),
        "the waiter polled instead of being woken ({:?})",
        at - released
    );
    waiter.release(&granted).await.expect("release");
}

/// Options for tests that hold locks for a long time: a TTL (60 s) far
/// longer than any test, so that only a release can free the lock.
pub fn long() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(60))
}

/// One `try_acquire` that must grant `name`.
///
/// # Panics
/// When the lock is held or the call fails, naming the lock.
pub async fn must_acquire(backend: &dyn Backend, name: &str, opts: &LockOptions) -> Lease {
    match backend.try_acquire(name, opts).await {
        Ok(Some(lease)) => lease,
        Ok(None) => panic!("try_acquire({name:?}) found the lock held, expected it free"),
        Err(e) => panic!("try_acquire({name:?}) failed: {e}"),
    }
}

/// One `try_acquire` through `locker` that must grant `name`: its guard.
///
/// # Panics
/// When the lock is held or the call fails, naming the lock.
pub async fn must_lock(locker: &Locker, name: &str, opts: &LockOptions) -> Guard {
    match locker.try_acquire(name, opts).await {
        Ok(Some(guard)) => guard,
        Ok(None) => panic!("try_acquire({name:?}) found the lock held, expected it free"),
        Err(e) => panic!("try_acquire({name:?}) failed: {e}"),
    }
}

/// For drivers with a schema: `backend` works on tables made by an older
/// release, which hold `old_owner`'s grant of `legacy` (holder `web-1:77`),
/// until `migrate` gives them this release's layout: the mutex works at
/// once, the reads and the shared kinds say to migrate; after `migrate`,
/// the old grant reads with its holder, every kind stores its holder, and
/// a second `migrate` changes nothing.
///
/// # Panics
/// When the backend breaks one of those.
pub async fn older_tables_work_until_migrated<M, Fut>(
    backend: &dyn Backend,
    old_owner: dlock_core::OwnerToken,
    migrate: M,
) where
    M: Fn() -> Fut,
    Fut: Future<Output = dlock_core::Result<()>>,
{
    let early = must_acquire(backend, "early", &long().holder("web-2:88")).await;
    backend.release(&early).await.expect("release");
    let says = |e: Option<dlock_core::Error>| {
        let e = e.expect("an error until the migration");
        assert!(e.to_string().contains("older release"), "{e}");
    };
    says(backend.inspect("legacy").await.err());
    says(backend.try_acquire("shared", &long().read()).await.err());
    migrate().await.expect("migrate");

    let old = backend.inspect("legacy").await.expect("inspect");
    let old = old.expect("the old grant");
    assert_eq!(old.owner, old_owner);
    assert_eq!(
        old.holder.as_deref(),
        Some("web-1:77"),
        "the old row's holder"
    );
    let holder = "Zürich 🔒 worker";
    let mutex = must_acquire(backend, "mutex", &long().holder(holder)).await;
    let reader = must_acquire(backend, "shared", &long().read().holder(holder)).await;
    for name in ["mutex", "shared"] {
        let info = backend.inspect(name).await.expect("inspect").expect("held");
        assert_eq!(info.holder.as_deref(), Some(holder), "{name}");
    }
    migrate().await.expect("a second migrate");
    backend.release(&mutex).await.expect("release");
    backend.release(&reader).await.expect("release");
}

/// A setting given in a URL's query takes effect: a lock taken through
/// `by_url` (connected with the setting in its URL) is seen by
/// `by_setter` (the same setting given to the builder's setter), and not
/// by `default` (neither).
///
/// # Panics
/// When the lock is not where the setting says, or a call fails.
pub async fn url_setting_takes_effect(
    by_url: &dyn Backend,
    by_setter: &dyn Backend,
    default: &dyn Backend,
    opts: &LockOptions,
) {
    let name = unique_name("url-setting");
    let lease = must_acquire(by_url, &name, opts).await;
    let seen = by_setter.inspect(&name).await.expect("inspect");
    assert_eq!(
        seen.map(|holder| holder.owner),
        Some(lease.owner()),
        "the backend built with the setter sees the lock taken through the URL"
    );
    let elsewhere = default.inspect(&name).await.expect("inspect");
    assert!(
        elsewhere.is_none(),
        "the default setting's backend: {elsewhere:?}"
    );
    by_url.release(&lease).await.expect("release");
}

/// A URL parameter neither the driver nor its client library knows is
/// refused at connect by its name (`param`), its value (`value`) unshown.
///
/// # Panics
/// When `connected` is anything else.
pub fn refused_by_name<T: std::fmt::Debug>(connected: Result<T>, param: &str, value: &str) {
    let shown = format!("{connected:?}");
    assert!(
        matches!(&connected, Err(Error::InvalidOption { option: "url", reason })
            if reason.contains(&format!("`{param}`"))),
        "{shown}"
    );
    assert!(!shown.contains(value), "the value is shown: {shown}");
}
