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
use crate::proxy::{Fault, FaultProxy};

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
}
