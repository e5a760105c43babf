//! Expiry: a TTL lease that is not extended frees the lock on the server,
//! and so does a holder that goes away; extending keeps the lock. After
//! expiry the old lease is "not held".

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, Lease, LockOptions};
use tokio::time::{Instant, sleep, sleep_until};

use super::{
    Judged, SHORT_TTL, acquire_after_expiry, assert_held, assert_not_held, fresh_lease,
    judged_with_doubling_ttl, needs_ttl, server_ttl, short,
};
use crate::support::{long, must_acquire, unique_name};

/// A TTL lease that is not extended expires on the server, and another
/// client can take the lock over.
pub async fn expiry_then_takeover(backend: &Arc<dyn Backend>) {
    if !needs_ttl(backend.as_ref(), "expiry_then_takeover") {
        return;
    }
    let case = "expiry_then_takeover";
    judged_with_doubling_ttl(case, SHORT_TTL, |ttl| async move {
        let name = unique_name(case);
        let first = match fresh_lease(backend.as_ref(), &name, &short().ttl(ttl)).await {
            Ok(lease) => lease,
            Err(late) => return late,
        };
        let deadline = first.valid_until().expect("TTL leases have a deadline");
        assert!(
            deadline <= Instant::now() + ttl,
            "validity is counted from before the request"
        );
        sleep(server_ttl(backend.as_ref(), ttl) + Duration::from_millis(200)).await;
        assert!(!first.is_valid(), "the lease is invalid after its TTL");
        let second = match acquire_after_expiry(backend.as_ref(), &name, &long(), ttl).await {
            Ok(Some(lease)) => lease,
            other => panic!("{name:?} was not free after its holder's TTL: {other:?}"),
        };
        if backend.capabilities().fencing {
            assert!(
                second.fencing_token() > first.fencing_token(),
                "takeover must carry a greater fencing token ({} then {})",
                first.fencing_token(),
                second.fencing_token()
            );
        }
        backend.release(&second).await.expect("release");
        Judged::Yes
    })
    .await;
}

/// After expiry and takeover, the first holder's release and extend are
/// "not held" and the new holder keeps the lock.
pub async fn release_after_expiry_is_not_held(backend: &Arc<dyn Backend>) {
    if !needs_ttl(backend.as_ref(), "release_after_expiry_is_not_held") {
        return;
    }
    let case = "release_after_expiry_is_not_held";
    judged_with_doubling_ttl(case, SHORT_TTL, |ttl| async move {
        let name = unique_name(case);
        let mut first = match fresh_lease(backend.as_ref(), &name, &short().ttl(ttl)).await {
            Ok(lease) => lease,
            Err(late) => return late,
        };
        sleep(ttl + Duration::from_millis(200)).await;
        // Not taken over yet: the expired lease still must not come back
        // to life.
        assert_not_held(backend.extend(&mut first).await, "extend after expiry");
        let second = must_acquire(backend.as_ref(), &name, &long()).await;
        assert_not_held(backend.release(&first).await, "release after takeover");
        assert_not_held(backend.extend(&mut first).await, "extend after takeover");
        assert_held(
            backend.as_ref(),
            &name,
            "the expired holder freed the new holder's lock",
        )
        .await;
        backend
            .release(&second)
            .await
            .expect("the new holder releases");
        Judged::Yes
    })
    .await;
}

/// Extending a lease keeps the lock past its original TTL and moves its
/// validity deadline. For session leases extend is a no-op that succeeds.
///
/// Decided on order: an extend answered after the lease's deadline is no
/// answer (the driver rightly calls it not held), and a look answered
/// after it proves nothing, so such a round cannot judge and runs again
/// with twice the TTL. A renewal that never reaches the server fails
/// every round.
pub async fn extend_keeps_the_lock(backend: &Arc<dyn Backend>) {
    const CASE: &str = "extend_keeps_the_lock";
    judged_with_doubling_ttl(CASE, SHORT_TTL, |ttl| async move {
        let name = unique_name(CASE);
        let mut lease = match fresh_lease(backend.as_ref(), &name, &short().ttl(ttl)).await {
            Ok(lease) => lease,
            Err(late) => return late,
        };
        let judged = extend_round(backend.as_ref(), &mut lease, ttl).await;
        let released = backend.release(&lease).await;
        if matches!(judged, Judged::Yes) {
            released.expect("release");
        }
        judged
    })
    .await;
}

/// Extends `lease` four times, a third of `ttl` apart, then checks that
/// the server still holds it, 4/3 of the TTL after the grant.
async fn extend_round(backend: &dyn Backend, lease: &mut Lease, ttl: Duration) -> Judged {
    let late = |what: &str, deadline: Instant| {
        Judged::No(format!(
            "{what} was answered {:?} after the lease's deadline",
            Instant::now().saturating_duration_since(deadline)
        ))
    };
    for _ in 0..4 {
        sleep(ttl / 3).await;
        let before = lease.valid_until();
        match backend.extend(lease).await {
            Ok(()) => {}
            // Not held, or a timeout, when answered past the deadline.
            Err(_) if before.is_some_and(|d| Instant::now() >= d) => {
                return late("an extend", before.unwrap_or_else(Instant::now));
            }
            Err(e) => panic!("extend while held: {e}"),
        }
        if let (Some(before), Some(after)) = (before, lease.valid_until()) {
            assert!(after > before, "extend moves the validity deadline");
        }
    }
    let deadline = lease.valid_until();
    match backend.try_acquire(lease.name(), &long()).await {
        Ok(None) => Judged::Yes,
        Ok(Some(second)) => {
            let _ = backend.release(&second).await;
            match deadline {
                Some(d) if Instant::now() >= d => late("the look", d),
                _ => panic!(
                    "{:?} was granted twice: an extended lock expired",
                    lease.name()
                ),
            }
        }
        Err(e) => panic!("try_acquire({:?}) failed: {e}", lease.name()),
    }
}

