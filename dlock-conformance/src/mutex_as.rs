//! [`MutexAs`]: a backend whose mutex is another backend's write lock, or
//! its semaphore of one, so that the whole mutex suite (fault cases
//! included) proves those too.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{
    Backend, Capabilities, Lease, LockInfo, LockOptions, LockPage, Mode, Result, async_trait,
};

/// A backend with every mutex acquire made an acquire in another mode;
/// other modes and every other call pass through. Run the suites on it
/// (`conformance_tests!`, `fault_tests!`) to check that a driver's write
/// lock, or its semaphore of one permit, keeps every rule its mutex keeps.
#[derive(Debug, Clone)]
pub struct MutexAs {
    backend: Arc<dyn Backend>,
    mode: Mode,
}

impl MutexAs {
    /// The mutex as `backend`'s write lock.
    pub fn write_lock(backend: Arc<dyn Backend>) -> Self {
        MutexAs {
            backend,
            mode: Mode::Write,
        }
    }

    /// The mutex as `backend`'s semaphore of one permit.
    pub fn one_permit(backend: Arc<dyn Backend>) -> Self {
        MutexAs {
            backend,
            mode: Mode::Permit(1),
        }
    }

    fn opts(&self, opts: &LockOptions) -> LockOptions {
        match opts.mode_value() {
            Mode::Exclusive => opts.clone().mode(self.mode),
            _ => opts.clone(),
        }
    }
}

#[async_trait]
impl Backend for MutexAs {
    fn capabilities(&self) -> Capabilities {
        // The cases of the shared kinds ran on the driver itself already.
        let mut caps = self.backend.capabilities();
        caps.rwlock = false;
        caps.semaphore = false;
        caps
    }

    fn driver(&self) -> &'static str {
        self.backend.driver()
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        self.backend.try_acquire(name, &self.opts(opts)).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        self.backend.acquire(name, &self.opts(opts)).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.backend.release(lease).await
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        self.backend.extend(lease).await
    }

    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        self.backend.extend_many(leases).await
    }

    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        self.backend.release_after(lease, hold).await
    }

    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        self.backend.downgrade(write, opts).await
    }

    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        self.backend.force_release(name).await
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.backend.inspect(name).await
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        self.backend.list(prefix, cursor, limit).await
    }
}
