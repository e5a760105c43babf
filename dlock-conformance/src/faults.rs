//! Fault cases: the lock's promises under real faults.
//!
//! The link cases fault one client's link to its server: through a
//! [`FaultProxy`] for a real server ([`proxied`] builds the clients), or
//! through a driver's own [`Link`] for a driver simulated in memory (the
//! suite's mutants). They take two factories: one for the faulty client
//! (a client and its link; a new link each call) and one for healthy
//! clients of the same lock service.
//!
//! Faulty clients must bound each request by at most [`REQUEST_TIMEOUT`]
//! (a session backend: a session timeout of at most 2 s).
//!
//! The server cases ([`server_restart_keeps_fencing_increasing`],
//! [`server_pause_past_the_lease`]) start a container of their own.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::{Backend, Error, Lease, LockOptions, Locker};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, timeout};

use crate::cases::needs_ttl;
use crate::checker::Checker;
use crate::harness::{ServerOptions, Service, start, wait_ready};
use crate::proxy::{Fault, FaultProxy, Link};
use crate::support::unique_name;
use crate::{BoxFuture, Factory};

/// The request timeout faulty clients use: the stall cases allow each call
/// its wait bound or this, whichever is longer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// What a loaded CI machine may add to any bound the cases check.
const SLACK: Duration = Duration::from_millis(1250);

/// A client whose link to its server a case can fault, and the link.
#[derive(Debug, Clone)]
pub struct FaultyClient {
    /// The client.
    pub backend: Arc<dyn Backend>,
    /// Its link to the server, and only its own.
    pub link: Arc<dyn Link>,
}

/// Makes a new faulty client, with a link of its own, each call.
pub type FaultyFactory = Arc<dyn Fn() -> BoxFuture<FaultyClient> + Send + Sync>;

/// One link case, for running it programmatically.
#[derive(Clone, Copy)]
pub struct FaultCase {
    /// The case's name, as its test is named.
    pub name: &'static str,
    /// Runs the case; it panics when the backend breaks the rule.
    pub run: fn(FaultyFactory, Factory) -> BoxFuture<()>,
}

impl std::fmt::Debug for FaultCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Factories for the link cases against a real server at `server_url`:
/// faulty clients reach it through a [`FaultProxy`] each, healthy ones
/// directly. `connect` makes a client from a URL of the server's form.
pub fn proxied<C, Fut>(connect: C, server_url: String) -> (FaultyFactory, Factory)
where
    C: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Arc<dyn Backend>> + Send + 'static,
{
    let connect = Arc::new(connect);
    let url = server_url.clone();
    let via = connect.clone();
    let faulty: FaultyFactory = Arc::new(move || {
        let connect = via.clone();
        let url = url.clone();
        Box::pin(async move {
            let (_, upstream) = redirect(&url, 0);
            let proxy = FaultProxy::start(upstream).await.expect("start the proxy");
            let (proxied, _) = redirect(&url, proxy.addr().port());
            FaultyClient {
                backend: connect(proxied).await,
                link: Arc::new(proxy),
            }
        })
    });
    let client: Factory = Arc::new(move || {
        let connect = connect.clone();
        let url = server_url.clone();
        Box::pin(async move { connect(url).await })
    });
    (faulty, client)
}

/// Fails a case that runs longer than a suite case may, instead of letting
/// a hung backend hang the run.
async fn bounded(case: &str, body: impl Future<Output = ()>) {
    crate::__private::within_case_timeout(case, body).await;
}

/// `url` with its `127.0.0.1:<port>` pointed at `port` instead, and the
/// address it pointed at.
fn redirect(url: &str, port: u16) -> (String, std::net::SocketAddr) {
    let at = url
        .find("127.0.0.1:")
        .unwrap_or_else(|| panic!("fault cases need a server on 127.0.0.1, got {url}"));
    let digits_at = at + "127.0.0.1:".len();
    let digits: String = url[digits_at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let upstream = format!("127.0.0.1:{digits}")
        .parse()
        .unwrap_or_else(|e| panic!("no port in {url}: {e}"));
    let redirected = format!(
        "{}127.0.0.1:{port}{}",
        &url[..at],
        &url[digits_at + digits.len()..]
    );
    (redirected, upstream)
}

fn long() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(60))
}

