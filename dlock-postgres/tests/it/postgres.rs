//! PostgreSQL-specific behaviour: concurrent first inserts, the clock a
//! blocked statement judges by, fencing across deletes and restores,
//! privileges and configuration errors.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock_conformance::harness::{Server, ServerOptions, Service, shared, start, unused_port};
use dlock_conformance::proxy::{Fault, FaultProxy};
use dlock_conformance::support::{
    long, must_acquire, refused_by_name, unique_name, url_setting_takes_effect,
};
use dlock_core::{Backend, Error, LockOptions};
use dlock_postgres::PgBackend;
use sqlx::Connection;

async fn url() -> &'static str {
    shared(Service::Postgres).await.url()
}

async fn backend() -> PgBackend {
    PgBackend::connect(url().await).await.unwrap()
}

/// A connection of the test's own, to look at and lock the table.
async fn admin() -> sqlx::PgConnection {
    sqlx::PgConnection::connect(url().await).await.unwrap()
}

/// Begins a transaction on `conn` that locks `name`'s row of the default
/// table until the test ends it.
async fn hold_the_row(conn: &mut sqlx::PgConnection, name: &str) {
    sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
    sqlx::query("SELECT 1 FROM public.dlock_locks WHERE name = $1 FOR UPDATE")
        .bind(name.as_bytes())
        .execute(&mut *conn)
        .await
        .unwrap();
}

/// Sixteen clients take a name nobody has taken yet, all at once: the
/// first insert wins, the others find the row held (never a duplicate-key
/// error, never two winners), for each of twenty names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_acquires_of_a_missing_row_have_one_winner() {
    // Sixteen new connections at once, on two loaded cores: time enough.
    let b = PgBackend::builder(url().await)
        .max_connections(16)
        .request_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    for _ in 0..20 {
        let name = unique_name("first");
        let mut tries = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let (b, name) = (b.clone(), name.clone());
            tries.spawn(async move { b.try_acquire(&name, &long()).await });
        }
        let mut winners = 0;
        while let Some(done) = tries.join_next().await {
            match done.unwrap() {
                Ok(Some(_)) => winners += 1,
                Ok(None) => {}
                Err(e) => panic!("a concurrent first acquire failed: {e}"),
            }
        }
        assert_eq!(winners, 1, "{name}: {winners} winners");
    }
}

/// An acquire that waited on another transaction's lock of the row judges
/// expiry, and sets it, by the clock as it is when it runs: with `now()`
/// (the transaction's start) the row, locked for 1.5 s, would look free
/// sooner and its new lease would end 1.5 s early.
#[tokio::test]
async fn an_acquire_blocked_on_a_row_lock_counts_from_when_it_ran() {
    // The statement waits 1.5 s on the row lock: far inside its timeout.
    let b = PgBackend::builder(url().await)
        .request_timeout(Duration::from_secs(10))
        .connect()
        .await
        .unwrap();
    let name = unique_name("blocked");
    let short = LockOptions::new().ttl(Duration::from_millis(500));
    let first = must_acquire(&b, &name, &short).await;
    let mut admin = admin().await;
    hold_the_row(&mut admin, &name).await;
    // Sent while the first lease is live, judged once the row is free,
    // after that lease ended.
    let ttl = Duration::from_secs(3);
    let acquiring = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move { b.try_acquire(&name, &LockOptions::new().ttl(ttl)).await }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::raw_sql("COMMIT").execute(&mut admin).await.unwrap();
    let lease = acquiring
        .await
        .unwrap()
        .unwrap()
        .expect("the lease had ended when the statement ran");
    assert!(lease.fencing_token() > first.fencing_token());
    let left = b.inspect(&name).await.unwrap().unwrap().expires_in.unwrap();
    assert!(
        left > ttl - Duration::from_millis(500),
        "the new lease has {left:?} of {ttl:?} left: its expiry was counted from before the wait"
    );
    b.release(&lease).await.unwrap();
}

/// The token is never lowered: across release, force release, expiry
/// takeover, a deleted row and a restored one (an old, small token), each
/// grant's token is above every earlier one, because it never falls below
/// the database clock.
#[tokio::test]
async fn fencing_tokens_only_go_up_whatever_happens_to_the_row() {
    let b = backend().await;
    let name = unique_name("fences");
    let mut admin = admin().await;
    let mut last = 0;
    let mut next = |token: u64, after: &str| {
        assert!(
            token > last,
            "after {after} the token went from {last} to {token}"
        );
        last = token;
    };
    let lease = must_acquire(&b, &name, &long()).await;
    next(lease.fencing_token(), "the first grant");
    b.release(&lease).await.unwrap();
    let lease = must_acquire(&b, &name, &long()).await;
    next(lease.fencing_token(), "a release");
    b.force_release(&name).await.unwrap();
    let short = LockOptions::new().ttl(Duration::from_millis(100));
    let lease = must_acquire(&b, &name, &short).await;
    next(lease.fencing_token(), "a force release");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lease = must_acquire(&b, &name, &long()).await;
    next(lease.fencing_token(), "an expiry takeover");
    b.release(&lease).await.unwrap();
    sqlx::query("DELETE FROM dlock_locks WHERE name = $1")
        .bind(name.as_bytes())
        .execute(&mut admin)
        .await
        .unwrap();
    let lease = must_acquire(&b, &name, &long()).await;
    next(lease.fencing_token(), "a deleted row");
    b.release(&lease).await.unwrap();
    sqlx::query("UPDATE dlock_locks SET fence = 1 WHERE name = $1")
        .bind(name.as_bytes())
        .execute(&mut admin)
        .await
        .unwrap();
    let lease = must_acquire(&b, &name, &long()).await;
    next(lease.fencing_token(), "a restored row");
    b.release(&lease).await.unwrap();
}

/// Names are bytes compared byte for byte: case, trailing spaces and
/// Unicode normalisation make distinct locks.
#[tokio::test]
async fn names_differing_in_case_space_or_normalisation_are_distinct() {
    let b = backend().await;
    let base = unique_name("Case");
    let names = [
        base.clone(),
        base.to_lowercase(),
        format!("{base} "),
        format!("{base}\u{e9}"),
        format!("{base}e\u{301}"),
    ];
    let mut leases = Vec::new();
    for name in &names {
        leases.push(must_acquire(&b, name, &long()).await);
    }
    for lease in &leases {
        b.release(lease).await.unwrap();
    }
}

