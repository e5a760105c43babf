//! Waiting until a server answers its own protocol.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, sleep};

use super::Service;

/// How long a server may take to answer its readiness probe.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one probe may wait for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Polls the server's own protocol until it answers.
pub async fn wait_ready(service: Service, url: &str) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let probe = async {
            match service {
                Service::Redis => probe_redis(url).await,
                Service::MariaDb => probe_mysql(url).await,
                Service::ZooKeeper => probe_zookeeper(url).await,
                Service::Postgres | Service::PgBouncer => probe_postgres(url).await,
                Service::Etcd => probe_etcd(url).await,
            }
        };
        // A server that accepts a connection but does not answer yet must
        // not hold the probe forever.
        let probe = tokio::time::timeout(PROBE_TIMEOUT, probe)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {PROBE_TIMEOUT:?}")));
        match probe {
            Ok(()) => return Ok(()),
            Err(e) if started.elapsed() > READY_TIMEOUT => {
                return Err(format!(
                    "dlock harness: {service:?} at {url} not ready after {READY_TIMEOUT:?}: {e}"
                ));
            }
            Err(_) => sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn probe_redis(url: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let pong: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    (pong == "PONG").then_some(()).ok_or(pong)
}

async fn probe_mysql(url: &str) -> Result<(), String> {
    use sqlx::Connection;
    let mut conn = sqlx::MySqlConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let one: i64 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    (one == 1).then_some(()).ok_or_else(|| one.to_string())
}

/// A simple query, as PgBouncer's transaction pooling passes on in one
/// piece (a prepared statement's parts may go to different servers), on a
/// connection without `extra_float_digits`, which a stock PgBouncer
/// refuses at startup.
async fn probe_postgres(url: &str) -> Result<(), String> {
    use sqlx::{ConnectOptions, Row};
    let options: sqlx::postgres::PgConnectOptions = url.parse().map_err(|e| format!("{e}"))?;
    let mut conn = options
        .extra_float_digits(None)
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let row = sqlx::raw_sql("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let one: i32 = row.try_get(0).map_err(|e| e.to_string())?;
    (one == 1).then_some(()).ok_or_else(|| one.to_string())
}

/// ZooKeeper's `srvr` four-letter word: it reports a `Mode:` line only once
/// the server is serving.
async fn probe_zookeeper(connect: &str) -> Result<(), String> {
    let addr = connect.split(',').next().unwrap_or(connect);
    let reply = four_letter_word(addr, "srvr").await?;
    reply.contains("Mode:").then_some(()).ok_or(reply)
}

/// etcd's own health check (`/health` on the client port), which is
/// healthy once the member has a leader and serves.
async fn probe_etcd(url: &str) -> Result<(), String> {
    let addr = url.trim_start_matches("etcd://");
    let addr = addr.split([',', '/']).next().unwrap_or(addr);
    let request = "GET /health HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n";
    let reply = ask(addr, request).await?;
    reply
        .contains("\"health\":\"true\"")
        .then_some(())
        .ok_or(reply)
}

/// Asks a ZooKeeper server at `addr` one of its four-letter words.
pub(crate) async fn four_letter_word(addr: &str, word: &str) -> Result<String, String> {
    ask(addr, word).await
}

/// Sends `request` to `addr` and reads the reply until the server closes
/// the connection, within the probe timeout.
pub(crate) async fn ask(addr: &str, request: &str) -> Result<String, String> {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut reply = String::new();
        stream
            .read_to_string(&mut reply)
            .await
            .map_err(|e| e.to_string())?;
        Ok(reply)
    };
    tokio::time::timeout(PROBE_TIMEOUT, ask)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {PROBE_TIMEOUT:?}")))
}
