//! The whole conformance suite against a real etcd in a container.

use std::sync::Arc;

use dlock_conformance::harness::{Service, shared};
use dlock_core::Backend;
use dlock_etcd::EtcdBackend;

async fn etcd() -> Arc<dyn Backend> {
    let server = shared(Service::Etcd).await;
    Arc::new(
        EtcdBackend::connect(server.url())
            .await
            .expect("connect to the test etcd"),
    )
}

dlock_conformance::conformance_tests!(etcd);

dlock_conformance::shared_kind_tests!(etcd);
