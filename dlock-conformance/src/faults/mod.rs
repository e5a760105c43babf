//! Fault cases: the lock's promises under real faults.
//!
//! The link cases fault one client's link to its server: through a
//! [`FaultProxy`](crate::proxy::FaultProxy) for a real server ([`proxied`]
//! builds the clients), or through a driver's own [`Link`] for a driver
//! simulated in memory (the suite's mutants). They take two factories: one
//! for the faulty client (a client and its link; a new link each call) and
//! one for healthy clients of the same lock service.
//!
//! Faulty clients must bound each request by at most [`REQUEST_TIMEOUT`]
//! (a session backend: a session timeout of at most 2 s).
//!
//! The server cases ([`fencing_tokens_keep_increasing_across_a_server_restart`],
//! [`a_server_paused_past_the_lease_loses_it_to_the_next_client`]) start a
//! container of their own.
//!
//! | file | the fault |
//! |---|---|
//! | `takeover.rs` | the holder's link is cut or hangs |
//! | `slow.rs` | replies are late |
//! | `bounds.rs` | the server stalls; acquires are dropped in flight |
//! | `lost_reply.rs` | a queued reader's grant is answered after its request timed out |
//! | `server.rs` | the server restarts or freezes |
//! | `proxied.rs` | (the factories for a real server) |

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::Backend;

use crate::harness::Service;
use crate::proxy::Link;
use crate::support::{long, must_acquire, unique_name};
use crate::{BoxFuture, Factory};

mod bounds;
mod lost_reply;
mod proxied;
mod server;
mod slow;
mod takeover;

pub use bounds::*;
pub use lost_reply::*;
pub use proxied::*;
pub use server::*;
pub use slow::*;
pub use takeover::*;

/// The request timeout faulty clients use: the stall cases allow each call
/// its wait bound plus this (the look made when the wait ends is a request).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

/// What a loaded CI machine may add to any bound the cases check.
const SLACK: Duration = Duration::from_millis(1250);

/// A client whose link to its server a case can fault, and the link.
#[derive(Debug, Clone)]
pub struct FaultyClient {
    /// The client.
    pub backend: Arc<dyn Backend>,
    /// Its link to the server, and only its own.
    pub link: Arc<dyn Link>,
}

/// Makes a new faulty client, with a link of its own, each call.
pub type FaultyFactory = Arc<dyn Fn() -> BoxFuture<FaultyClient> + Send + Sync>;

/// Makes a client of the service from a URL of its server's form, as the
/// server cases need: they start the server, so only they know its URL.
pub type Connect = Arc<dyn Fn(String) -> BoxFuture<Arc<dyn Backend>> + Send + Sync>;

/// One fault case, for running it programmatically.
#[derive(Clone, Copy)]
pub struct FaultCase {
    /// The case's name, as its test is named.
    pub name: &'static str,
    /// Runs the case; it panics when the backend breaks the rule.
    pub run: FaultRun,
}

/// What a fault case faults decides what it is given to run.
#[derive(Clone, Copy)]
pub enum FaultRun {
    /// A link case: a faulty client's link to a server it shares with
    /// healthy clients, so it runs against any driver with a [`Link`].
    Link(fn(FaultyFactory, Factory) -> BoxFuture<()>),
    /// A server case: it starts a server of the service in a container of
    /// its own, then connects to it, so it needs Docker and the
    /// [`harness`](crate::harness).
    Server(fn(Connect, Service) -> BoxFuture<()>),
}

impl std::fmt::Debug for FaultCase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// Fails a case that runs longer than a suite case may, instead of letting
/// a hung backend hang the run.
async fn bounded(case: &str, body: impl Future<Output = ()>) {
    crate::__private::within_case_timeout(case, body).await;
}

/// One acquire and release on a throwaway name, so that the client's
/// connections, prepared statements and scripts are in place before a case
/// slows its link down, as they are in a client that has been running.
async fn warm_up(client: &dyn Backend) {
    let name = unique_name("warm_up");
    let lease = must_acquire(client, &name, &long()).await;
    client.release(&lease).await.expect("warm-up release");
}
