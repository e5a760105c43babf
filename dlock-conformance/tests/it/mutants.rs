//! The suite catches broken drivers. A small driver simulated in memory
//! (a lock server, and a link to it that the fault cases can delay, stall
//! or cut) is run with one bug at a time, each one that real lock
//! libraries have shipped; the cases that guard against that bug, link
//! fault cases included, must fail. The driver without a bug is the
//! control: it must pass the whole suite.
//!
//! `tests/it/readme.rs` reads this file: the README's mutant table and its
//! "caught by" columns must match [`Bug`] and the `caught!` list below.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock_conformance::faults::{FaultRun, FaultyFactory};
use dlock_conformance::{Factory, MutexAs, fault_suite, suite};
use tokio::time::timeout;

mod server;
mod sim;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    /// Names and options are not checked (a bare `Backend` that skips
    /// what core does for every `Driver`).
    NoValidation,
    /// Release deletes whoever holds the name (`DELETE … WHERE name = ?`).
    ReleaseWithoutOwnerCheck,
    /// Release reports success and deletes nothing (a statement keyed on
    /// the wrong column): the name stays held until its TTL.
    ReleaseDoesNothing,
    /// The client counts the lease from a clock running ahead of the server's.
    SkewedClock,
    /// The fencing counter starts over (Redis restarted without persistence).
    ResettingFence,
    /// Extend reports success and does nothing.
    ExtendDoesNothing,
    /// The server keeps a grant for as long as its client trusts it (the
    /// TTL less the drift allowance and any lock-delay), not for the TTL
    /// it was sent: a lock-delay is lost.
    ServerTtlFromValidity,
    /// Extend gives the server the TTL in seconds where it counts
    /// milliseconds (`EXPIRE` for `PEXPIRE`): an extended lock outlives
    /// its lease a thousandfold.
    ExtendInSeconds,
    /// The server treats an expired holder as alive.
    TryIgnoresExpiry,
    /// Waiters are not woken on release: they look again only when the
    /// holder's lease would have ended.
    NoWakeup,
    /// Acquire reads the lock, then writes it in a second request: two
    /// clients can both see it free and both take it. Declares no fencing,
    /// so only the checker's overlap test can catch it.
    RacyCheckThenSet,
    /// The lease is counted from when the reply arrived, not from before
    /// the request was sent.
    ValidityFromReply,
    /// A grant whose reply arrived after its validity deadline is returned
    /// as a success.
    ExpiredOnArrival,
    /// Requests have no timeout and acquire no overall bound: a stalled
    /// server holds the caller forever.
    IgnoresWaitBound,
    /// An acquire dropped or timed out while its request is in flight is
    /// not undone: the name stays locked for the whole TTL.
    NoCleanup,
    /// `list` shows every row, released and expired ones too (a `SELECT`
    /// without the expiry condition).
    ListShowsFreeLocks,
    /// `release_after` releases at once (the hold is ignored).
    ReleaseAfterFreesAtOnce,
    /// `release_after` keeps the lease's own TTL instead of the hold.
    ReleaseAfterKeepsTheLeaseTtl,
    /// `release_after` sets the hold on whoever holds the name.
    ReleaseAfterWithoutOwnerCheck,
    /// The hold is kept by the client (as a session's ephemeral node
    /// would be): it ends when the client goes away.
    HoldEndsWithClient,
    /// `release_after` leaves the lease's owner on the hold, so the
    /// released lease (or a renewal still in flight) can still release or
    /// extend it.
    ReleaseAfterKeepsOwner,
    /// `force_release` reports the holder but removes nothing (a delete
    /// keyed on the wrong row).
    ForceReleaseOnlyReports,
    /// `holders` shows one hold, as `inspect` does (the trait's default,
    /// kept by a driver with shared kinds).
    HoldersShowOne,
    /// `force_release` of a name held by several readers or permits ends
    /// the one `inspect` shows, and the others hold on.
    ForceReleaseEndsOneHold,
    /// A reader's delayed release keeps every request out, readers too (a
    /// hold made the mutex's way).
    ReadHoldIsExclusive,
    /// Grants store no holder description.
    HolderNotStored,
    /// A grant stores its client's `host:pid`, not the holder description
    /// its options give (one description per connection).
    HolderOfTheClient,
    /// `extend_many` checks ownership by name: a lease counts as extended
    /// when any lease of the batch holds its name (a stale lease next to
    /// the name's new holder, say).
    BatchOwnerByName,
    /// `extend_many` fails the whole batch as not held when one lease is.
    BatchFailsAsAWhole,
    /// `extend_many` extends every named lock, owner or not (`UPDATE …
    /// WHERE name IN (…)`), and reports the owner check's result.
    BatchExtendsWithoutOwnerCheck,
    /// Each request is bounded, the call is not: `list` sends a request
    /// that timed out again, twice, each time with the whole request
    /// timeout (as a client library's retries do).
    BoundPerRequest,
    /// The TTL goes to the server truncated to whole milliseconds
    /// (`as_millis()`), so the server frees the name up to 1 ms before the
    /// client stops trusting its lease.
    TruncatedTtl,
    /// A reader is admitted while a writer holds.
    ReaderBesideWriter,
    /// A writer is admitted while readers hold.
    WriterBesideReaders,
    /// New readers are admitted while a writer waits (Redisson's read-write
    /// lock): a stream of readers starves writers.
    NoWriterPreference,
    /// A queued reader is admitted only when nobody holds: readers behind
    /// a writer enter one by one, not together.
    QueuedReadersOneByOne,
    /// A downgrade releases the write lock, then asks for a read lock: a
    /// waiting writer gets in between (CURATOR-621).
    DowngradeReleasesFirst,
    /// A shared waiter's fencing token is drawn when it queues, not when
    /// it is granted (a token from its queue node's sequence number): a
    /// writer that queued before a downgrade gets a token below the
    /// downgraded reader's.
    TokenDrawnAtQueueing,
    /// A semaphore admits one holder more than its permits.
    OverAdmitsByOne,
    /// Expired permits still count against the semaphore, which fills up
    /// with the dead.
    ExpiredPermitCounted,
    /// Renewing an expired permit brings it back.
    RenewalResurrects,
    /// Renewing an expired permit brings it back, and says it did not.
    RenewalResurrectsSilently,
    /// Semaphores asked for with different permit counts are taken as one,
    /// each caller judging by its own count (Curator's warning).
    PermitCountsUnchecked,
    /// A permit is granted on a name held as a mutex: the semaphore looks
    /// only at its own permits.
    PermitIgnoresMutex,
    /// Each kind of lock has its own fencing counter: a name's tokens go
    /// back when it changes kind.
    FencePerKind,
    /// The newest waiter is served first.
    LifoWaiters,
    /// `extend_many` renews every lease of a batch as a mutex (a statement
    /// over the lock table alone): shared holds are reported lost.
    BatchIgnoresKinds,
    /// A queued waiter's grant deletes its place in the queue, so the undo
    /// of a grant whose reply was lost releases the hold but cannot give
    /// the place back: the waiter asks again behind a writer that queued
    /// after it (dlock-postgres and dlock-mysql before their fix).
    UndoLosesPlace,
}

