//! Wrong drivers for the controls: the in-memory reference driver with one
//! promise broken, to show the checker sees each kind of violation.

use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use dlock::{Backend, Capabilities, LockInfo, LockOptions, LockPage, MemoryBackend, Result};
use dlock::{Lease, Mode};
use tokio::time::Instant;

/// Which promise the mutant breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    /// A name is kept as two names on the server, picked at random per
    /// acquire: two holders at once, each with its own token sequence.
    SplitBrain,
    /// One mutex grant in ten carries the token before its own, as a
    /// driver that lost its counter would.
    StaleToken,
}

/// The reference driver with one promise broken.
#[derive(Debug)]
pub struct Mutant {
    inner: MemoryBackend,
    broken: Broken,
    rng: Mutex<fastrand::Rng>,
}

impl Mutant {
    /// A fresh lock space that breaks `broken`, deciding with `seed`.
    pub fn new(broken: Broken, seed: u64) -> Self {
        Mutant {
            inner: MemoryBackend::new(),
            broken,
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
        }
    }

    fn one_in(&self, n: u32) -> bool {
        let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
        rng.u32(0..n) == 0
    }

    fn server_name(&self, name: &str) -> String {
        match self.broken {
            Broken::SplitBrain if self.one_in(2) => format!("{name}#split"),
            _ => name.to_owned(),
        }
    }

    fn doctor(&self, lease: Lease, opts: &LockOptions) -> Lease {
        if self.broken != Broken::StaleToken
            || opts.get_mode() != Mode::Exclusive
            || lease.fencing_token() < 2
            || !self.one_in(10)
        {
            return lease;
        }
        let Some(valid_until) = lease.valid_until() else {
            return lease;
        };
        // The lease as granted, with its deadline, and one token lower.
        let ttl = opts.get_ttl().saturating_sub(opts.get_drift());
        let sent = valid_until.checked_sub(ttl).unwrap_or(valid_until);
        Lease::with_ttl(
            lease.name(),
            lease.owner(),
            lease.fencing_token() - 1,
            opts,
            sent,
        )
        .with_mode(lease.mode())
    }
}

#[async_trait]
impl Backend for Mutant {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        let lease = self
            .inner
            .try_acquire(&self.server_name(name), opts)
            .await?;
        Ok(lease.map(|l| self.doctor(l, opts)))
    }

    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease> {
        let lease = self.inner.acquire(&self.server_name(name), opts).await?;
        Ok(self.doctor(lease, opts))
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }

    async fn release_detached(&self, lease: &Lease, until: Instant) -> Result<()> {
        self.inner.release_detached(lease, until).await
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        self.inner.extend(lease).await
    }

    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>> {
        self.inner.inspect(name).await
    }

    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        self.inner.list(prefix, cursor, limit).await
    }
}
