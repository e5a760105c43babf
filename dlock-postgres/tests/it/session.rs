//! The session mode (`?mode=session`): the whole conformance suite, the
//! mutex suite on its write lock, and the fault cases, against a real
//! PostgreSQL; and its refusal through PgBouncer in transaction mode.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::harness::{ServerOptions, Service, shared, start};
use dlock_core::{Backend, Error};
use dlock_postgres::{PgBackend, PgSessionBackend};

async fn postgres() -> Arc<dyn Backend> {
    let server = shared(Service::Postgres).await;
    let url = format!("{}?mode=session", server.url());
    Arc::new(
        PgSessionBackend::connect(&url)
            .await
            .expect("connect to the test PostgreSQL"),
    )
}

dlock_conformance::conformance_tests!(postgres);

/// The mutex suite again, on the write lock (no semaphores in this mode).
mod write_lock {
    use super::*;

    async fn write_lock_client() -> Arc<dyn Backend> {
        Arc::new(dlock_conformance::MutexAs::write_lock(postgres().await))
    }

    dlock_conformance::conformance_tests!(write_lock_client);
}

async fn connect(url: String) -> Arc<dyn Backend> {
    // The default connect timeout: a loaded machine may take over a
    // second to open a connection (a fork and a SCRAM login on the server),
    // and a call's own connects are bounded by its request timeout anyway.
    let backend = PgBackend::builder(url)
        .request_timeout(dlock_conformance::faults::REQUEST_TIMEOUT)
        .connect_session()
        .await
        .unwrap();
    Arc::new(backend)
}

mod faults {
    use super::*;

    dlock_conformance::fault_tests!(connect, Service::Postgres);

    /// The fault cases again, on the write lock.
    mod write_lock {
        use super::*;

        async fn connect_write_lock(url: String) -> Arc<dyn Backend> {
            Arc::new(dlock_conformance::MutexAs::write_lock(connect(url).await))
        }

        dlock_conformance::fault_tests!(connect_write_lock, Service::Postgres);
    }
}

/// PgBouncer in transaction pooling serves the two connections `connect`
/// opens from one server session. It does when it has one (as it mostly
/// does when not loaded: the shared PgBouncer, busy with other tests,
/// served them from two once in a flake hunt), hence one here.
#[tokio::test]
async fn a_pooler_in_transaction_mode_is_refused_naming_the_mode() {
    let options = ServerOptions {
        files: vec![(
            "/tmp/pgbouncer.extra".into(),
            b"default_pool_size = 1\n".to_vec(),
        )],
        ..ServerOptions::default()
    };
    let pgbouncer = start(Service::PgBouncer, options).await;
    let url = format!("{}?mode=session", pgbouncer.url());
    match PgBackend::builder(url).connect_locker().await {
        Err(Error::InvalidOption {
            option: "mode",
            reason,
        }) => {
            assert!(reason.contains("transaction mode"), "{reason}");
        }
        other => panic!("a session mode through PgBouncer in transaction mode: {other:?}"),
    }
}

/// The versions (`xmin`) of a session-mode client's sessions' rows.
struct Versions {
    conn: sqlx::PgConnection,
    sql: String,
    /// The client's URL, for another on the same table, and the
    /// holders' table.
    url: String,
    sessions: String,
}

impl Versions {
    async fn read(&mut self) -> Vec<(i32, String)> {
        sqlx::query_as(sqlx::AssertSqlSafe(self.sql.clone()))
            .fetch_all(&mut self.conn)
            .await
            .unwrap()
    }
}

/// A session-mode client of at most `max` idle connections on a table of
/// its own, and a look at its sessions' rows.
async fn own_sessions(max: u32) -> (PgSessionBackend, Versions) {
    use sqlx::Connection;

    let server = shared(Service::Postgres).await;
    let table = format!(
        "t{:016x}",
        dlock_core::OwnerToken::random().unwrap().as_u128() as u64
    );
    // Probed every 30 s, so the server ends no idle session of the
    // client (after twice that and the request timeout) during a test on
    // a slow machine.
    let url = format!(
        "{}?mode=session&table={table}&max_connections={max}&max_poll_interval=30s",
        server.url()
    );
    let backend = PgSessionBackend::connect(&url).await.unwrap();
    let conn = sqlx::PgConnection::connect(server.url()).await.unwrap();
    let sessions = format!("public.{table}_sessions");
    let sql = format!("SELECT pid, xmin::text FROM {sessions} ORDER BY pid");
    (
        backend,
        Versions {
            conn,
            sql,
            url,
            sessions,
        },
    )
}

