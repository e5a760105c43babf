#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod pool;
mod sql;
mod wake;

pub use backend::{MIN_PURGE_AGE, MySqlBackend, MySqlBuilder, Purger};
/// The sqlx crate this driver is built on, so that callers use the same
/// version.
pub use sqlx;
