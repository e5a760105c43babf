//! Guards: a guard renews its lease in the background, says through
//! `lost()` when the lease can no longer be trusted, and releases when
//! dropped; `with_lock` runs its closure under the lock.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, Error, Guard, LeaseKind, LockOptions, Locker};
use tokio::time::{Instant, sleep, sleep_until};

use super::{
    Judged, SHORT_TTL, assert_held_by, fresh_guard, judged_with_doubling_ttl, needs_ttl,
    server_ttl, short,
};
use crate::support::{long, must_lock, unique_name};

/// A guard renews its lease in the background, so it outlives its TTL.
/// Each renewal must come back before the lease's deadline: a round where
/// one came later (a loaded server) runs again with twice the TTL; a guard
/// that does not renew is lost in every round.
pub async fn guard_renews_past_ttl(backend: &Arc<dyn Backend>) {
    let case = "guard_renews_past_ttl";
    if !needs_ttl(backend.as_ref(), case) {
        return;
    }
    judged_with_doubling_ttl(case, SHORT_TTL, |ttl| async move {
        let name = unique_name(case);
        let locker = Locker::from_arc(backend.clone());
        let guard = match fresh_guard(&locker, &name, &short().ttl(ttl)).await {
            Ok(guard) => guard,
            Err(late) => return late,
        };
        sleep(ttl * 3).await;
        if !guard.is_valid() {
            return Judged::No("the guard was lost within 3 TTLs".to_owned());
        }
        if let Err(late) =
            assert_held_by(backend.as_ref(), &guard, "a renewed guard's lock expired").await
        {
            return late;
        }
        // A renewal that came late (a loaded machine) lets the lease run
        // out on the server; the guard then stops trusting it, so a
        // "not held" is wrong only while the guard still trusted its lease.
        let trusted_until = guard.valid_until();
        match guard.release().await {
            Ok(()) => Judged::Yes,
            Err(Error::NotHeld { .. }) if trusted_until.is_none_or(|t| t <= Instant::now()) => {
                Judged::No("the lease ran out before the release reached the server".to_owned())
            }
            Err(e) => panic!("release of a guard that trusted its lease: {e}"),
        }
    })
    .await;
}

/// Without renewal a guard's `lost()` resolves when its lease runs out.
pub async fn guard_lost_fires_at_expiry(backend: &Arc<dyn Backend>) {
    if !needs_ttl(backend.as_ref(), "guard_lost_fires_at_expiry") {
        return;
    }
    let case = "guard_lost_fires_at_expiry";
    judged_with_doubling_ttl(case, SHORT_TTL, |ttl| async move {
        let name = unique_name(case);
        let locker = Locker::from_arc(backend.clone());
        let opts = short().ttl(ttl);
        let guard = match fresh_guard(&locker, &name, &opts.clone().renew(false)).await {
            Ok(guard) => guard,
            Err(late) => return late,
        };
        // Judged on the deadline the guard keeps, not on when a timer woke
        // this task: on loaded cores a timer fires late by any amount, while
        // the deadline says exactly when the guard stops trusting its lease.
        let arrived = Instant::now();
        let deadline = guard
            .valid_until()
            .expect("a TTL lease has a validity deadline");
        assert!(
            deadline <= arrived + (ttl - opts.get_drift()),
            "the guard trusts its lease until {:?} after the grant arrived, past the server's TTL",
            deadline - arrived
        );
        // Liveness only: the verdict above does not rest on this bound.
        tokio::time::timeout(Duration::from_secs(10), guard.lost())
            .await
            .expect("lost() resolves when the lease runs out");
        assert!(
            Instant::now() >= deadline,
            "lost() fired while the lease was still good"
        );
        assert!(!guard.is_valid(), "a lost guard is invalid");
        Judged::Yes
    })
    .await;
}

/// On a session backend, `opts` (with an option that needs TTL leases) is
/// refused as `Unsupported` naming `operation`, and nothing is locked.
async fn refused_on_sessions(
    backend: &Arc<dyn Backend>,
    case: &str,
    opts: &LockOptions,
    operation: &str,
) {
    let locker = Locker::from_arc(backend.clone());
    let r = locker.try_acquire(&unique_name(case), opts).await;
    assert!(
        matches!(&r, Err(Error::Unsupported { operation: o, .. }) if *o == operation),
        "{operation} on session leases: {r:?}"
    );
}

