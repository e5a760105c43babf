//! dlock-conformance's integration tests, one binary (one link, one set of shared servers).

mod harness_smoke;
mod memory;
mod mutants;
mod proxy;
mod readme;
