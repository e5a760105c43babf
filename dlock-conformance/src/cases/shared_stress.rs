//! Many clients at once on a reader-writer lock and a semaphore, every
//! grant judged by the [`SharedChecker`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, LockOptions};
use tokio::time::sleep;

use super::{StressBudget, needs};
use crate::checker::SharedChecker;
use crate::support::{long, unique_name};

/// Clients per name, and grants per client on the reader-writer lock and on
/// the semaphore: 10,200 grants in all, or as many as
/// [`STRESS_TIME`](super::STRESS_TIME) gives once each client has made a
/// tenth of its own.
const CLIENTS: usize = 6;
const RW_GRANTS: usize = 1000;
const PERMIT_GRANTS: usize = 700;
const PERMITS: u32 = 3;

/// No writer beside anyone, never more than N permits, tokens a fenced store
/// accepts: 6 clients on a reader-writer lock (one grant in four a write)
/// and 6 on a semaphore of 3, over up to 10,200 grants, half the critical
/// sections spanning a 1 ms sleep. Prints the most readers and permit
/// holders seen at once.
///
/// A backend without wake-ups ([`Capabilities::notify`](dlock_core::Capabilities::notify)
/// off) hands a queued name over only when its next waiter polls, so it
/// gets a tenth of the grants (1,020).
pub async fn stress_shared_grants_respect_their_kind<F, Fut>(factory: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Backend>>,
{
    let case = "stress_shared_grants_respect_their_kind";
    let probe = factory().await;
    let caps = probe.capabilities();
    if !needs(
        case,
        caps.rwlock && caps.semaphore && caps.fencing,
        "the backend lacks reader-writer locks, semaphores or fencing",
    ) {
        return;
    }
    let scale = if caps.notify { 1 } else { 10 };
    let run = unique_name("stress_shared");
    let (rw, permits) = (
        Arc::new(SharedChecker::new()),
        Arc::new(SharedChecker::new()),
    );
    let mut tasks = Vec::new();
    for c in 0..CLIENTS * 2 {
        let backend = factory().await;
        let on_rw = c < CLIENTS;
        let (checker, name, grants) = if on_rw {
            (rw.clone(), format!("{run}-rw"), RW_GRANTS / scale)
        } else {
            (permits.clone(), format!("{run}-sem"), PERMIT_GRANTS / scale)
        };
        let budget = StressBudget::new(grants as u64);
        tasks.push(tokio::spawn(async move {
            let mut i = 0;
            while budget.more(i as u64) {
                let opts = match (on_rw, i % 4) {
                    (false, _) => long().permits(PERMITS),
                    (true, 0) => long().write(),
                    (true, _) => long().read(),
                };
                let opts: LockOptions = opts.wait(Duration::from_secs(60));
                let lease = backend
                    .acquire(&name, &opts)
                    .await
                    .unwrap_or_else(|e| panic!("client {c} on {name}: {e} ({e:?})"));
                checker.enter(lease.mode(), lease.fencing_token());
                if i % 2 == 0 {
                    sleep(Duration::from_millis(1)).await;
                } else {
                    tokio::task::yield_now().await;
                }
                checker.leave(lease.mode());
                backend
                    .release(&lease)
                    .await
                    .unwrap_or_else(|e| panic!("client {c} releasing {name}: {e} ({e:?})"));
                i += 1;
            }
            (on_rw, i as u64, budget.floor())
        }));
    }
    let (mut made_rw, mut made_permits) = (0, 0);
    for task in tasks {
        match task.await {
            Ok((on_rw, n, floor)) => {
                assert!(n >= floor, "a client made {n} grants, fewer than {floor}");
                *if on_rw {
                    &mut made_rw
                } else {
                    &mut made_permits
                } += n;
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    rw.assert_safe();
    permits.assert_safe();
    let (rw_grants, max_readers, _) = rw.counts();
    let (permit_grants, _, max_permits) = permits.counts();
    assert_eq!(rw_grants, made_rw, "the checker saw every grant made");
    assert_eq!(
        permit_grants, made_permits,
        "the checker saw every grant made"
    );
    // How many shared at once depends on the scheduler (and, without
    // wake-ups, on polls): reported, not judged. That readers share and
    // all N permits are granted is decided by `readers_share_…` and
    // `a_semaphore_admits_exactly_its_permits`.
    eprintln!(
        "{case}: {} grants of {}, at most {max_readers} readers and {max_permits} permit holders at once",
        rw_grants + permit_grants,
        CLIENTS * (RW_GRANTS + PERMIT_GRANTS) / scale
    );
}
