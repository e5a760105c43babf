//! The cases of the suite: one public async fn per rule of the contract.
//!
//! Each case takes a backend, uses fresh random lock names, panics with a
//! message naming the broken rule when the backend breaks it, and skips
//! itself, saying so, when the backend lacks the capability the rule needs.
//! The list of cases grows with releases; it is not a semver promise.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    Backend, Error, Guard, Lease, LeaseKind, LockOptions, Locker, OwnerToken, validate_name,
};
use tokio::time::{Instant, sleep};

use crate::support::unique_name;
use crate::support::{long, must_acquire};

/// A short TTL, for cases that let leases expire.
const SHORT_TTL: Duration = Duration::from_millis(400);

fn short() -> LockOptions {
    LockOptions::new().ttl(SHORT_TTL)
}

pub(crate) fn needs_ttl(backend: &dyn Backend, case: &str) -> bool {
    let ok = backend.capabilities().lease == LeaseKind::Ttl;
    if !ok {
        eprintln!("{case}: not applicable: the backend has session leases, not TTLs");
    }
    ok
}

fn needs_fencing(backend: &dyn Backend, case: &str) -> bool {
    let ok = backend.capabilities().fencing;
    if !ok {
        eprintln!("{case}: not applicable: the backend has no fencing tokens");
    }
    ok
}

async fn assert_held(backend: &dyn Backend, name: &str, why: &str) {
    match backend.try_acquire(name, &long()).await {
        Ok(None) => {}
        Ok(Some(_)) => panic!("{name:?} was granted twice: {why}"),
        Err(e) => panic!("try_acquire({name:?}) failed: {e}"),
    }
}

fn assert_not_held<T: std::fmt::Debug>(result: dlock_core::Result<T>, what: &str) {
    match result {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("{what}: expected Error::NotHeld, got {other:?}"),
    }
}

/// A lease for `name` that the server never granted: what a client that
/// guessed or forged a lease holds.
fn foreign_lease(name: &str) -> Lease {
    let owner = OwnerToken::random().expect("the OS has randomness");
    Lease::with_ttl(name, owner, 1, &long(), Instant::now())
}

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
    let mut forged = foreign_lease(&name);
    assert_not_held(backend.release(&forged).await, "release by a foreign lease");
    assert_not_held(
        backend.extend(&mut forged).await,
        "extend by a foreign lease",
    );
    assert_held(backend.as_ref(), &name, "a foreign lease freed the lock").await;
    backend.release(&holder).await.expect("the holder releases");
    // And on a name nobody holds.
    let free = foreign_lease(&unique_name("foreign_lease_is_not_held"));
    assert_not_held(backend.release(&free).await, "release of a free lock");
}

/// A TTL lease that is not extended expires on the server, and another
/// client can take the lock over.
pub async fn expiry_then_takeover(backend: &Arc<dyn Backend>) {
    if !needs_ttl(backend.as_ref(), "expiry_then_takeover") {
        return;
    }
    let name = unique_name("expiry_then_takeover");
    let first = must_acquire(backend.as_ref(), &name, &short()).await;
    let deadline = first.valid_until().expect("TTL leases have a deadline");
    assert!(
        deadline <= Instant::now() + SHORT_TTL,
        "validity is counted from before the request"
    );
    sleep(SHORT_TTL + Duration::from_millis(200)).await;
    assert!(!first.is_valid(), "the lease is invalid after its TTL");
    let second = must_acquire(backend.as_ref(), &name, &long()).await;
    if backend.capabilities().fencing {
        assert!(
            second.fencing_token() > first.fencing_token(),
            "takeover must carry a greater fencing token ({} then {})",
            first.fencing_token(),
            second.fencing_token()
        );
    }
    backend.release(&second).await.expect("release");
}

/// After expiry and takeover, the first holder's release and extend are
/// "not held" and the new holder keeps the lock.
pub async fn release_after_expiry_is_not_held(backend: &Arc<dyn Backend>) {
    if !needs_ttl(backend.as_ref(), "release_after_expiry_is_not_held") {
        return;
    }
    let name = unique_name("release_after_expiry_is_not_held");
    let mut first = must_acquire(backend.as_ref(), &name, &short()).await;
    sleep(SHORT_TTL + Duration::from_millis(200)).await;
    // Not taken over yet: the expired lease still must not come back to life.
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
}

