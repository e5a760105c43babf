//! Delayed release: `release_after` keeps the name locked until the hold
//! ends, even past the client that asked, acts only on its own lease, and
//! spends that lease.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, Error, Lease};
use tokio::time::{Instant, sleep_until};

use super::{assert_held, assert_not_held, foreign_lease, needs, needs_delayed_release};
use crate::support::{long, must_acquire, unique_name};

/// The hold the delayed-release cases ask for.
const HOLD: Duration = Duration::from_secs(1);

/// How much earlier than the hold a grant may come, counted from when
/// `release_after` was sent (the server cannot start the hold before it
/// has the request): what the server's clock may gain on the client's over
/// the hold, the Safety model's drift allowance (1 % and 2 ms; servers
/// count in whole milliseconds).
const HOLD_SLACK: Duration = Duration::from_millis(HOLD.as_millis() as u64 / 100 + 2);

/// Acquires `name` and gives it up with a `release_after` of [`HOLD`]: the
/// lease, and when `release_after` was sent, which is before the hold began.
async fn acquire_then_hold(backend: &dyn Backend, name: &str) -> (Lease, Instant) {
    let first = must_acquire(backend, name, &long()).await;
    let sent = Instant::now();
    backend
        .release_after(&first, HOLD)
        .await
        .expect("release_after");
    (first, sent)
}

/// After `release_after`, a waiter acquires the name once the hold has
/// passed, not before, and not much later.
async fn wait_out_the_hold(backend: &dyn Backend, name: &str, since: Instant, first: &Lease) {
    let lease = backend
        .acquire(name, &long().wait(HOLD * 5))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the name was not free {:?} after a {HOLD:?} hold: {e}",
                since.elapsed()
            )
        });
    let waited = since.elapsed();
    assert!(
        waited + HOLD_SLACK >= HOLD,
        "granted {waited:?} after release_after with a {HOLD:?} hold"
    );
    if backend.capabilities().fencing {
        assert!(
            lease.fencing_token() > first.fencing_token(),
            "the grant after a hold has fencing token {} after {}",
            lease.fencing_token(),
            first.fencing_token()
        );
    }
    backend.release(&lease).await.expect("release");
}

/// `release_after` keeps the name locked for the hold asked, then frees
/// it with no further call: a waiter gets it when the hold ends.
pub async fn release_after_holds_the_name_until_then(backend: &Arc<dyn Backend>) {
    let case = "release_after_holds_the_name_until_then";
    if !needs_delayed_release(backend.as_ref(), case) {
        return;
    }
    let name = unique_name(case);
    let (first, since) = acquire_then_hold(backend.as_ref(), &name).await;
    // The released lease is spent: it cannot end or stretch the hold (a
    // renewal still in flight would otherwise do just that).
    assert_not_held(
        backend.extend(&mut first.clone()).await,
        "extend of a lease given up by release_after",
    );
    assert_not_held(
        backend.release(&first).await,
        "release of a lease given up by release_after",
    );
    assert_held(backend.as_ref(), &name, "within the hold of release_after").await;
    wait_out_the_hold(backend.as_ref(), &name, since, &first).await;
}

/// `release_after` of a lease that is not the holder's is "not held" and
/// leaves the holder's lock as it was: no hold is left behind.
pub async fn release_after_acts_only_on_its_own_lease(backend: &Arc<dyn Backend>) {
    let case = "release_after_acts_only_on_its_own_lease";
    if !needs_delayed_release(backend.as_ref(), case) {
        return;
    }
    let name = unique_name(case);
    let holder = must_acquire(backend.as_ref(), &name, &long()).await;
    assert_not_held(
        backend
            .release_after(&foreign_lease(&name, &long()), Duration::from_secs(30))
            .await,
        "release_after of a lease never granted",
    );
    backend
        .release(&holder)
        .await
        .expect("the holder's release after a foreign release_after");
    let next = must_acquire(backend.as_ref(), &name, &long()).await;
    backend.release(&next).await.expect("release");
}

/// The hold of `release_after` outlives the client that made it: a
/// process that exits right after a run still keeps the name locked.
pub async fn release_after_outlives_its_client<F, Fut>(factory: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Backend>>,
{
    let case = "release_after_outlives_its_client";
    let holder = factory().await;
    if !needs_delayed_release(holder.as_ref(), case) {
        return;
    }
    // Connected before the hold begins: a connect (a new session with a
    // three-node ensemble, on a loaded machine) took longer than the half
    // hold the check has, and the check then came after the hold's end.
    let other = factory().await;
    let name = unique_name(case);
    let (first, since) = acquire_then_hold(holder.as_ref(), &name).await;
    drop(holder);
    // Long enough for a closed session's nodes to be gone; the check has
    // the hold's other half to reach the server.
    sleep_until(since + HOLD / 2).await;
    assert_held(
        other.as_ref(),
        &name,
        "within the hold, after the client that made it went away",
    )
    .await;
    wait_out_the_hold(other.as_ref(), &name, since, &first).await;
}

/// A reader's `release_after` holds the name as a reader would: no writer
/// gets in until the hold ends, another reader shares with it meanwhile.
pub async fn a_readers_hold_keeps_writers_out_not_readers(backend: &Arc<dyn Backend>) {
    let case = "a_readers_hold_keeps_writers_out_not_readers";
    let b = backend.as_ref();
    if !needs_delayed_release(b, case)
        || !needs(case, b.capabilities().rwlock, "no reader-writer locks")
    {
        return;
    }
    // A writer's try that returns after the hold could have ended judges
    // nothing (several round trips to a loaded ensemble took longer than
    // the hold): such a round runs again with a new name.
    for _ in 0..3 {
        let name = unique_name(case);
        let reader = must_acquire(b, &name, &long().read()).await;
        // Sent before the hold began (see `HOLD_SLACK`).
        let since = Instant::now();
        match b.release_after(&reader, HOLD).await {
            Ok(()) => {}
            Err(Error::Unsupported { .. }) => {
                eprintln!("{case}: not applicable: the backend cannot hold a read lock");
                b.release(&reader).await.expect("release");
                return;
            }
            Err(e) => panic!("release_after of a reader: {e}"),
        }
        match b.try_acquire(&name, &long().write()).await {
            Ok(None) => {}
            Ok(Some(writer)) if since.elapsed() + HOLD_SLACK >= HOLD => {
                eprintln!(
                    "{case}: a writer's try returned {:?} after the hold was asked: \
                     cannot judge, again",
                    since.elapsed()
                );
                b.release(&writer).await.expect("release");
                continue;
            }
            other => panic!(
                "a writer within a reader's hold ({:?} after it was asked): {other:?}",
                since.elapsed()
            ),
        }
        let other = b.try_acquire(&name, &long().read()).await;
        let other = other
            .expect("a reader within a reader's hold")
            .unwrap_or_else(|| panic!("a reader's hold kept another reader out"));
        b.release(&other).await.expect("release");
        let waiter = b.acquire(&name, &long().write().wait(HOLD * 5)).await;
        let writer = waiter.unwrap_or_else(|e| panic!("no writer after a reader's hold: {e}"));
        assert!(
            since.elapsed() + HOLD_SLACK >= HOLD,
            "a writer {:?} into a {HOLD:?} reader's hold",
            since.elapsed()
        );
        if b.capabilities().fencing {
            assert!(writer.fencing_token() > reader.fencing_token());
        }
        b.release(&writer).await.expect("release");
        return;
    }
    panic!("{case}: in 3 rounds every writer's try outlasted the {HOLD:?} hold");
}
