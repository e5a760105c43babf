//! Every call is bounded: on a stalled server each acquire returns within
//! its wait bound, and an acquire of unknown outcome (dropped or timed out
//! after sending) is undone at once, not left to its TTL.

use std::time::Duration;

use dlock_core::{Backend, Error, Lease, LockOptions, Result};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};

use super::{FaultyFactory, REQUEST_TIMEOUT, SLACK, bounded};
use crate::proxy::Fault;
use crate::support::{long, must_acquire, unique_name};
use crate::{BoxFuture, Factory};

/// The wait bound of the stall cases.
const STALLED_WAIT: Duration = Duration::from_secs(1);

/// The faulty client's server stops answering (its link stalls), some
/// calls already waiting, others started after: every call of the
/// [`Backend`] trait but `force_release` (an operator's tool of several
/// rounds), three of each, all at once, so that a pool of connections runs
/// dry. Each must return within its bound, counted from the call's start,
/// whatever it waits for inside (a free connection, a reconnect, several
/// requests): `acquire` within its wait bound plus the request timeout
/// (the look it makes when its wait ends is one more request), every
/// other call within the request timeout. No
/// acquire may be granted. When the link recovers, the client's calls must
/// get through within two request timeouts, or within one after a client
/// made then got its first call through, whichever is later: no connection
/// pool left exhausted, and no budget a loaded machine's connect misses.
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
            let mut leases = Vec::new();
            for _ in 0..COPIES * 4 {
                leases.push(
                    must_acquire(f.backend.as_ref(), &unique_name("stalled_own"), &long()).await,
                );
            }
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(2))
                .wait(STALLED_WAIT);
            let mut calls = JoinSet::new();
            let mut call = |what: &'static str, bound: Duration, run: BoxFuture<Outcome>| {
                calls.spawn(async move {
                    let started = Instant::now();
                    let done = timeout(bound + SLACK + Duration::from_secs(10), run).await;
                    (what, bound, started.elapsed(), done)
                });
            };
            let acquire_bound = STALLED_WAIT + REQUEST_TIMEOUT;
            // Waiting already when the server stalls.
            for _ in 0..COPIES * 3 {
                let (b, name, opts) = (f.backend.clone(), held.clone(), opts.clone());
                call(
                    "acquire of a held name",
                    acquire_bound,
                    Box::pin(async move { granted(b.acquire(&name, &opts).await.map(Some)) }),
                );
            }
            sleep(Duration::from_millis(200)).await;
            f.link.set(Fault::Stall);
            let mut own = leases.into_iter();
            let mut next = || own.next().expect("a lease for each call");
            for _ in 0..COPIES {
                let b = f.backend.clone();
                let opts = opts.clone();
                call(
                    "acquire",
                    acquire_bound,
                    Box::pin(async move {
                        granted(
                            b.acquire(&unique_name("stalled_free"), &opts)
                                .await
                                .map(Some),
                        )
                    }),
                );
                let b = f.backend.clone();
                call(
                    "try_acquire",
                    REQUEST_TIMEOUT,
                    Box::pin(async move {
                        granted(b.try_acquire(&unique_name("stalled_free"), &long()).await)
                    }),
                );
                let (b, lease) = (f.backend.clone(), next());
                call(
                    "release",
                    REQUEST_TIMEOUT,
                    Box::pin(async move { Outcome::from(b.release(&lease).await) }),
                );
                let (b, lease) = (f.backend.clone(), next());
                call(
                    "release_after",
                    REQUEST_TIMEOUT,
                    Box::pin(async move {
                        Outcome::from(b.release_after(&lease, Duration::from_secs(1)).await)
                    }),
                );
                let (b, mut lease) = (f.backend.clone(), next());
                call(
                    "extend",
                    REQUEST_TIMEOUT,
                    Box::pin(async move { Outcome::from(b.extend(&mut lease).await) }),
                );
                let (b, lease) = (f.backend.clone(), next());
                call(
                    "extend_many",
                    REQUEST_TIMEOUT,
                    Box::pin(async move {
                        let mut batch = [lease.clone(), lease];
                        Outcome::from(b.extend_many(&mut batch).await)
                    }),
                );
                let (b, name) = (f.backend.clone(), held.clone());
                call(
                    "inspect",
                    REQUEST_TIMEOUT,
                    Box::pin(async move { Outcome::from(b.inspect(&name).await) }),
                );
                let b = f.backend.clone();
                call(
                    "list",
                    REQUEST_TIMEOUT,
                    Box::pin(async move { Outcome::from(b.list("stalled", None, 100).await) }),
                );
            }
            let mut slowest: Vec<(&str, Duration)> = Vec::new();
            while let Some(joined) = calls.join_next().await {
                let (what, bound, took, done) = match joined {
                    Ok(out) => out,
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                };
                match slowest.iter_mut().find(|(w, _)| *w == what) {
                    Some((_, t)) => *t = (*t).max(took),
                    None => slowest.push((what, took)),
                }
                match done {
                    Err(_) => panic!(
                        "{what} on a stalled server still had not returned after {took:?}: \
                         every call must be bounded"
                    ),
                    Ok(Outcome::Granted) => panic!("{what} on a stalled server was granted"),
                    Ok(Outcome::Returned(e)) => assert!(
                        took <= bound + SLACK,
                        "{what} on a stalled server returned after {took:?} ({}); its bound \
                         is {bound:?}, counted from the call's start",
                        e.as_deref().unwrap_or("no error")
                    ),
                }
            }
            eprintln!("stalled server, slowest return of each call: {slowest:?}");

            f.link.set(Fault::Pass);
            let recovered = Instant::now();
            // How long a new client takes to get a call through now: a
            // loaded machine may take over a second to open a connection,
            // and every connection of the faulty client's pool was closed.
            let mut fresh = tokio::spawn(through_from_scratch(client.clone(), recovered));
            let mut fresh_took = None;
            let mut failed = Vec::new();
            let lease = loop {
                let tried = recovered.elapsed();
                // A fresh name each try: one that timed out may have been
                // granted all the same, its undo not yet run.
                let name = unique_name("stalled_after");
                match f.backend.try_acquire(&name, &long()).await {
                    Ok(Some(lease)) => break lease,
                    Ok(None) => panic!("{name:?} is held: nobody asked for it"),
                    Err(e) => {
                        if fresh_took.is_none() && fresh.is_finished() {
                            fresh_took = Some(fresh_result(&mut fresh).await);
                        }
                        // Until a new client got through, and one request
                        // after, or two requests, whichever is later.
                        let allowed = fresh_took.map_or(FRESH_WITHIN, |took| {
                            (took + REQUEST_TIMEOUT).max(REQUEST_TIMEOUT * 2)
                        });
                        let fresh = match fresh_took {
                            Some(took) => format!("a new client got through after {took:?}"),
                            None => format!("no new client got through in {FRESH_WITHIN:?}"),
                        };
                        assert!(
                            e.is_retryable() && recovered.elapsed() < allowed,
                            "{:?} after the server recovered the client still fails (allowed: \
                             {allowed:?}; {fresh}): {e}; earlier tries: {failed:#?}",
                            recovered.elapsed()
                        );
                        failed.push(format!("{tried:?}: {e}"));
                        sleep(Duration::from_millis(50)).await;
                    }
                }
            };
            eprintln!(
                "stalled server: a call got through {:?} after it recovered, after {} failed \
                 tries",
                recovered.elapsed(),
                failed.len()
            );
            fresh.abort();
            f.backend.release(&lease).await.expect("release");
            other.release(&holder).await.expect("release");
        },
    )
    .await;
}