/// Runs every case of the suite, link fault cases included, against the
/// driver with `bug`, all at once, and returns the names of the cases
/// that failed.
async fn failing_cases(bug: Option<Bug>) -> Vec<&'static str> {
    let (faulty, factory) = sim::factories(bug);
    failing(factory, Some(faulty), &[]).await
}

/// [`failing_cases`] of the mutex suite alone, run on the last free permit
/// of semaphores of three ([`MutexAs::last_permit`]).
async fn failing_last_permit_cases(bug: Option<Bug>, only: &[&str]) -> Vec<&'static str> {
    let (_, factory) = sim::factories(bug);
    failing(MutexAs::last_permit_clients(factory, 3).await, None, only).await
}

/// Runs the cases named in `only` (every case if it is empty) and returns
/// the names of those that failed.
async fn failing(
    factory: Factory,
    faulty: Option<FaultyFactory>,
    only: &[&str],
) -> Vec<&'static str> {
    let chosen = |name: &str| only.is_empty() || only.contains(&name);
    let mut runs = Vec::new();
    for case in suite().into_iter().filter(|case| chosen(case.name)) {
        runs.push((case.name, (case.run)(factory.clone())));
    }
    let fault_cases = fault_suite().into_iter().filter(|case| chosen(case.name));
    for case in fault_cases.filter(|_| faulty.is_some()) {
        match case.run {
            FaultRun::Link(run) => runs.extend(
                faulty
                    .clone()
                    .map(|faulty| (case.name, run(faulty, factory.clone()))),
            ),
            // They restart and pause a server in a container; the simulated
            // server has none.
            FaultRun::Server(_) => {}
        }
    }
    let runs: Vec<_> = runs
        .into_iter()
        .map(|(name, run)| (name, tokio::spawn(timeout(Duration::from_secs(40), run))))
        .collect();
    let mut failed = Vec::new();
    for (name, run) in runs {
        match run.await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => failed.push(name),
        }
    }
    failed.sort_unstable();
    failed
}

