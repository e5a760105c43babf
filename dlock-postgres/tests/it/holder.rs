//! Tables made by older releases: the mutex works on them, and `migrate`
//! gives them this release's holder columns, drops their expiry index and
//! leaves half of each new page free; their rows still read.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use dlock_conformance::harness::{Service, shared};
use dlock_conformance::support::{older_tables_work_until_migrated, unique_name};
use dlock_core::{Backend, LockOptions, OwnerToken};
use dlock_postgres::PgBackend;
use sqlx::Connection;

#[tokio::test]
async fn tables_of_an_older_release_work_and_migrate_upgrades_them() {
    let url = shared(Service::Postgres).await.url();
    let mut admin = sqlx::PgConnection::connect(url).await.unwrap();
    let table = unique_name("old").replace('-', "_").to_lowercase();
    let old_owner = OwnerToken::random().unwrap();
    // The tables as an older release made them: no holder in the holds
    // table, an index on the expiry.
    let old_layout = format!(
        "CREATE TABLE {table} (name bytea PRIMARY KEY, owner text NOT NULL,
           fence bigint NOT NULL, expires_at timestamptz NOT NULL,
           acquired_at timestamptz NOT NULL, holder text NOT NULL);
         CREATE INDEX {table}_expires_at ON {table} (expires_at);
         CREATE TABLE {table}_holds (name bytea NOT NULL, owner text NOT NULL,
           mode text NOT NULL, kind text NOT NULL, fence bigint NOT NULL,
           expires_at timestamptz NOT NULL, waiting boolean NOT NULL,
           since bigint NOT NULL, PRIMARY KEY (name, owner));
         INSERT INTO {table} VALUES ('legacy', '{old_owner}', 5,
           clock_timestamp() + interval '1 minute', clock_timestamp(), 'web-1:77')"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(old_layout))
        .execute(&mut admin)
        .await
        .unwrap();

    // With wake-ups, a release on a table without the count of places
    // reads the queue in a second statement.
    let waking = |url: &str| {
        PgBackend::builder(url)
            .table(&table)
            .wake_ups(true)
            .connect()
    };
    let name = unique_name("old-wake");
    let lease = waking(url).await.unwrap();
    let held = lease
        .try_acquire(&name, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    lease.release(&held).await.unwrap();
    let b = PgBackend::builder(url)
        .table(&table)
        .connect()
        .await
        .unwrap();
    older_tables_work_until_migrated(&b, old_owner, || b.migrate()).await;
    let places: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1)
           AND attname = 'places')",
    )
    .bind(&table)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(places, "migrate counts places in the lock table");
    let waking = waking(url).await.unwrap();
    let held = waking
        .try_acquire(&name, &LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    waking.release(&held).await.unwrap();
    let (index, options): (Option<String>, Vec<String>) = sqlx::query_as(
        "SELECT to_regclass($1)::text, (SELECT array_agg(COALESCE(array_to_string(reloptions, ','), '') \
           ORDER BY relname) FROM pg_class WHERE relname IN ($2, $3))",
    )
    .bind(format!("public.{table}_expires_at"))
    .bind(&table)
    .bind(format!("{table}_holds"))
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert_eq!(index, None, "the expiry index is gone");
    assert_eq!(options, ["fillfactor=50"; 2], "pages are left half free");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {table}, {table}_holds"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
}