/// How long the stall case waits for a client made at the recovery to get
/// a call through, at most: a connect timeout and then some.
const FRESH_WITHIN: Duration = Duration::from_secs(10);

/// How many of each call the stall case makes at once.
const COPIES: usize = 3;

/// What a call on a stalled server came to.
enum Outcome {
    /// An acquire got a lease.
    Granted,
    /// It returned: with an error (its text), or with what it read.
    Returned(Option<String>),
}

impl<T> From<Result<T>> for Outcome {
    fn from(done: Result<T>) -> Self {
        Outcome::Returned(done.err().map(|e| e.to_string()))
    }
}

/// An acquire's outcome: a lease is a grant.
fn granted(done: Result<Option<Lease>>) -> Outcome {
    match done {
        Ok(Some(_)) => Outcome::Granted,
        Ok(None) => Outcome::Returned(None),
        Err(e) => Outcome::Returned(Some(e.to_string())),
    }
}

/// How long after `since` a client made now by `client` got its first
/// call through, retrying what may pass (the case's timeout bounds it).
async fn through_from_scratch(client: Factory, since: Instant) -> Duration {
    let backend = client().await;
    loop {
        let name = unique_name("stalled_fresh");
        match backend.try_acquire(&name, &long()).await {
            Ok(Some(lease)) => {
                let took = since.elapsed();
                let _ = backend.release(&lease).await;
                return took;
            }
            Ok(None) => panic!("{name:?} is held: nobody asked for it"),
            Err(e) if e.is_retryable() => sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("a new client fails after the server recovered: {e}"),
        }
    }
}

