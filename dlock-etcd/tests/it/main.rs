//! dlock-etcd's integration tests, one binary (one link, one set of shared servers).

mod cluster;
mod cluster_conformance;
mod conformance;
mod etcd;
mod faults;
mod interop;
