//! MySQL-specific behaviour: the table, versions, migrate, configuration
//! errors.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock_conformance::cases::unique_name;
use dlock_conformance::harness::{ServerOptions, Service, shared, start, unused_port};
use dlock_core::{Backend, Error, LockOptions};
use dlock_mysql::MySqlBackend;

fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

async fn url() -> &'static str {
    shared(Service::MariaDb).await.url()
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
        leases.push(
            b.try_acquire(n, &opts())
                .await
                .unwrap()
                .expect("distinct lock"),
        );
    }
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM dlock_locks WHERE name LIKE ?")
        .bind(format!("%{id}%"))
        .fetch_one(b.pool())
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
        let lease = b.try_acquire(&name, &opts()).await.unwrap().unwrap();
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
    let first = b.try_acquire(&name, &short).await.unwrap().unwrap();
    assert_eq!(first.fencing_token(), 1, "a new row starts at version 1");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let second = b.try_acquire(&name, &opts()).await.unwrap().unwrap();
    assert_eq!(second.fencing_token(), 2);
    b.release(&second).await.unwrap();
    let third = b.try_acquire(&name, &opts()).await.unwrap().unwrap();
    assert_eq!(
        third.fencing_token(),
        3,
        "release keeps the row and its version"
    );
    let (version, owner, holder): (u64, String, String) =
        sqlx::query_as("SELECT version, owner, holder FROM dlock_locks WHERE name = ?")
            .bind(name.as_bytes())
            .fetch_one(b.pool())
            .await
            .unwrap();
    assert_eq!(version, 3);
    assert_eq!(owner, third.owner().to_string());
    assert!(
        holder.ends_with(&format!(":{}", std::process::id())),
        "{holder}"
    );
    b.release(&third).await.unwrap();
}

#[tokio::test]
async fn migrate_twice_is_a_no_op() {
    let b = backend().await;
    let name = unique_name("migrate");
    let lease = b.try_acquire(&name, &opts()).await.unwrap().unwrap();
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
        .connect()
        .await
        .unwrap();
    let r = b.try_acquire("x", &opts()).await;
    match r {
        Err(e @ Error::Backend { .. }) => assert!(e.to_string().contains("migrate"), "{e}"),
        other => panic!("expected a missing-table error, got {other:?}"),
    }
    b.migrate().await.unwrap();
    let lease = b.try_acquire("x", &opts()).await.unwrap().unwrap();
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
    let r = MySqlBackend::builder(format!("mysql://dlock:dlock@127.0.0.1:{port}/dlock"))
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await;
    assert!(matches!(r, Err(Error::Connection { .. })), "{r:?}");
}

#[tokio::test]
async fn a_server_that_is_down_gives_errors_not_grants() {
    let server = start(Service::MariaDb, ServerOptions::default()).await;
    let b = MySqlBackend::builder(server.url())
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    b.migrate().await.unwrap();
    let lease = b.try_acquire("down", &opts()).await.unwrap().unwrap();
    server.container().unwrap().stop().await.unwrap();
    let r = b.try_acquire("other", &opts()).await;
    assert!(matches!(r, Err(Error::Connection { .. })), "{r:?}");
    let r = b.release(&lease).await;
    assert!(matches!(r, Err(Error::Connection { .. })), "{r:?}");
}
