//! Tracing spans and metrics for every backend call, in one place: the
//! [`Observed`] wrapper that every [`Locker`](crate::Locker) puts around its
//! backend.
//!
//! Spans (named `dlock`, one per call, its `call` field one of
//! `try_acquire`, `acquire`, `release`, `release_detached` (a dropped
//! guard's, sent in the background), `release_after`, `extend`,
//! `extend_many`, `downgrade`, `inspect`, `holders`, `list`,
//! `force_release`) are at debug level and carry the
//! backend, the lock name, the outcome, the fencing token of a grant and
//! the time the call took. Nothing else is recorded: never a URL, a
//! password or an owner token.
//!
//! With the `metrics` feature the same calls feed the
//! [`metrics`](https://docs.rs/metrics) facade, so any exporter works. Every
//! metric has a `backend` label:
//!
//! | metric | kind | what |
//! |---|---|---|
//! | `dlock_acquire_seconds` | histogram | duration of each `acquire` and `try_acquire`, labelled `call` and `outcome` (`granted`, `held`, `timeout`, `error`) |
//! | `dlock_wait_seconds` | histogram | how long a granted `acquire` waited |
//! | `dlock_grants_total` | counter | grants |
//! | `dlock_contended_total` | counter | calls that found the lock held: `try_acquire` answering "held", `acquire` timing out |
//! | `dlock_timeouts_total` | counter | `acquire` calls that timed out |
//! | `dlock_renewals_total` | counter | successful renewals by guards |
//! | `dlock_renewal_failures_total` | counter | failed renewal attempts |
//! | `dlock_lost_total` | counter | guards whose lease was lost |
//! | `dlock_errors_total` | counter | errors, labelled `kind` ([`Error::kind`]) |

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tracing::Instrument;

use crate::metrics as metric;
use crate::{Backend, Capabilities, Error, Lease, LockInfo, LockOptions, LockPage, Result};

/// A backend whose every call is traced and counted. [`Locker`](crate::Locker)
/// wraps its backend in one; wrap a backend yourself only to use the
/// lease-level API with the same observability.
#[derive(Debug, Clone)]
pub struct Observed {
    inner: Arc<dyn Backend>,
}

impl Observed {
    /// Observes `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Observed { inner }
    }

    fn span(&self, call: &'static str, name: &str) -> tracing::Span {
        tracing::debug_span!(
            "dlock",
            call,
            backend = self.inner.driver(),
            lock = name,
            outcome = tracing::field::Empty,
            fencing_token = tracing::field::Empty,
            elapsed_ms = tracing::field::Empty,
        )
    }

    /// `release`, one of the calls that give `lease` up, observed as `call`.
    async fn releasing(
        &self,
        call: &'static str,
        lease: &Lease,
        release: impl Future<Output = Result<()>>,
    ) -> Result<()> {
        let (span, backend, started) =
            (self.span(call, lease.name()), self.driver(), Instant::now());
        span.record("fencing_token", lease.fencing_token());
        let result = release.instrument(span.clone()).await;
        let outcome = match &result {
            Ok(()) => "released",
            Err(e) => error_outcome(backend, e),
        };
        finish(&span, backend, call, outcome, started);
        result
    }
}

/// Records a call's outcome on its span and in the metrics.
fn finish(
    span: &tracing::Span,
    backend: &'static str,
    call: &'static str,
    outcome: &str,
    started: Instant,
) {
    let elapsed = started.elapsed();
    span.record("outcome", outcome);
    span.record("elapsed_ms", elapsed.as_secs_f64() * 1000.0);
    if matches!(call, "acquire" | "try_acquire") {
        metric::acquire_seconds(backend, call, outcome, elapsed);
    }
}