/// Extending a lease keeps the lock past its original TTL and moves its
/// validity deadline. For session leases extend is a no-op that succeeds.
pub async fn extend_keeps_the_lock(backend: &Arc<dyn Backend>) {
    let name = unique_name("extend_keeps_the_lock");
    let mut lease = must_acquire(backend.as_ref(), &name, &short()).await;
    for _ in 0..4 {
        sleep(SHORT_TTL / 3).await;
        let before = lease.valid_until();
        backend.extend(&mut lease).await.expect("extend while held");
        if let (Some(before), Some(after)) = (before, lease.valid_until()) {
            assert!(after > before, "extend moves the validity deadline");
        }
    }
    // 4/3 of the TTL has passed since the grant.
    assert!(lease.is_valid(), "the extended lease is valid");
    assert_held(backend.as_ref(), &name, "an extended lock expired").await;
    backend.release(&lease).await.expect("release");
}

/// Fencing tokens strictly increase over successive grants of one name.
pub async fn fencing_increases_across_grants(backend: &Arc<dyn Backend>) {
    if !needs_fencing(backend.as_ref(), "fencing_increases_across_grants") {
        return;
    }
    let name = unique_name("fencing_increases_across_grants");
    let mut last = 0;
    for i in 0..5 {
        let lease = must_acquire(backend.as_ref(), &name, &long()).await;
        assert!(
            lease.fencing_token() > last,
            "grant {i}: fencing token {} is not greater than {last}",
            lease.fencing_token()
        );
        last = lease.fencing_token();
        backend.release(&lease).await.expect("release");
    }
}

/// `acquire` on a held lock gives `Error::Timeout` once the wait bound has
/// passed, and not long after; a zero bound makes one attempt.
pub async fn acquire_times_out_within_wait_bound(backend: &Arc<dyn Backend>) {
    let name = unique_name("acquire_times_out_within_wait_bound");
    let holder = must_acquire(backend.as_ref(), &name, &long()).await;
    for wait in [Duration::ZERO, Duration::from_millis(300)] {
        let started = Instant::now();
        let result = backend.acquire(&name, &long().wait(wait)).await;
        let took = started.elapsed();
        assert!(
            matches!(result, Err(Error::Timeout { .. })),
            "acquire with wait {wait:?} on a held lock: expected Timeout, got {result:?}"
        );
        assert!(
            took >= wait,
            "gave up after {took:?}, before the {wait:?} bound"
        );
        // The bound plus one round trip; generous for a loaded CI machine.
        assert!(
            took < wait + Duration::from_secs(2),
            "acquire with wait {wait:?} took {took:?}"
        );
    }
    backend.release(&holder).await.expect("release");
}

/// A waiter gets the lock soon after the holder releases it, long before
/// the holder's TTL would have freed it.
pub async fn waiter_acquires_after_release(backend: &Arc<dyn Backend>) {
    let name = unique_name("waiter_acquires_after_release");
    let holder = must_acquire(backend.as_ref(), &name, &long()).await;
    let waiter = {
        let backend = backend.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let lease = backend
                .acquire(&name, &long().wait(Duration::from_secs(30)))
                .await;
            (lease, Instant::now())
        })
    };
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let released = Instant::now();
    backend.release(&holder).await.expect("release");
    let (lease, granted) = waiter.await.expect("waiter task");
    let lease = lease.expect("the waiter acquires after release");
    let after = granted - released;
    assert!(
        after < Duration::from_secs(5),
        "the waiter took {after:?} after the release"
    );
    backend.release(&lease).await.expect("release");
}

