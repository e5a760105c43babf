#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
pub mod driver;
mod election;
mod error;
mod fence;
mod finished;
mod guard;
mod info;
mod job;
mod lease;
mod memory;
mod metrics;
mod mode;
mod multi;
mod name;
mod observe;
mod options;
mod renew;
mod settings;
mod shared;
mod watch;

pub use backend::{Backend, Capabilities, LeaseKind, MAX_BATCH, MAX_HOLDERS};
pub use election::{Election, Leader, Leadership, Observer, OnLost, Term};
pub use error::{BoxError, Error, ErrorKind, Result};
pub use fence::{Fence, check_fence};
pub use finished::Finished;
pub use guard::{Guard, Locker};
pub use info::{HeldLock, LockInfo, LockPage};
pub use job::{JobOptions, JobOutcome, JobRun, RunReport, RunResult, Schedule, ScheduledJob};
pub use lease::{Lease, OwnerToken};
pub use memory::MemoryBackend;
pub use mode::{Admission, Mode};
pub use multi::MultiGuard;
pub use name::{MAX_NAME_LEN, validate_name};
pub use observe::Observed;
pub use options::{LockOptions, MAX_HOLDER_LEN, MAX_TTL, MIN_TTL};
pub use shared::Semaphore;
pub use tokio_util::sync::CancellationToken;
pub use watch::NameWatch;

/// Support for dlock's macros; not a public API.
#[doc(hidden)]
pub mod __private {
    /// `#[locked]`: the body ran but its lock could not be released; the
    /// lease ends with its TTL or session.
    pub fn release_failed(name: &str, error: &crate::Error) {
        tracing::warn!(lock = name, %error, "could not release the lock of a #[locked] fn");
    }
}