fn error_outcome(backend: &'static str, e: &Error) -> &'static str {
    metric::count_error(backend, e.kind().as_str());
    match e {
        Error::Timeout { .. } => "timeout",
        Error::NotHeld { .. } => "not_held",
        _ => "error",
    }
}

#[async_trait]
impl Backend for Observed {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn driver(&self) -> &'static str {
        self.inner.driver()
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        let (span, backend, started) = (
            self.span("try_acquire", name),
            self.driver(),
            Instant::now(),
        );
        let result = self
            .inner
            .try_acquire(name, opts)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(Some(lease)) => {
                span.record("fencing_token", lease.fencing_token());
                metric::count(metric::GRANTS, backend);
                "granted"
            }
            Ok(None) => {
                metric::count(metric::CONTENDED, backend);
                "held"
            }
            Err(e) => error_outcome(backend, e),
        };
        finish(&span, backend, "try_acquire", outcome, started);
        result
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        let (span, backend, started) = (self.span("acquire", name), self.driver(), Instant::now());
        let result = self
            .inner
            .acquire(name, opts)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(lease) => {
                span.record("fencing_token", lease.fencing_token());
                metric::count(metric::GRANTS, backend);
                metric::wait_seconds(backend, started.elapsed());
                "granted"
            }
            Err(e @ Error::Timeout { .. }) => {
                metric::count(metric::CONTENDED, backend);
                metric::count(metric::TIMEOUTS, backend);
                error_outcome(backend, e)
            }
            Err(e) => error_outcome(backend, e),
        };
        finish(&span, backend, "acquire", outcome, started);
        result
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let release = self.inner.release(lease);
        self.releasing("release", lease, release).await
    }

    async fn release_detached(&self, lease: &Lease, until: Instant) -> Result<()> {
        let release = self.inner.release_detached(lease, until);
        self.releasing("release_detached", lease, release).await
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        let release = self.inner.release_after(lease, hold);
        self.releasing("release_after", lease, release).await
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        let (span, backend, started) = (
            self.span("extend", lease.name()),
            self.driver(),
            Instant::now(),
        );
        span.record("fencing_token", lease.fencing_token());
        let result = self.inner.extend(lease).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(()) => "extended",
            Err(e) => error_outcome(backend, e),
        };
        finish(&span, backend, "extend", outcome, started);
        result
    }

    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let first = leases.first().map_or("", Lease::name);
        let (span, backend, started) = (
            self.span("extend_many", first),
            self.driver(),
            Instant::now(),
        );
        let result = self
            .inner
            .extend_many(leases)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(_) => "extended",
            Err(e) => error_outcome(backend, e),
        };
        finish(&span, backend, "extend_many", outcome, started);
        result
    }

    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        let (span, backend, started) = (
            self.span("downgrade", write.name()),
            self.driver(),
            Instant::now(),
        );
        let result = self
            .inner
            .downgrade(write, opts)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(lease) => {
                span.record("fencing_token", lease.fencing_token());
                metric::count(metric::GRANTS, backend);
                "granted"
            }
            Err(e) => error_outcome(backend, e),
        };
        finish(&span, backend, "downgrade", outcome, started);
        result
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        let (span, backend, started) = (
            self.span("force_release", name),
            self.driver(),
            Instant::now(),
        );
        let result = self
            .inner
            .force_release(name)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(Some(_)) => "released",
            Ok(None) => "free",
            Err(e) => error_outcome(backend, e),
        };
        finish(&span, backend, "force_release", outcome, started);
        result
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        let (span, backend, started) = (self.span("inspect", name), self.driver(), Instant::now());
        let result = self.inner.inspect(name).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(Some(_)) => "held",
            Ok(None) => "free",
            Err(e) => error_outcome(backend, e),
        };
        finish(&span, backend, "inspect", outcome, started);
        result
    }

    async fn holders(&self, name: &str) -> Result<Vec<LockInfo>> {
        let (span, backend, started) = (self.span("holders", name), self.driver(), Instant::now());
        let result = self.inner.holders(name).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(holds) if holds.is_empty() => "free",
            Ok(_) => "held",
            Err(e) => error_outcome(backend, e),
        };
        finish(&span, backend, "holders", outcome, started);
        result
    }

    async fn watch(&self, name: &str) -> Result<Option<Box<dyn crate::NameWatch>>> {
        self.inner.watch(name).await
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        let (span, backend, started) = (self.span("list", prefix), self.driver(), Instant::now());
        let result = self
            .inner
            .list(prefix, cursor, limit)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(_) => "listed",
            Err(e) => error_outcome(backend, e),
        };
        finish(&span, backend, "list", outcome, started);
        result
    }
}
