//! Server faults: each case starts a server of its own (so that the fault
//! disturbs no other test) and restarts or pauses its container.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, LockOptions, Locker};
use tokio::time::{Instant, sleep, timeout};

use super::bounded;
use crate::harness::{Server, ServerOptions, Service, last_words, start, wait_ready};
use crate::support::{must_acquire, must_lock, unique_name};

/// The server restarts (stop, then start on the same port): fencing tokens
/// granted after the restart are greater than every token before it. Starts
/// its own server, so that the restart disturbs no other test.
///
/// `connect` makes a client from the server's URL.
pub async fn fencing_tokens_keep_increasing_across_a_server_restart<C, Fut>(
    connect: C,
    service: Service,
) where
    C: Fn(String) -> Fut,
    Fut: Future<Output = Arc<dyn Backend>>,
{
    bounded(
        "fencing_tokens_keep_increasing_across_a_server_restart",
        async move {
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
                let lease = must_acquire(before.as_ref(), &name, &opts).await;
                last = lease.fencing_token();
                before.release(&lease).await.expect("release");
            }
            drop(before);

            docker(&server, &["stop", "start"]).await;
            if let Err(e) = wait_ready(service, &url).await {
                let words = match server.container() {
                    Some(container) => last_words(container).await,
                    None => String::new(),
                };
                panic!("the server comes back: {e}\n{words}");
            }

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
        },
    )
    .await;
}

/// The server hangs (its container paused) for longer than the lease, then
/// resumes. The holder's `lost()` must fire while the server is frozen, and
/// once it runs again another client gets the lock with a greater token.
/// Starts its own server. `connect` should give session backends a session
/// timeout of at most 2 s.
pub async fn a_server_paused_past_the_lease_loses_it_to_the_next_client<C, Fut>(
    connect: C,
    service: Service,
) where
    C: Fn(String) -> Fut,
    Fut: Future<Output = Arc<dyn Backend>>,
{
    bounded(
        "a_server_paused_past_the_lease_loses_it_to_the_next_client",
        async move {
            let server = start(service, ServerOptions::default()).await;
            let url = server.url().to_owned();
            let holder = Locker::from_arc(connect(url.clone()).await);
            let name = unique_name("server_pause");
            let ttl = Duration::from_secs(1);
            let guard = must_lock(&holder, &name, &LockOptions::new().ttl(ttl)).await;
            docker(&server, &["pause"]).await;
            let lost = timeout(Duration::from_secs(8), guard.lost()).await;
            // Stay frozen past the lease, and past a 2 s session timeout.
            sleep(Duration::from_millis(2500)).await;
            docker(&server, &["unpause"]).await;
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
        },
    )
    .await;
}

/// Runs `docker <verb> <container>` on `server`'s container for each verb
/// in turn, off the runtime's threads.
async fn docker(server: &Server, verbs: &'static [&'static str]) {
    let id = server
        .container()
        .expect("the harness started it")
        .id()
        .to_owned();
    tokio::task::spawn_blocking(move || {
        for &verb in verbs {
            // A pause the kernel could not freeze in runc's time ("unable
            // to freeze": a process busy in the kernel on a loaded
            // machine) left the container running: try again.
            let mut tries = 0;
            loop {
                let out = std::process::Command::new("docker")
                    .args([verb, &id])
                    .output();
                let said = out.as_ref().map_or_else(
                    |e| e.to_string(),
                    |o| String::from_utf8_lossy(&o.stderr).into_owned(),
                );
                if out.as_ref().is_ok_and(|o| o.status.success()) {
                    break;
                }
                tries += 1;
                assert!(
                    said.contains("unable to freeze") && tries < 5,
                    "docker {verb} {id} failed: {said}"
                );
                std::thread::sleep(std::time::Duration::from_millis(50 * tries));
            }
        }
    })
    .await
    .expect("docker task");
}
