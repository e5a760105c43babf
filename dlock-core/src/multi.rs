//! Several names at once: acquired in one global order, the order of the
//! names' bytes, so that callers locking overlapping sets (an order and its
//! customer; a batch of accounts) never wait for each other in a cycle;
//! all or nothing, within one wait bound.

use std::collections::BTreeSet;

use futures_util::future::{join_all, select_all};
use tokio::time::Instant;

use crate::{Error, Guard, LockOptions, Locker, Result};

impl Locker {
    /// Acquires every name of `names`, whatever order they come in, in the
    /// order of their bytes, each in the options' mode: the whole set
    /// within the options' wait bound, or none of it. Callers that lock
    /// these names only this way (or one at a time, never holding one while
    /// waiting for another) cannot deadlock, however their sets overlap. A name already held by this task through this
    /// locker is [`Error::Reentrant`] as for [`Locker::acquire`], so lock a
    /// set in one call rather than adding to names held.
    ///
    /// On failure, and when the returned future is dropped midway, the
    /// names acquired so far are released (awaited on failure, so they are
    /// free when the error comes back; in the background when dropped).
    ///
    /// ```
    /// # async fn f(locker: dlock_core::Locker) -> dlock_core::Result<()> {
    /// use std::time::Duration;
    /// let opts = dlock_core::LockOptions::new().wait(Duration::from_secs(5));
    /// let both = locker.acquire_all(&["order:42", "customer:7"], &opts).await?;
    /// // Fence each write with its own name's token.
    /// let order_token = both.fencing_token("order:42");
    /// # let _ = order_token;
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidName`] for a name given twice (or invalid),
    /// [`Error::InvalidOption`] for an empty set; [`Error::Timeout`] (naming
    /// the name it was waiting for, and the time since the call began) when
    /// the wait bound passes; else those of [`Locker::acquire`].
    pub async fn acquire_all<S: AsRef<str>>(
        &self,
        names: &[S],
        opts: &LockOptions,
    ) -> Result<MultiGuard> {
        let names = self.checked_set(names, opts, true)?;
        let started = Instant::now();
        let mut guards = Vec::with_capacity(names.len());
        for name in names {
            let opts = match opts.get_wait() {
                Some(wait) => opts.clone().wait(wait.saturating_sub(started.elapsed())),
                None => opts.clone(),
            };
            match self.acquire(name, &opts).await {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    release_all(guards).await;
                    return Err(match e {
                        Error::Timeout { name, .. } => Error::Timeout {
                            name,
                            waited: started.elapsed(),
                        },
                        e => e,
                    });
                }
            }
        }
        Ok(MultiGuard { guards })
    }

    /// One attempt at each name of `names`, in the order of their bytes:
    /// every guard if all were free, `None` (and those taken released) as
    /// soon as one is held.
    ///
    /// # Errors
    /// As [`Locker::acquire_all`].
    #[must_use = "the guards release their locks when dropped"]
    pub async fn try_acquire_all<S: AsRef<str>>(
        &self,
        names: &[S],
        opts: &LockOptions,
    ) -> Result<Option<MultiGuard>> {
        let names = self.checked_set(names, opts, false)?;
        let mut guards = Vec::with_capacity(names.len());
        for name in names {
            match self.try_acquire(name, opts).await {
                Ok(Some(guard)) => guards.push(guard),
                Ok(None) => {
                    release_all(guards).await;
                    return Ok(None);
                }
                Err(e) => {
                    release_all(guards).await;
                    return Err(e);
                }
            }
        }
        Ok(Some(MultiGuard { guards }))
    }
}

impl Locker {
    /// `names` in lock order, each checked before anything is locked (a
    /// bad name or a reentrant one found only after the names before it
    /// were taken would have held them, and made the caller wait, for
    /// nothing).
    fn checked_set<'a, S: AsRef<str>>(
        &self,
        names: &'a [S],
        opts: &LockOptions,
        waits: bool,
    ) -> Result<Vec<&'a str>> {
        opts.validate()?;
        let names = in_lock_order(names)?;
        for name in &names {
            crate::validate_name(name)?;
            self.check_mode(name, opts, waits)?;
        }
        Ok(names)
    }
}

/// `names` in the order of their bytes; refuses an empty set and a name
/// given twice (it would wait for itself).
fn in_lock_order<S: AsRef<str>>(names: &[S]) -> Result<Vec<&str>> {
    if names.is_empty() {
        return Err(Error::invalid_option("names", "no names to lock"));
    }
    let mut ordered = BTreeSet::new();
    for name in names {
        let name = name.as_ref();
        if !ordered.insert(name.as_bytes()) {
            return Err(Error::InvalidName {
                reason: format!("{name:?} is given twice"),
            });
        }
    }
    // Keys came from `&str`s: they are UTF-8.
    Ok(ordered
        .into_iter()
        .filter_map(|bytes| std::str::from_utf8(bytes).ok())
        .collect())
}

/// Releases `guards` together; their errors are logged by nobody: each
/// lease ends with its TTL or session if its release failed.
async fn release_all(guards: Vec<Guard>) {
    join_all(guards.into_iter().map(Guard::release)).await;
}

/// Every lock of one [`Locker::acquire_all`], held together: each keeps its
/// own lease, renewal and fencing token.
#[derive(Debug)]
#[must_use = "the guards release their locks when dropped: bind them for as long as the locks must be held"]
pub struct MultiGuard {
    /// In lock order.
    guards: Vec<Guard>,
}

impl MultiGuard {
    /// The guards, in lock order (the order of the names' bytes).
    pub fn guards(&self) -> &[Guard] {
        &self.guards
    }

    /// The fencing token of `name`'s grant, to send with each write to what
    /// that name protects; `None` for a name not in the set.
    pub fn fencing_token(&self, name: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|g| g.name() == name)
            .map(Guard::fencing_token)
    }

    /// Whether every lease can still be trusted now.
    pub fn is_valid(&self) -> bool {
        self.guards.iter().all(Guard::is_valid)
    }

    /// Resolves the moment any of the leases can no longer be trusted (see
    /// [`Guard::lost`]).
    pub async fn lost(&self) {
        if self.guards.is_empty() {
            return std::future::pending().await;
        }
        select_all(self.guards.iter().map(|g| Box::pin(g.lost()))).await;
    }

    /// Releases every lock, all at once.
    ///
    /// # Errors
    /// The first release that failed (see [`Guard::release`]); the others
    /// were released all the same.
    pub async fn release(self) -> Result<()> {
        join_all(self.guards.into_iter().map(Guard::release))
            .await
            .into_iter()
            .collect()
    }

    /// The guards, in lock order, to release or keep one by one.
    pub fn into_guards(self) -> Vec<Guard> {
        self.guards
    }
}

#[cfg(test)]
mod tests;