/// Runs the cases in `by` against the driver with `bug`: each must fail.
/// The control runs the whole suite; a mutant needs only the cases that
/// should catch it (the rest would only load the machine, and a loaded
/// machine hides faults that show within a millisecond).
async fn assert_caught(bug: Bug, by: &[&str]) {
    let (faulty, factory) = sim::factories(Some(bug));
    let failed = failing(factory, Some(faulty), by).await;
    for case in by {
        assert!(
            failed.contains(case),
            "{bug:?} got past {case}; failed: {failed:?}"
        );
    }
}

/// `caught!(test, Bug::X, [case, ...])`: a test that runs the suite against
/// the driver with `Bug::X` and fails unless every case listed fails.
macro_rules! caught {
    ($test:ident, $bug:expr, [$($case:ident),+ $(,)?]) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            assert_caught($bug, &[$(stringify!($case)),+]).await;
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_correct_driver_passes_the_suite() {
    assert_eq!(failing_cases(None).await, Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_permit_of_a_correct_semaphore_passes_the_suite() {
    assert_eq!(
        failing_last_permit_cases(None, &[]).await,
        Vec::<&str>::new()
    );
}

/// The mutex suite on a semaphore's last permit catches a semaphore that
/// admits one too many, through the mutex's own cases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_admission_by_one_is_caught_on_the_last_permit() {
    let by = [
        "try_acquire_when_held_is_none",
        "stress_contended_grants_are_exclusive",
    ];
    let failed = failing_last_permit_cases(Some(Bug::OverAdmitsByOne), &by).await;
    for case in by {
        assert!(failed.contains(&case), "{case} passed; failed: {failed:?}");
    }
}

caught!(
    release_without_owner_check_is_caught,
    Bug::ReleaseWithoutOwnerCheck,
    [
        foreign_lease_is_not_held,
        release_twice_is_not_held,
        stale_lease_cannot_touch_new_holder,
        a_permit_release_frees_only_its_own
    ]
);
caught!(
    a_skewed_client_clock_is_caught,
    Bug::SkewedClock,
    [
        expiry_then_takeover,
        guard_lost_fires_at_expiry,
        delayed_grant_is_valid_only_until_the_server_frees_it
    ]
);
caught!(
    a_resetting_fencing_counter_is_caught,
    Bug::ResettingFence,
    [
        fencing_increases_across_grants,
        stress_contended_grants_are_exclusive
    ]
);
caught!(
    an_extend_that_does_nothing_is_caught,
    Bug::ExtendDoesNothing,
    [extend_keeps_the_lock, guard_renews_past_ttl]
);
caught!(
    a_release_that_does_nothing_is_caught,
    Bug::ReleaseDoesNothing,
    [acquire_then_release, acquire_all_takes_all_or_none]
);
caught!(
    a_server_ttl_from_the_validity_is_caught,
    Bug::ServerTtlFromValidity,
    [lock_delay_keeps_an_unreleased_name]
);
caught!(
    an_extend_in_the_wrong_unit_is_caught,
    Bug::ExtendInSeconds,
    [max_hold_ends_the_hold]
);
caught!(
    a_try_acquire_that_ignores_expiry_is_caught,
    Bug::TryIgnoresExpiry,
    [expiry_then_takeover]
);
caught!(
    no_wakeup_on_release_is_caught,
    Bug::NoWakeup,
    [waiter_acquires_after_release]
);
caught!(
    a_racy_check_then_set_is_caught_by_the_checker,
    Bug::RacyCheckThenSet,
    [stress_contended_grants_are_exclusive]
);
caught!(
    validity_counted_from_the_reply_is_caught,
    Bug::ValidityFromReply,
    [
        delayed_grant_is_valid_only_until_the_server_frees_it,
        grant_slower_than_its_lease_is_no_grant
    ]
);
caught!(
    no_validation_is_caught,
    Bug::NoValidation,
    [invalid_names_are_rejected, invalid_options_are_rejected]
);
caught!(
    an_expired_on_arrival_grant_is_caught,
    Bug::ExpiredOnArrival,
    [grant_slower_than_its_lease_is_no_grant]
);
caught!(
    ignoring_the_wait_bound_on_a_stalled_server_is_caught,
    Bug::IgnoresWaitBound,
    [calls_on_a_stalled_server_return_within_their_bound]
);
caught!(
    no_cleanup_of_a_dropped_acquire_is_caught,
    Bug::NoCleanup,
    [acquire_dropped_in_flight_frees_the_name_at_once]
);
caught!(
    a_list_that_shows_free_locks_is_caught,
    Bug::ListShowsFreeLocks,
    [list_pages_through_held_locks]
);
caught!(
    a_release_after_that_frees_at_once_is_caught,
    Bug::ReleaseAfterFreesAtOnce,
    [
        release_after_holds_the_name_until_then,
        release_after_outlives_its_client
    ]
);
caught!(
    a_release_after_that_ignores_the_hold_is_caught,
    Bug::ReleaseAfterKeepsTheLeaseTtl,
    [release_after_holds_the_name_until_then]
);
caught!(
    a_release_after_without_owner_check_is_caught,
    Bug::ReleaseAfterWithoutOwnerCheck,
    [release_after_acts_only_on_its_own_lease]
);
caught!(
    a_hold_that_ends_with_its_client_is_caught,
    Bug::HoldEndsWithClient,
    [release_after_outlives_its_client]
);
caught!(
    a_force_release_that_removes_nothing_is_caught,
    Bug::ForceReleaseOnlyReports,
    [force_release_frees_the_name_for_the_next_holder]
);
caught!(
    holders_that_show_one_hold_are_caught,
    Bug::HoldersShowOne,
    [holders_list_every_hold]
);
caught!(
    a_force_release_that_ends_one_hold_is_caught,
    Bug::ForceReleaseEndsOneHold,
    [holders_list_every_hold]
);
caught!(
    a_readers_hold_that_keeps_readers_out_is_caught,
    Bug::ReadHoldIsExclusive,
    [a_readers_hold_keeps_writers_out_not_readers]
);
caught!(
    a_grant_without_its_holder_is_caught,
    Bug::HolderNotStored,
    [
        holders_show_in_inspect_and_list,
        an_election_has_one_leader_at_a_time
    ]
);
caught!(
    a_holder_per_client_is_caught,
    Bug::HolderOfTheClient,
    [
        holders_show_in_inspect_and_list,
        an_election_has_one_leader_at_a_time
    ]
);
caught!(
    a_hold_the_released_lease_can_still_touch_is_caught,
    Bug::ReleaseAfterKeepsOwner,
    [release_after_holds_the_name_until_then]
);
caught!(
    a_batch_renewal_that_checks_owners_by_name_is_caught,
    Bug::BatchOwnerByName,
    [extend_many_acts_per_lease]
);
caught!(
    a_batch_renewal_that_fails_as_a_whole_is_caught,
    Bug::BatchFailsAsAWhole,
    [
        extend_many_acts_per_lease,
        batch_renewal_loses_only_the_taken_over_guard
    ]
);
caught!(
    a_batch_renewal_without_owner_check_is_caught,
    Bug::BatchExtendsWithoutOwnerCheck,
    [extend_many_acts_per_lease]
);
caught!(
    a_ttl_rounded_down_is_caught,
    Bug::TruncatedTtl,
    [ttl_fractions_are_rounded_up]
);
caught!(
    a_bound_per_request_instead_of_per_call_is_caught,
    Bug::BoundPerRequest,
    [calls_on_a_stalled_server_return_within_their_bound]
);
caught!(
    a_reader_beside_a_writer_is_caught,
    Bug::ReaderBesideWriter,
    [
        readers_share_and_writers_hold_alone,
        stress_shared_grants_respect_their_kind
    ]
);
caught!(
    a_writer_beside_readers_is_caught,
    Bug::WriterBesideReaders,
    [
        readers_share_and_writers_hold_alone,
        a_waiting_writer_keeps_new_readers_out
    ]
);
caught!(
    no_writer_preference_is_caught,
    Bug::NoWriterPreference,
    [a_waiting_writer_keeps_new_readers_out]
);
caught!(
    queued_readers_one_by_one_is_caught,
    Bug::QueuedReadersOneByOne,
    [queued_readers_enter_together]
);
caught!(
    a_downgrade_that_releases_first_is_caught,
    Bug::DowngradeReleasesFirst,
    [a_downgrade_lets_no_writer_in]
);
caught!(
    a_token_drawn_at_queueing_is_caught,
    Bug::TokenDrawnAtQueueing,
    [a_downgrade_lets_no_writer_in]
);
caught!(
    over_admission_by_one_is_caught,
    Bug::OverAdmitsByOne,
    [
        a_semaphore_admits_exactly_its_permits,
        stress_shared_grants_respect_their_kind
    ]
);
caught!(
    expired_permits_still_counted_is_caught,
    Bug::ExpiredPermitCounted,
    [an_expired_permit_frees_its_place_for_good]
);
caught!(
    a_renewal_that_resurrects_a_permit_is_caught,
    Bug::RenewalResurrects,
    [an_expired_permit_frees_its_place_for_good]
);
caught!(
    a_renewal_that_resurrects_a_permit_without_a_word_is_caught,
    Bug::RenewalResurrectsSilently,
    [an_expired_permit_frees_its_place_for_good]
);
caught!(
    unchecked_permit_counts_are_caught,
    Bug::PermitCountsUnchecked,
    [one_name_is_one_kind_of_lock]
);
caught!(
    a_permit_beside_a_mutex_is_caught,
    Bug::PermitIgnoresMutex,
    [one_name_is_one_kind_of_lock]
);
caught!(
    a_fencing_counter_per_kind_is_caught,
    Bug::FencePerKind,
    [fencing_increases_across_kinds]
);
caught!(
    a_batch_that_ignores_kinds_is_caught,
    Bug::BatchIgnoresKinds,
    [a_renewal_batch_of_every_kind_judges_each_lease]
);
caught!(
    lifo_waiters_are_caught,
    Bug::LifoWaiters,
    [permit_waiters_are_served_in_order]
);
caught!(
    an_undo_that_loses_the_waiters_place_is_caught,
    Bug::UndoLosesPlace,
    [a_lost_grant_keeps_the_waiters_place]
);