/// `max_hold` bounds renewal: a guard renewed until it has been held that
/// long is lost at its lease's end after it, and the server frees the name
/// by then (the lease it was last renewed to, in the server's TTL steps),
/// so another client takes it within that TTL. A session backend, whose
/// leases nothing would end, refuses the option.
pub async fn max_hold_ends_the_hold(backend: &Arc<dyn Backend>) {
    let case = "max_hold_ends_the_hold";
    if backend.capabilities().lease == LeaseKind::Session {
        let opts = long().max_hold(Duration::from_secs(1));
        return refused_on_sessions(backend, case, &opts, "max_hold").await;
    }
    judged_with_doubling_ttl(case, SHORT_TTL, |ttl| async move {
        let name = unique_name(case);
        let locker = Locker::from_arc(backend.clone());
        let opts = short().ttl(ttl).max_hold(ttl);
        let guard = match fresh_guard(&locker, &name, &opts).await {
            Ok(guard) => guard,
            Err(late) => return late,
        };
        let granted_until = guard.valid_until();
        // Liveness only: renewal stops after a TTL, the lease ends a TTL on.
        tokio::time::timeout(ttl * 4 + Duration::from_secs(10), guard.lost())
            .await
            .expect("renewed past max_hold");
        if guard.valid_until() == granted_until {
            // Lost before its first renewal (a loaded machine): nothing
            // was extended whose end could be judged.
            return Judged::No("the guard was never renewed".to_owned());
        }
        let other = Locker::from_arc(backend.clone());
        let wait = long().wait(server_ttl(backend.as_ref(), ttl));
        match other.acquire(&name, &wait).await {
            Ok(next) => {
                next.release().await.expect("release");
                Judged::Yes
            }
            Err(Error::Timeout { .. }) => {
                Judged::No("the name was still held a TTL after the guard was lost".to_owned())
            }
            Err(e) => panic!("acquire after the bounded hold: {e}"),
        }
    })
    .await;
}

