//! For driver authors: the [`Driver`] trait, a lock service's protocol and
//! nothing else, and the toolkit drivers share: the [`wait`] loops and
//! their [`wait::Deadline`], [`undo`] for requests of unknown
//! outcome, [`admin`] and [`batch`] for operators' calls and mixed renewal
//! batches, and the checks and conversions of settings below.
//!
//! A driver implements [`Driver`]; core makes every driver a [`Backend`]
//! that checks and bounds each call the same way before and after the
//! driver sees it, so a driver cannot forget a check and does not write
//! one. Users (and [`Locker`](crate::Locker)) only ever see that
//! [`Backend`].

use std::fmt::Debug;
use std::time::Duration;

use tokio::time::Instant;

#[cfg(doc)]
use crate::Backend;
use crate::driver::wait::Deadline;
use crate::{Capabilities, Lease, LockInfo, LockOptions, LockPage, Result};

pub mod admin;
pub mod batch;
mod checked;
mod params;
pub mod undo;
pub mod wait;

pub use ::async_trait::async_trait;
pub use checked::GRACE;
pub use params::UrlParams;

pub use crate::name::{host_and_pid, percent_decodes, redact_url};
pub use crate::settings::{
    MAX_SETTING, check_duration, check_hold, check_holder, micros_up, millis_up,
};

/// A driver's turn for background work ([`Driver::background_turn`]):
/// whatever the driver keeps while the work runs (a semaphore's permit),
/// given back when it is dropped.
#[derive(Default)]
pub struct Turn(Option<Box<dyn std::any::Any + Send + Sync>>);

impl Turn {
    /// A turn that keeps `held` until it is dropped.
    pub fn holding(held: impl std::any::Any + Send + Sync) -> Self {
        Turn(Some(Box::new(held)))
    }
}

impl Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Turn").field(&self.0.is_some()).finish()
    }
}

