//! dlock-mysql's integration tests, one binary (one link, one set of shared servers).

mod conformance;
mod conformance_wake_ups;
mod faults;
mod holder;
mod mysql;
mod queue;
