//! What the macros call: running one case on its own runtime, in its turn,
//! within the case timeout.

use std::future::Future;
use std::time::Duration;

pub use dlock_core::Backend;

use crate::{BoxFuture, Factory};

/// The suite's [`Factory`] of an async fn that makes a client.
pub fn factory<F, Fut>(make: F) -> Factory
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = std::sync::Arc<dyn Backend>> + Send + 'static,
{
    std::sync::Arc::new(move || -> BoxFuture<std::sync::Arc<dyn Backend>> { Box::pin(make()) })
}

/// Runs one case like `#[tokio::test]` would, on a fresh runtime with two
/// workers (so background renewal and release run alongside), bounded
/// so that a hung backend fails the test instead of hanging the run.
/// It runs beside the other cases of its process that only wait
/// ([`beside_others`](crate::support::beside_others)), except the stress
/// cases, which run only beside each other
/// ([`stress`](crate::support::stress)): beside them two cores stayed
/// saturated for a minute of PostgreSQL's run, and the cases judging
/// within a short TTL judged the machine (renewals answered after their
/// deadlines, grants after their leases ended).
pub fn run(case: &str, fut: impl Future<Output = ()>) {
    let asked = std::time::Instant::now();
    let _turn = if case.starts_with("stress_") {
        crate::support::stress()
    } else {
        crate::support::beside_others()
    };
    block_on(case, asked, fut);
}

/// [`run`] in its [turn](crate::support::in_turn) among the cases that
/// judge time: for the fault cases, which judge their bounds in time.
pub fn run_in_turn(case: &str, fut: impl Future<Output = ()>) {
    let asked = std::time::Instant::now();
    let _turn = crate::support::in_turn();
    block_on(case, asked, fut);
}

fn block_on(case: &str, asked: std::time::Instant, fut: impl Future<Output = ()>) {
    let started = std::time::Instant::now();
    // Shown with the case's failure, or with `--nocapture`: a case that
    // failed on time can be told from one that waited long for its turn.
    eprintln!("{case}: its turn came after {:?}", started - asked);
    let _ran = Ran(case, started);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot start a tokio runtime: {e}"));
    runtime.block_on(within_case_timeout(case, fut));
}

/// Says how long a case ran, when it ends (or unwinds).
struct Ran<'a>(&'a str, std::time::Instant);

impl Drop for Ran<'_> {
    fn drop(&mut self) {
        eprintln!("{}: ran {:?}", self.0, self.1.elapsed());
    }
}

/// Runs a case, failing it when it runs longer than [`CASE_TIMEOUT`],
/// not counting time spent waiting for the test image to be built.
pub async fn within_case_timeout(case: &str, fut: impl Future<Output = ()>) {
    let started = tokio::time::Instant::now();
    let mut fut = std::pin::pin!(fut);
    loop {
        let limit = CASE_TIMEOUT + crate::harness::image_build_time();
        if tokio::time::timeout_at(started + limit, fut.as_mut())
            .await
            .is_ok()
        {
            return;
        }
        // Still over the limit once a build that ran meanwhile is
        // counted out: the case hangs.
        if started.elapsed() >= CASE_TIMEOUT + crate::harness::image_build_time() {
            panic!("{case} did not finish in {CASE_TIMEOUT:?}");
        }
    }
}

/// The longest a case may run.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);
