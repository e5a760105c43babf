//! Helpers of this crate's own tests (the shared ones are in
//! `dlock_conformance::support`). Each test binary uses some of them.
#![allow(dead_code)]

use std::time::Duration;

use dlock_conformance::proxy::FaultProxy;
use dlock_redis::RedisBackend;
use dlock_redis::redis::{self, aio::ConnectionLike};

/// A client whose waiters poll at most every `poll` when no wake-up comes.
pub async fn polling_every(url: impl Into<String>, poll: Duration) -> RedisBackend {
    RedisBackend::builder(url)
        .max_poll_interval(poll)
        .connect()
        .await
        .expect("connect")
}

/// A proxy in front of the Redis at `url`, to cut or slow one client's
/// links.
pub async fn proxy_to(url: &str) -> FaultProxy {
    let port = url.rsplit(':').next().expect("a URL with a port");
    let addr = format!("127.0.0.1:{port}").parse().expect("a port number");
    FaultProxy::start(addr).await.expect("start the proxy")
}

/// How many times the server behind `conn` has run each of `commands`
/// (lower case, as `INFO commandstats` names them: `publish`, `evalsha`,
/// `spublish`), calls made from scripts included; 0 for a command it
/// never ran. All counts come from one `INFO`, so they are of one moment.
///
/// It subtracts nothing for its own `INFO` call, and needs not: Redis
/// counts a command once it has run, so the `INFO` that asks is not yet in
/// its own reply, and it counts as `info`, never as one of the commands
/// asked about. Two readings around an action differ by exactly the
/// action's calls (for any command but `info`, where the first reading's
/// own call shows in the second).
///
/// # Panics
/// When `INFO` fails or a count is not a number.
pub async fn command_calls<const N: usize>(
    conn: &mut impl ConnectionLike,
    commands: [&str; N],
) -> [u64; N] {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    commands.map(|command| {
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |calls| {
                calls
                    .parse()
                    .unwrap_or_else(|_| panic!("cmdstat_{command}: calls={calls}"))
            })
    })
}
