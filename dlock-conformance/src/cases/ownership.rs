//! Ownership: release and extend act only on the caller's own lease. A
//! lease that was released, taken over, or never granted is "not held",
//! and it never touches the current holder's lock.

use std::sync::Arc;

use dlock_core::Backend;

use super::{assert_held, assert_not_held, foreign_lease};
use crate::support::{long, must_acquire, unique_name};

/// Acquire, see the holder through `inspect`, release, and see it free.
pub async fn acquire_then_release(backend: &Arc<dyn Backend>) {
    let name = unique_name("acquire_then_release");
    let lease = must_acquire(backend.as_ref(), &name, &long()).await;
    assert_eq!(lease.name(), name);
    assert!(lease.is_valid(), "a fresh lease is valid");
    let info = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("inspect shows the holder");
    assert_eq!(
        info.owner,
        lease.owner(),
        "inspect reports the holder's token"
    );
    if backend.capabilities().fencing {
        assert_eq!(info.fencing_token, lease.fencing_token());
    }
    backend.release(&lease).await.expect("release");
    assert!(
        backend.inspect(&name).await.expect("inspect").is_none(),
        "the lock is free after release"
    );
    let again = must_acquire(backend.as_ref(), &name, &long()).await;
    backend.release(&again).await.expect("release");
}

/// `try_acquire` on a held lock returns `None` and leaves the holder alone.
pub async fn try_acquire_when_held_is_none(backend: &Arc<dyn Backend>) {
    let name = unique_name("try_acquire_when_held_is_none");
    let lease = must_acquire(backend.as_ref(), &name, &long()).await;
    assert_held(backend.as_ref(), &name, "try_acquire while held").await;
    backend
        .release(&lease)
        .await
        .expect("the holder can still release");
}

/// Releasing twice: the second release is "not held".
pub async fn release_twice_is_not_held(backend: &Arc<dyn Backend>) {
    let name = unique_name("release_twice_is_not_held");
    let lease = must_acquire(backend.as_ref(), &name, &long()).await;
    backend.release(&lease).await.expect("first release");
    assert_not_held(backend.release(&lease).await, "second release");
}

/// A stale lease (released, then the lock granted again) can neither
/// release nor extend the new holder's lock.
pub async fn stale_lease_cannot_touch_new_holder(backend: &Arc<dyn Backend>) {
    let name = unique_name("stale_lease_cannot_touch_new_holder");
    let mut stale = must_acquire(backend.as_ref(), &name, &long()).await;
    backend.release(&stale).await.expect("release");
    let holder = must_acquire(backend.as_ref(), &name, &long()).await;
    assert_not_held(backend.release(&stale).await, "release by a stale lease");
    assert_not_held(backend.extend(&mut stale).await, "extend by a stale lease");
    assert_held(
        backend.as_ref(),
        &name,
        "a stale lease freed the new holder's lock",
    )
    .await;
    let info = backend
        .inspect(&name)
        .await
        .expect("inspect")
        .expect("held");
    assert_eq!(info.owner, holder.owner(), "the holder is unchanged");
    backend.release(&holder).await.expect("the holder releases");
}

/// A lease the server never granted can neither release nor extend.
pub async fn foreign_lease_is_not_held(backend: &Arc<dyn Backend>) {
    let name = unique_name("foreign_lease_is_not_held");
    let holder = must_acquire(backend.as_ref(), &name, &long()).await;
    let mut forged = foreign_lease(&name, &long());
    assert_not_held(backend.release(&forged).await, "release by a foreign lease");
    assert_not_held(
        backend.extend(&mut forged).await,
        "extend by a foreign lease",
    );
    assert_held(backend.as_ref(), &name, "a foreign lease freed the lock").await;
    backend.release(&holder).await.expect("the holder releases");
    // And on a name nobody holds.
    let free = foreign_lease(&unique_name("foreign_lease_is_not_held"), &long());
    assert_not_held(backend.release(&free).await, "release of a free lock");
}
