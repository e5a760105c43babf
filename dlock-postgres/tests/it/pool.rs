//! The SQL drivers' pool (dlock-sql's), on a real PostgreSQL: background
//! work never takes the connections new calls need.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dlock_conformance::harness::{Service, shared};
use dlock_core::{Backend, Error, LockOptions, Locker, Result};
use dlock_postgres::PgBackend;
use dlock_sql::{Conn, Dialect, Pool};
use sqlx::postgres::{PgConnectOptions, PgQueryResult, Postgres};
use sqlx::{Connection, PgConnection};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};

/// Plain connections to the test server.
struct Plain {
    options: PgConnectOptions,
    /// When set, each opening first waits for a permit of the semaphore
    /// (the test hands them out), and is counted once open: a server slow
    /// to accept, on cue.
    gate: Option<(Arc<tokio::sync::Semaphore>, Arc<AtomicUsize>)>,
}

impl Plain {
    fn new(options: PgConnectOptions) -> Self {
        Plain {
            options,
            gate: None,
        }
    }
}

impl Dialect for Plain {
    type Db = Postgres;
    type Mark = ();

    async fn open(&self) -> std::result::Result<(Conn<Self>, ()), sqlx::Error> {
        if let Some((gate, _)) = &self.gate {
            gate.acquire()
                .await
                .map_err(|e| sqlx::Error::Protocol(e.to_string()))?
                .forget();
        }
        let conn = PgConnection::connect_with(&self.options).await?;
        if let Some((_, opened)) = &self.gate {
            opened.fetch_add(1, Ordering::SeqCst);
        }
        Ok((conn, ()))
    }

    fn reusable(_: &sqlx::Error) -> bool {
        false
    }

    fn error(e: sqlx::Error, doing: &str) -> Error {
        Error::backend("test", doing, e)
    }

    fn timed_out(message: String) -> Error {
        Error::timed_out("test", message)
    }

    fn rows_matched(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    fn may_not_create(_: &sqlx::Error) -> bool {
        false
    }
}

/// A connection whose opening outlasts the call that asked for it (the
/// server slow to accept, past the request timeout but within the connect
/// timeout) is kept for the next call: a pool whose every connection was
/// closed (after a stall) fills again even where each call alone could
/// never open one in time. Decided on order: the first call fails while
/// its opening waits at the gate; the gate then lets one opening through
/// while no call runs, and that opening must finish, and a later call
/// succeed on its connection, nothing else having opened.
#[tokio::test]
async fn an_opening_cut_off_by_its_call_serves_the_next_call() {
    let server = shared(Service::Postgres).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let opened = Arc::new(AtomicUsize::new(0));
    let pool = Pool::new(
        Plain {
            options: server.url().parse().unwrap(),
            gate: Some((gate.clone(), opened.clone())),
        },
        2,
        Duration::from_secs(60),
        Duration::from_millis(200),
    );
    let select = || pool.execute(sqlx::raw_sql("SELECT 1"), "select", pool.deadline());
    let cut = select().await.expect_err("no connection can open yet");
    assert!(
        cut.to_string().contains("no connection opened"),
        "the call says its opening ran out of time: {cut}"
    );
    gate.add_permits(1);
    let started = Instant::now();
    while opened.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the opening cut off by its call did not go on"
        );
        sleep(Duration::from_millis(20)).await;
    }
    loop {
        match select().await {
            Ok(_) => break,
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(30),
                "the connection opened after its call gave up never served another: {e}"
            ),
        }
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        opened.load(Ordering::SeqCst),
        1,
        "a call opened a connection of its own"
    );
}

/// The sessions of this test (by its `application_name`) asleep in
/// `pg_sleep`.
async fn asleep(watch: &mut PgConnection, tag: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
         AND query LIKE 'SELECT pg_sleep%' AND state = 'active'",
    )
    .bind(tag)
    .fetch_one(watch)
    .await
    .unwrap()
}