/// `connect` creates the table; a role with SELECT, INSERT, UPDATE and
/// DELETE on it and its holds table (and nothing else) works once they
/// exist, reader-writer locks included; a role that may
/// not create a missing table is told what an administrator should run.
#[tokio::test]
async fn the_table_is_created_on_connect_and_least_privilege_suffices() {
    let mut admin = admin().await;
    let id = unique_name("priv").replace('-', "_").to_lowercase();
    let table = format!("t_{}", &id[id.len() - 16..]);
    let fresh = PgBackend::builder(url().await)
        .table(&table)
        .connect()
        .await
        .expect("connect creates the missing table");
    let lease = must_acquire(&fresh, "x", &long()).await;
    fresh.release(&lease).await.unwrap();

    let role = format!("r_{}", &id[id.len() - 12..]);
    for statement in [
        format!("CREATE ROLE {role} LOGIN PASSWORD 'pw'"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {table}, {table}_holds TO {role}"),
        format!("REVOKE CREATE ON SCHEMA public FROM {role}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut admin)
            .await
            .unwrap();
    }
    let good = url().await;
    let at = good.find('@').unwrap();
    let role_url = format!("postgres://{role}:pw{}", &good[at..]);
    let least = PgBackend::builder(&role_url)
        .table(&table)
        .connect()
        .await
        .expect("a role with SELECT, INSERT, UPDATE, DELETE on an existing table can connect");
    let name = unique_name("least");
    let lease = must_acquire(&least, &name, &long()).await;
    least.release(&lease).await.unwrap();
    let reader = must_acquire(&least, &name, &long().read()).await;
    least.release(&reader).await.unwrap();
    least
        .purge_expired(dlock_postgres::MIN_PURGE_AGE, 10)
        .await
        .unwrap();

    let missing = format!("m_{}", &id[id.len() - 16..]);
    match PgBackend::builder(&role_url)
        .table(&missing)
        .connect()
        .await
    {
        Err(e @ Error::Backend { .. }) => {
            let text = e.to_string();
            assert!(text.contains("may not create it"), "{text}");
            assert!(
                text.contains(&format!(
                    "CREATE TABLE IF NOT EXISTS \"public\".\"{missing}\""
                )),
                "{text}"
            );
            assert!(!text.contains(":pw"), "the password leaked: {text}");
        }
        other => panic!("expected the DDL to be shown, got {other:?}"),
    }
}

/// A server of the test's own without autovacuum (whose analyze or vacuum
/// would change what a test counts), and a backend of `table` on it.
async fn alone(table: &str) -> (dlock_conformance::harness::Server, PgBackend) {
    let options = ServerOptions {
        args: ["-c", "autovacuum=off"].map(str::to_owned).to_vec(),
        ..ServerOptions::default()
    };
    let server = start(Service::Postgres, options).await;
    let backend = PgBackend::builder(server.url())
        .table(table)
        .connect()
        .await
        .unwrap();
    (server, backend)
}

/// A purge reads the table a slice at a time (no index leads to expired
/// rows), going on where the last one stopped: each call is bounded work,
/// and calls in turn delete every row expired long enough, and none held
/// or released lately. Slices of one page here, so that a small table is
/// many of them. On a server of its own: an open snapshot of another test
/// would keep the expired rows' old versions on their pages, and the
/// expiry's update would move the rows to new pages at the table's end.
#[tokio::test]
async fn purges_read_the_table_a_slice_at_a_time_and_go_on_where_they_stopped() {
    let table = own_table("purge_slices");
    let (server, b) = alone(&table).await;
    b.set_purge_slice_for_tests(1);
    let old = 1000;
    for i in 0..old {
        let lease = must_acquire(&b, &format!("old-{i}"), &long()).await;
        b.release(&lease).await.unwrap();
    }
    let recent = must_acquire(&b, "recent", &long()).await;
    b.release(&recent).await.unwrap();
    let held = must_acquire(&b, "held", &long()).await;
    let mut admin = sqlx::PgConnection::connect(server.url()).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET expires_at = clock_timestamp() - interval '2 hours' \
         WHERE substr(name, 1, 4) = convert_to('old-', 'UTF8')"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let mut purged = Vec::new();
    for _ in 0..20 {
        purged.push(
            b.purge_expired(dlock_postgres::MIN_PURGE_AGE, 1000)
                .await
                .unwrap(),
        );
    }
    assert!(
        purged[0] > 0 && purged[0] < old,
        "a purge reads eight slices of one page, not the whole table: {purged:?}"
    );
    assert_eq!(purged.iter().sum::<u64>(), old, "{purged:?}");
    let left: Vec<Vec<u8>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT name FROM {table} ORDER BY name"
    )))
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert_eq!(left, [b"held".to_vec(), b"recent".to_vec()]);
    b.release(&held).await.unwrap();
}