/// Dropping a guard releases the lock in the background, long before its TTL.
pub async fn guard_drop_releases(backend: &Arc<dyn Backend>) {
    let name = unique_name("guard_drop_releases");
    let locker = Locker::from_arc(backend.clone());
    let guard: Guard = must_lock(&locker, &name, &long()).await;
    drop(guard);
    let started = Instant::now();
    loop {
        if backend.inspect(&name).await.expect("inspect").is_none() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the dropped guard's lock is still held"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// `with_lock` runs the closure while holding the lock and releases after.
pub async fn with_lock_runs_under_the_lock(backend: &Arc<dyn Backend>) {
    let name = unique_name("with_lock_runs_under_the_lock");
    let locker = Locker::from_arc(backend.clone());
    let value = locker
        .with_lock(&name, &long(), async |guard| {
            assert!(guard.is_valid());
            backend.try_acquire(&name, &long()).await
        })
        .await
        .expect("with_lock")
        .into_result()
        .expect("with_lock's release");
    assert!(
        matches!(value, Ok(None)),
        "the lock must be held inside with_lock, got {value:?}"
    );
    assert!(
        backend.inspect(&name).await.expect("inspect").is_none(),
        "with_lock releases when the closure ends"
    );
}

/// A lock-delay keeps a name whose lease ended without a release from
/// everyone for the delay more: asked before the trusted deadline plus the
/// delay (the server keeps it at least the drift allowance longer), the
/// name is held; it is free once the delay has passed; a released name is
/// free at once. A session backend, whose server frees a lost session's
/// locks at once, refuses the option.
pub async fn lock_delay_keeps_an_unreleased_name(backend: &Arc<dyn Backend>) {
    let case = "lock_delay_keeps_an_unreleased_name";
    if backend.capabilities().lease == LeaseKind::Session {
        let opts = long().lock_delay(Duration::from_secs(1));
        return refused_on_sessions(backend, case, &opts, "lock_delay").await;
    }
    judged_with_doubling_ttl(case, SHORT_TTL, |ttl| async move {
        let (name, delay) = (unique_name(case), ttl * 2);
        let (locker, other) = (
            Locker::from_arc(backend.clone()),
            Locker::from_arc(backend.clone()),
        );
        let paused = short().ttl(ttl).lock_delay(delay).renew(false);
        let guard = match fresh_guard(&locker, &name, &paused).await {
            Ok(guard) => guard,
            Err(late) => return late,
        };
        let trusted = guard.valid_until().expect("a TTL lease has a deadline");
        // Liveness only: the lease runs out at its TTL.
        tokio::time::timeout(ttl * 4 + Duration::from_secs(10), guard.lost())
            .await
            .expect("lost() at the lease's end");
        // Dropped lost: a guard with a lock-delay leaves its name to the
        // server (released, it would be free at once).
        drop(guard);
        // Halfway through the delay: a server that kept the grant only as
        // long as its holder trusted it has let it go by now, however late
        // the grant's request reached it (its answer came before the
        // deadline).
        sleep_until(trusted + delay / 2).await;
        let during = other.try_acquire(&name, &long()).await;
        // A grant whose answer is in before the trusted deadline plus the
        // delay was made before it: the server keeps the name at least
        // that long (and a drift allowance more). A later answer may come
        // from a server that ran the request after it: no verdict.
        let answered = Instant::now();
        match during {
            Ok(None) => {}
            Ok(Some(_)) if answered >= trusted + delay => {
                return Judged::No("the answer came once the delay had passed".to_owned());
            }
            Ok(Some(_)) => panic!(
                "granted {:?} after the lease's end, within its lock-delay of {delay:?}",
                answered.saturating_duration_since(trusted)
            ),
            Err(e) => panic!("try_acquire during the lock-delay: {e}"),
        }
        let wait = long().wait(server_ttl(backend.as_ref(), ttl + delay) * 2);
        match other.acquire(&name, &wait).await {
            Ok(next) => next.release().await.expect("release"),
            Err(Error::Timeout { .. }) => {
                return Judged::No("still held well after the TTL and the delay".to_owned());
            }
            Err(e) => panic!("acquire after the lock-delay: {e}"),
        }
        let released = unique_name(case);
        let done = must_lock(&locker, &released, &long().lock_delay(delay)).await;
        done.release().await.expect("release");
        let next = other.try_acquire(&released, &long()).await;
        assert!(
            matches!(next, Ok(Some(_))),
            "a released name was delayed: {next:?}"
        );
        Judged::Yes
    })
    .await;
}

/// Several names at once: with one name of the set held elsewhere,
/// `acquire_all` gives up at its wait bound naming it, and `try_acquire_all`
/// at once, each leaving the other names free; once it is free, the whole
/// set is taken, each name with its own lease and token.
pub async fn acquire_all_takes_all_or_none(backend: &Arc<dyn Backend>) {
    let case = "acquire_all_takes_all_or_none";
    let (a, b) = (unique_name(case), unique_name(case));
    let (locker, other) = (
        Locker::from_arc(backend.clone()),
        Locker::from_arc(backend.clone()),
    );
    let held = must_lock(&other, &b, &long()).await;
    let set = [a.as_str(), b.as_str()];
    let wait = long().wait(Duration::from_millis(300));
    match locker.acquire_all(&set, &wait).await {
        Err(Error::Timeout { name, .. }) => assert_eq!(name, b, "the name waited for"),
        other => panic!("acquire_all with {b:?} held: {other:?}"),
    }
    let left = backend.inspect(&a).await.expect("inspect");
    assert!(left.is_none(), "a failed acquire_all kept {a:?}: {left:?}");
    let tried = locker.try_acquire_all(&set, &long()).await.expect("try");
    assert!(tried.is_none(), "try_acquire_all took a held name");
    let left = backend.inspect(&a).await.expect("inspect");
    assert!(
        left.is_none(),
        "a failed try_acquire_all kept {a:?}: {left:?}"
    );
    held.release().await.expect("release");
    let both = locker
        .acquire_all(&set, &long().wait(Duration::from_secs(10)))
        .await
        .expect("the whole set, once free");
    for name in set {
        let seen = backend.inspect(name).await.expect("inspect");
        let token = both.fencing_token(name).expect("a token per name");
        assert!(
            seen.is_some_and(|info| !backend.capabilities().fencing || info.fencing_token == token),
            "{name:?} not held with its own token"
        );
    }
    both.release().await.expect("release");
}
