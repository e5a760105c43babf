//! MySQL-specific behaviour: the table, versions, migrate, configuration
//! errors.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock_conformance::harness::{ServerOptions, Service, shared, start, unused_port};
use dlock_conformance::proxy::{Fault, FaultProxy};
use dlock_conformance::support::{
    Waited, long, must_acquire, refused_by_name, release_wakes, unique_name,
    url_setting_takes_effect, wait_on_task,
};
use dlock_core::{Backend, Error, LockOptions};
use dlock_mysql::MySqlBackend;

async fn url() -> &'static str {
    shared(Service::MariaDb).await.url()
}

/// A plain sqlx pool on the test database, to look at the table directly.
async fn raw() -> sqlx::MySqlPool {
    sqlx::MySqlPool::connect(url().await).await.unwrap()
}

async fn backend() -> MySqlBackend {
    let b = MySqlBackend::connect(url().await).await.unwrap();
    b.migrate().await.unwrap();
    b
}

#[tokio::test]
async fn names_differing_in_case_or_trailing_space_are_distinct_rows() {
    let b = backend().await;
    let id = unique_name("case");
    let names = [format!("Job{id}"), format!("job{id}"), format!("job{id} ")];
    let mut leases = Vec::new();
    for n in &names {
        leases.push(must_acquire(&b, n, &long()).await);
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM dlock_locks WHERE name LIKE ?")
        .bind(format!("%{id}%"))
        .fetch_one(&raw().await)
        .await
        .unwrap();
    assert_eq!(rows, 3);
    for l in &leases {
        b.release(l).await.unwrap();
    }
}

#[tokio::test]
async fn long_and_multibyte_names_fit() {
    let b = backend().await;
    let id = unique_name("m");
    for name in [
        format!("{id}{}", "x".repeat(255 - id.len())),
        format!("{id}{}", "€".repeat((255 - id.len()) / 3)),
        format!("{id}{}", "🔒".repeat((255 - id.len()) / 4)),
    ] {
        let lease = must_acquire(&b, &name, &long()).await;
        let info = b.inspect(&name).await.unwrap().unwrap();
        assert_eq!(info.owner, lease.owner());
        b.release(&lease).await.unwrap();
    }
}

#[tokio::test]
async fn takeover_of_an_expired_row_bumps_the_version() {
    let b = backend().await;
    let name = unique_name("takeover");
    let short = LockOptions::new().ttl(Duration::from_millis(100));
    let first = must_acquire(&b, &name, &short).await;
    assert!(
        first.fencing_token() > 1_600_000_000_000_000,
        "a new row starts at the database clock in microseconds, got {}",
        first.fencing_token()
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    let second = must_acquire(&b, &name, &long()).await;
    assert!(second.fencing_token() > first.fencing_token());
    b.release(&second).await.unwrap();
    let third = must_acquire(&b, &name, &long()).await;
    assert!(
        third.fencing_token() > second.fencing_token(),
        "release keeps the row and its version"
    );
    let (version, owner, holder): (u64, String, Vec<u8>) =
        sqlx::query_as("SELECT version, owner, holder FROM dlock_locks WHERE name = ?")
            .bind(name.as_bytes())
            .fetch_one(&raw().await)
            .await
            .unwrap();
    assert_eq!(version, third.fencing_token());
    assert_eq!(owner, third.owner().to_string());
    // The holder description, as its UTF-8 bytes: `host:pid` by default.
    let holder = String::from_utf8(holder).unwrap();
    assert!(
        holder.ends_with(&format!(":{}", std::process::id())),
        "{holder}"
    );
    b.release(&third).await.unwrap();
}

/// An operator deletes a name's row (or restores an old backup): the next
/// grant still carries a greater token, because tokens fold in the
/// database clock instead of counting from the row.
#[tokio::test]
async fn a_deleted_or_restored_row_never_lowers_the_fencing_token() {
    let b = backend().await;
    let name = unique_name("deleted_row");
    let mut last = 0;
    for _ in 0..3 {
        let lease = must_acquire(&b, &name, &long()).await;
        last = lease.fencing_token();
        b.release(&lease).await.unwrap();
    }
    sqlx::query("DELETE FROM dlock_locks WHERE name = ?")
        .bind(name.as_bytes())
        .execute(&raw().await)
        .await
        .unwrap();
    let after_delete = must_acquire(&b, &name, &long()).await;
    assert!(
        after_delete.fencing_token() > last,
        "after the row was deleted the token went from {last} to {}",
        after_delete.fencing_token()
    );
    b.release(&after_delete).await.unwrap();
    // A restored backup: the row comes back with an old, small version.
    sqlx::query("UPDATE dlock_locks SET version = 1 WHERE name = ?")
        .bind(name.as_bytes())
        .execute(&raw().await)
        .await
        .unwrap();
    let after_restore = must_acquire(&b, &name, &long()).await;
    assert!(after_restore.fencing_token() > after_delete.fencing_token());
    b.release(&after_restore).await.unwrap();
}

/// Purging deletes only rows whose lease ended longer ago than asked: a
/// held lock keeps its row and holder, and a purged name's next token is
/// still greater than its last.
#[tokio::test]
async fn purging_frees_no_held_lock_and_lowers_no_token() {
    let b = backend().await;
    let other = backend().await;
    let held = unique_name("purge_held");
    let expired = unique_name("purge_expired");
    let released = unique_name("purge_released");
    let holder = must_acquire(&b, &held, &long()).await;
    let short = LockOptions::new().ttl(Duration::from_millis(50));
    let gone = must_acquire(&b, &expired, &short).await;
    let freed = must_acquire(&b, &released, &long()).await;
    b.release(&freed).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Nothing has been expired for an hour: nothing of ours goes.
    b.purge_expired(Duration::from_secs(3600), 1000)
        .await
        .unwrap();
    let pool = raw().await;
    let rows = |name: String| {
        let pool = pool.clone();
        async move {
            let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM dlock_locks WHERE name = ?")
                .bind(name.into_bytes())
                .fetch_one(&pool)
                .await
                .unwrap();
            n
        }
    };
    assert_eq!(rows(expired.clone()).await, 1, "a recent row was purged");

    // Back-date our two free rows by two hours, as if they had expired then.
    for name in [&expired, &released] {
        sqlx::query(
            "UPDATE dlock_locks SET expires_at = expires_at - INTERVAL 2 HOUR WHERE name = ?",
        )
        .bind(name.as_bytes())
        .execute(&pool)
        .await
        .unwrap();
    }
    while b
        .purge_expired(dlock_mysql::MIN_PURGE_AGE, 1000)
        .await
        .unwrap()
        == 1000
    {}
    assert_eq!(rows(expired.clone()).await, 0, "the expired row stayed");
    assert_eq!(rows(released.clone()).await, 0, "the released row stayed");
    assert_eq!(rows(held.clone()).await, 1, "the held row was purged");
    assert!(
        other.try_acquire(&held, &long()).await.unwrap().is_none(),
        "purging freed a held lock"
    );
    assert_eq!(
        other.inspect(&held).await.unwrap().unwrap().owner,
        holder.owner()
    );
    for (name, before) in [
        (&expired, gone.fencing_token()),
        (&released, freed.fencing_token()),
    ] {
        let again = must_acquire(&other, name, &long()).await;
        assert!(
            again.fencing_token() > before,
            "after a purge the token went from {before} to {}",
            again.fencing_token()
        );
        other.release(&again).await.unwrap();
    }
    b.release(&holder).await.unwrap();
    assert!(matches!(
        b.spawn_purger(Duration::ZERO, Duration::ZERO),
        Err(Error::InvalidOption {
            option: "every",
            ..
        })
    ));
    assert!(matches!(
        b.purge_expired(Duration::from_secs(60), 10).await,
        Err(Error::InvalidOption {
            option: "older_than",
            ..
        })
    ));
    let purger = b
        .spawn_purger(Duration::from_secs(1), Duration::from_secs(3600))
        .unwrap();
    drop(purger);
}

#[tokio::test]
async fn migrate_twice_is_a_no_op() {
    let b = backend().await;
    let name = unique_name("migrate");
    let lease = must_acquire(&b, &name, &long()).await;
    b.migrate().await.unwrap();
    b.migrate().await.unwrap();
    assert_eq!(
        b.inspect(&name).await.unwrap().unwrap().owner,
        lease.owner()
    );
    b.release(&lease).await.unwrap();
}

#[tokio::test]
async fn a_custom_table_is_used_and_a_missing_one_is_explained() {
    let table = unique_name("t").replace('-', "_");
    let b = MySqlBackend::builder(url().await)
        .table(&table)
        .create_table(false)
        .connect()
        .await
        .unwrap();
    let r = b.try_acquire("x", &long()).await;
    match r {
        Err(e @ Error::Backend { .. }) => assert!(e.to_string().contains("migrate"), "{e}"),
        other => panic!("expected a missing-table error, got {other:?}"),
    }
    b.migrate().await.unwrap();
    let lease = must_acquire(&b, "x", &long()).await;
    b.release(&lease).await.unwrap();
}

#[tokio::test]
async fn an_invalid_table_name_is_refused_before_connecting() {
    for table in ["locks; DROP TABLE users", "a`b", "", "9x"] {
        let r = MySqlBackend::builder("mysql://u:p@127.0.0.1:1/db")
            .table(table)
            .connect()
            .await;
        assert!(
            matches!(
                r,
                Err(Error::InvalidOption {
                    option: "table",
                    ..
                })
            ),
            "{table:?}: {r:?}"
        );
    }
}

#[tokio::test]
async fn configuration_errors_are_typed() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let good = url().await;
    let wrong_password = good.replace("dlock:dlock@", "dlock:wrong@");
    match MySqlBackend::connect(&wrong_password).await {
        Err(e @ Error::Backend { .. }) => {
            assert!(e.to_string().contains("access denied"), "{e}");
            assert!(!e.to_string().contains("wrong"), "the password leaked: {e}");
        }
        other => panic!("wrong password: {other:?}"),
    }
    let missing_db = format!("{}/no_such_database", good.trim_end_matches("/dlock"));
    match MySqlBackend::connect(&missing_db).await {
        Err(e @ Error::Backend { .. }) => {
            assert!(e.to_string().contains("unknown database"), "{e}")
        }
        other => panic!("missing database: {other:?}"),
    }
    let r = MySqlBackend::connect("postgres://x@127.0.0.1/db").await;
    assert!(
        matches!(r, Err(Error::InvalidOption { option: "url", .. })),
        "{r:?}"
    );
    let port = unused_port();
    let started = std::time::Instant::now();
    let r = MySqlBackend::builder(format!("mysql://dlock:dlock@127.0.0.1:{port}/dlock"))
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await;
    match r {
        Err(e @ Error::Connection { .. }) => {
            assert!(e.to_string().contains("refused"), "{e}");
            assert!(started.elapsed() < Duration::from_secs(2), "not at once");
        }
        other => panic!("refused connection: {other:?}"),
    }
    for bad in [
        "mysql://dlock:dlock@/dlock".to_owned(),
        format!("mysql://dlock:%zz@127.0.0.1:{port}/dlock"),
    ] {
        let started = std::time::Instant::now();
        let r = MySqlBackend::connect(&bad).await;
        assert!(
            matches!(r, Err(Error::InvalidOption { option: "url", .. })),
            "{r:?}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "not at once"
        );
    }
    for (option, builder) in [
        (
            "request_timeout",
            MySqlBackend::builder(good).request_timeout(Duration::ZERO),
        ),
        (
            "connect_timeout",
            MySqlBackend::builder(good).connect_timeout(Duration::MAX),
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
    let server = start(Service::MariaDb, ServerOptions::default()).await;
    let b = MySqlBackend::builder(server.url())
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    b.migrate().await.unwrap();
    let lease = must_acquire(&b, "down", &long()).await;
    server.container().unwrap().stop().await.unwrap();
    let r = b.try_acquire("other", &long()).await;
    assert!(matches!(r, Err(Error::Connection { .. })), "{r:?}");
    let r = b.release(&lease).await;
    assert!(matches!(r, Err(Error::Connection { .. })), "{r:?}");
}

/// `connect` on an empty database creates the tables and procedures; a
/// least-privilege user (SELECT, INSERT, UPDATE, DELETE on the lock and
/// holds tables) works, every kind of lock, once they exist, without the
/// procedures;
/// a user who may not create the missing table is told what to run.
#[tokio::test]
async fn the_table_is_created_on_connect_and_least_privilege_suffices() {
    let admin = raw().await;
    let id = unique_name("priv").replace('-', "_");
    let table = format!("t_{id}");
    let fresh = MySqlBackend::builder(url().await)
        .table(&table)
        .connect()
        .await
        .expect("connect creates the missing table");
    let lease = must_acquire(&fresh, "x", &long()).await;
    fresh.release(&lease).await.unwrap();

    let user = format!("u_{}", &id[id.len() - 12..]);
    let statements = [
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON dlock.`{table}` TO '{user}'@'%'"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON dlock.`{table}_holds` TO '{user}'@'%'"),
    ];
    for statement in &statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&admin)
            .await
            .unwrap();
    }
    let url = url_with_user(&user).await;
    let least = MySqlBackend::builder(&url)
        .table(&table)
        .connect()
        .await
        .expect("a user with SELECT, INSERT, UPDATE, DELETE on an existing table can connect");
    // It may not call the procedures `fresh` made, nor make its own: its
    // shared calls go as text.
    assert!(fresh.calls_procedures() && !least.calls_procedures());
    let name = unique_name("least");
    let lease = must_acquire(&least, &name, &long()).await;
    least.release(&lease).await.unwrap();
    let shared = unique_name("least-shared");
    let reader = must_acquire(&least, &shared, &long().read()).await;
    least.release(&reader).await.unwrap();
    least
        .purge_expired(dlock_mysql::MIN_PURGE_AGE, 10)
        .await
        .unwrap();

    let missing = format!("m_{id}");
    match MySqlBackend::builder(&url).table(&missing).connect().await {
        Err(e @ Error::Backend { .. }) => {
            let text = e.to_string();
            assert!(text.contains("may not create it"), "{text}");
            assert!(
                text.contains(&format!("CREATE TABLE IF NOT EXISTS `{missing}`")),
                "{text}"
            );
            assert!(!text.contains("pw"), "the password leaked: {text}");
        }
        other => panic!("expected the DDL to run, got {other:?}"),
    }
    assert_eq!(
        MySqlBackend::table_ddl(&missing)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .trim(),
        format!("CREATE TABLE IF NOT EXISTS `{missing}` (")
    );
}