#[tokio::test]
async fn configuration_errors_are_typed() {
    let good = url().await;
    let wrong_password = good.replace("dlock:dlock@", "dlock:wrong@");
    match PgBackend::connect(&wrong_password).await {
        Err(e @ Error::Backend { .. }) => {
            assert!(e.to_string().contains("authentication failed"), "{e}");
            assert!(!e.to_string().contains("wrong"), "the password leaked: {e}");
        }
        other => panic!("wrong password: {other:?}"),
    }
    let missing_db = format!("{}/no_such_database", good.trim_end_matches("/dlock"));
    match PgBackend::connect(&missing_db).await {
        Err(e @ Error::Backend { .. }) => {
            assert!(e.to_string().contains("unknown database"), "{e}");
        }
        other => panic!("missing database: {other:?}"),
    }
    let port = unused_port();
    let r = PgBackend::connect(&format!("postgres://dlock:dlock@127.0.0.1:{port}/dlock")).await;
    match r {
        Err(e @ Error::Connection { .. }) => assert!(e.to_string().contains("refused"), "{e}"),
        other => panic!("refused connection: {other:?}"),
    }
    for bad in [
        "mysql://x@127.0.0.1/db".to_owned(),
        "postgres://dlock:dlock@/dlock".to_owned(),
        format!("postgres://dlock:%zz@127.0.0.1:{port}/dlock"),
    ] {
        let r = PgBackend::connect(&bad).await;
        assert!(
            matches!(r, Err(Error::InvalidOption { option: "url", .. })),
            "{r:?}"
        );
    }
    for (option, builder) in [
        ("table", PgBackend::builder(good).table("Locks")),
        (
            "max_connections",
            PgBackend::builder(good).max_connections(0),
        ),
        (
            "request_timeout",
            PgBackend::builder(good).request_timeout(Duration::ZERO),
        ),
        (
            "connect_timeout",
            PgBackend::builder(good).connect_timeout(Duration::MAX),
        ),
    ] {
        match builder.connect().await {
            Err(Error::InvalidOption { option: o, .. }) => assert_eq!(o, option),
            other => panic!("{option}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_server_that_is_down_gives_errors_not_grants() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let server = start(Service::Postgres, ServerOptions::default()).await;
    let b = PgBackend::builder(server.url())
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let lease = must_acquire(&b, "down", &long()).await;
    server.container().unwrap().stop().await.unwrap();
    let r = b.try_acquire("other", &long()).await;
    assert!(matches!(r, Err(Error::Connection { .. })), "{r:?}");
    let r = b.release(&lease).await;
    assert!(matches!(r, Err(Error::Connection { .. })), "{r:?}");
}

/// A server's arguments to count plans. No autovacuum: an analyze of a new
/// table would replan the cached statements, and count plans that are none
/// of theirs.
const PLANNING: [&str; 4] = [
    "-c",
    "pg_stat_statements.track_planning=on",
    "-c",
    "autovacuum=off",
];

/// An acquire and a release cost the server two statements and no `SET
/// LOCAL` (straight to the server, a connection has its settings for its
/// whole session), planned once on a connection
/// (prepared, with one plan for every call), and a renewal of a thousand
/// leases one: counted by pg_stat_statements, on a server of its own so
/// that no other test's statements are counted.
#[tokio::test]
async fn a_cycle_costs_two_statements_planned_once_and_a_renewal_batch_one() {
    let options = ServerOptions {
        args: PLANNING.map(str::to_owned).to_vec(),
        ..ServerOptions::default()
    };
    let server = start(Service::Postgres, options).await;
    let b = PgBackend::builder(server.url())
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    let mut admin = sqlx::PgConnection::connect(server.url()).await.unwrap();
    sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut admin)
        .await
        .unwrap();
    // Statements, `SET LOCAL`s, and how often the statements were planned.
    let counted = async |admin: &mut sqlx::PgConnection| -> (i64, i64, i64) {
        let row = sqlx::raw_sql(
            "SELECT COALESCE(sum(calls) FILTER (WHERE query NOT ILIKE 'SET %'), 0)::bigint, \
                    COALESCE(sum(calls) FILTER (WHERE query ILIKE 'SET %'), 0)::bigint, \
                    COALESCE(sum(plans) FILTER (WHERE query NOT ILIKE 'SET %'), 0)::bigint \
             FROM pg_stat_statements WHERE query NOT ILIKE '%pg_stat_statements%'",
        )
        .fetch_one(admin)
        .await
        .unwrap();
        (
            sqlx::Row::try_get(&row, 0).unwrap(),
            sqlx::Row::try_get(&row, 1).unwrap(),
            sqlx::Row::try_get(&row, 2).unwrap(),
        )
    };
    sqlx::raw_sql("SELECT pg_stat_statements_reset()")
        .execute(&mut admin)
        .await
        .unwrap();
    let cycles = 100;
    for i in 0..cycles {
        let lease = must_acquire(&b, &format!("count-{i}"), &long()).await;
        b.release(&lease).await.unwrap();
    }
    let (statements, settings, plans) = counted(&mut admin).await;
    assert_eq!(statements, 2 * cycles, "statements for {cycles} cycles");
    assert_eq!(settings, 0, "SET LOCALs for {cycles} cycles");
    // Prepared once on the backend's one connection, and planned once:
    // left to choose, PostgreSQL plans a prepared statement's first five
    // runs for their values, and may go on doing so.
    assert!(
        plans <= 2,
        "{plans} plans of the statements of {cycles} cycles"
    );

    let mut leases = Vec::new();
    for i in 0..1000 {
        leases.push(must_acquire(&b, &format!("batch-{i}"), &long()).await);
    }
    sqlx::raw_sql("SELECT pg_stat_statements_reset()")
        .execute(&mut admin)
        .await
        .unwrap();
    let held = b.extend_many(&mut leases).await.unwrap();
    assert!(
        held.iter().all(|&h| h),
        "every lease of the batch is still held"
    );
    assert_eq!(
        counted(&mut admin).await.0,
        1,
        "statements for one batch of 1000"
    );

    // Told not to (`?session_settings=false`), every transaction sets them.
    let url = format!("{}?session_settings=false", server.url());
    let b = PgBackend::builder(url)
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    sqlx::raw_sql("SELECT pg_stat_statements_reset()")
        .execute(&mut admin)
        .await
        .unwrap();
    for i in 0..10 {
        let lease = must_acquire(&b, &format!("local-{i}"), &long()).await;
        b.release(&lease).await.unwrap();
    }
    assert_eq!(
        counted(&mut admin).await.1,
        10 * 10,
        "SET LOCALs of 10 cycles"
    );
}

/// Straight to the server a connection has its statement timeout for its
/// whole session: an acquire blocked on its name's row past the request
/// timeout is cut off by the server, not left waiting for the row after
/// its caller gave up. Decided on whom the row's holder blocks, not on
/// time: without the timeout the acquire's server session waits for as
/// long as the row is held. On a server of its own: the test holds a row
/// for seconds and reads the server's lock waits, which would slow the
/// shared server's other tests.
#[tokio::test]
async fn a_statement_blocked_past_the_request_timeout_is_ended_by_the_server() {
    let server = start(Service::Postgres, ServerOptions::default()).await;
    let b = PgBackend::builder(server.url())
        .request_timeout(Duration::from_secs(3))
        .max_connections(1)
        .connect()
        .await
        .unwrap();
    let name = unique_name("blocked");
    let lease = must_acquire(&b, &name, &long()).await;
    b.release(&lease).await.unwrap();
    let mut holder = sqlx::PgConnection::connect(server.url()).await.unwrap();
    hold_the_row(&mut holder, &name).await;
    let holder_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut holder)
        .await
        .unwrap();
    // Connected before the acquire starts, which is seen blocked only
    // until its request timeout.
    let mut watch = sqlx::PgConnection::connect(server.url()).await.unwrap();
    let acquire = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.try_acquire(&name, &long()).await })
    };
    let blocked = async |watch: &mut sqlx::PgConnection| -> Vec<i32> {
        sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'
               AND $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(holder_pid)
        .fetch_all(watch)
        .await
        .unwrap()
    };
    let mut first = Vec::new();
    while first.is_empty() && !acquire.is_finished() {
        first = blocked(&mut watch).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = *first.first().expect("the acquire waits for the row");
    let r = acquire.await.unwrap();
    assert!(r.is_err(), "an acquire blocked past its timeout: {r:?}");
    let mut ended = false;
    for _ in 0..100 {
        if !blocked(&mut watch).await.contains(&pid) {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();
    assert!(
        ended,
        "the acquire's server session still waits for the row 10 s after its call failed"
    );
}

/// PgBouncer in transaction pooling with one server connection, on a
/// server started with `args`: every client's statements share one server
/// session.
async fn one_server_session(args: Vec<String>) -> Server {
    let options = ServerOptions {
        args,
        files: vec![(
            "/tmp/pgbouncer.extra".into(),
            b"default_pool_size = 1\n".to_vec(),
        )],
        ..ServerOptions::default()
    };
    start(Service::PgBouncer, options).await
}

/// Through PgBouncer, which refuses startup options, or drops them when
/// told to ignore them, every transaction sets its statement timeout,
/// isolation and plans itself (five `SET LOCAL`s): a setting of a server
/// session that PgBouncer lends to other clients would be theirs too.
#[tokio::test]
async fn through_pgbouncer_every_transaction_has_its_own_settings() {
    for extra in ["", "ignore_startup_parameters = options\n"] {
        let options = ServerOptions {
            args: PLANNING.map(str::to_owned).to_vec(),
            files: vec![(
                "/tmp/pgbouncer.extra".into(),
                format!("default_pool_size = 1\n{extra}").into_bytes(),
            )],
            ..ServerOptions::default()
        };
        let server = start(Service::PgBouncer, options).await;
        let b = one_connection(&server).await;
        let mut admin = through(&server).await;
        sqlx::raw_sql(
            "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()",
        )
        .execute(&mut admin)
        .await
        .unwrap();
        for i in 0..10 {
            let lease = must_acquire(&b, &format!("set-{i}"), &long()).await;
            b.release(&lease).await.unwrap();
        }
        let row = sqlx::raw_sql(
            "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements \
             WHERE query ILIKE 'SET LOCAL%'",
        )
        .fetch_one(&mut admin)
        .await
        .unwrap();
        let settings: i64 = sqlx::Row::try_get(&row, 0).unwrap();
        assert_eq!(settings, 10 * 10, "SET LOCALs of 10 cycles ({extra:?})");
    }
}

/// A plain connection through `server`'s PgBouncer, which refuses the
/// startup parameter sqlx sends by default.
async fn through(server: &Server) -> sqlx::PgConnection {
    let options: sqlx::postgres::PgConnectOptions = server.url().parse().unwrap();
    sqlx::PgConnection::connect_with(&options.extra_float_digits(None))
        .await
        .unwrap()
}

/// A backend of one connection to `server`.
async fn one_connection(server: &Server) -> PgBackend {
    PgBackend::builder(server.url())
        .max_connections(1)
        .connect()
        .await
        .unwrap()
}

/// Through PgBouncer in transaction pooling, a statement runs prepared
/// whichever server connection it lands on: one that another client
/// prepared it on already (the `PREPARE` fails, the `EXECUTE` is sent), and
/// one that lacks it although this client prepared it (PgBouncer replaced
/// the server connection: the `EXECUTE` fails, both are sent). Told apart
/// from a statement written out (planned on each run) by the plans counted:
/// PgBouncer has one server connection, so every statement runs on it.
#[tokio::test]
async fn through_pgbouncer_statements_stay_prepared_on_any_server_connection() {
    let server = one_server_session(PLANNING.map(str::to_owned).to_vec()).await;
    let admin = async || through(&server).await;
    let (first, second) = (one_connection(&server).await, one_connection(&server).await);
    let cycles = async |b: &PgBackend, n: usize| {
        for i in 0..n {
            let lease = must_acquire(b, &format!("bounced-{i}"), &long()).await;
            b.release(&lease).await.unwrap();
        }
    };
    sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut admin().await)
        .await
        .unwrap();
    cycles(&first, 10).await;
    // Prepared on the server connection by `first` already.
    cycles(&second, 30).await;
    // The server connection ends; PgBouncer opens another, without them.
    let ended = sqlx::raw_sql("SELECT pg_terminate_backend(pg_backend_pid())")
        .execute(&mut admin().await)
        .await;
    assert!(ended.is_err(), "the session ended itself: {ended:?}");
    cycles(&first, 30).await;
    let row = sqlx::raw_sql(
        "SELECT COALESCE(sum(calls), 0)::bigint, COALESCE(sum(plans), 0)::bigint \
         FROM pg_stat_statements WHERE query ILIKE '%dlock_locks%'",
    )
    .fetch_one(&mut admin().await)
    .await
    .unwrap();
    let calls: i64 = sqlx::Row::try_get(&row, 0).unwrap();
    let plans: i64 = sqlx::Row::try_get(&row, 1).unwrap();
    assert!(calls >= 140, "{calls} runs of the statements of 70 cycles");
    // Two sessions, each planning the acquire and the release once;
    // written out, the 60 cycles after the first ten would have planned
    // 120 times.
    assert!(plans <= 2 * 2, "{plans} plans of {calls} runs");
}

/// A call of several prepared statements (a semaphore's acquire: the
/// row's lock, then the grant) on a server session that has some of them
/// and lacks others: one client prepared them all there, and then some
/// were dropped (by hand here; behind a pooler, another client's session
/// may have prepared some). The server names the one it lacks, and the
/// call prepares it, and the parts after it, keeps the others as they
/// were, and runs them all as `EXECUTE`s of one generic plan, never
/// falling back to the statement written out; so does a client that has
/// prepared nothing yet, whose `PREPARE`s find some there already. PgBouncer has one server connection, so both backends and the
/// hand that drops statements share its session.
#[tokio::test]
async fn a_call_prepares_only_the_statements_its_session_lacks() {
    let server = one_server_session(Vec::new()).await;
    let mut admin = through(&server).await;
    let one = async || one_connection(&server).await;
    let opts = long().permits(2);
    // Each of ours: its name, when it was prepared, and its custom plans.
    let prepared = async |admin: &mut sqlx::PgConnection| -> Vec<(String, String, i64)> {
        sqlx::query_as(
            "SELECT name, prepare_time::text, custom_plans FROM pg_prepared_statements \
             WHERE name LIKE 'dlock_%' ORDER BY name",
        )
        .fetch_all(admin)
        .await
        .unwrap()
    };
    let cycle = async |b: &PgBackend| {
        let lease = must_acquire(b, "partly-prepared", &opts).await;
        b.release(&lease).await.unwrap();
    };
    sqlx::raw_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(&mut admin)
        .await
        .unwrap();
    let first = one().await;
    cycle(&first).await;
    let all = prepared(&mut admin).await;
    // Each call's two: the row's lock, then the grant or the change.
    assert!(all.len() >= 4, "prepared: {all:?}");
    for second in [false, true] {
        let before = prepared(&mut admin).await;
        // Every call's first part, then every call's last: each call
        // finds some of its statements there and lacks others.
        let dropped: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM pg_prepared_statements \
             WHERE name LIKE 'dlock_%' AND (statement LIKE '%WHERE false%') = $1",
        )
        .bind(!second)
        .fetch_all(&mut admin)
        .await
        .unwrap();
        assert!(
            !dropped.is_empty() && dropped.len() < before.len(),
            "dropped {dropped:?} of {before:?}"
        );
        for name in &dropped {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DEALLOCATE {name}")))
                .execute(&mut admin)
                .await
                .unwrap();
        }
        // `first` believes its session has them all; a new backend that
        // none are there.
        let b = if second { one().await } else { first.clone() };
        cycle(&b).await;
        cycle(&b).await;
        let after = prepared(&mut admin).await;
        let names = |list: &[(String, String, i64)]| -> Vec<String> {
            list.iter().map(|(name, ..)| name.clone()).collect()
        };
        assert_eq!(names(&after), names(&before), "prepared again");
        for (kept, now) in before.iter().zip(&after) {
            if !dropped.contains(&kept.0) {
                assert_eq!(kept.1, now.1, "{} was prepared once", kept.0);
            }
            assert_eq!(now.2, 0, "{} was planned for its values", now.0);
        }
        // Every row's lock ran as an `EXECUTE`: no call gave up and went
        // written out (a session that names what it lacks never needs to).
        let written_out: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements \
             WHERE query LIKE '%SET owner = l.owner WHERE%' AND query NOT LIKE 'PREPARE%'",
        )
        .fetch_one(&mut admin)
        .await
        .unwrap();
        assert_eq!(written_out, 0, "a call went written out");
    }
}