/// Background work (an undo that keeps retrying, each try stuck behind a
/// row lock) takes half the pool at most: with every background task
/// holding its connection in a statement that does not end, new calls
/// still get the other half. Decided on counts, not on time: four
/// background tasks asleep for a minute in a pool of four, two of them
/// asleep, the other two waiting for a turn, and two connections lent to
/// calls beside them.
#[tokio::test]
async fn background_work_leaves_half_the_pool_to_new_calls() {
    let server = shared(Service::Postgres).await;
    let tag = format!("pool{:08x}", fastrand::u32(..));
    let options: PgConnectOptions = server.url().parse().unwrap();
    let pool = Arc::new(Pool::new(
        Plain::new(options.application_name(&tag)),
        4,
        Duration::from_secs(30),
        Duration::from_secs(60),
    ));
    let mut background = JoinSet::new();
    for _ in 0..4 {
        let pool = pool.clone();
        background.spawn(async move {
            let by = Instant::now() + Duration::from_secs(60);
            let work = pool.fetch_all(sqlx::raw_sql("SELECT pg_sleep(60)"), "sleep", by);
            let slept: Result<_> = pool.in_background(by, work).await;
            slept.map(drop)
        });
    }
    let mut watch = PgConnection::connect(server.url()).await.unwrap();
    let started = Instant::now();
    while asleep(&mut watch, &tag).await < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the background work did not start"
        );
        sleep(Duration::from_millis(20)).await;
    }
    let by = Instant::now() + Duration::from_secs(10);
    let first = pool
        .lend("a new call", by)
        .await
        .expect("a connection beside the background work");
    let second = pool.lend("a new call", by).await.expect("a second one");
    assert_eq!(
        asleep(&mut watch, &tag).await,
        2,
        "background work holds half the pool, no more"
    );
    drop((first, second));
    background.abort_all();
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&tag)
    .execute(&mut watch)
    .await
    .unwrap();
}

/// This test's sessions (by `application_name`) waiting for a lock.
async fn blocked(watch: &mut PgConnection, tag: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
         AND wait_event_type = 'Lock'",
    )
    .bind(tag)
    .fetch_one(watch)
    .await
    .unwrap()
}

/// A dropped guard's release, which core sends and retries in the
/// background, is background work too: with the releases of four dropped
/// guards stuck behind a row lock in a pool of four, two of them hold
/// connections and a new call gets one beside them. Decided on counts:
/// the backend's sessions waiting for the row lock.
#[tokio::test]
async fn dropped_guards_release_in_background_turns() {
    let server = shared(Service::Postgres).await;
    let tag = format!("drop{:08x}", fastrand::u32(..));
    let table = format!("w_{tag}");
    let backend = PgBackend::builder(format!("{}?application_name={tag}", server.url()))
        .table(&table)
        .max_connections(4)
        .request_timeout(Duration::from_secs(60))
        .connect()
        .await
        .unwrap();
    let locker = Locker::new(backend.clone());
    let opts = LockOptions::new().ttl(Duration::from_secs(120));
    let mut guards = Vec::new();
    for i in 0..4 {
        guards.push(locker.acquire(&format!("held-{i}"), &opts).await.unwrap());
    }
    let mut blocker = PgConnection::connect(server.url()).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT 1 FROM {table} FOR UPDATE"
    )))
    .execute(&mut blocker)
    .await
    .unwrap();
    drop(guards);
    let mut watch = PgConnection::connect(server.url()).await.unwrap();
    let started = Instant::now();
    while blocked(&mut watch, &tag).await < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the dropped guards' releases did not start"
        );
        sleep(Duration::from_millis(20)).await;
    }
    // The releases are stuck for a minute (the request timeout); a new
    // call that finds no connection in a sixth of that has none.
    let call = backend.try_acquire("free", &opts);
    let beside = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("a connection beside the background releases")
        .unwrap()
        .expect("a free name");
    assert_eq!(
        blocked(&mut watch, &tag).await,
        2,
        "background releases hold half the pool, no more"
    );
    backend.release(&beside).await.unwrap();
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut blocker)
        .await
        .unwrap();
    // The turns come back: the two releases that waited for one go too.
    let started = Instant::now();
    while !backend
        .list("held-", None, 10)
        .await
        .unwrap()
        .locks
        .is_empty()
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the releases that waited for a turn did not run"
        );
        sleep(Duration::from_millis(20)).await;
    }
}
