//! Fault cases: the lock's promises under real network faults, through a
//! [`FaultProxy`] between one client and its server.
//!
//! These take a `connect` function from a URL to a client, because the
//! faulty client must reach its server through the proxy.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, LockOptions, Locker};
use tokio::time::{Instant, sleep, timeout};

use crate::cases::unique_name;
use crate::checker::Checker;
use crate::harness::{ServerOptions, Service, start, wait_ready};
use crate::proxy::{Fault, FaultProxy};

/// Fails a case that runs longer than a suite case may, instead of letting
/// a hung backend hang the run.
async fn bounded(case: &str, body: impl Future<Output = ()>) {
    let limit = crate::__private::CASE_TIMEOUT;
    if timeout(limit, body).await.is_err() {
        panic!("{case} did not finish in {limit:?}");
    }
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

/// The holder is cut off from its server (or its link hangs) while it
/// holds the lock. Its guard's `lost()` must fire before any other client
/// is granted the lock, another client must then get the lock, and the
/// stale holder's fencing token must be refused by the protected resource.
///
/// `connect` makes a client from a URL of the server's form; for session
/// backends it should use a short session timeout (a few seconds).
pub async fn cut_off_holder_loses_the_lock_before_takeover<C, Fut>(
    connect: C,
    server_url: &str,
    fault: Fault,
) where
    C: Fn(String) -> Fut,
    Fut: Future<Output = Arc<dyn Backend>>,
{
    bounded(
        "cut_off_holder_loses_the_lock_before_takeover",
        async move {
            let (_, upstream) = redirect(server_url, 0);
            let proxy = FaultProxy::start(upstream).await.expect("start the proxy");
            let (proxied, _) = redirect(server_url, proxy.addr().port());
            let holder = Locker::from_arc(connect(proxied).await);
            let other = connect(server_url.to_owned()).await;
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
            proxy.set(fault);

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
            proxy.set(Fault::Pass);
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
