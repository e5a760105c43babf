//! [`MutexAs`]: a backend whose mutex is another backend's write lock,
//! its semaphore of one, or the last free permit of a larger semaphore, so
//! that the whole mutex suite (fault cases included) proves those too.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::{BoxFuture, Factory};
use dlock_core::driver::async_trait;
use dlock_core::{
    Backend, Capabilities, Error, Lease, LockInfo, LockOptions, LockPage, Mode, OwnerToken, Result,
};

/// A backend with every mutex acquire made an acquire in another mode;
/// other modes and every other call pass through. Run the suites on it
/// (`conformance_tests!`, `fault_tests!`) to check that a driver's write
/// lock, or its semaphore of one permit, keeps every rule its mutex keeps.
#[derive(Debug, Clone)]
pub struct MutexAs {
    backend: Arc<dyn Backend>,
    mode: Mode,
    fillers: Option<Arc<Fillers>>,
}

/// The permits held by a client of their own, all but one of each
/// semaphore the suite uses, for [`MutexAs::last_permit`]. Share one
/// among the clients of a case.
#[derive(Debug)]
pub struct Fillers {
    client: Arc<dyn Backend>,
    permits: u32,
    // The owner tokens of each name's filling permits. The lock is held
    // while a name is filled, so that two clients never both fill it.
    held: tokio::sync::Mutex<HashMap<String, Vec<OwnerToken>>>,
}

