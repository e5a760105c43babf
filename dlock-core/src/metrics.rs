//! The metrics every locker records, as no-ops without the `metrics`
//! feature. The names are listed once here; [`crate::Observed`]'s docs
//! describe them.

use std::time::Duration;

/// Grants.
pub const GRANTS: &str = "dlock_grants_total";
/// Calls that found the lock held.
pub const CONTENDED: &str = "dlock_contended_total";
/// `acquire` calls that timed out.
pub const TIMEOUTS: &str = "dlock_timeouts_total";
/// Successful renewals by guards.
pub const RENEWALS: &str = "dlock_renewals_total";
/// Failed renewal attempts.
pub const RENEWAL_FAILURES: &str = "dlock_renewal_failures_total";
/// Guards whose lease was lost.
pub const LOST: &str = "dlock_lost_total";
/// Errors, by kind.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub const ERRORS: &str = "dlock_errors_total";
/// Duration of each `acquire` and `try_acquire`.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub const ACQUIRE_SECONDS: &str = "dlock_acquire_seconds";
/// How long a granted `acquire` waited.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub const WAIT_SECONDS: &str = "dlock_wait_seconds";

#[cfg(feature = "metrics")]
pub fn count(name: &'static str, backend: &'static str) {
    ::metrics::counter!(name, "backend" => backend).increment(1);
}

#[cfg(feature = "metrics")]
pub fn count_error(backend: &'static str, kind: &'static str) {
    ::metrics::counter!(ERRORS, "backend" => backend, "kind" => kind).increment(1);
}

#[cfg(feature = "metrics")]
pub fn acquire_seconds(backend: &'static str, call: &'static str, outcome: &str, d: Duration) {
    ::metrics::histogram!(
        ACQUIRE_SECONDS,
        "backend" => backend,
        "call" => call,
        "outcome" => outcome.to_owned()
    )
    .record(d.as_secs_f64());
}

#[cfg(feature = "metrics")]
pub fn wait_seconds(backend: &'static str, d: Duration) {
    ::metrics::histogram!(WAIT_SECONDS, "backend" => backend).record(d.as_secs_f64());
}

#[cfg(not(feature = "metrics"))]
pub fn count(_: &'static str, _: &'static str) {}

#[cfg(not(feature = "metrics"))]
pub fn count_error(_: &'static str, _: &'static str) {}

#[cfg(not(feature = "metrics"))]
pub fn acquire_seconds(_: &'static str, _: &'static str, _: &str, _: Duration) {}

#[cfg(not(feature = "metrics"))]
pub fn wait_seconds(_: &'static str, _: Duration) {}
