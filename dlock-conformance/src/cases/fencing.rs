//! Fencing and exclusion: fencing tokens strictly increase over the grants
//! of one name, and at no instant do two clients hold it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::Backend;
use tokio::time::sleep;

use super::{StressBudget, needs_fencing};
use crate::checker::Checker;
use crate::support::{long, must_acquire, unique_name};

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

/// Clients per name, names, and grants per client in the stress case:
/// 10,000 contended grants in all, or as many as [`STRESS_TIME`](super::STRESS_TIME) gives once
/// each client has made a tenth of its own (1,000 in all).
const STRESS: (usize, usize, u64) = (4, 2, 1250);

/// Many clients, each its own backend from the factory (its own
/// connections), contend on a few names; every grant passes through the
/// [`Checker`], which fails on any overlap of two
/// holders or any fencing token that does not increase.
pub async fn stress_contended_grants_are_exclusive<F, Fut>(factory: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Backend>>,
{
    let (per_name, names, grants) = STRESS;
    let budget = StressBudget::new(grants);
    let run = unique_name("stress");
    let mut tasks = Vec::new();
    let mut checkers = Vec::new();
    for n in 0..names {
        let checker = Arc::new(Checker::new());
        checkers.push(checker.clone());
        for c in 0..per_name {
            let backend = factory().await;
            let fenced = backend.capabilities().fencing;
            let checker = checker.clone();
            let name = format!("{run}-{n}");
            tasks.push(tokio::spawn(async move {
                let opts = long().wait(Duration::from_secs(60));
                let mut i = 0;
                while budget.more(i) {
                    let lease = backend
                        .acquire(&name, &opts)
                        .await
                        .unwrap_or_else(|e| panic!("client {c} on {name}: {e} ({e:?})"));
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
                        .unwrap_or_else(|e| panic!("client {c} releasing {name}: {e} ({e:?})"));
                    i += 1;
                }
                i
            }));
        }
    }
    let mut made = 0;
    for task in tasks {
        match task.await {
            Ok(n) => {
                assert!(n >= budget.floor(), "a client made {n} grants");
                made += n;
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    let total: u64 = checkers.iter().map(|c| c.grants()).sum();
    assert_eq!(total, made, "the checker saw every grant the clients made");
    eprintln!(
        "stress_contended_grants_are_exclusive: {made} grants of {}",
        per_name as u64 * names as u64 * grants
    );
    for checker in checkers {
        checker.assert_safe();
    }
}
