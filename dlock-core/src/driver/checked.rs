//! What core does on every call to every driver: the checks before and the
//! bounds after, once, in the one [`Backend`] implementation drivers get.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::Driver;
use crate::driver::check_hold;
use crate::driver::wait::{Backoff, Deadline, on_arrival};
use crate::{
    Backend, Capabilities, Error, Lease, LeaseKind, LockInfo, LockOptions, LockPage, MAX_BATCH,
    MAX_HOLDERS, Mode, Result, validate_name,
};

/// How much longer than its request timeout core lets a driver's call run
/// before dropping it: enough for the driver's own bound, started a little
/// later than core's, to answer first. Not a setting: it may change.
pub const GRACE: Duration = Duration::from_millis(100);

/// `op`, cut off at `requests` request timeouts plus [`GRACE`]. The error
/// names the timeout the user set, not the grace.
async fn bounded<D: Driver, T>(
    driver: &D,
    doing: &str,
    requests: u32,
    op: impl Future<Output = Result<T>>,
) -> Result<T> {
    let limit = driver.request_timeout().saturating_mul(requests);
    tokio::time::timeout(limit.saturating_add(GRACE), op)
        .await
        .map_err(|_| {
            Error::timed_out(
                Driver::driver(driver),
                format!("{doing}: no answer within {limit:?}"),
            )
        })?
}

/// A background release of `lease` that had no turn before its retries
/// ended.
fn no_turn<D: Driver>(driver: &D, lease: &Lease) -> Error {
    Error::timed_out(
        Driver::driver(driver),
        format!(
            "release {:?} in the background: no turn before its retries ended",
            lease.name()
        ),
    )
}

/// A late grant's pause before the wait looks again: long enough not to
/// spin on a server that answers slower than the lease lasts.
fn after_late_grant() -> Backoff {
    Backoff::new(Duration::from_millis(10), Duration::from_secs(1))
}

/// The checks of an acquire: the name, the options, and a kind of lock
/// the driver declares.
/// Refuses a lock-delay where leases live with a session: the server
/// frees a lost session's locks at once.
fn check_lease_kind<D: Driver>(driver: &D, opts: &LockOptions) -> Result<()> {
    let delayed = opts.get_lock_delay().is_some_and(|d| !d.is_zero());
    if delayed && Driver::capabilities(driver).lease == LeaseKind::Session {
        return Err(Error::Unsupported {
            backend: Driver::driver(driver),
            operation: "lock_delay",
        });
    }
    Ok(())
}

fn check_request<D: Driver>(driver: &D, name: &str, opts: &LockOptions) -> Result<()> {
    validate_name(name)?;
    opts.validate()?;
    check_lease_kind(driver, opts)?;
    let caps = Driver::capabilities(driver);
    let (declared, kind) = match opts.get_mode() {
        Mode::Exclusive => (true, ""),
        Mode::Permit(_) => (caps.semaphore, "semaphore"),
        _ => (caps.rwlock, "reader-writer lock"),
    };
    if declared {
        Ok(())
    } else {
        Err(Error::Unsupported {
            backend: Driver::driver(driver),
            operation: kind,
        })
    }
}

#[async_trait]
impl<D: Driver> Backend for D {
    fn capabilities(&self) -> Capabilities {
        Driver::capabilities(self)
    }