/// An administrator's scripts, run by the `mariadb` client as they are:
/// `table_ddl`'s then `procedures_ddl`'s make the tables and the
/// procedures, which a user who may only use them (no `CREATE`, no
/// `CREATE ROUTINE`) finds and calls. A table named with capitals has no
/// procedures to make.
#[tokio::test]
async fn an_administrator_s_scripts_make_the_tables_and_the_procedures() {
    use std::io::Write;

    let server = shared(Service::MariaDb).await;
    let container = server
        .container()
        .expect("the harness's own MariaDB (DLOCK_MYSQL_URL names another)")
        .id()
        .to_owned();
    let id = unique_name("admin").replace('-', "_").to_lowercase();
    let table = format!("a_{}", &id[id.len() - 20..]);
    let script = format!(
        "{};\n{}",
        MySqlBackend::table_ddl(&table).unwrap(),
        MySqlBackend::procedures_ddl(&table).unwrap()
    );
    // Twice: an administrator's migration runs again.
    for _ in 0..2 {
        let mut client = std::process::Command::new("docker")
            .args(["exec", "-i", &container, "mariadb", "-uroot", "dlock"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        client
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let ran = client.wait_with_output().unwrap();
        assert!(
            ran.status.success(),
            "the mariadb client refused the script: {}",
            String::from_utf8_lossy(&ran.stderr)
        );
    }

    let admin = raw().await;
    let user = format!("p_{}", &id[id.len() - 12..]);
    let mut statements = vec![
        format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'pw'"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON dlock.`{table}` TO '{user}'@'%'"),
        format!("GRANT SELECT, INSERT, UPDATE, DELETE ON dlock.`{table}_holds` TO '{user}'@'%'"),
    ];
    for suffix in ["_sa1", "_se1", "_sr1"] {
        statements.push(format!(
            "GRANT EXECUTE ON PROCEDURE dlock.`{table}{suffix}` TO '{user}'@'%'"
        ));
    }
    for statement in &statements {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&admin)
            .await
            .unwrap();
    }
    let b = MySqlBackend::builder(url_with_user(&user).await)
        .table(&table)
        .connect()
        .await
        .unwrap();
    assert!(
        b.calls_procedures(),
        "the script's procedures are not called"
    );
    let name = unique_name("admin");
    let permit = must_acquire(&b, &name, &long().permits(2)).await;
    b.release(&permit).await.unwrap();
    let read = must_acquire(&b, &name, &long().read()).await;
    b.release(&read).await.unwrap();
    assert!(b.calls_procedures(), "a call turned back to the text");

    assert!(matches!(
        MySqlBackend::procedures_ddl("Capitals"),
        Err(Error::InvalidOption {
            option: "table",
            ..
        })
    ));
}