/// One acquire and release on a throwaway name, so that the client's
/// connections, prepared statements and scripts are in place before a case
/// slows its link down, as they are in a client that has been running.
async fn warm_up(client: &dyn Backend) {
    let name = unique_name("warm_up");
    let lease = client
        .try_acquire(&name, &long())
        .await
        .expect("warm-up try_acquire")
        .expect("a fresh name is free");
    client.release(&lease).await.expect("warm-up release");
}

/// Waits for the faulty client's grant of `name` to land on the server,
/// then polls `try_acquire` until the server frees it; the lease and when
/// its reply arrived.
async fn take_after_grant(client: &dyn Backend, name: &str, within: Duration) -> (Lease, Instant) {
    let started = Instant::now();
    while client.inspect(name).await.expect("inspect").is_none() {
        assert!(
            started.elapsed() < within,
            "the faulty client's grant of {name:?} never landed"
        );
        sleep(Duration::from_millis(2)).await;
    }
    loop {
        match client.try_acquire(name, &long()).await {
            Ok(Some(lease)) => return (lease, Instant::now()),
            Ok(None) => {}
            Err(e) => panic!("a healthy client's try_acquire({name:?}) failed: {e}"),
        }
        assert!(
            started.elapsed() < within,
            "{name:?} was not free after {within:?}"
        );
        sleep(Duration::from_millis(5)).await;
    }
}

/// The holder is cut off from its server (or its link hangs) while it
/// holds the lock. Its guard's `lost()` must fire before any other client
/// is granted the lock, another client must then get the lock, and the
/// stale holder's fencing token must be refused by the protected resource.
pub async fn cut_holder_loses_the_lock_before_takeover(faulty: FaultyFactory, client: Factory) {
    holder_loses_the_lock_before_takeover(faulty, client, Fault::Cut).await;
}

/// As [`cut_holder_loses_the_lock_before_takeover`], with the holder's link
/// hanging instead of closed: no error comes back, requests just never end.
pub async fn stalled_holder_loses_the_lock_before_takeover(faulty: FaultyFactory, client: Factory) {
    holder_loses_the_lock_before_takeover(faulty, client, Fault::Stall).await;
}

async fn holder_loses_the_lock_before_takeover(
    faulty: FaultyFactory,
    client: Factory,
    fault: Fault,
) {
    bounded(
        "cut_off_holder_loses_the_lock_before_takeover",
        async move {
            let f = faulty().await;
            let holder = Locker::from_arc(f.backend.clone());
            let other = client().await;
            let fenced = other.capabilities().fencing;

            let name = unique_name("cut_off_holder");
            let ttl = Duration::from_secs(1);
            let opts = LockOptions::new().ttl(ttl);
            let checker = Arc::new(Checker::new());
            let guard = Arc::new(
                holder
                    .try_acquire(&name, &opts)
                    .await
                    .expect("try_acquire")
                    .expect("the lock is free"),
            );
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

            // Let a renewal or two go through before the fault.
            sleep(ttl / 2).await;
            assert!(guard.is_valid(), "the guard is valid before the fault");
            let faulted = Instant::now();
            f.link.set(fault);

            let lease = other
                .acquire(&name, &opts.clone().wait(Duration::from_secs(30)))
                .await
                .expect("another client gets the lock after the holder is cut off");
            let granted = Instant::now();
            checker.enter(1, fenced.then(|| lease.fencing_token()));
            checker.leave(1);

            let lost_at = timeout(Duration::from_secs(1), watcher)
                .await
                .expect("lost() fired before the takeover")
                .expect("watcher task");
            assert!(
                lost_at <= granted,
                "the holder was told at {:?}, after the takeover at {:?} (fault at 0)",
                lost_at - faulted,
                granted - faulted
            );
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
        },
    )
    .await;
}