/// Names that are easy to map onto one key by mistake are distinct locks.
pub async fn tricky_names_are_distinct(backend: &Arc<dyn Backend>) {
    let id = format!("{:08x}", fastrand::u32(..));
    let mut names: Vec<String> = [
        "a/b",
        "a%2Fb",
        "a_b",
        "a{b}",
        "{a}b",
        "}x",
        "{",
        "}",
        "Job",
        "job",
        "JOB",
        "🔒 lock",
        "with space",
        "with  space",
        ".",
        "..",
        "/",
        "//",
        "a:b",
        "a\\b",
        "é",
        "e\u{301}",
        "tab\tx",
        "line\nx",
        "*",
        "?",
    ]
    .iter()
    .map(|n| format!("{n}{id}"))
    .collect();
    // SQL's PAD SPACE collations compare these equal to `pad<id>`.
    names.extend([
        format!("pad{id}"),
        format!("pad{id} "),
        format!("pad{id}  "),
    ]);
    names.push(format!("{}{id}", "x".repeat(255 - id.len())));
    names.push(format!("{}{id}", "é".repeat((255 - id.len()) / 2)));
    for n in &names {
        validate_name(n).expect("test names are legal");
    }
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "the test's names repeat");
    let mut leases = Vec::new();
    for n in &names {
        let lease = backend
            .try_acquire(n, &long())
            .await
            .unwrap_or_else(|e| panic!("try_acquire({n:?}) failed: {e}"))
            .unwrap_or_else(|| panic!("{n:?} was held already: it shares a key with another name"));
        leases.push(lease);
    }
    for (n, lease) in names.iter().zip(&leases) {
        let info = backend.inspect(n).await.expect("inspect").expect("held");
        assert_eq!(
            info.owner,
            lease.owner(),
            "{n:?} reports another name's holder"
        );
    }
    for lease in &leases {
        backend.release(lease).await.expect("release");
    }
}

/// Illegal names give `Error::InvalidName` from every operation.
pub async fn invalid_names_are_rejected(backend: &Arc<dyn Backend>) {
    for name in [
        String::new(),
        "x".repeat(256),
        "a\0b".to_owned(),
        "é".repeat(128),
    ] {
        let shown = format!("{:?}", name.chars().take(12).collect::<String>());
        let r = backend.try_acquire(&name, &long()).await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "try_acquire({shown}): {r:?}"
        );
        let r = backend.acquire(&name, &long().wait(Duration::ZERO)).await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "acquire({shown}): {r:?}"
        );
        let r = backend.inspect(&name).await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "inspect({shown}): {r:?}"
        );
    }
}

/// Out-of-range options give `Error::InvalidOption`.
pub async fn invalid_options_are_rejected(backend: &Arc<dyn Backend>) {
    let name = unique_name("invalid_options_are_rejected");
    for opts in [
        LockOptions::new().ttl(Duration::ZERO),
        LockOptions::new().ttl(Duration::from_secs(400 * 24 * 3600)),
        LockOptions::new()
            .ttl(Duration::from_secs(1))
            .drift(Duration::from_secs(1)),
    ] {
        let r = backend.try_acquire(&name, &opts).await;
        assert!(
            matches!(r, Err(Error::InvalidOption { .. })),
            "{opts:?}: {r:?}"
        );
        let r = backend.acquire(&name, &opts).await;
        assert!(
            matches!(r, Err(Error::InvalidOption { .. })),
            "{opts:?}: {r:?}"
        );
    }
    assert!(
        backend.inspect(&name).await.expect("inspect").is_none(),
        "a refused acquire took the lock"
    );
}

/// A guard renews its lease in the background, so it outlives its TTL.
pub async fn guard_renews_past_ttl(backend: &Arc<dyn Backend>) {
    if !needs_ttl(backend.as_ref(), "guard_renews_past_ttl") {
        return;
    }
    let name = unique_name("guard_renews_past_ttl");
    let locker = Locker::from_arc(backend.clone());
    let guard = locker
        .try_acquire(&name, &short())
        .await
        .expect("try_acquire")
        .expect("free");
    sleep(SHORT_TTL * 3).await;
    assert!(guard.is_valid(), "the renewed guard is valid after 3 TTLs");
    assert_held(backend.as_ref(), &name, "a renewed guard's lock expired").await;
    guard.release().await.expect("release");
}

