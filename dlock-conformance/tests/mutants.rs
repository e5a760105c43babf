//! The suite catches broken drivers. Each mutant wraps the correct
//! in-memory driver and adds one bug that real lock libraries have shipped;
//! running the whole suite against it must fail the case that guards
//! against that bug. The unmodified driver is the control: it must pass.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_conformance::{Factory, suite};
use dlock_core::wait::Deadline;
use dlock_core::{
    Backend, Capabilities, Lease, LockInfo, LockOptions, MemoryBackend, Result, async_trait,
};
use tokio::time::{Instant, sleep, timeout};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    /// Release deletes whoever holds the name (`DELETE … WHERE name = ?`).
    ReleaseWithoutOwnerCheck,
    /// The client counts the lease from a clock running ahead of the server's.
    SkewedClock,
    /// The fencing counter starts over (Redis restarted without persistence).
    ResettingFence,
    /// Extend reports success and does nothing.
    ExtendDoesNothing,
    /// try-acquire treats an expired holder as alive.
    TryIgnoresExpiry,
    /// Waiters poll slowly instead of being woken on release.
    NoWakeup,
}

#[derive(Debug)]
struct Mutant {
    inner: MemoryBackend,
    bug: Option<Bug>,
    granted: Mutex<HashSet<String>>,
}

impl Mutant {
    fn has(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }
}

#[async_trait]
impl Backend for Mutant {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        if self.has(Bug::TryIgnoresExpiry) && self.granted.lock().unwrap().contains(name) {
            dlock_core::validate_name(name)?;
            return Ok(None);
        }
        let Some(lease) = self.inner.try_acquire(name, opts).await? else {
            return Ok(None);
        };
        self.granted.lock().unwrap().insert(name.to_owned());
        let sent = Instant::now();
        Ok(Some(match self.bug {
            Some(Bug::SkewedClock) => {
                let ahead = sent + opts.ttl_value();
                Lease::with_ttl(name, lease.owner(), lease.fencing_token(), opts, ahead)
            }
            Some(Bug::ResettingFence) => Lease::with_ttl(name, lease.owner(), 1, opts, sent),
            _ => lease,
        }))
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        let poll = if self.has(Bug::NoWakeup) {
            Duration::from_secs(10)
        } else {
            Duration::from_millis(20)
        };
        let deadline = Deadline::after(opts.wait_value());
        loop {
            if let Some(lease) = self.try_acquire(name, opts).await? {
                return Ok(lease);
            }
            if deadline.is_past() {
                return Err(deadline.timeout_error(name));
            }
            sleep(deadline.cap(poll)).await;
        }
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        if self.has(Bug::ReleaseWithoutOwnerCheck) {
            if let Some(holder) = self.inner.inspect(lease.name()).await? {
                let opts = LockOptions::new();
                let whoever = Lease::with_ttl(lease.name(), holder.owner, 0, &opts, Instant::now());
                self.inner.release(&whoever).await?;
            }
            return Ok(());
        }
        self.inner.release(lease).await?;
        self.granted.lock().unwrap().remove(lease.name());
        Ok(())
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        if self.has(Bug::ExtendDoesNothing) {
            lease.extended(Instant::now());
            return Ok(());
        }
        self.inner.extend(lease).await
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }
}

/// Runs every case of the suite against the driver with `bug`, all at
/// once, and returns the names of the cases that failed.
async fn failing_cases(bug: Option<Bug>) -> Vec<&'static str> {
    let space = MemoryBackend::new();
    let factory: Factory = Arc::new(move || {
        let backend: Arc<dyn Backend> = Arc::new(Mutant {
            inner: space.clone(),
            bug,
            granted: Mutex::default(),
        });
        Box::pin(async move { backend })
    });
    let mut runs = Vec::new();
    for case in suite() {
        let run = (case.run)(factory.clone());
        runs.push((
            case.name,
            tokio::spawn(timeout(Duration::from_secs(15), run)),
        ));
    }
    let mut failed = Vec::new();
    for (name, run) in runs {
        match run.await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => failed.push(name),
        }
    }
    failed.sort_unstable();
    failed
}

async fn assert_caught(bug: Bug, by: &[&str]) {
    let failed = failing_cases(Some(bug)).await;
    for case in by {
        assert!(
            failed.contains(case),
            "{bug:?} got past {case}; failed: {failed:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_correct_driver_passes_the_suite() {
    assert_eq!(failing_cases(None).await, Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_without_owner_check_is_caught() {
    assert_caught(
        Bug::ReleaseWithoutOwnerCheck,
        &[
            "foreign_lease_is_not_held",
            "release_twice_is_not_held",
            "stale_lease_cannot_touch_new_holder",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_client_clock_is_caught() {
    assert_caught(Bug::SkewedClock, &["expiry_then_takeover"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resetting_fencing_counter_is_caught() {
    assert_caught(
        Bug::ResettingFence,
        &[
            "fencing_increases_across_grants",
            "stress_contended_grants_are_exclusive",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_that_does_nothing_is_caught() {
    assert_caught(
        Bug::ExtendDoesNothing,
        &["extend_keeps_the_lock", "guard_renews_past_ttl"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_acquire_that_ignores_expiry_is_caught() {
    assert_caught(Bug::TryIgnoresExpiry, &["expiry_then_takeover"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_wakeup_on_release_is_caught() {
    assert_caught(Bug::NoWakeup, &["waiter_acquires_after_release"]).await;
}