/// The holders' table keeps the rows of live sessions only: a connect
/// deletes (in the background) the row of a session that has ended, here
/// a pid no server session has, and keeps those of another client's idle
/// connections.
#[tokio::test]
async fn a_connect_deletes_the_rows_of_ended_sessions() {
    let (backend, mut versions) = own_sessions(2).await;
    let pids = async |versions: &mut Versions| -> Vec<i32> {
        versions
            .read()
            .await
            .into_iter()
            .map(|(pid, _)| pid)
            .collect()
    };
    let live = pids(&mut versions).await;
    assert_eq!(live.len(), 2, "the client's two idle connections' rows");
    let insert = format!(
        "INSERT INTO {} (pid, holder, hold) VALUES (-1, 'ended', '')",
        versions.sessions
    );
    sqlx::query(sqlx::AssertSqlSafe(insert))
        .execute(&mut versions.conn)
        .await
        .unwrap();
    assert!(pids(&mut versions).await.contains(&-1));
    let other = PgSessionBackend::connect(&versions.url).await.unwrap();
    // Decided on the row's going, whenever the background delete runs:
    // a minute is only the bound of a test that would otherwise hang.
    let started = std::time::Instant::now();
    let mut after = pids(&mut versions).await;
    while after.contains(&-1) && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        after = pids(&mut versions).await;
    }
    assert!(
        !after.contains(&-1),
        "the row of an ended session: {after:?}"
    );
    assert!(
        live.iter().all(|pid| after.contains(pid)),
        "a live session's row went: {live:?} -> {after:?}"
    );
    drop((backend, other));
}

/// A grant writes nothing once its connection's row names its holder and
/// name: the lock, the fence and the mark (`application_name`) cost no row
/// version. One connection, 100 cycles: the row of its session keeps the
/// version its first grant wrote.
#[tokio::test]
async fn a_grant_writes_nothing_once_its_connection_has_its_holder() {
    let (backend, mut versions) = own_sessions(1).await;
    let opts = dlock_core::LockOptions::new();
    let cycle = || async {
        let lease = backend
            .try_acquire("writes", &opts)
            .await
            .unwrap()
            .expect("free");
        backend.release(&lease).await.unwrap();
    };
    cycle().await;
    let before = versions.read().await;
    for _ in 0..100 {
        cycle().await;
    }
    assert_eq!(
        versions.read().await,
        before,
        "grants wrote their session's row"
    );
}

/// A hold whose session's row is gone (deleted by hand) is still one:
/// `holders` shows it by its mark, and `force_release` ends its session.
#[tokio::test]
async fn a_hold_without_its_session_s_row_is_shown_and_ended() {
    let (backend, mut versions) = own_sessions(1).await;
    let opts = dlock_core::LockOptions::new();
    let lease = backend
        .try_acquire("rowless", &opts)
        .await
        .unwrap()
        .expect("free");
    let delete = format!("DELETE FROM {}", versions.sessions);
    sqlx::query(sqlx::AssertSqlSafe(delete))
        .execute(&mut versions.conn)
        .await
        .unwrap();
    let holders = backend.holders("rowless").await.unwrap();
    assert_eq!(
        holders
            .iter()
            .map(|h| (h.owner, h.fencing_token))
            .collect::<Vec<_>>(),
        vec![(lease.owner(), lease.fencing_token())],
        "the hold is not shown"
    );
    let ended = backend.force_release("rowless").await.unwrap();
    assert_eq!(ended.map(|h| h.owner), Some(lease.owner()));
    let again = backend.try_acquire("rowless", &opts).await.unwrap();
    assert!(again.is_some(), "its session was not ended");
}

