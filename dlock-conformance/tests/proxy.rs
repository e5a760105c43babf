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
