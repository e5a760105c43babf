//! The whole conformance suite against a three-member etcd cluster, with
//! the client given every member.

use std::sync::Arc;

use dlock_conformance::topology::{Topology, etcd_cluster};
use dlock_core::Backend;
use dlock_etcd::EtcdBackend;
use tokio::sync::OnceCell;

async fn cluster() -> Arc<dyn Backend> {
    static CLUSTER: OnceCell<Topology> = OnceCell::const_new();
    let cluster = CLUSTER.get_or_init(|| etcd_cluster(3)).await;
    Arc::new(
        EtcdBackend::connect(&cluster.etcd_url(&[0, 1, 2]))
            .await
            .expect("connect to the test cluster"),
    )
}

dlock_conformance::conformance_tests!(cluster);