/// `extend_many` judges each lease by its own owner token: it extends the
/// leases that still hold their names and reports the others not held, a
/// stale lease next to the new holder of its name among them, and it never
/// touches a lock that a lease of the batch no longer holds.
pub async fn extend_many_acts_per_lease(backend: &Arc<dyn Backend>) {
    let case = "extend_many_acts_per_lease";
    if !needs_ttl(backend.as_ref(), case) {
        return;
    }
    // Longer than the suite's short TTL: four round trips fit before the
    // batch with room to spare on a loaded server.
    let ttl = Duration::from_millis(1200);
    let opts = LockOptions::new().ttl(ttl);
    let names: Vec<String> = (0..4).map(|_| unique_name(case)).collect();
    let [kept, taken, never, elsewhere] = names.as_slice() else {
        unreachable!("four names")
    };
    let holder = must_acquire(backend.as_ref(), kept, &opts).await;
    let stale = must_acquire(backend.as_ref(), taken, &opts).await;
    backend.release(&stale).await.expect("release");
    let current = must_acquire(backend.as_ref(), taken, &opts).await;
    let gone = must_acquire(backend.as_ref(), elsewhere, &opts).await;
    backend.release(&gone).await.expect("release");
    // Its new holder is not in the batch: only an owner check keeps the
    // batch from moving its expiry.
    let outsider = must_acquire(backend.as_ref(), elsewhere, &long()).await;
    let owner = OwnerToken::random().expect("random");
    let foreign = Lease::with_ttl(never, owner, 1, &opts, Instant::now());
    // Late in the first TTL, so that the leases outlive it only if extended.
    sleep(ttl * 5 / 8).await;
    let mut batch = vec![stale, holder, foreign, current, gone];
    let held = backend.extend_many(&mut batch).await.expect("extend_many");
    assert_eq!(
        held,
        [false, true, false, true, false],
        "extend_many must judge each lease by its own owner token: [a stale \
         lease, its holder, a lease never granted, the name's new holder, a \
         stale lease whose name another holds]"
    );
    let left = backend
        .inspect(elsewhere)
        .await
        .expect("inspect")
        .and_then(|info| info.expires_in);
    assert!(
        left.is_none_or(|left| left > Duration::from_secs(30)),
        "extend_many moved the expiry of a lock its lease no longer holds ({left:?} left)"
    );
    sleep(ttl * 5 / 8).await;
    for (lease, name) in [(&batch[1], kept), (&batch[3], taken)] {
        assert!(
            lease.is_valid(),
            "an extended lease's deadline did not move"
        );
        assert_held(
            backend.as_ref(),
            name,
            "extend_many did not extend the lock",
        )
        .await;
    }
    assert!(
        backend.inspect(never).await.expect("inspect").is_none(),
        "extend_many created a lock for a lease never granted"
    );
    for lease in [&batch[1], &batch[3], &outsider] {
        backend.release(lease).await.expect("release");
    }
}

/// Renewing many guards together, the renewal that finds a lock taken
/// over tells that guard `lost()` well before its lease would have run out,
/// and the guards renewed with it keep their locks.
pub async fn batch_renewal_loses_only_the_taken_over_guard(backend: &Arc<dyn Backend>) {
    let case = "batch_renewal_loses_only_the_taken_over_guard";
    if !needs_ttl(backend.as_ref(), case) {
        return;
    }
    let ttl = Duration::from_millis(1200);
    let opts = LockOptions::new().ttl(ttl);
    let locker = Locker::from_arc(backend.clone());
    let mut guards = Vec::new();
    for _ in 0..8 {
        let name = unique_name(case);
        guards.push(
            locker
                .try_acquire(&name, &opts)
                .await
                .expect("try_acquire")
                .expect("free"),
        );
    }
    let victim = guards.remove(3);
    backend.release(victim.lease()).await.expect("release");
    let thief = must_acquire(backend.as_ref(), victim.name(), &long()).await;
    let deadline = victim.valid_until().expect("a TTL lease");
    // The first renewal, at a third of the TTL, finds the lock taken.
    tokio::time::timeout_at(deadline - ttl / 4, victim.lost())
        .await
        .expect("the guard whose lock was taken over is told lost() at its next renewal");
    sleep(ttl * 2).await;
    for guard in &guards {
        assert!(
            guard.is_valid(),
            "a guard renewed with a lost one was lost too"
        );
        assert_held(
            backend.as_ref(),
            guard.name(),
            "a renewed guard's lock expired",
        )
        .await;
    }
    for guard in guards {
        guard.release().await.expect("release");
    }
    backend.release(&thief).await.expect("release");
}

