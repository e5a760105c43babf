//! What the lock service says about who holds what.

use std::time::Duration;

use crate::OwnerToken;

/// Who holds a lock, as [`Backend::inspect`](crate::Backend::inspect) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The holder's owner token.
    pub owner: OwnerToken,
    /// The holder's fencing token.
    pub fencing_token: u64,
    /// How long the server will keep the lock without an extension; `None`
    /// for session leases.
    pub expires_in: Option<Duration>,
    /// Who the grant is for ([`LockOptions::holder`](crate::LockOptions::holder)), as stored with it;
    /// `None` when the grant stored none (an empty description, or a grant
    /// made by an older client or by another library).
    pub holder: Option<String>,
    /// The kind of hold (for a reader-writer lock or a semaphore, that of
    /// the hold shown); `None` where the driver cannot tell.
    pub mode: Option<crate::Mode>,
}

impl LockInfo {
    /// A holder's description, for drivers.
    pub fn new(owner: OwnerToken, fencing_token: u64, expires_in: Option<Duration>) -> Self {
        LockInfo {
            owner,
            fencing_token,
            expires_in,
            holder: None,
            mode: None,
        }
    }

    /// Sets the kind of hold.
    pub fn with_mode(mut self, mode: crate::Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Sets the holder description; an empty one is none.
    pub fn with_holder(mut self, holder: impl Into<String>) -> Self {
        let holder = holder.into();
        self.holder = (!holder.is_empty()).then_some(holder);
        self
    }
}

/// One held lock, as [`Backend::list`](crate::Backend::list) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The lock name.
    pub name: String,
    /// Its holder.
    pub info: LockInfo,
}

impl HeldLock {
    /// A listed lock, for drivers.
    pub fn new(name: String, info: LockInfo) -> Self {
        HeldLock { name, info }
    }
}

/// One page of [`Backend::list`](crate::Backend::list).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockPage {
    /// Held locks of this page.
    pub locks: Vec<HeldLock>,
    /// The cursor of the next page; `None` on the last page.
    pub next: Option<String>,
}

impl LockPage {
    /// A page, for drivers.
    pub fn new(locks: Vec<HeldLock>, next: Option<String>) -> Self {
        LockPage { locks, next }
    }
}