/// The faulty client's replies take longer than the lease it asks for
/// (300 ms each way, TTL 400 ms). Whatever the server granted has expired
/// before the reply arrives, so `try_acquire` must not return a lease (it
/// says "held" or fails), `with_lock` must not run its closure, and the
/// grant must be released without touching the client that takes the lock
/// meanwhile.
pub async fn grant_slower_than_its_lease_is_no_grant(faulty: FaultyFactory, client: Factory) {
    bounded("grant_slower_than_its_lease_is_no_grant", async move {
        let other = client().await;
        if !needs_ttl(other.as_ref(), "grant_slower_than_its_lease_is_no_grant") {
            return;
        }
        let f = faulty().await;
        warm_up(f.backend.as_ref()).await;
        let ttl = Duration::from_millis(400);
        let opts = LockOptions::new().ttl(ttl);
        let name = unique_name("slow_grant");
        f.link.set(Fault::Delay(Duration::from_millis(300)));

        // The other client takes the lock as soon as the slow grant ends on
        // the server.
        let taker = {
            let other = other.clone();
            let name = name.clone();
            tokio::spawn(async move {
                take_after_grant(other.as_ref(), &name, Duration::from_secs(10)).await
            })
        };
        match f.backend.try_acquire(&name, &opts).await {
            Ok(Some(lease)) => panic!(
                "a grant whose reply took longer than its {ttl:?} lease reached the caller \
                 (is_valid: {}): the reply arrived after the validity deadline",
                lease.is_valid()
            ),
            Ok(None) => {}
            Err(e) => panic!(
                "try_acquire over a link with a 600 ms round trip failed ({e}); the case needs \
                 the reply, so the client's request timeout must be at least 1 s"
            ),
        }

        let ran = Arc::new(AtomicBool::new(false));
        let locker = Locker::from_arc(f.backend.clone());
        let flag = ran.clone();
        let result = locker
            .with_lock(
                &unique_name("slow_grant_with_lock"),
                &opts.clone().wait(Duration::from_secs(1)),
                async move |_| flag.store(true, Ordering::SeqCst),
            )
            .await;
        assert!(
            !ran.load(Ordering::SeqCst),
            "with_lock ran its closure under a grant that expired on arrival ({result:?})"
        );

        let (lease, _) = match taker.await {
            Ok(taken) => taken,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        // The discarded grant's release crosses the slow link too.
        sleep(Duration::from_millis(1500)).await;
        f.link.set(Fault::Pass);
        let info = other
            .inspect(&name)
            .await
            .expect("inspect")
            .expect("the client that took the lock still holds it");
        assert_eq!(
            info.owner,
            lease.owner(),
            "releasing the slow grant touched the new holder's lock"
        );
        other.release(&lease).await.expect("release");
    })
    .await;
}

/// The faulty client's link is slow (150 ms each way) but faster than its
/// lease (TTL 1 s): it gets the lock, and its lease's validity must end no
/// later than the moment another client is granted the lock after the
/// server frees it. A driver that counts the lease from the reply instead
/// of from before the request believes it holds the lock 300 ms too long.
pub async fn delayed_grant_is_valid_only_until_the_server_frees_it(
    faulty: FaultyFactory,
    client: Factory,
) {
    bounded(
        "delayed_grant_is_valid_only_until_the_server_frees_it",
        async move {
            let other = client().await;
            if !needs_ttl(
                other.as_ref(),
                "delayed_grant_is_valid_only_until_the_server_frees_it",
            ) {
                return;
            }
            let f = faulty().await;
            warm_up(f.backend.as_ref()).await;
            let name = unique_name("delayed_grant");
            f.link.set(Fault::Delay(Duration::from_millis(150)));
            let taker = {
                let other = other.clone();
                let name = name.clone();
                tokio::spawn(async move {
                    take_after_grant(other.as_ref(), &name, Duration::from_secs(10)).await
                })
            };
            let sent = Instant::now();
            let lease = f
                .backend
                .try_acquire(&name, &LockOptions::new().ttl(Duration::from_secs(1)))
                .await
                .expect("try_acquire over a slow link")
                .expect("the lock is free");
            let valid_until = lease.valid_until().expect("TTL leases have a deadline");
            let (taken, taken_at) = match taker.await {
                Ok(taken) => taken,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
            assert!(
                valid_until <= taken_at,
                "the lease was valid until {:?} after its request, but another client held \
                 the lock {:?} after it: validity must be counted from before the request",
                valid_until - sent,
                taken_at - sent
            );
            f.link.set(Fault::Pass);
            other.release(&taken).await.expect("release");
        },
    )
    .await;
}

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
            let holder = other
                .try_acquire(&held, &long())
                .await
                .expect("try_acquire")
                .expect("free");
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
            let holder = other
                .try_acquire(&name, &long())
                .await
                .expect("try_acquire")
                .expect("free");
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

/// The server restarts (stop, then start on the same port): fencing tokens
/// granted after the restart are greater than every token before it. Starts
/// its own server, so that the restart disturbs no other test.
///
/// `connect` makes a client from the server's URL.
pub async fn server_restart_keeps_fencing_increasing<C, Fut>(connect: C, service: Service)
where
    C: Fn(String) -> Fut,
    Fut: Future<Output = Arc<dyn Backend>>,
{
    bounded("server_restart_keeps_fencing_increasing", async move {
        let server = start(
            service,
            ServerOptions {
                fixed_port: true,
                ..ServerOptions::default()
            },
        )
        .await;
        let url = server.url().to_owned();
        let name = unique_name("server_restart");
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let before = connect(url.clone()).await;
        let mut last = 0;
        for _ in 0..3 {
            let lease = before
                .try_acquire(&name, &opts)
                .await
                .expect("try_acquire")
                .expect("free");
            last = lease.fencing_token();
            before.release(&lease).await.expect("release");
        }
        drop(before);

        let id = server
            .container()
            .expect("the harness started it")
            .id()
            .to_owned();
        tokio::task::spawn_blocking(move || docker(&["stop", "start"], &id))
            .await
            .expect("docker task");
        wait_ready(service, &url)
            .await
            .expect("the server comes back");

        // A client that connects after the restart; its first requests may
        // still meet a server that is finishing start-up.
        let started = Instant::now();
        let lease = loop {
            let after = connect(url.clone()).await;
            match after.try_acquire(&name, &opts).await {
                Ok(Some(lease)) => break lease,
                Ok(None) => panic!("the lock was held after the restart"),
                Err(e) if e.is_retryable() && started.elapsed() < Duration::from_secs(20) => {
                    sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("no grant after the restart: {e}"),
            }
        };
        assert!(
            lease.fencing_token() > last,
            "after a restart the token went from {last} to {}",
            lease.fencing_token()
        );
    })
    .await;
}

/// Runs `docker <verb> <id>` for each verb in turn.
fn docker(verbs: &[&str], id: &str) {
    for &verb in verbs {
        let ok = std::process::Command::new("docker")
            .args([verb, id])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(ok, "docker {verb} {id} failed");
    }
}

/// The server hangs (its container paused) for longer than the lease, then
/// resumes. The holder's `lost()` must fire while the server is frozen, and
/// once it runs again another client gets the lock with a greater token.
/// Starts its own server. `connect` should give session backends a session
/// timeout of at most 2 s.
pub async fn server_pause_past_the_lease<C, Fut>(connect: C, service: Service)
where
    C: Fn(String) -> Fut,
    Fut: Future<Output = Arc<dyn Backend>>,
{
    bounded("server_pause_past_the_lease", async move {
        let server = start(service, ServerOptions::default()).await;
        let url = server.url().to_owned();
        let holder = Locker::from_arc(connect(url.clone()).await);
        let name = unique_name("server_pause");
        let ttl = Duration::from_secs(1);
        let guard = holder
            .try_acquire(&name, &LockOptions::new().ttl(ttl))
            .await
            .expect("try_acquire")
            .expect("free");
        let id = server
            .container()
            .expect("the harness started it")
            .id()
            .to_owned();
        let pause = id.clone();
        tokio::task::spawn_blocking(move || docker(&["pause"], &pause))
            .await
            .expect("docker task");
        let lost = timeout(Duration::from_secs(8), guard.lost()).await;
        // Stay frozen past the lease, and past a 2 s session timeout.
        sleep(Duration::from_millis(2500)).await;
        tokio::task::spawn_blocking(move || docker(&["unpause"], &id))
            .await
            .expect("docker task");
        assert!(
            lost.is_ok(),
            "lost() did not fire while the server was frozen"
        );

        let other = connect(url).await;
        let lease = other
            .acquire(&name, &LockOptions::new().wait(Duration::from_secs(20)))
            .await
            .expect("another client gets the lock once the server resumes");
        if other.capabilities().fencing {
            assert!(lease.fencing_token() > guard.fencing_token());
        }
        other.release(&lease).await.expect("release");
    })
    .await;
}
