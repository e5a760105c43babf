//! Reader-writer locks: readers share, a writer holds alone, a waiting
//! writer keeps new readers out, the readers queued behind a writer enter
//! together, a downgrade lets no writer in, and a name is one kind of lock
//! at a time.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, Error, Lease, LockOptions, Mode};
use tokio::task::JoinHandle;
use tokio::time::sleep;

use super::{assert_not_held, needs};
use crate::support::{long, must_acquire, unique_name};

fn needs_rwlock(backend: &dyn Backend, case: &str) -> bool {
    let rwlock = backend.capabilities().rwlock;
    needs(case, rwlock, "the backend has no reader-writer locks")
}

/// How long a spawned acquire is given to reach the server's queue.
const QUEUE_TIME: Duration = Duration::from_millis(300);

async fn try_in(backend: &dyn Backend, name: &str, opts: &LockOptions) -> Option<Lease> {
    backend
        .try_acquire(name, opts)
        .await
        .unwrap_or_else(|e| panic!("try_acquire({name:?}, {}): {e}", opts.get_mode()))
}

/// Starts a waiting acquire and gives it time to queue.
async fn waiting(
    backend: &Arc<dyn Backend>,
    name: &str,
    opts: LockOptions,
) -> JoinHandle<dlock_core::Result<Lease>> {
    let (backend, name) = (backend.clone(), name.to_owned());
    let task = tokio::spawn(async move {
        backend
            .acquire(&name, &opts.wait(Duration::from_secs(30)))
            .await
    });
    sleep(QUEUE_TIME).await;
    task
}

async fn granted(task: JoinHandle<dlock_core::Result<Lease>>, who: &str) -> Lease {
    task.await
        .unwrap_or_else(|e| panic!("{who}'s task: {e}"))
        .unwrap_or_else(|e| panic!("{who} was not granted: {e}"))
}

/// Two readers hold at once; no writer beside them; once they are gone a
/// writer holds alone, with no reader beside it.
pub async fn readers_share_and_writers_hold_alone(backend: &Arc<dyn Backend>) {
    let case = "readers_share_and_writers_hold_alone";
    if !needs_rwlock(backend.as_ref(), case) {
        return;
    }
    let name = unique_name(case);
    let b = backend.as_ref();
    let first = must_acquire(b, &name, &long().read()).await;
    let second = try_in(b, &name, &long().read())
        .await
        .expect("a second reader beside a reader was refused: readers must share");
    assert!(
        try_in(b, &name, &long().write()).await.is_none(),
        "a writer was granted beside two readers"
    );
    b.release(&first).await.expect("release a reader");
    b.release(&second).await.expect("release a reader");
    let writer = try_in(b, &name, &long().write())
        .await
        .expect("a writer was refused a free lock");
    assert!(
        try_in(b, &name, &long().read()).await.is_none(),
        "a reader was granted beside a writer"
    );
    assert!(
        try_in(b, &name, &long().write()).await.is_none(),
        "a second writer was granted beside a writer"
    );
    b.release(&writer).await.expect("release the writer");
}

/// While a writer waits for readers to finish, a new reader is not let in
/// (else a steady stream of readers starves writers for ever).
pub async fn a_waiting_writer_keeps_new_readers_out(backend: &Arc<dyn Backend>) {
    let case = "a_waiting_writer_keeps_new_readers_out";
    if !needs_rwlock(backend.as_ref(), case) {
        return;
    }
    let name = unique_name(case);
    let b = backend.as_ref();
    let reader = must_acquire(b, &name, &long().read()).await;
    let writer = waiting(backend, &name, long().write()).await;
    assert!(
        !writer.is_finished(),
        "a writer was granted beside a reader"
    );
    // Decided on order, not on time: readers are let in until the writer
    // has queued, and from then on, never. A scheduler that holds the
    // writer back only makes this loop longer.
    let mut refused = 0;
    for _ in 0..100 {
        match try_in(b, &name, &long().read()).await {
            Some(late) => {
                assert!(
                    refused == 0,
                    "a new reader was let in after one was refused: the writer left the queue"
                );
                b.release(&late).await.expect("release a reader");
                sleep(Duration::from_millis(100)).await;
            }
            None => refused += 1,
        }
        if refused == 3 {
            break;
        }
    }
    assert!(
        refused > 0,
        "new readers were let in for 10 s while a writer waited: writers can starve"
    );
    b.release(&reader).await.expect("release the reader");
    let writer = granted(writer, "the waiting writer").await;
    b.release(&writer).await.expect("release the writer");
}

