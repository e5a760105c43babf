//! dlock-torture's integration tests, one binary (one link, one set of shared servers).

mod campaign;