/// An idle connection whose row names the name asked for is taken first:
/// two names held in turn, each on a connection of its own, write their
/// rows no more (the last connection given back would name the other).
#[tokio::test]
async fn a_name_held_again_takes_the_connection_that_named_it() {
    let (backend, mut versions) = own_sessions(2).await;
    let opts = dlock_core::LockOptions::new();
    let take = async |name: &str| {
        backend
            .try_acquire(name, &opts)
            .await
            .unwrap()
            .expect("free")
    };
    let (a, b) = (take("a").await, take("b").await);
    backend.release(&a).await.unwrap();
    backend.release(&b).await.unwrap();
    let before = versions.read().await;
    for _ in 0..20 {
        for name in ["a", "b"] {
            let lease = take(name).await;
            backend.release(&lease).await.unwrap();
        }
    }
    assert_eq!(
        versions.read().await,
        before,
        "grants wrote their sessions' rows"
    );
}

/// `list` reads the names from the sessions' rows, which outlive their
/// holds: the row of a connection given back idle still names the hold it
/// released, and must not be listed, nor a row that names another name
/// than its session holds; two readers of a name list it once.
#[tokio::test]
async fn list_leaves_out_the_rows_of_given_up_holds() {
    use dlock_core::LockOptions;
    use sqlx::Connection;

    let backend = postgres().await;
    let prefix = format!("{:016x}/", fastrand::u64(..));
    let take = async |name: &str, opts: &LockOptions| {
        let name = format!("{prefix}{name}");
        backend
            .try_acquire(&name, opts)
            .await
            .unwrap()
            .expect("free")
    };
    let held = take("held", &LockOptions::new()).await;
    let read = LockOptions::new().read();
    let readers = [take("read", &read).await, take("read", &read).await];
    // On a connection of its own (the others hold), given back idle.
    let released = take("released", &LockOptions::new()).await;
    backend.release(&released).await.unwrap();

    let page = backend.list(&prefix, None, 10).await.unwrap();
    let listed: Vec<&str> = page.locks.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        listed,
        [format!("{prefix}held"), format!("{prefix}read")],
        "list shows exactly the held names, each once"
    );
    assert_eq!(page.locks[0].info.owner, held.owner());
    assert!(page.next.is_none());

    // A row that names another name than its session holds, as between a
    // grant's lock and the commit of its row's new name: neither is
    // listed (not the row's name, which that session does not hold).
    let mut conn = sqlx::PgConnection::connect(shared(Service::Postgres).await.url())
        .await
        .unwrap();
    let renamed = sqlx::query(
        "UPDATE public.dlock_locks_sessions SET name = convert_to($1 || 'ghost', 'UTF8') \
         WHERE name = convert_to($1 || 'held', 'UTF8')",
    )
    .bind(&prefix)
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(renamed.rows_affected(), 1);
    let page = backend.list(&prefix, None, 10).await.unwrap();
    let listed: Vec<&str> = page.locks.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(
        listed,
        [format!("{prefix}read")],
        "a row's name, not held, listed"
    );
    for lease in readers.iter().chain([&held]) {
        backend.release(lease).await.unwrap();
    }
    let page = backend.list(&prefix, None, 10).await.unwrap();
    assert!(page.locks.is_empty(), "{:?}", page.locks);
}

/// A fault proxy in front of `server` (the harness's own, on 127.0.0.1),
/// and the server's URL through it.
async fn proxied(
    server: &dlock_conformance::harness::Server,
) -> (dlock_conformance::proxy::FaultProxy, String) {
    let port = server
        .port()
        .expect("these tests proxy the harness's own server on 127.0.0.1");
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let proxy = dlock_conformance::proxy::FaultProxy::start(upstream)
        .await
        .unwrap();
    let url = server.url().replace(
        &format!("127.0.0.1:{port}"),
        &format!("127.0.0.1:{}", proxy.addr().port()),
    );
    assert_ne!(url, server.url(), "the URL goes through the proxy");
    (proxy, url)
}

