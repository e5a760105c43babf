//! The fault proxy does to real traffic what each fault says.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock_conformance::harness::{Service, shared};
use dlock_conformance::proxy::{Fault, FaultProxy};
use tokio::time::{Instant, timeout};

async fn ping(port: u16) -> redis::RedisResult<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    redis::cmd("PING").query_async(&mut conn).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_delay_stall_and_cut_act_on_real_traffic() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let server = shared(Service::Redis).await;
    let proxy = FaultProxy::start(
        format!("127.0.0.1:{}", server.port().unwrap())
            .parse()
            .unwrap(),
    )
    .await
    .unwrap();
    let port = proxy.addr().port();
    assert_eq!(ping(port).await.unwrap(), "PONG");

    proxy.set(Fault::Delay(Duration::from_millis(100)));
    let started = Instant::now();
    assert_eq!(ping(port).await.unwrap(), "PONG");
    // Connect (hello) and PING each cross the link both ways.
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );

    proxy.set(Fault::Stall);
    assert!(
        timeout(Duration::from_millis(500), ping(port))
            .await
            .is_err(),
        "a stalled link answered"
    );

    proxy.set(Fault::Cut);
    assert!(
        timeout(Duration::from_secs(5), ping(port))
            .await
            .unwrap()
            .is_err(),
        "a cut link answered"
    );

    proxy.set(Fault::Pass);
    assert_eq!(ping(port).await.unwrap(), "PONG");
}

/// `set_open_connections(Stall)` hangs the connections open then, holding what
/// they send, while a new connection passes; `Pass` delivers what was held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalling_open_connections_lets_new_ones_pass() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let server = shared(Service::Redis).await;
    let proxy = FaultProxy::start(
        format!("127.0.0.1:{}", server.port().unwrap())
            .parse()
            .unwrap(),
    )
    .await
    .unwrap();
    let port = proxy.addr().port();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
    // No response timeout of the client's own: the test decides how long.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    let mut old = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    proxy.set_open_connections(Fault::Stall);

    let mut held = Box::pin(async move {
        redis::cmd("PING")
            .query_async::<String>(&mut old)
            .await
            .unwrap()
    });
    assert!(
        timeout(Duration::from_millis(500), &mut held)
            .await
            .is_err(),
        "a connection open when the link stalled answered"
    );
    assert_eq!(ping(port).await.unwrap(), "PONG", "a new connection");
    proxy.set(Fault::Pass);
    assert_eq!(
        timeout(Duration::from_secs(5), held).await.unwrap(),
        "PONG",
        "what was held back is delivered"
    );
}