/// The test server's URL with another user, password `pw`.
async fn url_with_user(user: &str) -> String {
    let good = url().await;
    let at = good.find('@').unwrap();
    format!("mysql://{user}:pw{}", &good[at..])
}

/// The server's count of statements (`Questions`) and of pings and other
/// admin commands (`Com_admin_commands`).
#[derive(Debug, Clone, Copy)]
struct Counters {
    statements: u64,
    admin: u64,
}

/// Reads the server's [`Counters`] as they are, with one
/// `SHOW GLOBAL STATUS` on `conn`. That read is itself a statement, so the
/// difference between two reads counts one of them (it is no admin
/// command); [`Counters::since`] subtracts it.
async fn counters(conn: &mut sqlx::MySqlConnection) -> Counters {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_admin_commands')",
    )
    .fetch_all(conn)
    .await
    .unwrap();
    let get = |name: &str| -> u64 {
        rows.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {rows:?}"))
    };
    Counters {
        statements: get("Questions"),
        admin: get("Com_admin_commands"),
    }
}

impl Counters {
    /// What the server ran between the read `before` and this one, less
    /// the counters' own read statement.
    fn since(self, before: Counters) -> Counters {
        Counters {
            statements: self.statements - before.statements - 1,
            admin: self.admin - before.admin,
        }
    }
}