/// Without renewal a guard's `lost()` resolves when its lease runs out.
pub async fn guard_lost_fires_at_expiry(backend: &Arc<dyn Backend>) {
    if !needs_ttl(backend.as_ref(), "guard_lost_fires_at_expiry") {
        return;
    }
    let name = unique_name("guard_lost_fires_at_expiry");
    let locker = Locker::from_arc(backend.clone());
    let guard = locker
        .try_acquire(&name, &short().renew(false))
        .await
        .expect("try_acquire")
        .expect("free");
    let started = Instant::now();
    tokio::time::timeout(SHORT_TTL * 3, guard.lost())
        .await
        .expect("lost() resolves when the lease runs out");
    assert!(
        started.elapsed() < SHORT_TTL,
        "lost() must fire before the server's TTL ends"
    );
    assert!(!guard.is_valid(), "a lost guard is invalid");
    drop(guard);
}

/// Dropping a guard releases the lock in the background, long before its TTL.
pub async fn guard_drop_releases(backend: &Arc<dyn Backend>) {
    let name = unique_name("guard_drop_releases");
    let locker = Locker::from_arc(backend.clone());
    let guard: Guard = locker
        .try_acquire(&name, &long())
        .await
        .expect("try_acquire")
        .expect("free");
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
        .expect("with_lock");
    assert!(
        matches!(value, Ok(None)),
        "the lock must be held inside with_lock, got {value:?}"
    );
    assert!(
        backend.inspect(&name).await.expect("inspect").is_none(),
        "with_lock releases when the closure ends"
    );
}

/// Clients per name, names, and grants per client in the stress case:
/// 10,000 contended grants in all.
const STRESS: (usize, usize, u64) = (4, 2, 1250);

