//! dlock's integration tests, one binary (one link, one set of shared servers).

mod connect;
mod election;
mod examples;
mod jobs;
mod no_panic;
mod observer;
mod reentrant;
mod secrets;
mod tls;