/// A lock service's protocol: what a driver implements. Every `Driver` is
/// a [`Backend`](crate::Backend), through core, and that is how everyone
/// calls it.
///
/// # Contract
///
/// Core has done this before a call reaches the driver, so the driver does
/// not repeat it:
///
/// - the name passed [`validate_name`](crate::validate_name) (for every
///   call that takes a name) and the options [`LockOptions::validate`];
/// - a [`Mode`](crate::Mode) other than a mutex reaches the driver only
///   when its [`Capabilities`] declare it (`rwlock`, `semaphore`): the rest
///   are [`Error::Unsupported`](crate::Error::Unsupported) in core;
/// - [`release_after`](Driver::release_after) is called only with a hold
///   that passed [`check_hold`] and is not zero (core makes a zero hold a
///   plain release), and only when the driver declares
///   `delayed_release`;
/// - [`downgrade`](Driver::downgrade) gets a write lease (anything else is
///   [`Error::NotHeld`](crate::Error::NotHeld) in core) and options that ask
///   for a read hold;
/// - [`extend_many`](Driver::extend_many) gets at most
///   [`MAX_BATCH`](crate::MAX_BATCH) leases (a larger batch goes in
///   several calls, and an error in one fails the whole batch: the leases
///   whose deadline the driver moved stay extended, as ever);
///   [`holders`](Driver::holders) is asked for at most
///   [`MAX_HOLDERS`](crate::MAX_HOLDERS) and the answer is cut there.
///
/// And this after:
///
/// - every call but [`wait`](Driver::wait) and
///   [`background_turn`](Driver::background_turn) (cut off at its
///   `until`) is cut off at the
///   [`request_timeout`](Driver::request_timeout) plus [`GRACE`]
///   ([`force_release`](Driver::force_release): ten request timeouts, for
///   the default's rounds), counted from the call's start. A driver bounds
///   each whole call by one deadline taken when it starts, so that it fails
///   with its own error, and cleans up its own way (closing a connection
///   that still owes a reply), before core drops its future;
/// - [`wait`](Driver::wait) is cut off as [`Deadline::bound`] says, its
///   last look given the request timeout plus [`GRACE`];
/// - a lease that reaches core after its validity deadline is no grant:
///   core releases it in the background and reports the name held (a wait
///   pauses, then looks again while its deadline allows). A wait loop
///   does better to judge each attempt's grant itself, with
///   [`on_arrival`](wait::on_arrival), and keep its place.
///
/// What remains the driver's, besides everything in [`Backend`]'s
/// contract about the server (exclusion, validity counted from before the
/// request, fencing, ownership, undoing an acquire of unknown outcome,
/// cancellation at any await point, waking waiters on release):
///
/// - `capabilities` and `request_timeout` stay the same for the driver's
///   life, and the timeout is above zero;
/// - `holders` honours `limit`, the hold that lasts longest first where it
///   knows: `inspect` asks for one, and should cost one cheap request;
/// - a driver that declares `rwlock` or `semaphore` overrides
///   `force_release`: the default ends one hold;
/// - [`Lease::extended`] only on a confirmed extension;
/// - `Clone` is cheap (an `Arc` inside): core clones the driver to give a
///   late grant back.
///
/// The methods share their names with [`Backend`]'s: with only `Driver` in
/// scope (a glob import of this module, a function generic over `D:
/// Driver`), `driver.try_acquire(…)` calls the protocol itself, unchecked
/// and unbounded. Call through [`Backend`] (or a [`Locker`](crate::Locker)),
/// as users do.
///
/// `dlock-conformance/examples/own_driver.rs` is a complete driver in
/// about a hundred lines.
#[async_trait]
pub trait Driver: Clone + Debug + Send + Sync + 'static {
    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// The driver's name (`redis`, `mysql`, ...), as traces, metrics and
    /// errors show it.
    fn driver(&self) -> &'static str {
        "custom"
    }

    /// The longest one call may take: what core cuts every call off at
    /// (plus [`GRACE`]), and what a wait is given past its bound for its
    /// last look. Above zero, and the same for the driver's life.
    fn request_timeout(&self) -> Duration;

    /// One attempt, as [`Backend::try_acquire`].
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>>;

    /// Waits for the lock until `deadline` (the options' wait bound,
    /// counted from the call's start), as [`Backend::acquire`]: the
    /// driver's wait loop, usually [`wait_for_lock`](crate::driver::wait::wait_for_lock)
    /// around its attempt.
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when the deadline passes
    /// first.
    async fn wait(&self, name: &str, opts: &LockOptions, deadline: Deadline) -> Result<Lease>;

    /// As [`Backend::release`].
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// A turn for a release no caller waits for
    /// ([`Backend::release_detached`]), held while core sends it (one
    /// request timeout). A driver whose callers share a pool of connections
    /// keeps such releases to part of the pool, so that after a stall the
    /// guards dropped during it leave connections to new calls: it waits
    /// here for a turn, until `until` at the latest (core drops the wait
    /// then). The default is a turn at once.
    ///
    /// # Errors
    /// No turn by `until`.
    async fn background_turn(&self, until: Instant) -> Result<Turn> {
        let _ = until;
        Ok(Turn::default())
    }

    /// As [`Backend::release_after`], with a hold above zero; called only
    /// when the driver declares `delayed_release`. The default is
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        let _ = (lease, hold);
        Err(crate::Error::Unsupported {
            backend: self.driver(),
            operation: "release_after",
        })
    }

    /// As [`Backend::extend`].
    async fn extend(&self, lease: &mut Lease) -> Result<()>;

    /// As [`Backend::extend_many`]; the default extends one lease after
    /// another.
    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let mut held = Vec::with_capacity(leases.len());
        for lease in leases {
            match Driver::extend(self, lease).await {
                Ok(()) => held.push(true),
                Err(crate::Error::NotHeld { .. }) => held.push(false),
                Err(e) => return Err(e),
            }
        }
        Ok(held)
    }

    /// As [`Backend::downgrade`], of a write lease; `opts` ask for a read
    /// hold. The default is
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        let _ = (write, opts);
        Err(crate::Error::Unsupported {
            backend: self.driver(),
            operation: "downgrade",
        })
    }

    /// As [`Backend::force_release`]. The default reads the holder with
    /// [`holders`](Driver::holders) and releases with its owner token
    /// (see [`force_release_with`](crate::driver::admin::force_release_with)), which
    /// suits drivers whose release needs nothing else.
    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        crate::driver::admin::force_release_with(
            self.driver(),
            name,
            || async { Ok(Driver::holders(self, name, 1).await?.into_iter().next()) },
            || async { Ok(false) },
            |lease| async move { Driver::release(self, &lease).await },
        )
        .await
    }

    /// The live holds of `name`, at most `limit` of them, the one that
    /// lasts longest first where the driver knows: what
    /// [`Backend::holders`] shows (with `limit`
    /// [`MAX_HOLDERS`](crate::MAX_HOLDERS)) and [`Backend::inspect`] (the
    /// first, asked with `limit` 1).
    async fn holders(&self, name: &str, limit: usize) -> Result<Vec<LockInfo>>;

    /// As [`Backend::list`]; the default is
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        let _ = (prefix, cursor, limit);
        Err(crate::Error::Unsupported {
            backend: self.driver(),
            operation: "list",
        })
    }

    /// As [`Backend::watch`]; the default is `None` (callers poll). Its
    /// setting up is bounded by core; the watch's `changed` is not (it
    /// waits for a change).
    async fn watch(&self, name: &str) -> Result<Option<Box<dyn crate::NameWatch>>> {
        let _ = name;
        Ok(None)
    }
}
