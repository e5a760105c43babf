#![doc = include_str!("../README.md")]

use dlock_core::{Capabilities, LeaseKind};

pub mod error;
mod lent;
mod pool;
mod purge;
mod settings;
mod shared;

pub use lent::Lent;
pub use pool::{Conn, Dialect, LendError, Pool};
pub use purge::{MIN_PURGE_AGE, Purger, check_purge_age, spawn_purger};
pub use settings::{Settings, check_url};
pub use shared::{SharedKinds, SharedStatements};

/// Runs statements of `D` on a connection the application lent (a fenced
/// write's transaction, say) within `timeout`: an answer after it is no
/// answer, and the connection's state is then unknown.
///
/// # Errors
/// The driver's error for what `run` failed with, or its timeout error.
pub async fn bounded<D: Dialect, T>(
    timeout: std::time::Duration,
    run: impl Future<Output = sqlx::Result<T>>,
    doing: &str,
) -> dlock_core::Result<T> {
    match tokio::time::timeout(timeout, run).await {
        Ok(done) => done.map_err(|e| D::error(e, doing)),
        Err(_) => Err(D::timed_out(format!(
            "{doing}: no answer within {timeout:?}"
        ))),
    }
}

/// What both SQL drivers can do: leases on the database clock, fencing
/// tokens that fold in that clock (so they keep increasing across a
/// restart or a deleted row), the undo of an acquire of unknown outcome,
/// delayed releases, batch renewal, reader-writer locks and semaphores;
/// wake-ups across processes where the driver has them (`notify`).
pub fn capabilities(notify: bool) -> Capabilities {
    let mut caps = Capabilities::new(LeaseKind::Ttl);
    caps.fencing = true;
    caps.fencing_survives_restart = true;
    caps.distributed = true;
    caps.cleanup = true;
    caps.delayed_release = true;
    caps.batch_extend = true;
    caps.rwlock = true;
    caps.semaphore = true;
    caps.notify = notify;
    caps
}