/// An acquire and a release cost the server two statements, and no ping:
/// the driver's pool does not test a connection before lending it. A plain
/// sqlx pool, which pings on every checkout by default, is the control
/// that shows the count sees pings. On a server of its own, so that no
/// other test's statements are counted.
#[tokio::test]
async fn a_cycle_costs_two_statements_and_no_ping() {
    use sqlx::Connection;
    let server = start(Service::MariaDb, ServerOptions::default()).await;
    let b = MySqlBackend::connect(server.url()).await.unwrap();
    let mut admin = sqlx::MySqlConnection::connect(server.url()).await.unwrap();
    let cycles = 100;
    let before = counters(&mut admin).await;
    for i in 0..cycles {
        let lease = must_acquire(&b, &format!("count-{i}"), &long()).await;
        b.release(&lease).await.unwrap();
    }
    let ran = counters(&mut admin).await.since(before);
    eprintln!(
        "{cycles} cycles: {} statements, {} pings",
        ran.statements, ran.admin
    );
    assert_eq!(ran.statements, 2 * cycles, "statements for {cycles} cycles");
    assert_eq!(ran.admin, 0, "pings for {cycles} cycles");

    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect(server.url())
        .await
        .unwrap();
    let before = counters(&mut admin).await;
    for _ in 0..10 {
        sqlx::query("SELECT 1").execute(&pool).await.unwrap();
    }
    let ran = counters(&mut admin).await.since(before);
    assert!(
        ran.admin >= 10,
        "the control's pings were not counted: {ran:?} since {before:?}"
    );
}

/// With polls a minute apart, a waiter in another process (its own backend
/// and connections) gets the lock within seconds of the release: the
/// release woke its sleep in the server.
#[tokio::test]
async fn a_release_wakes_a_waiter_in_another_process() {
    let holder = waking(url().await).await;
    let name = unique_name("wake");
    let lease = must_acquire(&holder, &name, &long()).await;
    let task = wait_for(slow_polling(url().await).await, &name);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!task.is_finished());
    release_wakes(&holder, &lease, task).await;
}

/// The same for the shared kinds, each queued waiter sleeping under its
/// own key: a writer queued behind a reader, then a permit queued behind
/// a full semaphore, each woken within seconds by the release in another
/// process, with polls a minute apart and holds of a minute.
#[tokio::test]
async fn a_shared_release_wakes_a_queued_waiter_in_another_process() {
    let holder = waking(url().await).await;
    for (kind, opts) in [("rw", long().read()), ("permits", long().permits(1))] {
        let name = unique_name(&format!("wake_{kind}"));
        let lease = must_acquire(&holder, &name, &opts).await;
        let asked = match kind {
            "rw" => long().write(),
            _ => long().permits(1),
        };
        let task = wait_on_task(
            slow_polling(url().await).await,
            &name,
            asked.wait(Duration::from_secs(50)),
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!task.is_finished(), "{kind}: granted beside the holder");
        release_wakes(&holder, &lease, task).await;
    }
}