    fn driver(&self) -> &'static str {
        Driver::driver(self)
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        check_request(self, name, opts)?;
        let opts = &*opts.for_server();
        let attempt = Driver::try_acquire(self, name, opts);
        let lease = bounded(self, "try to acquire", 1, attempt).await?;
        Ok(lease.and_then(|lease| on_arrival(self, lease).into_lease()))
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        check_request(self, name, opts)?;
        let opts = &*opts.for_server();
        let deadline = Deadline::after(opts.get_wait());
        let wait = async {
            let mut backoff = after_late_grant();
            loop {
                let lease = Driver::wait(self, name, opts, deadline).await?;
                if let Some(lease) = on_arrival(self, lease).into_lease() {
                    return Ok(lease);
                }
                // Given back in the background; a server slower than the
                // lease lasts is asked again, not hammered.
                if deadline.is_past() {
                    return Err(deadline.timeout_error(name));
                }
                tokio::time::sleep(deadline.cap(backoff.next_delay())).await;
            }
        };
        let last_look = self.request_timeout().saturating_add(GRACE);
        deadline.bound(name, last_look, wait).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        bounded(self, "release", 1, Driver::release(self, lease)).await
    }

    async fn release_detached(&self, lease: &Lease, until: Instant) -> Result<()> {
        let turn = Driver::background_turn(self, until);
        let Ok(turn) = tokio::time::timeout_at(until + GRACE, turn).await else {
            return Err(no_turn(self, lease));
        };
        // The driver's own "no turn" names no lock.
        let _turn = turn.map_err(|e| match e {
            Error::Timeout { .. } => no_turn(self, lease),
            e => e,
        })?;
        Backend::release(self, lease).await
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        check_hold(hold)?;
        if hold.is_zero() {
            return Backend::release(self, lease).await;
        }
        if !Driver::capabilities(self).delayed_release {
            return Err(Error::Unsupported {
                backend: Driver::driver(self),
                operation: "release_after",
            });
        }
        let release = Driver::release_after(self, lease, hold);
        bounded(self, "release after a hold", 1, release).await
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        bounded(self, "extend", 1, Driver::extend(self, lease)).await
    }

    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let mut held = Vec::with_capacity(leases.len());
        for batch in leases.chunks_mut(MAX_BATCH) {
            let extended = bounded(self, "extend", 1, Driver::extend_many(self, batch)).await?;
            if extended.len() != batch.len() {
                return Err(Error::Backend {
                    backend: Driver::driver(self),
                    message: format!(
                        "extend_many answered for {} leases of {}",
                        extended.len(),
                        batch.len()
                    ),
                    source: None,
                });
            }
            held.extend(extended);
        }
        Ok(held)
    }

    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        if !Driver::capabilities(self).rwlock {
            return Err(Error::Unsupported {
                backend: Driver::driver(self),
                operation: "downgrade",
            });
        }
        if write.mode() != Mode::Write {
            return Err(Error::not_held(write.name()));
        }
        let opts = opts.clone().read();
        opts.validate()?;
        check_lease_kind(self, &opts)?;
        let opts = opts.for_server();
        bounded(self, "downgrade", 1, Driver::downgrade(self, write, &opts)).await
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        validate_name(name)?;
        // Up to five rounds of a look and a release (see
        // `force_release_with`), each its own request.
        bounded(self, "force release", 10, Driver::force_release(self, name)).await
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        validate_name(name)?;
        let holders = bounded(self, "inspect", 1, Driver::holders(self, name, 1)).await?;
        Ok(holders.into_iter().next())
    }

    async fn holders(&self, name: &str) -> Result<Vec<LockInfo>> {
        validate_name(name)?;
        let holders = Driver::holders(self, name, MAX_HOLDERS);
        let mut holders = bounded(self, "list the holders", 1, holders).await?;
        holders.truncate(MAX_HOLDERS);
        Ok(holders)
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        let list = Driver::list(self, prefix, cursor, limit.max(1));
        bounded(self, "list", 1, list).await
    }

    async fn watch(&self, name: &str) -> Result<Option<Box<dyn crate::NameWatch>>> {
        validate_name(name)?;
        bounded(self, "watch", 1, Driver::watch(self, name)).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_trait::async_trait;
    use tokio::time::Instant;

    use super::*;
    use crate::{Locker, MemoryBackend};

    /// A mutex-only protocol that checks nothing and answers late: every
    /// grant's validity ended before it was returned.
    #[derive(Debug, Clone, Default)]
    struct Careless(MemoryBackend);

    #[async_trait]
    impl Driver for Careless {
        fn capabilities(&self) -> Capabilities {
            let mut caps = Driver::capabilities(&self.0);
            caps.rwlock = false;
            caps.semaphore = false;
            caps
        }
        fn request_timeout(&self) -> Duration {
            Duration::from_secs(1)
        }
        async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
            let lease = Driver::try_acquire(&self.0, name, opts).await?;
            Ok(lease.map(|lease| {
                let long_ago = Instant::now() - opts.get_ttl() * 2;
                Lease::with_ttl(name, lease.owner(), lease.fencing_token(), opts, long_ago)
            }))
        }
        async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease> {
            Driver::wait(&self.0, name, opts, deadline).await
        }
        async fn release(&self, lease: &Lease) -> Result<()> {
            Driver::release(&self.0, lease).await
        }
        async fn extend(&self, lease: &mut Lease) -> Result<()> {
            Driver::extend(&self.0, lease).await
        }
        async fn holders(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>> {
            Driver::holders(&self.0, name, limit).await
        }
    }

    #[tokio::test]
    async fn what_a_driver_does_not_check_core_refuses() {
        let memory = MemoryBackend::new();
        let (opts, bad_ttl) = (LockOptions::new(), LockOptions::new().ttl(Duration::ZERO));
        // The protocol alone takes an empty name and a zero TTL...
        assert!(matches!(
            Driver::try_acquire(&memory, "", &opts).await,
            Ok(Some(_))
        ));
        assert!(matches!(
            Driver::try_acquire(&memory, "z", &bad_ttl).await,
            Ok(Some(_))
        ));
        // ...and no call through core does.
        let locker = Locker::new(memory.clone());
        let r = locker.try_acquire("", &opts).await;
        assert!(matches!(r, Err(Error::InvalidName { .. })), "{r:?}");
        let r = locker.acquire("", &opts).await;
        assert!(matches!(r, Err(Error::InvalidName { .. })), "{r:?}");
        let r = Backend::inspect(&memory, "").await;
        assert!(matches!(r, Err(Error::InvalidName { .. })), "{r:?}");
        let r = Backend::force_release(&memory, "a\0b").await;
        assert!(matches!(r, Err(Error::InvalidName { .. })), "{r:?}");
        let r = locker.try_acquire("y", &bad_ttl).await;
        assert!(matches!(r, Err(Error::InvalidOption { .. })), "{r:?}");
        let lease = Backend::try_acquire(&memory, "x", &opts).await.unwrap();
        let lease = lease.expect("free");
        let r = Backend::release_after(&memory, &lease, Duration::MAX).await;
        assert!(matches!(r, Err(Error::InvalidOption { .. })), "{r:?}");
    }

    #[tokio::test]
    async fn kinds_a_driver_does_not_declare_are_unsupported() {
        let careless = Careless::default();
        for opts in [LockOptions::new().read(), LockOptions::new().permits(3)] {
            let r = Backend::try_acquire(&careless, "kinds", &opts).await;
            assert!(
                matches!(r, Err(Error::Unsupported { .. })),
                "{opts:?}: {r:?}"
            );
        }
        assert!(
            Backend::inspect(&careless, "kinds")
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_grant_past_its_deadline_is_no_grant_and_is_given_back() {
        let careless = Careless::default();
        let opts = LockOptions::new().ttl(Duration::from_secs(5));
        let r = Backend::try_acquire(&careless, "late", &opts)
            .await
            .unwrap();
        assert!(r.is_none(), "a late grant was returned: {r:?}");
        // Released in the background: the name is free again.
        let started = Instant::now();
        while Backend::inspect(&careless, "late").await.unwrap().is_some() {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "never given back"
            );
            tokio::task::yield_now().await;
        }
    }
}