/// What [`through_from_scratch`] found, once it has finished.
async fn fresh_result(fresh: &mut tokio::task::JoinHandle<Duration>) -> Duration {
    match fresh.await {
        Ok(took) => took,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// How many requests over the slowed link the undo of one dropped acquire
/// may take, the healthy client's look included. The longest undo here is
/// MySQL's when its pool has no idle connection left (each dropped acquire
/// closed the one it had): a new connection (TCP, the server's greeting
/// and the login, the session's settings, its marker: five), then ending
/// the connection the acquire went out on (the marker's holder, `KILL`,
/// the wait until it is gone: three), then the release by owner (one);
/// then the healthy client's look (one, on its own link: counted in full
/// all the same). Redis needs one, etcd and ZooKeeper two or three.
const UNDO_REQUESTS: u32 = 10;

/// Acquires dropped at points from before their request is sent to while
/// the reply is on its way back (the link is slow: 50 ms each way), on
/// free names with a 60 s TTL. For a driver that declares
/// [`Capabilities::cleanup`](dlock_core::Capabilities::cleanup), every
/// name must be free again within `UNDO_REQUESTS` requests of the slowed
/// link (about a second), not at the end of the TTL. The request's time is
/// measured on the link as the case runs (a loaded machine adds to every
/// round trip), so the bound is a count of requests, not seconds.
/// Then one-attempt acquires of a held name, dropped at points through
/// their attempt: once the holder releases, the name must be free within
/// the same bound (no queue place left behind, as a queueing driver might).
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
            let request = request_time(f.backend.as_ref()).await;
            let undone = request * UNDO_REQUESTS;
            eprintln!("one request over the slowed link: {request:?}; an undo's bound: {undone:?}");
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
            // The healthy client's look is one request of the bound: one
            // look untimed first, so that the timed ones find a connection
            // open (a session-mode client opens a server session per hold,
            // a handshake that on a loaded machine outlasted the bound when
            // a dozen looks made one each at once). The looks then go one
            // after another, on that connection, each name free by the
            // same deadline.
            let warm = must_acquire(other.as_ref(), &unique_name("dropped_warm"), &long()).await;
            other.release(&warm).await.expect("release");
            let by = Instant::now() + undone;
            for (cut, name) in dropped {
                let left = by.saturating_duration_since(Instant::now());
                match other.acquire(&name, &long().wait(left)).await {
                    Ok(lease) => other.release(&lease).await.expect("release"),
                    Err(Error::Timeout { .. }) => panic!(
                        "an acquire dropped {cut:?} after it started left its name locked \
                         for over {undone:?} ({UNDO_REQUESTS} requests of {request:?} over \
                         its link): an acquire of unknown outcome must be undone by owner \
                         token"
                    ),
                    Err(e) => panic!("acquire failed: {e}"),
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
            match other.acquire(&name, &long().wait(undone)).await {
                Ok(lease) => other.release(&lease).await.expect("release"),
                Err(e) => {
                    // What keeps it, and whether it ever frees: shown with
                    // the failure.
                    let holders = other.holders(&name).await;
                    let since = Instant::now();
                    let later = other
                        .acquire(&name, &long().wait(Duration::from_secs(20)))
                        .await;
                    panic!(
                        "attempts on a held name, dropped midway, kept it locked after its \
                         holder released it, for over {undone:?} ({UNDO_REQUESTS} requests of \
                         {request:?} over the link): {e}; holders then: {holders:?}; \
                         then {:?} later: {:?}",
                        since.elapsed(),
                        later.map(|l| l.fencing_token())
                    )
                }
            }
        },
    )
    .await;
}

/// The time one request over `client`'s link takes now: an `inspect` of a
/// name nobody holds (one read), the faster of two.
async fn request_time(client: &dyn Backend) -> Duration {
    let mut fastest = Duration::MAX;
    for _ in 0..2 {
        let started = Instant::now();
        let name = unique_name("request_time");
        if let Err(e) = client.inspect(&name).await {
            panic!("inspect({name:?}) over the slowed link failed: {e}");
        }
        fastest = fastest.min(started.elapsed());
    }
    fastest
}