/// A holder that goes away without releasing (its client dropped, its
/// connections closed) frees the lock within its TTL plus a second, or with
/// its session.
pub async fn crashed_holder_frees_the_lock<F, Fut>(factory: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Backend>>,
{
    let ttl = Duration::from_secs(1);
    let name = unique_name("crashed_holder_frees_the_lock");
    let holder = factory().await;
    let lease = must_acquire(holder.as_ref(), &name, &LockOptions::new().ttl(ttl)).await;
    drop(lease);
    drop(holder);
    let other = factory().await;
    let started = Instant::now();
    let mut wait = ttl + Duration::from_secs(1);
    if other.capabilities().ttl_restarts_on_leader_change {
        // An election meanwhile starts the TTL again (see
        // `acquire_after_expiry`).
        wait *= 10;
    }
    let lease = other
        .acquire(&name, &long().wait(wait))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the crashed holder's lock was not free after {:?}: {e}",
                started.elapsed()
            )
        });
    other.release(&lease).await.expect("release");
}

/// A TTL with a fraction of a millisecond, and no drift allowance: the
/// server keeps the lock at least as long as the client trusts its lease
/// (TTLs go to servers rounded up, never down). Decided on order, not on
/// timing: a second grant whose reply arrived before the first lease's
/// deadline was made while both clients believed they held the name.
///
/// Rounded down to whole milliseconds, the 30.999999 ms TTL frees the
/// name at most 30 ms after the server got the request, which was before
/// its reply: a probe sent 30 ms after that reply finds the name free on
/// such a server. The fault shows only if that probe's reply also comes
/// back before the deadline, within the lost millisecond. A round where
/// it did is *sharp*: on a server that rounds down, one sharp round fails
/// the case for certain. The case runs rounds until it has a few sharp
/// ones, or up to its cap on a link too slow for any (it then prints so).
pub async fn ttl_fractions_are_rounded_up(backend: &Arc<dyn Backend>) {
    const CASE: &str = "ttl_fractions_are_rounded_up";
    const TTL: Duration = Duration::from_nanos(30_999_999);
    const ROUNDED_DOWN: Duration = Duration::from_millis(30);
    // Enough rounds that a loaded scheduler, which can hold a task off
    // for the whole window now and then, does not hide the fault.
    const SHARP_WANTED: u32 = 3;
    const MIN_ROUNDS: u32 = 20;
    const MAX_ROUNDS: u32 = 100;
    if !needs_ttl(backend.as_ref(), CASE) {
        return;
    }
    let opts = LockOptions::new()
        .ttl(TTL)
        .drift(Duration::ZERO)
        .renew(false);
    let (mut tries, mut rounds, mut sharp) = (0, 0, 0);
    while tries < MIN_ROUNDS || (sharp < SHARP_WANTED && tries < MAX_ROUNDS) {
        tries += 1;
        let name = unique_name(CASE);
        let first = backend
            .try_acquire(&name, &opts)
            .await
            .unwrap_or_else(|e| panic!("try_acquire({name:?}) failed: {e}"));
        let replied = Instant::now();
        // A grant whose reply came after its 31 ms lease ended (a loaded
        // machine) is no lease, by the contract: that round asks nothing.
        let Some(first) = first else { continue };
        rounds += 1;
        let deadline = first.valid_until().expect("TTL leases have a deadline");
        let freed_if_rounded_down = replied + ROUNDED_DOWN;
        // The probes that matter are sent from then on: sleep until just
        // before (timers are coarse), then ask back to back.
        sleep_until(freed_if_rounded_down - Duration::from_millis(1)).await;
        loop {
            let sent = Instant::now();
            if sent >= deadline {
                break;
            }
            let taken = backend
                .try_acquire(&name, &long())
                .await
                .unwrap_or_else(|e| panic!("try_acquire({name:?}) failed: {e}"));
            let arrived = Instant::now();
            if let Some(second) = taken {
                assert!(
                    arrived >= deadline,
                    "a second client was granted {name:?} {:?} before the first lease's \
                     deadline: the server freed the name before the client stopped trusting it",
                    deadline - arrived
                );
                backend.release(&second).await.expect("release");
                break;
            }
            if sent >= freed_if_rounded_down && arrived < deadline {
                sharp += 1;
                break;
            }
        }
    }
    assert!(
        rounds > 0,
        "no grant of a 31 ms lease arrived within it in {tries} tries"
    );
    if sharp < SHARP_WANTED {
        println!(
            "{CASE}: {sharp} of {rounds} rounds had a probe answered within the millisecond \
             a server rounding down would lose; a slower link cannot see that fault"
        );
    }
}
