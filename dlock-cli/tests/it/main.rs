//! dlock-cli's integration tests, one binary (one link, one set of shared servers).

mod cli;
mod lead;
mod support;
mod watch;