/// Many clients, each its own backend from the factory (its own
/// connections), contend on a few names; every grant passes through the
/// [`Checker`](crate::checker::Checker), which fails on any overlap of two
/// holders or any fencing token that does not increase.
pub async fn stress_contended_grants_are_exclusive<F, Fut>(factory: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn Backend>>,
{
    let (per_name, names, grants) = STRESS;
    let run = unique_name("stress");
    let mut tasks = Vec::new();
    let mut checkers = Vec::new();
    for n in 0..names {
        let checker = Arc::new(crate::checker::Checker::new());
        checkers.push(checker.clone());
        for c in 0..per_name {
            let backend = factory().await;
            let fenced = backend.capabilities().fencing;
            let checker = checker.clone();
            let name = format!("{run}-{n}");
            tasks.push(tokio::spawn(async move {
                let opts = long().wait(Duration::from_secs(60));
                for i in 0..grants {
                    let lease = backend
                        .acquire(&name, &opts)
                        .await
                        .unwrap_or_else(|e| panic!("client {c} on {name}: {e}"));
                    checker.enter(c, fenced.then(|| lease.fencing_token()));
                    // The critical section spans real waits, as real work
                    // does: a driver that grants twice gets caught inside.
                    if i % 4 == 0 {
                        sleep(Duration::from_millis(1)).await;
                    } else {
                        tokio::task::yield_now().await;
                    }
                    checker.leave(c);
                    backend
                        .release(&lease)
                        .await
                        .unwrap_or_else(|e| panic!("client {c} releasing {name}: {e}"));
                }
            }));
        }
    }
    for task in tasks {
        if let Err(e) = task.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let total: u64 = checkers.iter().map(|c| c.grants()).sum();
    assert_eq!(total, per_name as u64 * names as u64 * grants);
    for checker in checkers {
        checker.assert_safe();
    }
}

/// An acquire future dropped at any point (before its request is sent,
/// mid-flight, while waiting in a queue) leaves no lock behind beyond the
/// TTL: once the holder releases, another client gets the name within a
/// TTL plus a second.
pub async fn dropped_acquire_leaves_no_lock(backend: &Arc<dyn Backend>) {
    let ttl = Duration::from_millis(500);
    let opts = LockOptions::new().ttl(ttl);
    for step in 0..16u64 {
        // Uncontended: dropped somewhere between sending and the reply.
        let name = unique_name("dropped_acquire_leaves_no_lock");
        let cut = Duration::from_micros(step * 200);
        if let Ok(done) = tokio::time::timeout(cut, backend.acquire(&name, &opts)).await {
            // Not dropped after all: the grant is the caller's to release.
            let lease = done.expect("acquire");
            backend.release(&lease).await.expect("release");
        }
        let lease = backend
            .acquire(&name, &opts.clone().wait(ttl + Duration::from_secs(1)))
            .await
            .unwrap_or_else(|e| panic!("dropped after {cut:?}: the name stayed locked: {e}"));
        backend.release(&lease).await.expect("release");
    }
    // Contended: dropped while waiting behind a holder.
    let name = unique_name("dropped_acquire_leaves_no_lock");
    let holder = must_acquire(backend.as_ref(), &name, &long()).await;
    let patient = opts.clone().wait(Duration::from_secs(30));
    for step in 0..5u64 {
        let cut = Duration::from_millis(step * 20);
        let waiting = backend.acquire(&name, &patient);
        assert!(
            tokio::time::timeout(cut, waiting).await.is_err(),
            "a waiter got a held lock"
        );
    }
    backend.release(&holder).await.expect("release");
    let lease = backend
        .acquire(&name, &opts.clone().wait(ttl + Duration::from_secs(1)))
        .await
        .expect("dropped waiters left the name locked");
    backend.release(&lease).await.expect("release");
}

/// A holder that goes away without releasing (its client dropped, its
/// connections closed) frees the lock within its TTL plus a second, or with
/// its session.
pub async fn crashed_holder_frees_the_lock<F, Fut>(factory: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn Backend>>,
{
    let ttl = Duration::from_secs(1);
    let name = unique_name("crashed_holder_frees_the_lock");
    let holder = factory().await;
    let lease = holder
        .try_acquire(&name, &LockOptions::new().ttl(ttl))
        .await
        .expect("try_acquire")
        .expect("free");
    drop(lease);
    drop(holder);
    let other = factory().await;
    let started = Instant::now();
    let lease = other
        .acquire(&name, &long().wait(ttl + Duration::from_secs(1)))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "the crashed holder's lock was not free after {:?}: {e}",
                started.elapsed()
            )
        });
    other.release(&lease).await.expect("release");
}

/// `list` pages through the held locks under a prefix: every held name
/// shows with its holder, released names and names outside the prefix do
/// not. Drivers that cannot list say so (`Unsupported`) and the case passes.
pub async fn list_pages_through_held_locks(backend: &Arc<dyn Backend>) {
    let prefix = format!("{}/", unique_name("list"));
    let mut held = std::collections::BTreeMap::new();
    for suffix in ["a", "b", "c", "d}", "e%7D", "é f", "g/h"] {
        let name = format!("{prefix}{suffix}");
        let lease = must_acquire(backend.as_ref(), &name, &long()).await;
        held.insert(name, lease);
    }
    let released = must_acquire(backend.as_ref(), &format!("{prefix}released"), &long()).await;
    backend.release(&released).await.expect("release");
    let outside_name = format!("{}x", &prefix[..prefix.len() - 1]);
    let outside = must_acquire(backend.as_ref(), &outside_name, &long()).await;

    let mut seen = std::collections::BTreeMap::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        assert!(page < 100, "list never reached its last page");
        let listed = match backend.list(&prefix, cursor.as_deref(), 2).await {
            Ok(listed) => listed,
            Err(Error::Unsupported { .. }) => {
                eprintln!("list_pages_through_held_locks: not applicable: the backend cannot list");
                return;
            }
            Err(e) => panic!("list failed: {e}"),
        };
        for lock in listed.locks {
            seen.insert(lock.name, lock.info);
        }
        match listed.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let names: Vec<&String> = seen.keys().collect();
    let expected: Vec<&String> = held.keys().collect();
    assert_eq!(
        names, expected,
        "list shows exactly the held names under the prefix"
    );
    for (name, info) in &seen {
        let lease = &held[name];
        assert_eq!(info.owner, lease.owner(), "{name:?} lists another holder");
        if backend.capabilities().fencing {
            assert_eq!(info.fencing_token, lease.fencing_token(), "{name:?}");
        }
    }
    for lease in held.values() {
        backend.release(lease).await.expect("release");
    }
    backend.release(&outside).await.expect("release");
}

