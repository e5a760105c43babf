//! dlock-redis's integration tests, one binary (one link, one set of shared servers).

mod cluster;
mod cluster_conformance;
mod conformance;
mod faults;
mod queue;
mod redis;
mod sentinel;
mod support;