/// A client whose waiters sleep in the server, woken by releases.
async fn waking(url: &str) -> MySqlBackend {
    MySqlBackend::builder(url)
        .wake_ups(true)
        .connect()
        .await
        .unwrap()
}

/// A waking client whose waiters poll at most once a minute.
async fn slow_polling(url: &str) -> MySqlBackend {
    MySqlBackend::builder(url)
        .wake_ups(true)
        .max_poll_interval(Duration::from_secs(60))
        .connect()
        .await
        .unwrap()
}

/// `waiter` waits up to 50 s for `name` on a task of its own.
fn wait_for(waiter: MySqlBackend, name: &str) -> tokio::task::JoinHandle<Waited<MySqlBackend>> {
    wait_on_task(waiter, name, long().wait(Duration::from_secs(50)))
}

/// Eight waiters in other processes cost the server a few statements a
/// second each while they wait (one sleeps in the server, the others poll
/// at the default interval), and each is served once the holder releases.
/// On a server of its own, so that no other test's statements are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_costs_a_few_statements_a_second_per_waiter() {
    use sqlx::Connection;
    let server = start(Service::MariaDb, ServerOptions::default()).await;
    let holder = waking(server.url()).await;
    let mut admin = sqlx::MySqlConnection::connect(server.url()).await.unwrap();
    let name = unique_name("load");
    let lease = must_acquire(&holder, &name, &long()).await;
    let waiters = 8;
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let b = waking(server.url()).await;
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let lease = b
                .acquire(&name, &long().wait(Duration::from_secs(60)))
                .await
                .unwrap();
            b.release(&lease).await.unwrap();
        }));
    }
    // Past the waiters' first quick polls.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = counters(&mut admin).await;
    let window = Duration::from_secs(5);
    tokio::time::sleep(window).await;
    let ran = counters(&mut admin).await.since(before);
    let per_waiter = ran.statements as f64 / window.as_secs_f64() / f64::from(waiters);
    eprintln!("{per_waiter:.1} statements/s per waiter");
    assert!(per_waiter <= 5.0, "{per_waiter:.1} statements/s per waiter");
    holder.release(&lease).await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("every waiter is served")
            .unwrap();
    }
}

/// The anchor that registered waiters wait for is lost (its connection is
/// killed), so the registered waiter's wait takes it: that connection is
/// closed rather than spinning on a lock it now holds, a new anchor is
/// opened, and the next release still wakes the waiter at once. On a server
/// of its own, so that the statements counted are this test's.
#[tokio::test]
async fn a_lost_anchor_is_replaced_and_wake_ups_go_on() {
    use sqlx::Connection;
    let server = start(Service::MariaDb, ServerOptions::default()).await;
    let holder = waking(server.url()).await;
    let waiter = slow_polling(server.url()).await;
    let mut admin = sqlx::MySqlConnection::connect(server.url()).await.unwrap();
    let name = unique_name("anchor");
    let lease = must_acquire(&holder, &name, &long()).await;
    let anchor = waiter.wake_anchor_for_tests().to_owned();
    let task = wait_for(waiter, &name);
    // The connection of the waiter sleeping in the server, once it sleeps.
    let sleeper = async |admin: &mut sqlx::MySqlConnection| -> i64 {
        loop {
            let waiting: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM information_schema.processlist \
                 WHERE state = 'User lock' AND info LIKE '%expires_at%'",
            )
            .fetch_optional(&mut *admin)
            .await
            .unwrap();
            if let Some(id) = waiting {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let first_sleeper = tokio::time::timeout(Duration::from_secs(10), sleeper(&mut admin))
        .await
        .expect("the waiter sleeps in the server");
    let holder_of = async |admin: &mut sqlx::MySqlConnection| -> Option<i64> {
        sqlx::query_scalar("SELECT IS_USED_LOCK(?)")
            .bind(&anchor)
            .fetch_one(admin)
            .await
            .unwrap()
    };
    let first = holder_of(&mut admin).await.expect("the anchor is held");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {first}")))
        .execute(&mut admin)
        .await
        .unwrap();
    // A new anchor, on a connection that waits for nothing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = counters(&mut admin).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ran = counters(&mut admin).await.since(before);
    let second = holder_of(&mut admin).await.expect("a new anchor is held");
    assert_ne!(first, second);
    let command: String =
        sqlx::query_scalar("SELECT command FROM information_schema.processlist WHERE id = ?")
            .bind(second)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert_eq!(command, "Sleep", "the anchor's connection runs nothing");
    // The waiter sleeps again rather than spinning (nor polling: a minute).
    assert!(
        ran.statements < 20,
        "{} statements in 2 s while one waiter waits",
        ran.statements
    );
    // Wake-ups go on: the waiter sleeps in the server again, and the
    // release wakes it.
    let second_sleeper = tokio::time::timeout(Duration::from_secs(10), sleeper(&mut admin))
        .await
        .expect("the waiter sleeps in the server again");
    assert_ne!(
        first_sleeper, second_sleeper,
        "the connection that won the anchor was kept"
    );
    release_wakes(&holder, &lease, task).await;
}

/// An acquire whose reply does not come in time is undone from another
/// connection. Its statement may not have reached the server yet (held in
/// a socket buffer; here, by the proxy) and must not grant after the undo:
/// the undo ends the acquire's connection before it releases. An undo that
/// only releases by owner finds nothing to release, and the statement,
/// arriving after it, takes the name for a whole TTL for an owner nobody
/// has. On a server of its own, so that its connections are the backend's.
#[tokio::test]
async fn an_undone_acquire_cannot_take_the_name_afterwards() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    use sqlx::Connection;
    let server = start(Service::MariaDb, ServerOptions::default()).await;
    let direct = format!("127.0.0.1:{}", server.port().unwrap());
    let proxy = FaultProxy::start(direct.parse().unwrap()).await.unwrap();
    let proxied = format!("127.0.0.1:{}", proxy.addr().port());
    let b = MySqlBackend::builder(server.url().replace(&direct, &proxied))
        .request_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    // The connection prepares the acquire statement now: stalled, it holds
    // the execution itself, not a prepare whose reply the client awaits.
    let warm = must_acquire(&b, &unique_name("warm"), &long()).await;
    b.release(&warm).await.unwrap();
    let mut admin = sqlx::MySqlConnection::connect(server.url()).await.unwrap();
    let open = connections(&mut admin).await;
    let [sent_on] = open[..] else {
        panic!("expected the backend's one connection, found {open:?}");
    };

    proxy.set_open_connections(Fault::Stall);
    let name = unique_name("undone");
    match b.try_acquire(&name, &long()).await {
        Err(e @ Error::Connection { .. }) => {
            assert!(e.to_string().contains("no reply"), "{e}");
        }
        other => panic!("expected no reply in time, got {other:?}"),
    }
    // The undo runs now. A correct one ends the connection; give one that
    // does not the time to release (nothing) before the statement arrives.
    let ended_by_undo = gone(&mut admin, sent_on, Duration::from_secs(5)).await;
    proxy.set(Fault::Pass);
    // Whatever the connection carried has run, or never will, once the
    // server is done with it.
    assert!(
        gone(&mut admin, sent_on, Duration::from_secs(10)).await,
        "the acquire's connection is still open"
    );
    let holder = b.inspect(&name).await.unwrap();
    assert!(
        holder.is_none(),
        "the undone acquire took the name after its undo, for nobody: {holder:?} \
         (the undo ended its connection: {ended_by_undo})"
    );
}

/// The ids of the server's client connections to the test database, but
/// `admin`'s own.
async fn connections(admin: &mut sqlx::MySqlConnection) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST
         WHERE DB = DATABASE() AND ID <> CONNECTION_ID() ORDER BY ID",
    )
    .fetch_all(admin)
    .await
    .unwrap()
}