/// A renewal updates its lease's row in place (no indexed column changes,
/// and half of each page is left for new versions: a HOT update), so a
/// table of held leases keeps its size however often they are renewed.
/// With an index on the expiry, each renewal added a row version and an
/// entry to each index until a vacuum: ~2 KB a lease at 100,000.
///
/// On a server of its own: the old versions can be cleared only once no
/// snapshot may see them, and other tests hold transactions open.
#[tokio::test]
async fn renewals_do_not_grow_the_lock_table() {
    let table = own_table("renewals_in_place");
    let (server, b) = alone(&table).await;
    let mut leases = Vec::new();
    for i in 0..1000 {
        leases.push(must_acquire(&b, &format!("kept-{i}"), &long()).await);
    }
    let mut admin = sqlx::PgConnection::connect(server.url()).await.unwrap();
    let mut size = async || {
        sqlx::query_scalar::<_, i64>("SELECT pg_total_relation_size($1::regclass)")
            .bind(format!("public.{table}"))
            .fetch_one(&mut admin)
            .await
            .unwrap()
    };
    let before = size().await;
    for _ in 0..20 {
        let held = b.extend_many(&mut leases).await.unwrap();
        assert!(held.iter().all(|&h| h), "every lease is still held");
    }
    let after = size().await;
    assert!(
        after <= before + before / 5,
        "1,000 leases renewed 20 times: {before} → {after} bytes"
    );
}

