#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod conn;
mod keys;
mod notify;
mod scripts;
mod sentinel;

pub use backend::{RedisBackend, RedisBuilder};
pub use conn::Connection;
/// The redis client crate this driver is built on, so that callers use the
/// same version.
pub use redis;