/// Whether the connection `id` has ended within `within` (polled).
async fn gone(admin: &mut sqlx::MySqlConnection, id: i64, within: Duration) -> bool {
    let until = tokio::time::Instant::now() + within;
    loop {
        if !connections(admin).await.contains(&id) {
            return true;
        }
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every call returns within the request timeout, counted from its start,
/// the wait for a connection included: with one connection in the pool
/// and the link black-holed, each call below waits for the connection the
/// others hold, then for a reply that never comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_returns_within_the_request_timeout_from_an_empty_pool() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    const TIMEOUT: Duration = Duration::from_secs(3);
    // What a loaded machine may add; under TIMEOUT, so that twice the
    // timeout cannot pass.
    const SLACK: Duration = Duration::from_millis(1250);
    let direct = url().await;
    let port = direct
        .rsplit_once(':')
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap();
    let proxy = FaultProxy::start(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap();
    let proxied = direct.replace(
        &format!("127.0.0.1:{port}"),
        &format!("127.0.0.1:{}", proxy.addr().port()),
    );
    let b = MySqlBackend::builder(proxied)
        .max_connections(1)
        .request_timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let mut leases = Vec::new();
    for _ in 0..4 {
        leases.push(must_acquire(&b, &unique_name("starved"), &long()).await);
    }
    proxy.set(Fault::Stall);
    let mut calls = tokio::task::JoinSet::new();
    let [a, c, d, e] = <[_; 4]>::try_from(leases).unwrap();
    let mut call = |what: &'static str, run: dlock_conformance::BoxFuture<bool>| {
        calls.spawn(async move {
            let started = tokio::time::Instant::now();
            let failed = run.await;
            (what, started.elapsed(), failed)
        });
    };
    let x = b.clone();
    call(
        "try_acquire",
        Box::pin(async move { x.try_acquire(&unique_name("s"), &long()).await.is_err() }),
    );
    let x = b.clone();
    call(
        "acquire",
        Box::pin(async move {
            x.acquire(&unique_name("s"), &long().wait(Duration::ZERO))
                .await
                .is_err()
        }),
    );
    let x = b.clone();
    call(
        "release",
        Box::pin(async move { x.release(&a).await.is_err() }),
    );
    let x = b.clone();
    call(
        "release_after",
        Box::pin(async move { x.release_after(&c, Duration::from_secs(1)).await.is_err() }),
    );
    let x = b.clone();
    call(
        "extend",
        Box::pin(async move {
            let mut d = d;
            x.extend(&mut d).await.is_err()
        }),
    );
    let x = b.clone();
    call(
        "extend_many",
        Box::pin(async move { x.extend_many(&mut [e]).await.is_err() }),
    );
    let x = b.clone();
    call(
        "inspect",
        Box::pin(async move { x.inspect("starved").await.is_err() }),
    );
    let x = b.clone();
    call(
        "list",
        Box::pin(async move { x.list("starved", None, 10).await.is_err() }),
    );
    let x = b.clone();
    call(
        "purge_expired",
        Box::pin(async move {
            x.purge_expired(dlock_mysql::MIN_PURGE_AGE, 10)
                .await
                .is_err()
        }),
    );
    while let Some(done) = calls.join_next().await {
        let (what, took, failed) = done.unwrap();
        eprintln!("{what}: {took:?}");
        assert!(failed, "{what} succeeded over a black-holed link");
        assert!(
            took <= TIMEOUT + SLACK,
            "{what} returned after {took:?}; the request timeout is {TIMEOUT:?}"
        );
    }
}

/// The wait for a connection and the statement share one bound: a call
/// that gets the pool's only connection late (another call's statement
/// waited on a row lock until then) has only the rest of its request
/// timeout for its own statement. Bounding each by the whole timeout let
/// such a call take nearly twice as long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_waited_for_a_connection_has_only_the_rest_of_its_timeout() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    use sqlx::Connection;
    const TIMEOUT: Duration = Duration::from_secs(3);
    const SLACK: Duration = Duration::from_millis(1250);
    let b = MySqlBackend::builder(url().await)
        .max_connections(1)
        .request_timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    b.migrate().await.unwrap();
    let first = must_acquire(&b, &unique_name("first"), &long()).await;
    let mut later = Vec::new();
    for _ in 0..3 {
        later.push(must_acquire(&b, &unique_name("later"), &long()).await);
    }
    // Row locks that make the statements wait in the server, answering
    // nothing until they are lifted.
    let lock_rows = |names: Vec<String>| async move {
        let mut conn = sqlx::MySqlConnection::connect(url().await).await.unwrap();
        sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
        for name in names {
            sqlx::query("SELECT 1 FROM dlock_locks WHERE name = ? FOR UPDATE")
                .bind(name.into_bytes())
                .fetch_all(&mut conn)
                .await
                .unwrap();
        }
        conn
    };
    let mut first_row = lock_rows(vec![first.name().to_owned()]).await;
    let _later_rows = lock_rows(later.iter().map(|l| l.name().to_owned()).collect()).await;

    // Takes the only connection and keeps it until the first row is free.
    let x = b.clone();
    let blocker = tokio::spawn(async move {
        let mut first = first;
        x.extend(&mut first).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut calls = tokio::task::JoinSet::new();
    for (i, lease) in later.into_iter().enumerate() {
        let x = b.clone();
        calls.spawn(async move {
            let started = tokio::time::Instant::now();
            let mut lease = lease;
            let failed = match i {
                0 => x.extend(&mut lease).await.is_err(),
                1 => x.release(&lease).await.is_err(),
                _ => x
                    .release_after(&lease, Duration::from_secs(1))
                    .await
                    .is_err(),
            };
            (i, started.elapsed(), failed)
        });
    }
    // The connection frees 2.5 s into the blocker's call, 2 s into theirs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    sqlx::query("COMMIT").execute(&mut first_row).await.unwrap();
    // Its own outcome does not matter: only that it held the connection.
    let _ = blocker.await.unwrap();
    while let Some(done) = calls.join_next().await {
        let (i, took, failed) = done.unwrap();
        eprintln!("call {i}: {took:?}");
        assert!(failed, "call {i} got through a locked row");
        assert!(
            took <= TIMEOUT + SLACK,
            "call {i} returned after {took:?}; the request timeout is {TIMEOUT:?}"
        );
    }
}

/// Shared waiters of two clients, with wake-ups, hand a write lock and a
/// semaphore of one back and forth, each release racing the other's look
/// and sleep: with polls 60 s apart and 60 s leases, every hand-off is a
/// wake-up from the other client's release (a missed one would leave the
/// waiter asleep past its 20 s wait, and fail the case).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_releases_wake_the_waiter_of_another_client() {
    let client = || async {
        let backend = MySqlBackend::builder(url().await)
            .wake_ups(true)
            .max_poll_interval(Duration::from_secs(60))
            .connect()
            .await
            .unwrap();
        backend.migrate().await.unwrap();
        backend
    };
    for opts in [LockOptions::new().write(), LockOptions::new().permits(1)] {
        let opts = opts
            .ttl(Duration::from_secs(60))
            .wait(Duration::from_secs(20));
        let name = unique_name("shared-hand-off");
        let (mut holder, mut waiter) = (client().await, client().await);
        let mut lease = holder.acquire(&name, &opts).await.unwrap();
        for i in 0..100 {
            let task = {
                let (waiter, name, opts) = (waiter.clone(), name.clone(), opts.clone());
                tokio::spawn(async move { waiter.acquire(&name, &opts).await })
            };
            tokio::time::sleep(Duration::from_millis(i % 3)).await;
            holder.release(&lease).await.unwrap();
            lease = task
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("hand-off {i} of {:?}: {e}", opts.get_mode()));
            std::mem::swap(&mut holder, &mut waiter);
        }
        holder.release(&lease).await.unwrap();
    }
}