/// `driver!(Backend, NAME)`: a SQL backend's `Debug` (its request timeout
/// only: the connect options inside hold the password), its
/// `spawn_purger` over its `purge_expired`, its `deadline`, and its
/// [`Driver`](dlock_core::driver::Driver) implementation, which sends each
/// call to the mutex's method or to the shared kinds' ([`SharedKinds`]) by
/// the lease's mode. `Backend` implements [`SharedKinds`], has an `inner`
/// with a `request_timeout` and a `pool`, and these methods:
///
/// ```text
/// async fn purge_expired(&self, older_than: Duration, limit: u32) -> Result<u64>
/// fn notifies(&self) -> bool  // wake-ups across processes
/// async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt>
/// async fn wait_for(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease>
/// async fn release_mutex(&self, lease: &Lease) -> Result<()>
/// async fn hold_mutex(&self, lease: &Lease, hold: Duration) -> Result<()>
/// async fn extend_mutex(&self, lease: &mut Lease) -> Result<()>
/// async fn extend_mutexes(&self, leases: &mut [Lease]) -> Result<Vec<bool>>
/// async fn extend_shared(&self, leases: &mut [Lease]) -> Result<Vec<bool>>
/// async fn inspect_lock(&self, name: &str) -> Result<Option<LockInfo>>
/// async fn holders_of(&self, name: &str) -> Result<Vec<LockInfo>>
/// async fn list_locks(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage>
/// ```
#[macro_export]
macro_rules! driver {
    ($backend:ident, $name:expr) => {
        impl ::std::fmt::Debug for $backend {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($backend))
                    .field("request_timeout", &self.inner.request_timeout)
                    .finish_non_exhaustive()
            }
        }

        impl $backend {
            /// When a call starting now must have returned.
            pub(crate) fn deadline(&self) -> $crate::__private::Instant {
                self.inner.pool.deadline()
            }

            /// Starts a background task that purges rows expired for longer
            /// than `older_than`, every `every` (jittered), in batches of
            /// 1,000. It runs until the returned handle is dropped; failures
            /// are logged and tried again at the next round. Needs a tokio
            /// runtime.
            ///
            /// # Errors
            /// [`Error::InvalidOption`](dlock_core::Error::InvalidOption)
            /// when `every` is under a second.
            pub fn spawn_purger(
                &self,
                every: ::std::time::Duration,
                older_than: ::std::time::Duration,
            ) -> $crate::__private::dlock_core::Result<$crate::Purger> {
                let backend = self.clone();
                $crate::spawn_purger(every, move |limit| {
                    let backend = backend.clone();
                    async move { backend.purge_expired(older_than, limit).await }
                })
            }
        }

        const _: () = {
            use ::std::time::Duration;

            use $crate::__private::dlock_core::driver::batch::extend_by_kind;
            use $crate::__private::dlock_core::driver::wait::Deadline;
            use $crate::__private::dlock_core::driver::{Driver, Turn};
            use $crate::__private::dlock_core::{
                Capabilities, Error, Lease, LockInfo, LockOptions, LockPage, Mode, Result,
            };
            use $crate::SharedKinds;

            #[$crate::__private::async_trait]
            impl Driver for $backend {
                fn capabilities(&self) -> Capabilities {
                    $crate::capabilities(self.notifies())
                }

                fn driver(&self) -> &'static str {
                    $name
                }

                fn request_timeout(&self) -> Duration {
                    self.inner.request_timeout
                }

                async fn try_acquire(
                    &self,
                    name: &str,
                    opts: &LockOptions,
                ) -> Result<Option<Lease>> {
                    Ok(self.attempt(name, opts).await?.into_lease())
                }

                async fn wait(
                    &self,
                    name: &str,
                    opts: &LockOptions,
                    deadline: Deadline,
                ) -> Result<Lease> {
                    self.wait_for(name, opts, deadline).await
                }

                async fn release(&self, lease: &Lease) -> Result<()> {
                    match lease.mode() {
                        Mode::Exclusive => self.release_mutex(lease).await,
                        _ => self.release_shared(lease).await,
                    }
                }

                async fn background_turn(&self, until: $crate::__private::Instant) -> Result<Turn> {
                    Ok(Turn::holding(self.inner.pool.turn(until).await?))
                }

                async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
                    match lease.mode() {
                        Mode::Exclusive => self.hold_mutex(lease, hold).await,
                        _ => self.hold_shared(lease, hold).await,
                    }
                }

                async fn extend(&self, lease: &mut Lease) -> Result<()> {
                    if lease.mode() == Mode::Exclusive {
                        return self.extend_mutex(lease).await;
                    }
                    match self.extend_shared(::std::slice::from_mut(lease)).await?[..] {
                        [true] => Ok(()),
                        _ => Err(Error::not_held(lease.name())),
                    }
                }

                async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
                    if leases.iter().all(|l| l.mode() == Mode::Exclusive) {
                        return self.extend_mutexes(leases).await;
                    }
                    extend_by_kind(
                        leases,
                        |mut mutexes| async move {
                            let held = self.extend_mutexes(&mut mutexes).await;
                            (mutexes, held)
                        },
                        |mut shared| async move {
                            let held = self.extend_shared(&mut shared).await;
                            (shared, held)
                        },
                    )
                    .await
                }

                async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
                    self.downgrade_lease(write, opts).await
                }

                async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
                    self.force_release_any(name).await
                }

                async fn holders(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>> {
                    if limit == 1 {
                        // One cheap statement: the longest hold, with the
                        // name's own fencing token, as `list` shows it.
                        return Ok(self.inspect_lock(name).await?.into_iter().collect());
                    }
                    let mut holders = self.holders_of(name).await?;
                    holders.truncate(limit);
                    Ok(holders)
                }

                async fn list(
                    &self,
                    prefix: &str,
                    cursor: Option<&str>,
                    limit: usize,
                ) -> Result<LockPage> {
                    self.list_locks(prefix, cursor, limit).await
                }
            }
        };
    };
}

/// What [`driver!`] expands to needs; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use async_trait::async_trait;
    pub use dlock_core;
    pub use tokio::time::Instant;
}
