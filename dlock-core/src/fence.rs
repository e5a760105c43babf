//! The resource's side of fencing. A lock's fencing token only protects
//! data when the store refuses a write whose token is below one it has
//! already accepted: a holder paused past its lease (a GC pause, a stalled
//! link) then cannot overwrite what the next holder wrote. The stores'
//! helpers (`dlock_postgres::fence`, `dlock_mysql::fence`,
//! `dlock_redis::fence`) apply [`check_fence`] inside the write itself;
//! [`Fence`] applies it to state this process keeps.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::{Error, Result};

/// The rule every fenced store applies: a write to `resource` with `token`
/// is admitted unless the resource has seen a greater token (`highest`,
/// `None` for none yet). An equal token is the same grant writing again.
///
/// # Errors
/// [`Error::Fenced`] for a stale token.
pub fn check_fence(resource: &str, token: u64, highest: Option<u64>) -> Result<()> {
    match highest {
        Some(highest) if highest > token => Err(Error::Fenced {
            resource: resource.to_owned(),
            token,
            highest,
        }),
        _ => Ok(()),
    }
}

/// Fencing for state this process keeps (a cache, a file it owns, a
/// client of a store with no conditional writes that only this process
/// writes to): the greatest token admitted per resource, and each write
/// run under the admission, so that no older token slips in between the
/// check and the write.
///
/// Fence a resource with the tokens of one lock name only, and of a mutex
/// or a write lock: readers and permits hold together, and a lower token
/// of one of them would be refused.
///
/// For a store that others write to, the check must happen in the store,
/// in the same step as the write: for S3-style object stores, keep the
/// token in the object's metadata, read it with the object's ETag, apply
/// [`check_fence`], and write with `If-Match: <ETag>`; a refused
/// condition means someone wrote meanwhile: read and check again.
///
/// ```
/// let fence = dlock_core::Fence::new();
/// let mut balance = 0;
/// fence.write("account:7", 42, || balance += 10).unwrap();
/// // A holder whose lease ended before token 42 was granted is refused.
/// assert!(fence.write("account:7", 41, || balance += 10).is_err());
/// assert_eq!(balance, 10);
/// ```
#[derive(Debug, Default)]
pub struct Fence {
    highest: Mutex<HashMap<String, u64>>,
}

impl Fence {
    /// A fence that has seen no token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `write` if `token` is admitted for `resource` (see
    /// [`check_fence`]), and records it; the next writes are checked
    /// against it. Writes to one fence run one at a time.
    ///
    /// # Errors
    /// [`Error::Fenced`] for a stale token: `write` did not run.
    pub fn write<T>(&self, resource: &str, token: u64, write: impl FnOnce() -> T) -> Result<T> {
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        check_fence(resource, token, highest.get(resource).copied())?;
        highest.insert(resource.to_owned(), token);
        Ok(write())
    }

    /// The greatest token admitted for `resource`.
    pub fn highest(&self, resource: &str) -> Option<u64> {
        let highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        highest.get(resource).copied()
    }
}