/// Every builder setting can come in the URL: the table named there is the
/// one a backend built with the setter uses; sqlx's own parameters pass,
/// and one neither knows is refused by its name.
#[tokio::test]
async fn settings_in_the_url_take_effect_and_unknown_ones_are_refused() {
    let url = url().await;
    let with = |query: &str| format!("{url}?{query}");
    let by_url = MySqlBackend::connect(&with("table=dlock_by_url&ssl-mode=disabled"))
        .await
        .unwrap();
    let by_setter = MySqlBackend::builder(url)
        .table("dlock_by_url")
        .connect()
        .await
        .unwrap();
    url_setting_takes_effect(&by_url, &by_setter, &backend().await, &long()).await;
    refused_by_name(
        MySqlBackend::connect(&with("tabel=s3cret")).await,
        "tabel",
        "s3cret",
    );
    let malformed = MySqlBackend::connect(&with("request_timeout=soon")).await;
    assert!(
        matches!(
            &malformed,
            Err(Error::InvalidOption {
                option: "request_timeout",
                ..
            })
        ),
        "{malformed:?}"
    );
}

/// A released row (no owner) whose `expires_at` is still ahead of a read's
/// clock, as a release that committed after a read's statement began but
/// before it read the row leaves it: `inspect`, `holders` and `list` show
/// the name free (they answered a malformed-owner error before).
#[tokio::test]
async fn a_row_released_as_a_read_began_shows_free() {
    let b = backend().await;
    let name = unique_name("released-row");
    let lease = must_acquire(&b, &name, &long()).await;
    b.release(&lease).await.unwrap();
    sqlx::query(
        "UPDATE dlock_locks SET expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR WHERE name = ?",
    )
    .bind(name.as_bytes())
    .execute(&raw().await)
    .await
    .unwrap();
    assert_eq!(b.inspect(&name).await.unwrap(), None);
    assert_eq!(b.holders(&name).await.unwrap(), Vec::new());
    let page = b.list(&name, None, 10).await.unwrap();
    assert!(page.locks.is_empty(), "{page:?}");
}