impl Fillers {
    /// Fillers of semaphores of `permits` (at least 2), held through
    /// `client`, which should stay connected for the whole case (on a
    /// session backend, its permits end with it).
    pub fn new(client: Arc<dyn Backend>, permits: u32) -> Arc<Self> {
        Arc::new(Fillers {
            client,
            permits: permits.max(2),
            held: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Makes sure `permits - 1` permits of `name` are held, taking those
    /// missing. It runs as a task of its own: an acquire dropped meanwhile
    /// (cases drop them on purpose) must not leave a filling half done.
    async fn fill(self: &Arc<Self>, name: &str, top_up: bool) -> Result<()> {
        let (fillers, name) = (Arc::clone(self), name.to_owned());
        let task = tokio::spawn(async move {
            let mut held = fillers.held.lock().await;
            let owners = held.entry(name.clone()).or_default();
            if top_up {
                let live = fillers.client.holders(&name).await?;
                owners.retain(|o| live.iter().any(|h| h.owner == *o));
            }
            // Long enough for any case; nothing renews them.
            let opts = LockOptions::new()
                .permits(fillers.permits)
                .ttl(Duration::from_secs(600))
                .wait(Duration::from_secs(10))
                .holder("dlock-conformance filler");
            // Each owner is kept as soon as it holds: a failure further on
            // must not leave a filler's permit looking like a case's.
            while owners.len() + 1 < fillers.permits as usize {
                owners.push(fillers.client.acquire(&name, &opts).await?.owner());
            }
            Ok(())
        });
        task.await.map_err(|e| Error::Backend {
            backend: "dlock-conformance",
            message: format!("filling a semaphore failed: {e}"),
            source: None,
        })?
    }

    /// `holds` without the fillers' own.
    async fn others(&self, name: &str, holds: Vec<LockInfo>) -> Vec<LockInfo> {
        let held = self.held.lock().await;
        let fillers = held.get(name).map(Vec::as_slice).unwrap_or_default();
        holds
            .into_iter()
            .filter(|h| !fillers.contains(&h.owner))
            .collect()
    }
}

impl MutexAs {
    /// The mutex as `backend`'s write lock.
    pub fn write_lock(backend: Arc<dyn Backend>) -> Self {
        MutexAs {
            backend,
            mode: Mode::Write,
            fillers: None,
        }
    }

    /// The mutex as `backend`'s semaphore of one permit.
    pub fn one_permit(backend: Arc<dyn Backend>) -> Self {
        MutexAs {
            backend,
            mode: Mode::Permit(1),
            fillers: None,
        }
    }

    /// The mutex as the one permit left of `backend`'s semaphores of
    /// `fillers`' size, the others held by `fillers`' client (the first
    /// acquire of a name takes them). `inspect`, `holders` and `list` do
    /// not show the fillers' permits, and `force_release` gives them
    /// back, so every case sees a mutex. Not for fault cases: a server
    /// restart loses the fillers, and the semaphore admits more than one.
    /// Nor for a `force_release` with waiters queued: between the release
    /// of every hold and the fillers' return, more than one may get in.
    pub fn last_permit(backend: Arc<dyn Backend>, fillers: Arc<Fillers>) -> Self {
        MutexAs {
            backend,
            mode: Mode::Permit(fillers.permits),
            fillers: Some(fillers),
        }
    }

    /// Clients of `factory` as [`MutexAs::last_permit`] of semaphores of
    /// `permits`, sharing one [`Fillers`] (whose client it makes first).
    pub async fn last_permit_clients(factory: Factory, permits: u32) -> Factory {
        let fillers = Fillers::new(factory().await, permits);
        Arc::new(move || -> BoxFuture<Arc<dyn Backend>> {
            let (factory, fillers) = (Arc::clone(&factory), Arc::clone(&fillers));
            Box::pin(async move {
                Arc::new(MutexAs::last_permit(factory().await, fillers)) as Arc<dyn Backend>
            })
        })
    }

    /// Fills the name's semaphore before a mutex acquire, if asked to.
    async fn prepare(&self, name: &str, opts: &LockOptions) -> Result<LockOptions> {
        if let (Some(fillers), Mode::Exclusive) = (&self.fillers, opts.get_mode()) {
            // A name refused by the driver is refused to the caller, with
            // no filling.
            dlock_core::validate_name(name)?;
            opts.validate()?;
            fillers.fill(name, false).await?;
        }
        Ok(self.opts(opts))
    }

    fn opts(&self, opts: &LockOptions) -> LockOptions {
        match opts.get_mode() {
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
        let opts = self.prepare(name, opts).await?;
        self.backend.try_acquire(name, &opts).await
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        let opts = self.prepare(name, opts).await?;
        self.backend.acquire(name, &opts).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.backend.release(lease).await
    }

    async fn release_detached(&self, lease: &Lease, until: Instant) -> Result<()> {
        self.backend.release_detached(lease, until).await
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
        let Some(fillers) = &self.fillers else {
            return self.backend.force_release(name).await;
        };
        let Some(removed) = self.inspect(name).await? else {
            return Ok(None);
        };
        // A driver may end one hold per call (a filler's, say) or all.
        for _ in 0..2 * fillers.permits {
            self.backend.force_release(name).await?;
            if self.inspect(name).await?.is_none() {
                fillers.fill(name, true).await?;
                return Ok(Some(removed));
            }
        }
        Err(Error::Backend {
            backend: "dlock-conformance",
            message: format!("force_release of {name:?} never freed its last permit"),
            source: None,
        })
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        if self.fillers.is_none() {
            return self.backend.inspect(name).await;
        }
        Ok(self.holders(name).await?.into_iter().next())
    }

    async fn holders(&self, name: &str) -> Result<Vec<LockInfo>> {
        let holds = self.backend.holders(name).await?;
        match &self.fillers {
            Some(fillers) => Ok(fillers.others(name, holds).await),
            None => Ok(holds),
        }
    }

    async fn watch(&self, name: &str) -> Result<Option<Box<dyn dlock_core::NameWatch>>> {
        // The same name's holds, whichever kind stands in for the mutex.
        self.backend.watch(name).await
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        let mut page = self.backend.list(prefix, cursor, limit).await?;
        if self.fillers.is_some() {
            // Each name as its holds other than the fillers' show it.
            let mut shown = Vec::with_capacity(page.locks.len());
            for mut lock in page.locks {
                if let Some(info) = self.inspect(&lock.name).await? {
                    lock.info = info;
                    shown.push(lock);
                }
            }
            page.locks = shown;
        }
        Ok(page)
    }
}
