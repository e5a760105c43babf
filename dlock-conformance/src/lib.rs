#![doc = include_str!("../README.md")]

pub mod cases;
pub mod harness;

#[doc(hidden)]
pub mod __private {
    pub use dlock_core::Backend;
    pub use tokio::time::timeout;

    /// A fresh runtime per test, like `#[tokio::test]`, but with two workers so
    /// that background renewal and release run alongside the case.
    pub fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start a tokio runtime: {e}"))
    }

    /// Bounds each case so that a hung backend fails the test instead of
    /// hanging the run.
    pub const CASE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);
}

/// Stamps out one `#[test]` per conformance case for a driver.
///
/// `$factory` is an async fn (or closure) with no arguments returning
/// `Arc<dyn Backend>`; each test calls it once, on the test's own runtime.
///
/// ```ignore
/// async fn my_backend() -> std::sync::Arc<dyn dlock_core::Backend> {
///     std::sync::Arc::new(MyBackend::connect("...").await.unwrap())
/// }
/// dlock_conformance::conformance_tests!(my_backend);
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::__conformance_cases!(
            $factory;
            acquire_then_release,
            try_acquire_when_held_is_none,
            release_twice_is_not_held,
            stale_lease_cannot_touch_new_holder,
            foreign_lease_is_not_held,
            expiry_then_takeover,
            release_after_expiry_is_not_held,
            extend_keeps_the_lock,
            fencing_increases_across_grants,
            acquire_times_out_within_wait_bound,
            waiter_acquires_after_release,
            tricky_names_are_distinct,
            invalid_names_are_rejected,
            invalid_options_are_rejected,
            guard_renews_past_ttl,
            guard_lost_fires_at_expiry,
            guard_drop_releases,
            with_lock_runs_under_the_lock,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::__private::runtime().block_on(async {
                    let backend: ::std::sync::Arc<dyn $crate::__private::Backend> =
                        ($factory)().await;
                    let case = $crate::cases::$case(&backend);
                    if $crate::__private::timeout($crate::__private::CASE_TIMEOUT, case)
                        .await
                        .is_err()
                    {
                        panic!("{} did not finish in {:?}", stringify!($case), $crate::__private::CASE_TIMEOUT);
                    }
                })
            }
        )*
    };
}