/// The shared kinds' stored procedures are made by `connect` and called;
/// dropped while a backend runs (an administrator, a restore), its next
/// shared call finds one gone and the backend goes back to the text: a
/// semaphore still grants, refuses, queues and hands over.
#[tokio::test]
async fn shared_calls_go_as_text_once_the_procedures_are_gone() {
    // A table of its own: no other test's backend loses its procedures.
    const TABLE: &str = "dlock_dropped";
    let connect = || async {
        MySqlBackend::builder(url().await)
            .table(TABLE)
            .wake_ups(true)
            .connect()
            .await
            .unwrap()
    };
    let (b, waiter) = (connect().await, connect().await);
    assert!(b.calls_procedures() && waiter.calls_procedures());
    let name = unique_name("gone");
    let two = long().permits(2);
    let first = must_acquire(&b, &name, &two).await;
    for suffix in ["sa1", "se1", "sr1"] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "DROP PROCEDURE `{TABLE}_{suffix}`"
        )))
        .execute(&raw().await)
        .await
        .unwrap();
    }
    let second = must_acquire(&b, &name, &two).await;
    assert!(
        !b.calls_procedures(),
        "the acquire did not go back to the text"
    );
    assert!(matches!(b.try_acquire(&name, &two).await, Ok(None)));
    let task = wait_on_task(waiter, &name, two.clone().wait(Duration::from_secs(50)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!task.is_finished(), "a third permit of two was granted");
    b.release(&first).await.unwrap();
    let (lease, _, waiter) = task.await.unwrap();
    assert!(
        !waiter.calls_procedures(),
        "the wait did not go back to the text"
    );
    waiter.release(&lease.unwrap()).await.unwrap();
    b.release(&second).await.unwrap();
}

/// A procedure of the table's name with another body (an older build's,
/// another program's) is never called, nor is one of a table named with
/// capitals (routine names ignore case: `Locks` and `locks` would share
/// them): such backends run the text, and their shared kinds work.
#[tokio::test]
async fn only_this_release_s_procedures_are_called() {
    let id = unique_name("body").replace('-', "_").to_lowercase();
    let table = format!("b_{}", &id[id.len() - 20..]);
    let admin = raw().await;
    let ddl = MySqlBackend::table_ddl(&table).unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE PROCEDURE `{table}_sa1`() BEGIN SELECT 1; END"
    )))
    .execute(&admin)
    .await
    .unwrap();
    let capitals = format!("B_{}", &id[id.len() - 20..]);
    for table in [table, capitals] {
        let b = MySqlBackend::builder(url().await)
            .table(&table)
            .connect()
            .await
            .unwrap();
        assert!(!b.calls_procedures(), "{table}: calls procedures");
        let name = unique_name("body");
        let permit = must_acquire(&b, &name, &long().permits(1)).await;
        assert!(matches!(
            b.try_acquire(&name, &long().permits(1)).await,
            Ok(None)
        ));
        b.release(&permit).await.unwrap();
    }
}

/// When a read that held the name longest ends, the name's marker comes
/// down to the longest read left: `inspect` shows that one's end, not the
/// ended read's (which would keep other kinds out for its whole TTL).
#[tokio::test]
async fn the_marker_comes_down_when_the_longest_read_ends() {
    let b = backend().await;
    let name = unique_name("longest");
    let long_read = must_acquire(&b, &name, &long().read()).await;
    let short = LockOptions::new().ttl(Duration::from_secs(5)).read();
    let short_read = must_acquire(&b, &name, &short).await;
    b.release(&long_read).await.unwrap();
    let shown = b
        .inspect(&name)
        .await
        .unwrap()
        .expect("a read holds the name");
    let left = shown.expires_in.expect("an expiry");
    assert!(
        left <= Duration::from_secs(5),
        "the marker ends in {left:?}"
    );
    b.release(&short_read).await.unwrap();
    assert!(
        b.inspect(&name).await.unwrap().is_none(),
        "nothing holds it"
    );
}
