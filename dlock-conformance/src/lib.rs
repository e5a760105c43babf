#![doc = include_str!("../README.md")]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use dlock_core::Backend;

pub mod cases;
pub mod checker;
pub mod faults;
pub mod harness;
mod mutex_as;
pub mod proxy;
pub mod support;
pub mod topology;
mod turns;

pub use mutex_as::{Fillers, MutexAs};

/// A boxed future, as the programmatic suite passes them around.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Makes a new client of the backend under test.
pub type Factory = Arc<dyn Fn() -> BoxFuture<Arc<dyn Backend>> + Send + Sync>;

/// One case of the suite, for running it programmatically (the macro is
/// the usual way).
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's name, as its test is named.
    pub name: &'static str,
    /// Runs the case; it panics when the backend breaks the rule.
    pub run: fn(Factory) -> BoxFuture<()>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The case list: the one place a case is named.
#[doc(hidden)]
#[macro_export]
macro_rules! __case_list {
    ($then:ident { $($context:tt)* }) => {
        $crate::$then! {
            { $($context)* }
            single [
                acquire_then_release,
                try_acquire_when_held_is_none,
                release_twice_is_not_held,
                stale_lease_cannot_touch_new_holder,
                foreign_lease_is_not_held,
                expiry_then_takeover,
                release_after_expiry_is_not_held,
                ttl_fractions_are_rounded_up,
                extend_keeps_the_lock,
                fencing_increases_across_grants,
                acquire_times_out_within_wait_bound,
                waiter_acquires_after_release,
                tricky_names_are_distinct,
                invalid_names_are_rejected,
                invalid_options_are_rejected,
                guard_renews_past_ttl,
                extend_many_acts_per_lease,
                batch_renewal_loses_only_the_taken_over_guard,
                guard_lost_fires_at_expiry,
                max_hold_ends_the_hold,
                lock_delay_keeps_an_unreleased_name,
                acquire_all_takes_all_or_none,
                guard_drop_releases,
                with_lock_runs_under_the_lock,
                dropped_acquire_leaves_no_lock,
                list_pages_through_held_locks,
                release_after_holds_the_name_until_then,
                release_after_acts_only_on_its_own_lease,
                a_readers_hold_keeps_writers_out_not_readers,
                force_release_frees_the_name_for_the_next_holder,
                holders_show_in_inspect_and_list,
                holders_list_every_hold,
                readers_share_and_writers_hold_alone,
                a_waiting_writer_keeps_new_readers_out,
                queued_readers_enter_together,
                a_downgrade_lets_no_writer_in,
                one_name_is_one_kind_of_lock,
                fencing_increases_across_kinds,
                a_semaphore_admits_exactly_its_permits,
                an_expired_permit_frees_its_place_for_good,
                a_permit_release_frees_only_its_own,
                permit_waiters_are_served_in_order,
                a_renewal_batch_of_every_kind_judges_each_lease,
            ]
            multi [
                stress_contended_grants_are_exclusive,
                stress_shared_grants_respect_their_kind,
                crashed_holder_frees_the_lock,
                release_after_outlives_its_client,
                an_election_has_one_leader_at_a_time,
            ]
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __suite_fn {
    ({} single [$($single:ident),* $(,)?] multi [$($multi:ident),* $(,)?]) => {
        /// Every case of the suite, in the order the macro stamps them out.
        pub fn suite() -> Vec<Case> {
            vec![
                $(Case {
                    name: stringify!($single),
                    run: |factory: Factory| -> BoxFuture<()> {
                        Box::pin(async move { cases::$single(&factory().await).await })
                    },
                },)*
                $(Case {
                    name: stringify!($multi),
                    run: |factory: Factory| -> BoxFuture<()> {
                        Box::pin(cases::$multi(move || factory()))
                    },
                },)*
            ]
        }
    };
}

__case_list!(__suite_fn {});

/// The fault cases: the one place each is named.
#[doc(hidden)]
#[macro_export]
macro_rules! __fault_case_list {
    ($then:ident { $($context:tt)* }) => {
        $crate::$then! {
            { $($context)* }
            link [
                cut_holder_loses_the_lock_before_takeover,
                stalled_holder_loses_the_lock_before_takeover,
                grant_slower_than_its_lease_is_no_grant,
                delayed_grant_is_valid_only_until_the_server_frees_it,
                calls_on_a_stalled_server_return_within_their_bound,
                acquire_dropped_in_flight_frees_the_name_at_once,
                a_lost_grant_keeps_the_waiters_place,
            ]
            server [
                fencing_tokens_keep_increasing_across_a_server_restart,
                a_server_paused_past_the_lease_loses_it_to_the_next_client,
            ]
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __fault_suite_fn {
    ({} link [$($link:ident),* $(,)?] server [$($server:ident),* $(,)?]) => {
        /// Every fault case, in the order `fault_tests!` stamps them out,
        /// for running them against a driver of one's own: the link cases
        /// ([`faults::FaultRun::Link`]) with a link one can fault, the
        /// server cases ([`faults::FaultRun::Server`]) with a server the
        /// [`harness`] starts.
        pub fn fault_suite() -> Vec<faults::FaultCase> {
            vec![
                $(faults::FaultCase {
                    name: stringify!($link),
                    run: faults::FaultRun::Link(|faulty, client| -> BoxFuture<()> {
                        Box::pin(faults::$link(faulty, client))
                    }),
                },)*
                $(faults::FaultCase {
                    name: stringify!($server),
                    run: faults::FaultRun::Server(|connect, service| -> BoxFuture<()> {
                        Box::pin(faults::$server(move |url| connect(url), service))
                    }),
                },)*
            ]
        }
    };
}

__fault_case_list!(__fault_suite_fn {});

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

#[doc(hidden)]
#[macro_export]
macro_rules! __stamp_tests {
    // Each test first makes its factory with `$setup`, an async
    // expression giving a [`Factory`]: for state its clients share.
    ({ setup $setup:expr } single [$($single:ident),* $(,)?] multi [$($multi:ident),* $(,)?]) => {
        $(
            #[test]
            fn $single() {
                $crate::__private::run(stringify!($single), async {
                    let factory: $crate::Factory = $setup.await;
                    $crate::cases::$single(&factory().await).await;
                });
            }
        )*
        $(
            #[test]
            fn $multi() {
                $crate::__private::run(stringify!($multi), async {
                    let factory: $crate::Factory = $setup.await;
                    $crate::cases::$multi(move || factory()).await;
                });
            }
        )*
    };
    ({ $factory:expr } single [$($single:ident),* $(,)?] multi [$($multi:ident),* $(,)?]) => {
        $(
            #[test]
            fn $single() {
                $crate::__private::run(stringify!($single), async {
                    let backend: ::std::sync::Arc<dyn $crate::__private::Backend> =
                        ($factory)().await;
                    $crate::cases::$single(&backend).await;
                });
            }
        )*
        $(
            #[test]
            fn $multi() {
                $crate::__private::run(stringify!($multi), $crate::cases::$multi(|| ($factory)()));
            }
        )*
    };
}

/// Stamps out one `#[test]` per conformance case for a driver.
///
/// `$factory` is an async fn (or closure) with no arguments returning
/// `Arc<dyn Backend>`. Single-client cases call it once; multi-client
/// cases call it once per client, so it should hand out a new client
/// (its own connections) of the same lock service each time.
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
        $crate::__case_list!(__stamp_tests { $factory });
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __stamp_fault_tests {
    (
        { $connect:expr, $service:expr }
        link [$($link:ident),* $(,)?]
        server [$($server:ident),* $(,)?]
    ) => {
        $(
            #[test]
            fn $link() {
                $crate::__private::run_in_turn(stringify!($link), async {
                    let url = $crate::harness::shared($service).await.url().to_owned();
                    let (faulty, client) = $crate::faults::proxied($connect, url);
                    $crate::faults::$link(faulty, client).await;
                });
            }
        )*
        $(
            #[test]
            fn $server() {
                $crate::__private::run_in_turn(stringify!($server), async {
                    $crate::faults::$server($connect, $service).await;
                });
            }
        )*
    };
}

/// Stamps out one `#[test]` per [`faults`] case for a driver whose server
/// the [`harness`] runs: every link case (through a [`proxy::FaultProxy`]
/// in front of the shared server) and the server cases (restart, pause),
/// which start servers of their own.
///
/// `$connect` is an async fn from a URL of the server's form to a client
/// (`Arc<dyn Backend>`). Its requests must time out within
/// [`faults::REQUEST_TIMEOUT`]; session backends should use a session
/// timeout of at most 2 s. `$service` is the [`harness::Service`].
///
/// ```ignore
/// async fn connect(url: String) -> std::sync::Arc<dyn dlock_core::Backend> { ... }
/// dlock_conformance::fault_tests!(connect, dlock_conformance::harness::Service::Redis);
/// ```
#[macro_export]
macro_rules! fault_tests {
    ($connect:expr, $service:expr) => {
        $crate::__fault_case_list!(__stamp_fault_tests { $connect, $service });
    };
}

/// The whole suite again on a driver's write lock, on its semaphore of one
/// permit, and on the last free permit of its semaphores of three
/// ([`MutexAs`]), in modules `write_lock`, `one_permit` and `last_permit`, for
/// a driver with reader-writer locks and semaphores. `$factory` names an
/// async fn of the calling module that makes a client.
///
/// ```ignore
/// dlock_conformance::conformance_tests!(redis);
/// dlock_conformance::shared_kind_tests!(redis);
/// ```
#[macro_export]
macro_rules! shared_kind_tests {
    ($factory:ident) => {
        /// The mutex suite again, on the write lock.
        mod write_lock {
            use super::*;

            async fn write_lock_client() -> ::std::sync::Arc<dyn $crate::__private::Backend> {
                ::std::sync::Arc::new($crate::MutexAs::write_lock($factory().await))
            }

            $crate::conformance_tests!(write_lock_client);
        }

        /// The mutex suite again, on a semaphore of one permit.
        mod one_permit {
            use super::*;

            async fn one_permit_client() -> ::std::sync::Arc<dyn $crate::__private::Backend> {
                ::std::sync::Arc::new($crate::MutexAs::one_permit($factory().await))
            }

            $crate::conformance_tests!(one_permit_client);
        }

        /// The mutex suite again, on the last free permit of semaphores
        /// of three.
        mod last_permit {
            use super::*;

            async fn last_permit_clients() -> $crate::Factory {
                $crate::MutexAs::last_permit_clients($crate::__private::factory($factory), 3).await
            }

            $crate::__case_list!(__stamp_tests { setup last_permit_clients() });
        }
    };
}

/// The fault cases again on a driver's write lock and on its semaphore of
/// one permit ([`MutexAs`]), in modules `write_lock` and `one_permit`.
/// `$connect` names an async fn of the calling module, as for
/// [`fault_tests!`].
#[macro_export]
macro_rules! shared_kind_fault_tests {
    ($connect:ident, $service:expr) => {
        /// The fault cases again, on the write lock.
        mod write_lock {
            use super::*;

            async fn connect_write_lock(
                url: String,
            ) -> ::std::sync::Arc<dyn $crate::__private::Backend> {
                ::std::sync::Arc::new($crate::MutexAs::write_lock($connect(url).await))
            }

            $crate::fault_tests!(connect_write_lock, $service);
        }

        /// The fault cases again, on a semaphore of one permit.
        mod one_permit {
            use super::*;

            async fn connect_one_permit(
                url: String,
            ) -> ::std::sync::Arc<dyn $crate::__private::Backend> {
                ::std::sync::Arc::new($crate::MutexAs::one_permit($connect(url).await))
            }

            $crate::fault_tests!(connect_one_permit, $service);
        }
    };
}
