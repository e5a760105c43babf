#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod hold;
mod path;

pub use backend::{ZkBackend, ZkBuilder};
/// The ZooKeeper client crate this driver is built on, so that callers use
/// the same version.
pub use zookeeper_client;