/// Readers queued behind a writer all enter when it releases, together;
/// a writer that comes while they hold waits for both.
///
/// The later writer asks only once both readers hold: asked earlier, it
/// could reach the server's queue before the second reader (whose first
/// look a loaded machine can delay by any time), and would then rightly
/// wait for the first reader, which this case holds until the second
/// enters.
pub async fn queued_readers_enter_together(backend: &Arc<dyn Backend>) {
    let case = "queued_readers_enter_together";
    if !needs_rwlock(backend.as_ref(), case) {
        return;
    }
    let name = unique_name(case);
    let b = backend.as_ref();
    let writer = must_acquire(b, &name, &long().write()).await;
    let first = waiting(backend, &name, long().read()).await;
    let second = waiting(backend, &name, long().read()).await;
    b.release(&writer).await.expect("release the writer");
    // Neither reader releases before both hold: readers admitted one at
    // a time would leave the second waiting here for ever.
    let first = granted(first, "the first queued reader").await;
    let second = granted(second, "the second queued reader").await;
    let next_writer = waiting(backend, &name, long().write()).await;
    assert!(
        !next_writer.is_finished(),
        "a writer was granted beside two readers"
    );
    b.release(&first).await.expect("release a reader");
    assert!(
        !next_writer.is_finished(),
        "a writer was granted beside a reader"
    );
    b.release(&second).await.expect("release a reader");
    let next_writer = granted(next_writer, "the writer that came after the readers").await;
    b.release(&next_writer).await.expect("release the writer");
}

/// A writer that downgrades holds a read lock before its write lock ends,
/// so a writer waiting meanwhile gets in only after the downgraded reader
/// is done (a downgrade that releases first lets it in between), with a
/// token above the reader's (though it asked first).
pub async fn a_downgrade_lets_no_writer_in(backend: &Arc<dyn Backend>) {
    let case = "a_downgrade_lets_no_writer_in";
    if !needs_rwlock(backend.as_ref(), case) {
        return;
    }
    let name = unique_name(case);
    let b = backend.as_ref();
    let writer = must_acquire(b, &name, &long().write()).await;
    let next_writer = waiting(backend, &name, long().write()).await;
    let reader = match b.downgrade(&writer, &long()).await {
        Ok(reader) => reader,
        Err(dlock_core::Error::Unsupported { .. }) => {
            eprintln!("{case}: not applicable: the backend does not downgrade");
            next_writer.abort();
            b.release(&writer).await.expect("release the write lock");
            return;
        }
        Err(e) => panic!("a write holder's downgrade was refused: {e}"),
    };
    assert_eq!(reader.mode(), Mode::Read, "a downgrade gave {:?}", reader);
    assert!(
        reader.fencing_token() > writer.fencing_token(),
        "the downgrade's token {} is not above the writer's {}",
        reader.fencing_token(),
        writer.fencing_token()
    );
    b.release(&writer).await.expect("release the write lock");
    sleep(QUEUE_TIME).await;
    assert!(
        !next_writer.is_finished(),
        "a waiting writer got in between a downgrade and the reader's release"
    );
    b.release(&reader)
        .await
        .expect("release the downgraded reader");
    let next_writer = granted(next_writer, "the waiting writer").await;
    assert!(
        next_writer.fencing_token() > reader.fencing_token(),
        "the next writer's token {} is not above the downgraded reader's {}",
        next_writer.fencing_token(),
        reader.fencing_token()
    );
    // A lease that is no longer the write holder cannot downgrade.
    assert_not_held(
        b.downgrade(&writer, &long()).await,
        "downgrade of a released write lease",
    );
    b.release(&next_writer).await.expect("release the writer");
}

