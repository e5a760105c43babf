//! A lock driver of your own, checked with the conformance suite.
//!
//! `ToyBackend` keeps its locks in a map with TTLs on tokio's clock and
//! polls while waiting: about the least a driver can be. It implements
//! [`Driver`], the protocol alone: core checks names and options, bounds
//! every call and refuses the kinds of lock it does not declare, before
//! and after each call reaches it. `main` runs every
//! case of the suite against it and prints the outcome:
//!
//! ```sh
//! cargo run -p dlock-conformance --example own_driver
//! ```
//!
//! In your own crate you would rather write, in a test file,
//! `dlock_conformance::conformance_tests!(my_factory);` and get one test per
//! case.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use dlock_conformance::{Factory, suite};
use dlock_core::driver::Driver;
use dlock_core::driver::async_trait;
use dlock_core::driver::wait::{Attempt, Backoff, Deadline, wait_for_lock};
use dlock_core::{
    Backend, Capabilities, Error, Lease, LeaseKind, LockInfo, LockOptions, OwnerToken, Result,
};
use tokio::time::Instant;

/// name → (last fencing token, current holder and when its lease ends,
/// the current holder's description)
type Table = HashMap<String, (u64, Option<(OwnerToken, Instant)>, String)>;

#[derive(Debug, Clone, Default)]
struct ToyBackend {
    table: Arc<Mutex<Table>>,
}

impl ToyBackend {
    fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt> {
        let owner = OwnerToken::random()?;
        let sent = Instant::now();
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let (version, holder, described) = table.entry(name.to_owned()).or_default();
        if let Some((_, ends)) = holder.filter(|&(_, ends)| ends > sent) {
            return Ok(Attempt::Held {
                expires_in: Some(ends - sent),
            });
        }
        *version += 1;
        *holder = Some((owner, sent + opts.get_ttl()));
        *described = opts.get_holder().to_owned();
        Ok(Attempt::Acquired(Lease::with_ttl(
            name, owner, *version, opts, sent,
        )))
    }

    /// Applies `f` to the lease's entry if the lease still holds it.
    fn own(&self, lease: &Lease, f: impl FnOnce(&mut Option<(OwnerToken, Instant)>)) -> Result<()> {
        let mut table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match table.get_mut(lease.name()) {
            Some((_, holder, _))
                if holder.is_some_and(|(owner, ends)| owner == lease.owner() && ends > now) =>
            {
                f(holder);
                Ok(())
            }
            _ => Err(Error::NotHeld {
                name: lease.name().to_owned(),
            }),
        }
    }
}

#[async_trait]
impl Driver for ToyBackend {
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::new(LeaseKind::Ttl);
        caps.fencing = true;
        caps.cleanup = true;
        // No `release_after`: the suite's delayed-release cases say so
        // and pass.
        caps
    }

    /// Nothing here waits on a server.
    fn request_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        Ok(self.attempt(name, opts)?.into_lease())
    }

    async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease> {
        let backoff = Backoff::new(Duration::from_millis(5), Duration::from_millis(200));
        wait_for_lock(name, deadline, None, backoff, || async {
            self.attempt(name, opts)
        })
        .await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        self.own(lease, |holder| *holder = None)
    }

    async fn extend(&self, lease: &mut Lease) -> Result<()> {
        let sent = Instant::now();
        let ttl = lease.ttl().unwrap_or_default();
        self.own(lease, |holder| {
            *holder = holder.map(|(owner, _)| (owner, sent + ttl));
        })?;
        lease.extended(sent);
        Ok(())
    }

    async fn holders(&self, name: &str, _limit: usize) -> Result<Vec<LockInfo>> {
        let table = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        Ok(table
            .get(name)
            .and_then(|(version, holder, described)| {
                let (owner, ends) = holder.filter(|&(_, ends)| ends > now)?;
                let info = LockInfo::new(owner, *version, Some(ends - now));
                Some(info.with_holder(described.clone()))
            })
            .into_iter()
            .collect())
    }
}

#[tokio::main]
async fn main() {
    // Every client the suite asks for shares one lock space, as clients of
    // one server would.
    let space = ToyBackend::default();
    let factory: Factory = Arc::new(move || {
        let client: Arc<dyn Backend> = Arc::new(space.clone());
        Box::pin(async move { client })
    });
    let mut failed = 0;
    for case in suite() {
        let passed = tokio::spawn((case.run)(factory.clone())).await.is_ok();
        failed += usize::from(!passed);
        println!("{} {}", if passed { "ok  " } else { "FAIL" }, case.name);
    }
    println!("{} passed, {failed} failed", suite().len() - failed);
    if failed > 0 {
        std::process::exit(1);
    }
}