/// A waking client of `table` whose waiters poll at most every `poll`.
async fn waking(table: &str, poll: Duration) -> PgBackend {
    PgBackend::builder(url().await)
        .table(table)
        .wake_ups(true)
        .max_poll_interval(poll)
        .connect()
        .await
        .unwrap()
}

/// A table of the test's own, so that its release channel is too.
fn own_table(test: &str) -> String {
    let id = unique_name(test).replace('-', "_").to_lowercase();
    format!("w_{}", &id[id.len() - 16..])
}

/// Waits until `check` holds, for at most `within`.
async fn eventually(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let until = tokio::time::Instant::now() + within;
    while !check() {
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// A release in another process reaches a waiting backend as a
/// notification, which wakes its waiter: it gets the lock at once. Counted
/// on the listener, so that a poll landing by chance cannot pass for it.
/// The release comes once the waiter has its place: a waiter listens
/// before it queues, and a release finding no place names nobody (the
/// waiter's next look then finds the lock free, unannounced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_in_another_process() {
    let table = own_table("wake");
    let holder = waking(&table, Duration::from_secs(1)).await;
    let waiter = waking(&table, Duration::from_secs(60)).await;
    let name = unique_name("wake");
    let lease = must_acquire(&holder, &name, &long()).await;
    let task = dlock_conformance::support::wait_on_task(
        waiter.clone(),
        &name,
        long().wait(Duration::from_secs(50)),
    );
    assert!(
        eventually(Duration::from_secs(10), || waiter
            .listener_counts_for_tests()
            .0
            >= 1)
        .await,
        "the waiting backend never listened"
    );
    let _ = queued(
        &mut admin().await,
        &table,
        &name,
        1,
        "the waiter never queued",
    )
    .await;
    let heard = waiter.listener_counts_for_tests().1;
    holder.release(&lease).await.unwrap();
    let (granted, _, waiter) = task.await.unwrap();
    waiter.release(&granted.unwrap()).await.unwrap();
    // The waiter's own look may find the lock free just before the
    // notification lands: it is counted when it does.
    assert!(
        eventually(Duration::from_secs(10), || waiter
            .listener_counts_for_tests()
            .1
            > heard)
        .await,
        "the release was not heard"
    );
}

/// The listener's connection killed on the server (`pg_terminate_backend`):
/// it connects and listens again, and hears the next release; a lease that
/// ends without a release (nothing is sent) still goes to the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_listener_listens_again_and_an_expiry_is_still_seen() {
    let table = own_table("killed");
    let waiter = waking(&table, Duration::from_millis(200)).await;
    let holder = waking(&table, Duration::from_secs(1)).await;
    let name = unique_name("killed-listener");
    let short = LockOptions::new().ttl(Duration::from_secs(2));
    let lease = must_acquire(&holder, &name, &short).await;
    let task = dlock_conformance::support::wait_on_task(
        waiter.clone(),
        &name,
        long().wait(Duration::from_secs(30)),
    );
    assert!(
        eventually(Duration::from_secs(10), || waiter
            .listener_counts_for_tests()
            .0
            >= 1)
        .await,
        "the waiting backend never listened"
    );
    let mut admin = admin().await;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE query ILIKE 'LISTEN %' AND query LIKE '%' || $1 || '%'",
    )
    .bind(format!("dlock_{table}"))
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(!killed.is_empty(), "no listening connection on the server");
    assert!(
        eventually(Duration::from_secs(10), || waiter
            .listener_counts_for_tests()
            .0
            >= 2)
        .await,
        "the listener did not listen again"
    );
    // Never released: it expires, and the waiter takes it.
    let (granted, _, waiter) = task.await.unwrap();
    let granted = granted.expect("the waiter gets the lock once the lease ends");
    assert!(granted.fencing_token() > lease.fencing_token());
    // A release announces itself when somebody waits: the first holder does.
    let next = dlock_conformance::support::wait_on_task(
        holder.clone(),
        &name,
        long().wait(Duration::from_secs(30)),
    );
    let _ = queued(&mut admin, &table, &name, 1, "the next waiter never queued").await;
    let heard = waiter.listener_counts_for_tests().1;
    waiter.release(&granted).await.unwrap();
    let (again, _, holder) = next.await.unwrap();
    holder.release(&again.unwrap()).await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || waiter
            .listener_counts_for_tests()
            .1
            > heard)
        .await,
        "the listener, connected again, did not hear a release"
    );
}

