//! A queued waiter whose grant's reply was lost keeps its place in the
//! queue: the undo of the grant it never heard of gives the place back.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, Lease, LockOptions, OwnerToken};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};

use super::{FaultyFactory, REQUEST_TIMEOUT, bounded, warm_up};
use crate::Factory;
use crate::cases::needs;
use crate::proxy::Fault;
use crate::support::{long, must_acquire, unique_name};

/// Each waiter's wait, and so the bound on a deadlock: a correct driver is
/// done a few round trips after its link recovers.
const WAIT: Duration = Duration::from_secs(30);

/// The time the acquires of a held name are given for their first look
/// (over links that still pass), which queues them: the faulty reader's
/// must be answered before its link slows down (a wait rides out the
/// failure of a later look, but need not ride out its first's).
const QUEUEING: Duration = Duration::from_millis(500);

/// An acquire waiting on a task of its own.
type Waiting = JoinHandle<dlock_core::Result<Lease>>;

/// `backend` acquiring `name` with `opts` and a wait of [`WAIT`], on a
/// task of its own, so that the case acts while it waits.
fn wait_for(backend: &Arc<dyn Backend>, name: &str, opts: LockOptions) -> Waiting {
    let (backend, name) = (backend.clone(), name.to_owned());
    tokio::spawn(async move { backend.acquire(&name, &opts.wait(WAIT)).await })
}

/// The lease `task` got.
///
/// # Panics
/// When it got none: `who` was not granted.
async fn granted(task: Waiting, who: &str) -> Lease {
    match task.await {
        Ok(Ok(lease)) => lease,
        Ok(Err(e)) => panic!("{who} was not granted: {e}"),
        Err(e) => panic!("{who}'s task: {e}"),
    }
}

/// Checks that `task` still waits, for a case that decides on order: a
/// grant now would be `who` granted `out_of_turn`.
///
/// # Panics
/// When the task has ended, granted or not.
async fn still_waiting(task: &mut Waiting, who: &str, out_of_turn: &str) {
    if !task.is_finished() {
        return;
    }
    match task.await {
        Ok(Ok(_)) => panic!("{who} was granted {out_of_turn}"),
        Ok(Err(e)) => panic!("{who} stopped waiting: {e}"),
        Err(e) => panic!("{who}'s task: {e}"),
    }
}

/// Whether a hold of `name` that is not `first`'s shows: the faulty
/// reader's grant, on the server while its reply crosses the slowed link
/// (for at least the link's delay, until the undo's release arrives).
/// Looked for until the reader's acquire ends, or for two request timeouts:
/// its next look (woken by the release, or at its next poll) and that
/// look's way to the server.
async fn grant_landed(
    client: &dyn Backend,
    name: &str,
    first: OwnerToken,
    reader: &Waiting,
) -> bool {
    let started = Instant::now();
    while !reader.is_finished() && started.elapsed() < REQUEST_TIMEOUT * 2 {
        let holds = client
            .holders(name)
            .await
            .unwrap_or_else(|e| panic!("holders({name:?}) failed: {e}"));
        if holds.iter().any(|hold| hold.owner != first) {
            return true;
        }
        sleep(Duration::from_millis(5)).await;
    }
    false
}

/// A writer holds; a healthy reader, then the faulty client's reader,
/// queue behind it. The faulty client's link is slowed to 3/5 of the
/// request timeout each way, and the writer releases: the first reader is
/// let in, and the faulty reader's next look reaches the server within
/// its request's timeout and is granted, but its reply comes back only
/// after it, so the driver must undo a grant it never heard of. Once that
/// grant shows on the server a healthy writer queues, and the link
/// recovers a request timeout later (the look timed out by then).
///
/// The faulty reader must be granted, beside the first reader, with the
/// writer still waiting: the undo gives the reader its place back, ahead
/// of the writer. Sent to the back instead, it waits behind the writer,
/// which waits for the first reader, which the case keeps until the faulty
/// reader is granted: nobody moves until the reader's 30 s wait ends.
/// Decided on order, not on time: a correct driver is done within a few
/// round trips of the recovered link. Needs reader-writer locks and
/// [`Capabilities::cleanup`](dlock_core::Capabilities::cleanup). A driver
/// whose grant does not show on the server while its reply is late (its
/// request timeout outlasts the slowed round trip, say) loses no reply;
/// the order is judged all the same.
pub async fn a_lost_grant_keeps_the_waiters_place(faulty: FaultyFactory, client: Factory) {
    const CASE: &str = "a_lost_grant_keeps_the_waiters_place";
    bounded(CASE, async move {
        let other = client().await;
        let caps = other.capabilities();
        if !needs(CASE, caps.rwlock, "the backend has no reader-writer locks")
            || !needs(
                CASE,
                caps.cleanup,
                "the backend does not declare cleanup of unknown outcomes",
            )
        {
            return;
        }
        let f = faulty().await;
        warm_up(f.backend.as_ref()).await;
        let name = unique_name("lost_grant");
        let writer = must_acquire(other.as_ref(), &name, &long().write()).await;
        let mut first = wait_for(&other, &name, long().read());
        let queued = Instant::now();
        let mut reader = wait_for(&f.backend, &name, long().read());
        sleep(QUEUEING).await;
        let beside = "beside the writer";
        still_waiting(&mut first, "a reader queued behind a writer", beside).await;
        still_waiting(&mut reader, "the faulty client's reader", beside).await;

        f.link.set(Fault::Delay(REQUEST_TIMEOUT * 3 / 5));
        other.release(&writer).await.expect("release the writer");
        let first = granted(first, "the first queued reader").await;
        let landed = grant_landed(other.as_ref(), &name, first.owner(), &reader).await;
        // Queued after the faulty reader's grant: behind its place.
        let mut next_writer = wait_for(&other, &name, long().write());
        if landed {
            // The grant's reply is due a request timeout or more after
            // its request was sent, which was at least 3/5 of one ago.
            sleep(REQUEST_TIMEOUT).await;
        } else {
            eprintln!(
                "{CASE}: the faulty reader's grant did not show on the server within {:?}: no \
                 reply was lost, and the order is judged all the same",
                REQUEST_TIMEOUT * 2
            );
        }
        f.link.set(Fault::Pass);

        let reader = match reader.await {
            Ok(Ok(lease)) => lease,
            Ok(Err(e)) if queued.elapsed() >= WAIT => panic!(
                "{name:?}: a waiter whose grant's reply was lost lost its place in the queue: \
                 the faulty client's reader (its grant showed on the server while the reply \
                 was late: {landed}) still waited after {WAIT:?} ({e}), behind the writer \
                 that queued after that grant, which waits for the reader let in beside it. \
                 The undo of a grant of unknown outcome must give the waiter its place back"
            ),
            Ok(Err(e)) => panic!(
                "the faulty client's reader failed after {:?} ({e}): a wait must ride out a \
                 reply lost to its request's timeout",
                queued.elapsed()
            ),
            Err(e) => panic!("the faulty client's reader's task: {e}"),
        };
        still_waiting(
            &mut next_writer,
            "the writer that queued after the faulty reader's grant",
            "beside the two readers",
        )
        .await;
        other
            .release(&first)
            .await
            .expect("release the first reader");
        f.backend
            .release(&reader)
            .await
            .expect("release the faulty client's reader");
        let next_writer = granted(next_writer, "the writer queued after the readers").await;
        other
            .release(&next_writer)
            .await
            .expect("release the writer");
    })
    .await;
}
