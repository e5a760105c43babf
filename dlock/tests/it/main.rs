//! dlock's integration tests, one binary (one link, one set of shared servers).

mod connect;
mod election;
mod examples;
mod fence;
mod jobs;
mod multi;
mod no_panic;
mod observer;
mod reentrant;
mod secrets;
mod tls;

/// A locker on the shared test server of `service`, through `connect(url)`.
async fn locker(service: dlock_conformance::harness::Service) -> dlock::Locker {
    use dlock_conformance::harness::{Service, shared};
    let server = shared(service).await;
    let url = match service {
        Service::ZooKeeper => format!("zk://{}", server.url()),
        _ => server.url().to_owned(),
    };
    #[allow(clippy::unwrap_used)] // tests panic on purpose
    dlock::connect(&url).await.unwrap()
}

/// A runtime of one thread, as each node process (or in-memory node
/// thread) of the multi-process tests runs.
fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}
