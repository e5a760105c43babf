#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod backend;
mod builder;
mod downgrade;
mod error;
mod extend;
mod hold;
mod list;
mod node_hold;
mod path;
mod release;
mod semaphore;
mod session;
mod wait;
mod watch;

pub use backend::ZkBackend;
pub use builder::ZkBuilder;
/// The ZooKeeper client crate this driver is built on, so that callers use
/// the same version.
pub use zookeeper_client;
