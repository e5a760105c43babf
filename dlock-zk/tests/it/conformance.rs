//! The whole conformance suite against a real ZooKeeper in a container.

use std::sync::Arc;

use dlock_conformance::harness::{Service, shared};
use dlock_core::Backend;
use dlock_zk::ZkBackend;

async fn zookeeper() -> Arc<dyn Backend> {
    let server = shared(Service::ZooKeeper).await;
    Arc::new(
        ZkBackend::connect(server.url())
            .await
            .expect("connect to the test ZooKeeper"),
    )
}

dlock_conformance::conformance_tests!(zookeeper);

dlock_conformance::shared_kind_tests!(zookeeper);