/// The places of `name`'s queue in `table`, first first.
async fn places(admin: &mut sqlx::PgConnection, table: &str, name: &str) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT owner FROM \"{table}_holds\" WHERE name = $1 AND waiting ORDER BY since, owner"
    )))
    .bind(name.as_bytes())
    .fetch_all(admin)
    .await
    .unwrap()
}

/// The places of `name`'s queue once there are `n` (within 10 s, or the
/// test fails saying `never`).
async fn queued(
    admin: &mut sqlx::PgConnection,
    table: &str,
    name: &str,
    n: usize,
    never: &str,
) -> Vec<String> {
    // A precondition, not a verdict: a crowd's first looks on a loaded
    // machine take seconds.
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let found = places(admin, table, name).await;
        if found.len() >= n {
            return found;
        }
        assert!(tokio::time::Instant::now() < until, "{never}: {found:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Mutex waiters of three processes queue; each release announces one
/// waiter, the first in the queue, not the name's whole crowd (a herd of
/// looks per release), and the last release, with nobody queued,
/// announces nothing. Decided on the announcements a listener of the test's own
/// hears, whichever waiter a poll lets in first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_announces_only_the_first_queued_waiter() {
    let table = own_table("head");
    let holder = patient(&table).await;
    let name = unique_name("head");
    let lease = must_acquire(&holder, &name, &long()).await;
    let mut admin = admin().await;
    let (mut queue, mut tasks) = (Vec::new(), tokio::task::JoinSet::new());
    for i in 0..3 {
        let (waiter, of) = (patient(&table).await, name.clone());
        let opts = long().wait(Duration::from_secs(50));
        tasks.spawn(async move { (waiter.acquire(&of, &opts).await, waiter) });
        queue = queued(&mut admin, &table, &name, i + 1, "a waiter never queued").await;
    }
    assert_eq!(queue.len(), 3, "three places: {queue:?}");
    let mut listener = sqlx::postgres::PgListener::connect(url().await)
        .await
        .unwrap();
    listener.listen(&format!("dlock_{table}")).await.unwrap();
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    let mut named = Vec::new();
    holder.release(&lease).await.unwrap();
    for _ in 0..3 {
        let heard = announced(&mut listener, Duration::from_secs(10))
            .await
            .expect("a release announced");
        let (of, who) = heard.split_once(':').expect("name:waiters");
        assert_eq!(of, hex, "announced for another name");
        named.push(who.to_owned());
        // Whoever got in (the one named, or a poll first) releases.
        let (granted, waiter) = tokio::time::timeout(Duration::from_secs(55), tasks.join_next())
            .await
            .expect("a waiter gets the lock")
            .unwrap()
            .unwrap();
        waiter.release(&granted.unwrap()).await.unwrap();
    }
    assert_eq!(
        named[0], queue[0],
        "the first release named {named:?}, queue {queue:?}"
    );
    for who in &named {
        assert!(
            queue.contains(who),
            "one queued waiter per release: {named:?}, queue {queue:?}"
        );
    }
    // The last release, with nobody queued, announced nothing.
    let last = announced(&mut listener, Duration::from_secs(2)).await;
    assert!(
        last.is_none(),
        "a release with nobody queued announced {last:?}"
    );
}

/// A release that waits for the name's row behind an acquire (which
/// writes its waiter's place under the row's lock) announces that place
/// once the acquire commits, though its own read of the queue was made
/// before: the place counted itself in the row, which the release sees
/// (that a real look counts it is the next test's). Here an open
/// transaction of the test's own plays the acquire; the release is seen
/// waiting on it before it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_blocked_behind_an_acquire_announces_the_place_it_wrote() {
    let table = own_table("blocked_release");
    let holder = patient(&table).await;
    let name = unique_name("blocked-release");
    let lease = must_acquire(&holder, &name, &long()).await;
    let mut listener = listen(&table).await;
    let mut acquire = admin().await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut acquire)
        .await
        .unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut acquire).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT FROM \"{table}\" WHERE name = $1 FOR UPDATE"
    )))
    .bind(name.as_bytes())
    .execute(&mut acquire)
    .await
    .unwrap();
    let waiter = "0123456789abcdef";
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{table}_holds\" (name, owner, mode, kind, fence, expires_at, waiting, since)
         VALUES ($1, $2, 'x', 'x', 0, clock_timestamp() + interval '1 minute', true,
                 (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)"
    )))
    .bind(name.as_bytes())
    .bind(waiter)
    .execute(&mut acquire)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE \"{table}\" SET places = places + 1 WHERE name = $1"
    )))
    .bind(name.as_bytes())
    .execute(&mut acquire)
    .await
    .unwrap();
    let releasing = tokio::spawn({
        let (holder, lease) = (holder.clone(), lease.clone());
        async move { holder.release(&lease).await }
    });
    let mut look = admin().await;
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let blocked: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(pid)
        .fetch_one(&mut look)
        .await
        .unwrap();
        if blocked > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the release never waited for the row"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sqlx::raw_sql("COMMIT").execute(&mut acquire).await.unwrap();
    releasing.await.unwrap().unwrap();
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        announced(&mut listener, Duration::from_secs(10)).await,
        Some(format!("{hex}:{waiter}")),
        "the release did not announce the place written under the row's lock"
    );
}

