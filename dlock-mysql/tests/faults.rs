//! The fault cases against a real MariaDB, through a fault proxy.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::faults::{
    cut_off_holder_loses_the_lock_before_takeover, server_pause_past_the_lease,
    server_restart_keeps_fencing_increasing,
};
use dlock_conformance::harness::{Service, shared};
use dlock_conformance::proxy::Fault;
use dlock_core::Backend;
use dlock_mysql::MySqlBackend;

async fn connect(url: String) -> Arc<dyn Backend> {
    let backend = MySqlBackend::builder(url)
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    backend.migrate().await.unwrap();
    Arc::new(backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_loses_the_lock_before_takeover() {
    let url = shared(Service::MariaDb).await.url();
    cut_off_holder_loses_the_lock_before_takeover(connect, url, Fault::Cut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_loses_the_lock_before_takeover() {
    let url = shared(Service::MariaDb).await.url();
    cut_off_holder_loses_the_lock_before_takeover(connect, url, Fault::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_keep_increasing_across_a_server_restart() {
    server_restart_keeps_fencing_increasing(connect, Service::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_paused_past_the_lease_loses_it_to_the_next_client() {
    server_pause_past_the_lease(connect, Service::MariaDb).await;
}