fn needs_delayed_release(backend: &dyn Backend, case: &str) -> bool {
    let ok = backend.capabilities().delayed_release;
    if !ok {
        eprintln!("{case}: not applicable: the backend has no delayed release");
    }
    ok
}

/// The hold the delayed-release cases ask for.
const HOLD: Duration = Duration::from_secs(1);

/// How much earlier than the hold a grant may come: the hold starts when
/// the server handles `release_after`, before its reply is in.
const HOLD_SLACK: Duration = Duration::from_millis(100);

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
    let first = must_acquire(backend.as_ref(), &name, &long()).await;
    backend
        .release_after(&first, HOLD)
        .await
        .expect("release_after");
    let since = Instant::now();
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
            .release_after(&foreign_lease(&name), Duration::from_secs(30))
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
    Fut: std::future::Future<Output = Arc<dyn Backend>>,
{
    let case = "release_after_outlives_its_client";
    let holder = factory().await;
    if !needs_delayed_release(holder.as_ref(), case) {
        return;
    }
    let name = unique_name(case);
    let first = must_acquire(holder.as_ref(), &name, &long()).await;
    holder
        .release_after(&first, HOLD)
        .await
        .expect("release_after");
    let since = Instant::now();
    drop(holder);
    let other = factory().await;
    // Long enough for a closed session's nodes to be gone.
    sleep(HOLD / 2).await;
    assert_held(
        other.as_ref(),
        &name,
        "within the hold, after the client that made it went away",
    )
    .await;
    wait_out_the_hold(other.as_ref(), &name, since, &first).await;
}

/// `force_release` frees a held name whoever holds it, and reports the
/// holder; the next grant's fencing token is greater, and the old holder's
/// lease is "not held". A free name gives `None`; a delayed release's hold
/// ends too.
pub async fn force_release_frees_the_name_for_the_next_holder(backend: &Arc<dyn Backend>) {
    let case = "force_release_frees_the_name_for_the_next_holder";
    let name = unique_name(case);
    let held = must_acquire(backend.as_ref(), &name, &long()).await;
    let removed = backend
        .force_release(&name)
        .await
        .expect("force_release")
        .unwrap_or_else(|| panic!("force_release of a held name reported it free"));
    assert_eq!(
        removed.owner,
        held.owner(),
        "force_release reported another holder"
    );
    let next = must_acquire(backend.as_ref(), &name, &long()).await;
    if backend.capabilities().fencing {
        assert!(next.fencing_token() > held.fencing_token());
    }
    assert_not_held(
        backend.release(&held).await,
        "release by the removed holder",
    );
    backend
        .release(&next)
        .await
        .expect("the new holder's release");
    assert!(
        backend
            .force_release(&name)
            .await
            .expect("force_release")
            .is_none(),
        "force_release of a free name reported a holder"
    );
    if backend.capabilities().delayed_release {
        let last = must_acquire(backend.as_ref(), &name, &long()).await;
        backend
            .release_after(&last, Duration::from_secs(60))
            .await
            .expect("release_after");
        assert!(
            backend
                .force_release(&name)
                .await
                .expect("force_release")
                .is_some(),
            "force_release did not see the hold of a delayed release"
        );
        let after = must_acquire(backend.as_ref(), &name, &long()).await;
        backend.release(&after).await.expect("release");
    }
}