/// A waiter's look that writes its place anew counts one more place in the
/// name's row, so that a release waiting for the row learns of a place its
/// snapshot lacks (see the test above); the row's fence stays the
/// holder's token, as `inspect` reads it. Decided on the row, read once
/// the place is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_place_is_counted_in_the_row() {
    let table = own_table("place_count");
    let (holder, waiter) = (patient(&table).await, listening(&table).await);
    let name = unique_name("place-count");
    let lease = must_acquire(&holder, &name, &long()).await;
    let mut admin = admin().await;
    let (row, places) = (
        format!("SELECT fence, places FROM \"{table}\" WHERE name = $1"),
        format!("SELECT count(*) FROM \"{table}_holds\" WHERE name = $1 AND waiting"),
    );
    let (fence, counted): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(row.clone()))
        .bind(name.as_bytes())
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(u64::try_from(fence).unwrap(), lease.fencing_token());
    let waiting = tokio::spawn({
        let name = name.clone();
        async move {
            waiter
                .acquire(&name, &long().wait(Duration::from_secs(60)))
                .await
        }
    });
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let queued: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(places.clone()))
            .bind(name.as_bytes())
            .fetch_one(&mut admin)
            .await
            .unwrap();
        if queued > 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after: (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(row))
        .bind(name.as_bytes())
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(
        after,
        (fence, counted + 1),
        "(fence, places) once the place is there"
    );
    let info = holder.inspect(&name).await.unwrap().expect("held");
    assert_eq!(info.fencing_token, lease.fencing_token());
    holder.release(&lease).await.unwrap();
    let next = waiting.await.unwrap().expect("let in");
    assert!(next.fencing_token() > lease.fencing_token());
}

/// A listener whose connection hangs without an error (the proxy in front
/// of it forwards nothing and closes nothing, as a half-open connection
/// does) asks the server after a quiet spell, gets no answer, and connects
/// again: it hears the next release. Without the check it would stay deaf
/// until TCP gave up, and waiters would only poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_whose_connection_hangs_connects_again() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let table = own_table("hung");
    let direct = url().await;
    let (before, rest) = direct.split_once("127.0.0.1:").unwrap();
    let (port, after) = rest.split_once('/').unwrap();
    let proxy = FaultProxy::start(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap();
    let via = format!("{before}127.0.0.1:{}/{after}", proxy.addr().port());
    // Quiet spell: ten polls' worth, 5 s.
    let waiter = PgBackend::builder(&via)
        .table(&table)
        .wake_ups(true)
        .max_poll_interval(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let holder = waking(&table, Duration::from_secs(1)).await;
    let name = unique_name("hung-listener");
    let lease = must_acquire(&holder, &name, &long()).await;
    let task = dlock_conformance::support::wait_on_task(
        waiter.clone(),
        &name,
        long().wait(Duration::from_secs(60)),
    );
    let listened = || waiter.listener_counts_for_tests().0;
    assert!(
        eventually(Duration::from_secs(10), || listened() >= 1).await,
        "the waiting backend never listened"
    );
    proxy.set_open_connections(Fault::Stall);
    assert!(
        eventually(Duration::from_secs(30), || listened() >= 2).await,
        "the listener never noticed that its connection hung"
    );
    // Listening again, the waiter keeps (or takes again) its place.
    let mut admin = admin().await;
    let _ = queued(
        &mut admin,
        &table,
        &name,
        1,
        "the waiter never queued again",
    )
    .await;
    let heard = waiter.listener_counts_for_tests().1;
    holder.release(&lease).await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || waiter
            .listener_counts_for_tests()
            .1
            > heard)
        .await,
        "the listener, connected again, did not hear the release"
    );
    let (granted, _, waiter) = task.await.unwrap();
    waiter.release(&granted.unwrap()).await.unwrap();
}

/// A client that starts while another holds a write on the lock table open
/// connects at once, and so does its `migrate`: neither waits for the
/// write (a `CREATE INDEX` would, and every write after it would wait for
/// it in turn). The write stays open until both are done,
/// so a start that waits for it can only time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_starting_beside_an_open_write_does_not_wait_for_it() {
    let holder = backend().await;
    let name = unique_name("open_write");
    let lease = must_acquire(&holder, &name, &long()).await;
    let mut open = admin().await;
    sqlx::raw_sql("BEGIN").execute(&mut open).await.unwrap();
    let written = sqlx::query("UPDATE dlock_locks SET holder = holder WHERE name = $1")
        .bind(name.as_bytes())
        .execute(&mut open)
        .await
        .unwrap();
    assert_eq!(written.rows_affected(), 1, "the open write holds the row");
    let started = PgBackend::builder(url().await)
        .request_timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("a client starting beside an open write");
    started
        .migrate()
        .await
        .expect("a migrate beside an open write");
    sqlx::raw_sql("ROLLBACK").execute(&mut open).await.unwrap();
    holder.release(&lease).await.unwrap();
}

/// Every builder setting can come in the URL: the table named there is the
/// one a backend built with the setter uses; sqlx's own parameters pass,
/// and one neither knows is refused by its name.
#[tokio::test]
async fn settings_in_the_url_take_effect_and_unknown_ones_are_refused() {
    let url = url().await;
    let with = |query: &str| format!("{url}?{query}");
    let by_url = PgBackend::connect(&with("table=dlock_by_url&sslmode=disable"))
        .await
        .unwrap();
    let by_setter = PgBackend::builder(url)
        .table("dlock_by_url")
        .connect()
        .await
        .unwrap();
    url_setting_takes_effect(&by_url, &by_setter, &backend().await, &long()).await;
    refused_by_name(
        PgBackend::connect(&with("tabel=s3cret")).await,
        "tabel",
        "s3cret",
    );
}

/// A backend with wake-ups whose waiters look again only when woken (polls
/// a minute apart), and whose looks never time out on a loaded machine (an
/// undone look would announce a release of its own).
async fn patient(table: &str) -> PgBackend {
    polling(table, Duration::from_secs(60), Duration::from_secs(20)).await
}

/// A [`patient`] backend whose waits poll at most every `max_poll`, its
/// calls bounded by `request_timeout`.
async fn polling(table: &str, max_poll: Duration, request_timeout: Duration) -> PgBackend {
    PgBackend::builder(url().await)
        .table(table)
        .wake_ups(true)
        .max_poll_interval(max_poll)
        .request_timeout(request_timeout)
        .connect()
        .await
        .unwrap()
}

/// A [`patient`] backend whose listener listens already, so that its
/// waits start with polls a fifth of a minute apart. A wait begun before
/// polls from 50 ms, and every waiter of a backend looks again once its
/// listener comes up: such a look may take the lock or a permit between a
/// release's commit and its read of whom to wake, and that release then
/// rightly announces nobody.
async fn listening(table: &str) -> PgBackend {
    listening_polling(table, Duration::from_secs(60), Duration::from_secs(20)).await
}

/// A [`listening`] backend whose waits poll at most every `max_poll`,
/// the first poll a fifth of it after the first look, its calls bounded
/// by `request_timeout`.
async fn listening_polling(
    table: &str,
    max_poll: Duration,
    request_timeout: Duration,
) -> PgBackend {
    let b = polling(table, max_poll, request_timeout).await;
    // Any wait starts the listener, one on a free name too.
    let warm = unique_name("warm");
    let lease = b
        .acquire(&warm, &long().wait(Duration::from_secs(10)))
        .await
        .unwrap();
    b.release(&lease).await.unwrap();
    assert!(
        eventually(Duration::from_secs(10), || b.listener_counts_for_tests().0
            >= 1)
        .await,
        "the backend never listened"
    );
    b
}

