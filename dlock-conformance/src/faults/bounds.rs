//! Every call is bounded: on a stalled server each acquire returns within
//! its wait bound, and an acquire of unknown outcome (dropped or timed out
//! after sending) is undone at once, not left to its TTL.

use std::time::Duration;

use dlock_core::{Error, LockOptions};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};

use super::{FaultyFactory, REQUEST_TIMEOUT, SLACK, bounded};
use crate::Factory;
use crate::proxy::Fault;
use crate::support::{long, must_acquire, unique_name};

/// The wait bound of the stall cases.
const STALLED_WAIT: Duration = Duration::from_secs(1);

/// The faulty client's server stops answering (its link stalls), some
/// calls already waiting, others started after. Every `acquire(wait =
/// 1 s)` must return within the bound (or the request timeout, if longer)
/// with an error, and none may be granted. Twenty calls are stalled at
/// once; when the link recovers, the client's next call must succeed at
/// once: no connection pool left exhausted by the stalled calls.
pub async fn calls_on_a_stalled_server_return_within_their_bound(
    faulty: FaultyFactory,
    client: Factory,
) {
    bounded(
        "calls_on_a_stalled_server_return_within_their_bound",
        async move {
            let f = faulty().await;
            let other = client().await;
            let held = unique_name("stalled_held");
            let holder = must_acquire(other.as_ref(), &held, &long()).await;
            let bound = STALLED_WAIT.max(REQUEST_TIMEOUT) + SLACK;
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(2))
                .wait(STALLED_WAIT);
            let mut calls = JoinSet::new();
            let mut call = |name: String| {
                let backend = f.backend.clone();
                let opts = opts.clone();
                calls.spawn(async move {
                    let started = Instant::now();
                    let done = timeout(
                        bound + Duration::from_secs(10),
                        backend.acquire(&name, &opts),
                    )
                    .await;
                    (started.elapsed(), done)
                });
            };
            // Ten already waiting when the server stalls, ten after.
            for _ in 0..10 {
                call(held.clone());
            }
            sleep(Duration::from_millis(200)).await;
            f.link.set(Fault::Stall);
            for _ in 0..10 {
                call(unique_name("stalled_free"));
            }
            let mut slowest = Duration::ZERO;
            while let Some(joined) = calls.join_next().await {
                let (took, done) = match joined {
                    Ok(out) => out,
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                };
                slowest = slowest.max(took);
                match done {
                    Err(_) => panic!(
                        "acquire(wait = {STALLED_WAIT:?}) on a stalled server still had not \
                         returned after {took:?}: every call must be bounded"
                    ),
                    Ok(Ok(_)) => panic!("acquire on a stalled server was granted"),
                    Ok(Err(e)) => assert!(
                        took <= bound,
                        "acquire(wait = {STALLED_WAIT:?}) on a stalled server returned after \
                         {took:?} ({e}); the bound is {:?}",
                        bound - SLACK
                    ),
                }
            }
            eprintln!("stalled server: 20 x acquire(wait = 1 s) returned within {slowest:?}");

            f.link.set(Fault::Pass);
            let recovered = Instant::now();
            let name = unique_name("stalled_after");
            let lease = loop {
                match f.backend.try_acquire(&name, &long()).await {
                    Ok(Some(lease)) => break lease,
                    Ok(None) => panic!("{name:?} is held: nobody asked for it"),
                    Err(e) if e.is_retryable() && recovered.elapsed() < Duration::from_secs(2) => {
                        sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!(
                        "{:?} after the server recovered the client still fails: {e}",
                        recovered.elapsed()
                    ),
                }
            };
            f.backend.release(&lease).await.expect("release");
            other.release(&holder).await.expect("release");
        },
    )
    .await;
}

/// Acquires dropped at points from before their request is sent to while
/// the reply is on its way back (the link is slow: 50 ms each way), on
/// free names with a 60 s TTL. For a driver that declares
/// [`Capabilities::cleanup`](dlock_core::Capabilities::cleanup), every
/// name must be free again within a second, not at the end of the TTL.
/// Then one-attempt acquires of a held name, dropped at points through
/// their attempt: once the holder releases, the name must be free at once
/// (no queue place left behind, as a queueing driver might).
pub async fn acquire_dropped_in_flight_frees_the_name_at_once(
    faulty: FaultyFactory,
    client: Factory,
) {
    bounded(
        "acquire_dropped_in_flight_frees_the_name_at_once",
        async move {
            let other = client().await;
            if !other.capabilities().cleanup {
                eprintln!(
                    "acquire_dropped_in_flight_frees_the_name_at_once: not applicable: \
                     the backend does not declare cleanup of unknown outcomes"
                );
                return;
            }
            let f = faulty().await;
            f.link.set(Fault::Delay(Duration::from_millis(50)));
            let mut dropped = Vec::new();
            for step in 0..12u64 {
                let name = unique_name("dropped_in_flight");
                let cut = Duration::from_millis(step * 10);
                match timeout(cut, f.backend.acquire(&name, &long().wait(Duration::ZERO))).await {
                    // Finished before the cut: the lease is the caller's.
                    Ok(Ok(lease)) => {
                        let _ = f.backend.release(&lease).await;
                    }
                    Ok(Err(e)) => panic!("acquire over a slow link failed: {e}"),
                    Err(_) => dropped.push((cut, name)),
                }
            }
            assert!(!dropped.is_empty(), "no acquire was in flight at its cut");
            let mut checks = JoinSet::new();
            for (cut, name) in dropped {
                let other = other.clone();
                checks.spawn(async move {
                    match other
                        .acquire(&name, &long().wait(Duration::from_secs(1)))
                        .await
                    {
                        Ok(lease) => other.release(&lease).await.expect("release"),
                        Err(Error::Timeout { .. }) => panic!(
                            "an acquire dropped {cut:?} after it started left its name locked \
                             for over a second: an acquire of unknown outcome must be undone \
                             by owner token"
                        ),
                        Err(e) => panic!("acquire failed: {e}"),
                    }
                });
            }
            while let Some(joined) = checks.join_next().await {
                if let Err(e) = joined {
                    std::panic::resume_unwind(e.into_panic());
                }
            }

            let name = unique_name("dropped_while_held");
            let holder = must_acquire(other.as_ref(), &name, &long()).await;
            for step in 0..16u64 {
                let cut = Duration::from_millis(step * 20);
                let once = long().wait(Duration::ZERO);
                if let Ok(done) = timeout(cut, f.backend.acquire(&name, &once)).await {
                    assert!(done.is_err(), "a held lock was granted");
                }
            }
            other.release(&holder).await.expect("release");
            match other
                .acquire(&name, &long().wait(Duration::from_secs(1)))
                .await
            {
                Ok(lease) => other.release(&lease).await.expect("release"),
                Err(e) => panic!(
                    "attempts on a held name, dropped midway, kept it locked after its \
                     holder released it: {e}"
                ),
            }
        },
    )
    .await;
}
