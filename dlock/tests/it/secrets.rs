//! A password in a URL never shows: not in an error's message, not in any
//! `Debug` output, not in a log line of dlock or of the client libraries
//! under it. Users with secret passwords are made on the test servers; every
//! log line at every level is captured while the drivers connect, lock,
//! fail, and are printed, and the capture is searched for the secret.

#![cfg(all(
    feature = "redis",
    feature = "mysql",
    feature = "postgres",
    feature = "zookeeper",
    feature = "etcd"
))]
#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::io::Write;
use std::sync::{Arc, Mutex};

use dlock::LockOptions;
use dlock_conformance::harness::{ServerOptions, Service, shared, start, unused_port};
use dlock_conformance::support::unique_name;
use tracing_subscriber::filter::LevelFilter;

const SECRET: &str = "Sekr1t-pw-7f3a";

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Takes and releases a lock, printing the guard and the locker as a user
/// debugging would.
async fn lock_once(locker: &dlock::Locker, printed: &mut Vec<String>) {
    let guard = locker
        .try_acquire(&unique_name("secret"), &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    printed.push(format!("{guard:?} {locker:?}"));
    guard.release().await.unwrap();
}

/// Everything printed about `value`, and its outcome.
fn shown<T: std::fmt::Debug, E: std::fmt::Display + std::fmt::Debug>(
    value: &Result<T, E>,
) -> String {
    match value {
        Ok(v) => format!("{v:?}"),
        Err(e) => format!("{e} / {e:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_show_in_errors_debug_output_or_logs() {
    // The users are made before the capture starts: making them sends the
    // password, which is the test's doing, not the drivers'.
    let redis = shared(Service::Redis).await.url();
    let admin = dlock::redis::RedisBackend::connect(redis).await.unwrap();
    let user = unique_name("secret_user");
    let () = dlock::redis::redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                &user,
                "on",
                &format!(">{SECRET}"),
                "~*",
                "&*",
                "+@all",
            ][..],
        )
        .query_async(&mut admin.connection())
        .await
        .unwrap();
    let mysql = shared(Service::MariaDb).await.url();
    let root = sqlx::MySqlPool::connect(mysql).await.unwrap();
    let db_user = format!("s{:x}", fastrand::u32(..));
    for statement in [
        format!("CREATE USER '{db_user}'@'%' IDENTIFIED BY '{SECRET}'"),
        format!("GRANT ALL PRIVILEGES ON dlock.* TO '{db_user}'@'%'"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&root)
            .await
            .unwrap();
    }
    let postgres = shared(Service::Postgres).await.url();
    let mut pg_root = {
        use sqlx::Connection;
        sqlx::PgConnection::connect(postgres).await.unwrap()
    };
    let pg_role = format!("s{:x}", fastrand::u32(..));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {pg_role} LOGIN SUPERUSER PASSWORD '{SECRET}'"
    )))
    .execute(&mut pg_root)
    .await
    .unwrap();
    drop((admin, root, pg_root));
    // etcd: a server of its own with authentication on, and a user with
    // the secret password (etcd requires a root user to turn it on).
    let etcd = start(Service::Etcd, ServerOptions::default()).await;
    let id = etcd.container().unwrap().id().to_owned();
    for command in [
        "user add root:root-pw".to_owned(),
        "user grant-role root root".to_owned(),
        format!("user add app:{SECRET}"),
        "user grant-role app root".to_owned(),
        "auth enable".to_owned(),
    ] {
        let out = std::process::Command::new("docker")
            .args(["exec", &id, "etcdctl", "--endpoints=127.0.0.1:2379"])
            .args(command.split(' '))
            .output()
            .unwrap();
        assert!(out.status.success(), "etcdctl: {out:?}");
    }

    let capture = Capture::default();
    let writer = capture.clone();
    tracing_subscriber::fmt()
        .with_max_level(LevelFilter::TRACE)
        .with_writer(move || writer.clone())
        .init();
    let mut printed = Vec::new();

    // Redis: an ACL user with the secret password.
    let with_secret = redis.replace("redis://", &format!("redis://{user}:{SECRET}@"));
    let locker = dlock::connect(&with_secret).await;
    printed.push(shown(&locker));
    lock_once(&locker.unwrap(), &mut printed).await;
    let wrong = redis.replace("redis://", &format!("redis://{user}:{SECRET}x@"));
    printed.push(shown(&dlock::connect(&wrong).await));
    printed.push(format!(
        "{:?}",
        dlock::redis::RedisBackend::builder(&with_secret)
    ));

    // MariaDB: a user with the secret password.
    let at = mysql.find('@').unwrap();
    let with_secret = format!("mysql://{db_user}:{SECRET}{}", &mysql[at..]);
    let locker = dlock::connect(&with_secret).await;
    printed.push(shown(&locker));
    lock_once(&locker.unwrap(), &mut printed).await;
    let wrong = format!("mysql://{db_user}:{SECRET}x{}", &mysql[at..]);
    printed.push(shown(&dlock::connect(&wrong).await));
    let port = unused_port();
    let refused = format!("mysql://{db_user}:{SECRET}@127.0.0.1:{port}/dlock");
    printed.push(shown(&dlock::connect(&refused).await));
    let malformed = format!("mysql://{db_user}:{SECRET}%zz@127.0.0.1:{port}/dlock");
    printed.push(shown(&dlock::connect(&malformed).await));
    printed.push(format!(
        "{:?}",
        dlock::mysql::MySqlBackend::builder(&with_secret)
    ));

    // PostgreSQL: a role with the secret password.
    let at = postgres.find('@').unwrap();
    let with_secret = format!("postgres://{pg_role}:{SECRET}{}", &postgres[at..]);
    let locker = dlock::connect(&with_secret).await;
    printed.push(shown(&locker));
    lock_once(&locker.unwrap(), &mut printed).await;
    let wrong = format!("postgres://{pg_role}:{SECRET}x{}", &postgres[at..]);
    printed.push(shown(&dlock::connect(&wrong).await));
    let refused = format!("postgres://{pg_role}:{SECRET}@127.0.0.1:{port}/dlock");
    printed.push(shown(&dlock::connect(&refused).await));
    let malformed = format!("postgres://{pg_role}:{SECRET}%zz@127.0.0.1:{port}/dlock");
    printed.push(shown(&dlock::connect(&malformed).await));
    printed.push(format!(
        "{:?}",
        dlock::postgres::PgBackend::builder(&with_secret)
    ));

    // ZooKeeper: digest auth with the secret password.
    let zk = shared(Service::ZooKeeper).await.url();
    let builder = dlock::zk::ZkBackend::builder(format!("zk://{zk}")).digest_auth("app", SECRET);
    printed.push(format!("{builder:?}"));
    let backend = builder.connect().await;
    printed.push(shown(&backend));
    lock_once(&dlock::Locker::new(backend.unwrap()), &mut printed).await;

    // etcd: a user with the secret password.
    let with_secret = etcd
        .url()
        .replace("etcd://", &format!("etcd://app:{SECRET}@"));
    let locker = dlock::connect(&with_secret).await;
    printed.push(shown(&locker));
    lock_once(&locker.unwrap(), &mut printed).await;
    let wrong = etcd
        .url()
        .replace("etcd://", &format!("etcd://app:{SECRET}x@"));
    printed.push(shown(&dlock::connect(&wrong).await));
    let refused = format!("etcd://app:{SECRET}@127.0.0.1:{port}");
    printed.push(shown(&dlock::connect(&refused).await));
    let malformed = format!("etcd://app:{SECRET}%ff@127.0.0.1:{port}");
    printed.push(shown(&dlock::connect(&malformed).await));
    printed.push(format!(
        "{:?}",
        dlock::etcd::EtcdBackend::builder(&with_secret)
    ));

    let logs = String::from_utf8_lossy(&capture.0.lock().unwrap()).into_owned();
    assert!(
        logs.contains("dlock"),
        "the capture saw no dlock log line at all: it would prove nothing"
    );
    for text in printed.iter().chain(std::iter::once(&logs)) {
        assert!(
            !text.contains(SECRET),
            "the password shows in: {}",
            text.lines()
                .find(|l| l.contains(SECRET))
                .unwrap_or_default()
        );
    }
}
