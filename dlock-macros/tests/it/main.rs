//! dlock-macros's integration tests, one binary (one link, one set of shared servers).

mod locked;
mod ui;
