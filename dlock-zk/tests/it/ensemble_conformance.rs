//! The whole conformance suite against a three-node ZooKeeper ensemble,
//! with the client given every node.

use std::sync::Arc;

use dlock_conformance::topology::{Topology, zookeeper_ensemble};
use dlock_core::Backend;
use dlock_zk::ZkBackend;
use tokio::sync::OnceCell;

async fn ensemble() -> Arc<dyn Backend> {
    static ENSEMBLE: OnceCell<Topology> = OnceCell::const_new();
    let ensemble = ENSEMBLE.get_or_init(|| zookeeper_ensemble(3)).await;
    Arc::new(
        ZkBackend::connect(&ensemble.connect_string(&[0, 1, 2]))
            .await
            .expect("connect to the test ensemble"),
    )
}

dlock_conformance::conformance_tests!(ensemble);
