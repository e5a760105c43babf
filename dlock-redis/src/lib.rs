#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod backend;
mod builder;
mod conn;
mod error;
mod eviction;
mod extend;
pub mod fence;
mod keys;
mod list;
mod notify;
mod release;
mod scripts;
mod sentinel;
mod shared;
mod wait;

pub use backend::RedisBackend;
pub use builder::RedisBuilder;
pub use conn::Connection;
pub use keys::cluster_slot;
/// The redis client crate this driver is built on, so that callers use the
/// same version.
pub use redis;
