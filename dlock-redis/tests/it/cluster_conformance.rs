//! The whole conformance suite against a Redis Cluster of three primaries
//! and three replicas.

use std::sync::Arc;

use dlock_conformance::topology::{Topology, redis_cluster};
use dlock_core::Backend;
use dlock_redis::RedisBackend;
use tokio::sync::OnceCell;

async fn cluster() -> Arc<dyn Backend> {
    static CLUSTER: OnceCell<Topology> = OnceCell::const_new();
    let cluster = CLUSTER.get_or_init(redis_cluster).await;
    Arc::new(
        RedisBackend::connect(&cluster.cluster_url())
            .await
            .expect("connect to the test cluster"),
    )
}

dlock_conformance::conformance_tests!(cluster);
