//! A holder cut off from its server loses the lock before anyone else is
//! granted it, and the stale holder's fencing token is refused after.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Guard, LockOptions, Locker};
use tokio::time::{Instant, sleep, timeout};

use super::{FaultyFactory, bounded};
use crate::Factory;
use crate::checker::Checker;
use crate::proxy::Fault;
use crate::support::{must_lock, unique_name};

/// The holder is cut off from its server (or its link hangs) while it
/// holds the lock. Its guard's `lost()` must fire before any other client
/// is granted the lock, another client must then get the lock, and the
/// stale holder's fencing token must be refused by the protected resource.
/// A backend whose server frees a hold when its connection closes
/// ([`freed_on_disconnect`](dlock_core::Capabilities::freed_on_disconnect))
/// cannot tell its holder first when the link is closed: there `lost()`
/// must fire soon after, and the fencing token refuse the holder meanwhile.
pub async fn cut_holder_loses_the_lock_before_takeover(faulty: FaultyFactory, client: Factory) {
    holder_loses_the_lock_before_takeover(
        "cut_holder_loses_the_lock_before_takeover",
        faulty,
        client,
        Fault::Cut,
    )
    .await;
}

/// As [`cut_holder_loses_the_lock_before_takeover`], with the holder's link
/// hanging instead of closed: no error comes back, requests just never end.
pub async fn stalled_holder_loses_the_lock_before_takeover(faulty: FaultyFactory, client: Factory) {
    holder_loses_the_lock_before_takeover(
        "stalled_holder_loses_the_lock_before_takeover",
        faulty,
        client,
        Fault::Stall,
    )
    .await;
}

/// How soon a holder whose server freed its hold when the link closed
/// ([`freed_on_disconnect`](dlock_core::Capabilities::freed_on_disconnect))
/// must learn it: its next probe, within a probe period and a request
/// timeout (a second and two by the drivers' defaults), with room for a
/// loaded machine.
const LEARNS_WITHIN: Duration = Duration::from_secs(10);

/// A guard of a fresh name that a renewal has extended (a lease with no
/// TTL: held for `ttl / 2`), so that the fault, not a slow first round
/// trip, is what ends it: on a loaded machine an acquire and its first
/// renewal may take longer than the TTL together, and that lease ends
/// before any fault, as it should. Such a lease is dropped and another
/// name tried, five times at most.
async fn renewed_once(holder: &Locker, opts: &LockOptions, ttl: Duration) -> (String, Guard) {
    for _ in 0..5 {
        let name = unique_name("cut_off_holder");
        let guard = must_lock(holder, &name, opts).await;
        let Some(granted) = guard.valid_until() else {
            sleep(ttl / 2).await;
            return (name, guard);
        };
        let renewed = async {
            while guard.valid_until().is_some_and(|until| until <= granted) {
                sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::select! {
            () = renewed => if guard.is_valid() {
                return (name, guard);
            },
            () = guard.lost() => {}
        }
        eprintln!("the lease of {name} ended before its first renewal; another name");
    }
    panic!("no lease lasted to its first renewal in five tries");
}

async fn holder_loses_the_lock_before_takeover(
    case: &str,
    faulty: FaultyFactory,
    client: Factory,
    fault: Fault,
) {
    bounded(case, async move {
        let f = faulty().await;
        let holder = Locker::from_arc(f.backend.clone());
        let other = client().await;
        let fenced = other.capabilities().fencing;

        let ttl = Duration::from_secs(1);
        let opts = LockOptions::new().ttl(ttl);
        let checker = Arc::new(Checker::new());
        let (name, guard) = renewed_once(&holder, &opts, ttl).await;
        let guard = Arc::new(guard);
        let token = guard.fencing_token();
        checker.enter(0, fenced.then_some(token));
        // The holder works until its guard says the lease is lost.
        let watcher = {
            let guard = guard.clone();
            let checker = checker.clone();
            tokio::spawn(async move {
                guard.lost().await;
                checker.leave(0);
                Instant::now()
            })
        };

        assert!(guard.is_valid(), "the guard is valid before the fault");
        let faulted = Instant::now();
        f.link.set(fault);

        let lease = other
            .acquire(&name, &opts.clone().wait(Duration::from_secs(30)))
            .await
            .expect("another client gets the lock after the holder is cut off");
        let granted = Instant::now();
        if fault == Fault::Cut && other.capabilities().freed_on_disconnect {
            // The server freed the hold when the link closed, before the
            // holder could know: the rule is that it learns soon, and that
            // the fencing token refuses it meanwhile.
            assert!(
                fenced,
                "holds that end with their connection need fencing tokens"
            );
            let lost_at = timeout(LEARNS_WITHIN, watcher)
                .await
                .expect("lost() fires soon after the link closed")
                .expect("watcher task");
            checker.enter(1, Some(lease.fencing_token()));
            checker.leave(1);
            eprintln!(
                "{case}: the holder learned {:?} after the takeover (the fencing token covers it)",
                lost_at.saturating_duration_since(granted)
            );
        } else {
            checker.enter(1, fenced.then(|| lease.fencing_token()));
            checker.leave(1);
            let lost_at = timeout(Duration::from_secs(1), watcher)
                .await
                .expect("lost() fired before the takeover")
                .expect("watcher task");
            // A TTL lease's belief ended at its deadline, which the watcher
            // learns when it is next scheduled: judged by the deadline, a
            // loaded machine's late wake-up is not taken for a late loss.
            let believed_until = guard.valid_until().unwrap_or(lost_at).min(lost_at);
            assert!(
                believed_until <= granted,
                "the holder believed until {:?}, after the takeover at {:?} (fault at 0)",
                believed_until - faulted,
                granted - faulted
            );
        }
        assert!(!guard.is_valid(), "a lost guard is invalid");
        if fenced {
            assert!(
                lease.fencing_token() > token,
                "the takeover carries a greater token"
            );
            assert!(
                !checker.would_accept(token),
                "the protected resource must refuse the stale holder's token"
            );
        }
        checker.assert_safe();
        other.release(&lease).await.expect("release");
        f.link.set(Fault::Pass);
    })
    .await;
}
