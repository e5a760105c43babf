//! dlock-postgres's integration tests, one binary (one link, one set of shared servers).

mod conformance;
mod conformance_pgbouncer;
mod conformance_wake_ups;
mod faults;
mod faults_pgbouncer;
mod holder;
mod pool;
mod postgres;
mod session;