/// The test's own listener on `table`'s channel.
async fn listen(table: &str) -> sqlx::postgres::PgListener {
    let mut listener = sqlx::postgres::PgListener::connect(url().await)
        .await
        .unwrap();
    listener.listen(&format!("dlock_{table}")).await.unwrap();
    listener
}

/// The next release announced on `listener` within `within`, as its
/// payload; `None` when none came. A backend's listener checks that it
/// hears by sending a `probe:` notification on the same channel: not a
/// release, so passed over.
async fn announced(listener: &mut sqlx::postgres::PgListener, within: Duration) -> Option<String> {
    let until = tokio::time::Instant::now() + within;
    loop {
        let heard = tokio::time::timeout_at(until, listener.recv()).await.ok()?;
        let payload = heard.unwrap().payload().to_owned();
        if !payload.starts_with("probe:") {
            return Some(payload);
        }
    }
}

/// A write's release that lets in more readers than one announcement can
/// name (`pg_notify` takes under 8000 bytes, about 230 tokens) announces
/// the name alone, which wakes every waiter of the name: the release
/// succeeds, and the readers are let in by it. Decided on order, not on a
/// budget (the 300 grants, each taking the name's row lock in turn, take
/// seconds on a loaded machine): no reader looks again on its own before
/// its wait ends (its first poll comes later, the write's TTL ends later
/// still), and a look at the wait's end comes back after it, so a grant
/// back before its wait's end was let in by a wake-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_letting_in_more_readers_than_a_payload_names_announces_the_name() {
    const READERS: usize = 300;
    const WAIT: Duration = Duration::from_secs(120);
    let table = own_table("crowd");
    let (holder, name) = (patient(&table).await, unique_name("crowd"));
    let write = long().write().ttl(WAIT * 5);
    let write = must_acquire(&holder, &name, &write).await;
    // The first poll comes a tenth to a fifth of this after the first
    // look. A look that fails (300 woken readers share the pool) is made
    // again only at the next poll: each call may wait half the wait.
    let readers = listening_polling(&table, WAIT * 15, WAIT / 2).await;
    let mut waits = tokio::task::JoinSet::new();
    for _ in 0..READERS {
        let (readers, of) = (readers.clone(), name.clone());
        waits.spawn(async move {
            let ends = tokio::time::Instant::now() + WAIT;
            let granted = readers.acquire(&of, &long().read().wait(WAIT)).await;
            (granted, tokio::time::Instant::now() < ends)
        });
    }
    let mut admin = admin().await;
    queued(
        &mut admin,
        &table,
        &name,
        READERS,
        "the readers never queued",
    )
    .await;
    let mut listener = listen(&table).await;
    holder.release(&write).await.expect("the write's release");
    let heard = announced(&mut listener, Duration::from_secs(10))
        .await
        .expect("the release announced");
    assert!(
        !heard.contains(':'),
        "an announcement naming {READERS} waiters, {} bytes",
        heard.len()
    );
    let (mut leases, mut late) = (Vec::new(), 0);
    while let Some(done) = waits.join_next().await {
        let (granted, in_time) = done.unwrap();
        leases.push(granted.expect("a reader let in"));
        late += usize::from(!in_time);
    }
    for lease in leases {
        readers.release(&lease).await.unwrap();
    }
    assert_eq!(
        late, 0,
        "readers let in only by the last look of their wait"
    );
}

/// A release of one permit of a full semaphore of 2 announces the one
/// waiter it lets in, not the first 2 of the queue: a waiter woken only to
/// be refused takes the name's row lock for nothing. Decided on the
/// announcement a listener of the test's own hears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_released_announces_only_the_waiter_it_lets_in() {
    let table = own_table("permit");
    let (holder, name) = (patient(&table).await, unique_name("permit"));
    let opts = long().permits(2);
    let first = must_acquire(&holder, &name, &opts).await;
    let second = must_acquire(&holder, &name, &opts).await;
    let mut admin = admin().await;
    let (mut queue, mut tasks) = (Vec::new(), tokio::task::JoinSet::new());
    for i in 0..3 {
        let (waiter, of, opts) = (listening(&table).await, name.clone(), opts.clone());
        tasks.spawn(async move {
            let granted = waiter
                .acquire(&of, &opts.wait(Duration::from_secs(50)))
                .await;
            if let Ok(lease) = &granted {
                waiter.release(lease).await.unwrap();
            }
            granted.map(drop)
        });
        queue = queued(&mut admin, &table, &name, i + 1, "a waiter never queued").await;
    }
    let mut listener = listen(&table).await;
    holder.release(&first).await.unwrap();
    let heard = announced(&mut listener, Duration::from_secs(10))
        .await
        .expect("a release announced");
    let (_, who) = heard.split_once(':').expect("name:waiters");
    assert_eq!(who, queue[0], "one permit freed, queue {queue:?}");
    holder.release(&second).await.unwrap();
    while let Some(done) = tasks.join_next().await {
        done.unwrap().unwrap();
    }
}

/// A reader's release while another reader still holds announces nothing,
/// though a writer waits: the writer goes in only once no read hold is
/// left, and that last release announces it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_release_before_the_last_wakes_no_writer() {
    let table = own_table("reader");
    let (holder, name) = (patient(&table).await, unique_name("reader"));
    let reads = [
        must_acquire(&holder, &name, &long().read()).await,
        must_acquire(&holder, &name, &long().read()).await,
    ];
    let writer = listening(&table).await;
    let of = name.clone();
    let wait = tokio::spawn(async move {
        let lease = writer
            .acquire(&of, &long().write().wait(Duration::from_secs(50)))
            .await
            .unwrap();
        writer.release(&lease).await.unwrap();
    });
    let mut admin = admin().await;
    let queue = queued(&mut admin, &table, &name, 1, "the writer never queued").await;
    let mut listener = listen(&table).await;
    holder.release(&reads[0]).await.unwrap();
    holder.release(&reads[1]).await.unwrap();
    let heard = announced(&mut listener, Duration::from_secs(10))
        .await
        .expect("the last release announced");
    let (_, who) = heard.split_once(':').expect("name:waiters");
    assert_eq!(who, queue[0], "the last read release names the writer");
    tokio::time::timeout(Duration::from_secs(55), wait)
        .await
        .expect("the writer gets the lock")
        .unwrap();
    // The first release announced nothing: the one heard came from the last.
    let more = announced(&mut listener, Duration::from_millis(500)).await;
    assert!(more.is_none(), "a release announced more: {more:?}");
}