/// A connect over a slow link has its connect timeout, as the lease
/// table's has: each connection it opens (the handshake's round trips,
/// then its session's setup) is bounded by it, not by the shorter request
/// timeout. Each round trip here takes 0.6 s, so the handshake and setup
/// of a connection take ~2-3 s: past the request timeout of 1 s, well
/// within the connect timeout of 30 s. The setup's deadline used to be
/// counted from before the handshake, which then left it no time. The
/// tables are made beforehand, directly: their creation is a request, of
/// one round trip, which the slow link would leave little margin.
#[tokio::test]
async fn a_connect_over_a_slow_link_has_its_connect_timeout() {
    use dlock_conformance::proxy::Fault;

    let server = shared(Service::Postgres).await;
    let session = format!("{}?mode=session", server.url());
    drop(PgSessionBackend::connect(&session).await.unwrap());
    let (proxy, url) = proxied(server).await;
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let backend = PgBackend::builder(url)
        .create_table(false)
        .request_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(30))
        .connect_session()
        .await
        .expect("a connect within its connect timeout");
    drop(backend);
}

/// The server sessions waiting for a lock.
async fn queued(watch: &mut sqlx::PgConnection) -> Vec<i32> {
    sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        .fetch_all(watch)
        .await
        .unwrap()
}

/// A wait whose connection drops while it is queued waits on from a new
/// connection (the dropped one's session is ended, holding nothing), as
/// the lease table's wait rides out a failed look: dropped twice, it is
/// still granted when the holder releases. Twice, because a grant on a
/// connection that sat idle already gets a second connection of its own.
/// On a server of its own, whose only lock waits are this test's.
#[tokio::test]
async fn a_wait_rides_out_its_connection_dropping() {
    use dlock_conformance::proxy::Fault;
    use dlock_core::LockOptions;
    use sqlx::Connection;

    let server = start(Service::Postgres, ServerOptions::default()).await;
    let direct = PgSessionBackend::connect(&format!("{}?mode=session", server.url()))
        .await
        .unwrap();
    let (proxy, url) = proxied(&server).await;
    let waiter = PgBackend::builder(format!("{url}?mode=session"))
        .create_table(false)
        .connect_session()
        .await
        .unwrap();
    let name = "rides-out";
    let opts = LockOptions::new().wait(Duration::from_secs(60));
    let held = direct.try_acquire(name, &opts).await.unwrap().unwrap();
    let wait = tokio::spawn({
        let opts = opts.clone();
        async move { (waiter.acquire(name, &opts).await, waiter) }
    });
    let mut watch = sqlx::PgConnection::connect(server.url()).await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let started = tokio::time::Instant::now();
        let pid = loop {
            let now = queued(&mut watch).await;
            if let Some(&pid) = now.iter().find(|pid| !seen.contains(*pid)) {
                break pid;
            }
            assert!(
                !wait.is_finished(),
                "the wait ended: {:?}",
                wait.await.unwrap().0
            );
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the wait did not queue"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        seen.push(pid);
        proxy.set_open_connections(Fault::Cut);
    }
    direct.release(&held).await.unwrap();
    let (granted, waiter) = wait.await.unwrap();
    let lease = granted.expect("granted on a new connection after two dropped ones");
    waiter.release(&lease).await.unwrap();
}

/// A wait that ends while its server cannot be reached says so: a
/// connection error, not a lock held. Its connections are cut and new
/// ones closed at once. The wait (25 ms) mostly ends during its backoff
/// after a failed try, where a wait that returned at its deadline would
/// report a lock held (a machine slow enough to fail the second try only
/// after the deadline returns that failure either way).
#[tokio::test]
async fn a_wait_on_a_server_out_of_reach_reports_the_connection() {
    use dlock_conformance::proxy::Fault;
    use dlock_core::LockOptions;

    let server = shared(Service::Postgres).await;
    drop(
        PgSessionBackend::connect(&format!("{}?mode=session", server.url()))
            .await
            .unwrap(),
    );
    let (proxy, url) = proxied(server).await;
    let waiter = PgBackend::builder(format!("{url}?mode=session"))
        .create_table(false)
        .connect_session()
        .await
        .unwrap();
    proxy.set(Fault::Cut);
    let opts = LockOptions::new().wait(Duration::from_millis(25));
    match waiter.acquire("out-of-reach", &opts).await {
        Err(Error::Connection { .. }) => {}
        other => panic!("expected a connection error, got {other:?}"),
    }
}