/// A name is one kind of lock at a time: a reader-writer lock, a mutex
/// and semaphores of other sizes are refused with `ModeConflict` while it
/// is held, never granted beside its holders.
pub async fn one_name_is_one_kind_of_lock(backend: &Arc<dyn Backend>) {
    let case = "one_name_is_one_kind_of_lock";
    let caps = backend.capabilities();
    if !needs(
        case,
        caps.rwlock || caps.semaphore,
        "the backend has only mutexes",
    ) {
        return;
    }
    let name = unique_name(case);
    let b = backend.as_ref();
    let (held, others) = if caps.semaphore {
        let a = must_acquire(b, &name, &long().permits(2)).await;
        let second = must_acquire(b, &name, &long().permits(2)).await;
        let mut others = vec![long().permits(3), long()];
        if caps.rwlock {
            others.push(long().read());
        }
        (vec![a, second], others)
    } else {
        (
            vec![must_acquire(b, &name, &long().read()).await],
            vec![long()],
        )
    };
    let held_as = format!("held as a {}", held[0].mode());
    for opts in others {
        let what = format!("a {}", opts.get_mode());
        refused(b, &name, &opts, &what, &held_as).await;
    }
    for lease in held {
        b.release(&lease).await.expect("release");
    }
    // A reader-writer lock keeps mutexes out too, and a mutex or a reader
    // keeps permits out: each kind meets every other one first.
    if caps.rwlock && caps.semaphore {
        let name = unique_name(case);
        let reader = must_acquire(b, &name, &long().read()).await;
        refused(b, &name, &long(), "a mutex", "held for reading").await;
        refused(b, &name, &long().permits(2), "a permit", "held for reading").await;
        b.release(&reader).await.expect("release");
    }
    if caps.semaphore {
        let name = unique_name(case);
        let mutex = must_acquire(b, &name, &long()).await;
        refused(b, &name, &long().permits(2), "a permit", "held as a mutex").await;
        b.release(&mutex).await.expect("release");
    }
    // A mutex keeps readers and writers out, a writer keeps mutexes out,
    // and once each is released the name takes any kind again.
    if caps.rwlock {
        let name = unique_name(case);
        let mutex = must_acquire(b, &name, &long()).await;
        refused(b, &name, &long().read(), "a reader", "held as a mutex").await;
        refused(b, &name, &long().write(), "a writer", "held as a mutex").await;
        b.release(&mutex).await.expect("release");
        let writer = must_acquire(b, &name, &long().write()).await;
        refused(b, &name, &long(), "a mutex", "held for writing").await;
        b.release(&writer).await.expect("release");
        let mutex = must_acquire(b, &name, &long()).await;
        b.release(&mutex).await.expect("release");
        let reader = must_acquire(b, &name, &long().read()).await;
        b.release(&reader).await.expect("release");
    }
}

/// Asserts that `opts` on `name` is refused as another kind of lock, tried
/// and waited for: a wait is refused at once too, not left to wait out the
/// holds of the other kind.
async fn refused(b: &dyn Backend, name: &str, opts: &LockOptions, what: &str, held: &str) {
    match b.try_acquire(name, opts).await {
        Err(Error::ModeConflict { .. }) => {}
        Ok(Some(lease)) => {
            b.release(&lease).await.ok();
            panic!("{what} was granted on a name {held}");
        }
        other => panic!("{what} on a name {held}: expected ModeConflict, got {other:?}"),
    }
    match b
        .acquire(name, &opts.clone().wait(Duration::from_secs(3)))
        .await
    {
        Err(Error::ModeConflict { .. }) => {}
        Ok(lease) => {
            b.release(&lease).await.ok();
            panic!("a wait for {what} was granted on a name {held}");
        }
        Err(other) => {
            panic!("a wait for {what} on a name {held}: expected ModeConflict, got {other}")
        }
    }
}

/// Fencing tokens increase over every grant of a name, whatever its kind:
/// a mutex, then writers and readers, then permits.
pub async fn fencing_increases_across_kinds(backend: &Arc<dyn Backend>) {
    let case = "fencing_increases_across_kinds";
    let caps = backend.capabilities();
    if !needs(
        case,
        caps.fencing && caps.rwlock && caps.semaphore,
        "the backend lacks fencing, reader-writer locks or semaphores",
    ) {
        return;
    }
    let name = unique_name(case);
    let b = backend.as_ref();
    let mut last = 0;
    for opts in [
        long(),
        long().write(),
        long().read(),
        long().permits(2),
        long(),
    ] {
        let first = must_acquire(b, &name, &opts).await;
        let mut leases = vec![first];
        if opts.get_mode().is_shared() {
            leases.push(must_acquire(b, &name, &opts).await);
        }
        for lease in &leases {
            assert!(
                lease.fencing_token() > last,
                "a {} got token {} after an earlier grant's {last}",
                opts.get_mode(),
                lease.fencing_token()
            );
            last = lease.fencing_token();
        }
        for lease in leases {
            b.release(&lease).await.expect("release");
        }
    }
}
