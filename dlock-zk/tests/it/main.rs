//! dlock-zk's integration tests, one binary (one link, one set of shared servers).

mod conformance;
mod curator;
mod ensemble;
mod ensemble_conformance;
mod faults;
mod in_doubt;
mod kazoo;
mod zookeeper;
