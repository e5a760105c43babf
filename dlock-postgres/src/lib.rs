#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod backend;
mod builder;
mod error;
mod extend;
pub mod fence;
mod list;
mod notify;
mod pool;
mod purge;
mod release;
mod session;
mod shared;
mod sql;
mod wait;

pub use backend::PgBackend;
pub use builder::{PgBuilder, PgMode};
pub use dlock_sql::{MIN_PURGE_AGE, Purger};
pub use session::PgSessionBackend;
/// The sqlx crate this driver is built on, so that callers use the same
/// version.
pub use sqlx;
