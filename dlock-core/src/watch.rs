//! Being told that a name's holds changed, where the lock service can tell
//! (etcd's watch, ZooKeeper's child watch), rather than reading it again
//! and again: [`Backend::watch`](crate::Backend::watch).

use std::fmt::Debug;

use async_trait::async_trait;

use crate::Result;

/// A watch on one name's holds, from [`Backend::watch`](crate::Backend::watch).
///
/// # Contract
/// [`changed`](NameWatch::changed) resolves after a change of the name's
/// holds (a grant, a release, an expiry, a queue node coming or going)
/// made after the watch began or after the previous `changed` returned,
/// and is re-armed before it returns, so that a caller who reads the name
/// next misses no later change. It may also resolve when nothing changed
/// (the caller reads and finds the same). An error ends the watch: the
/// caller watches anew, or reads on a timer.
#[async_trait]
pub trait NameWatch: Send + Debug {
    /// Resolves at the next change (see the trait's contract).
    ///
    /// # Errors
    /// The watch broke (a lost connection or session, a watch the server
    /// cancelled).
    async fn changed(&mut self) -> Result<()>;
}
