//! Tables made by older releases: the mutex works on them, and `migrate`
//! gives them this release's holder columns; their rows still read.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use dlock_conformance::harness::{Service, shared};
use dlock_conformance::support::{older_tables_work_until_migrated, unique_name};
use dlock_core::OwnerToken;
use dlock_mysql::MySqlBackend;

/// The tables as an older release made them: a `VARCHAR` holder in the
/// server's default character set (here latin1, which cannot store most
/// descriptions), none in the holds table.
fn old_layout(table: &str) -> [String; 2] {
    [
        format!(
            "CREATE TABLE `{table}` (
               name VARBINARY(255) NOT NULL PRIMARY KEY,
               owner CHAR(32) CHARACTER SET ascii NOT NULL,
               version BIGINT UNSIGNED NOT NULL,
               expires_at DATETIME(6) NOT NULL,
               acquired_at DATETIME(6) NOT NULL,
               holder VARCHAR(255) CHARACTER SET latin1 NOT NULL,
               KEY expires_at (expires_at)
             ) ENGINE=InnoDB"
        ),
        format!(
            "CREATE TABLE `{table}_holds` (
               name VARBINARY(255) NOT NULL,
               owner CHAR(32) CHARACTER SET ascii NOT NULL,
               mode CHAR(1) CHARACTER SET ascii NOT NULL,
               kind VARCHAR(16) CHARACTER SET ascii NOT NULL,
               fence BIGINT UNSIGNED NOT NULL,
               expires_at DATETIME(6) NOT NULL,
               waiting BOOLEAN NOT NULL,
               since BIGINT UNSIGNED NOT NULL,
               PRIMARY KEY (name, owner)
             ) ENGINE=InnoDB"
        ),
    ]
}

#[tokio::test]
async fn tables_of_an_older_release_work_and_migrate_upgrades_them() {
    let url = shared(Service::MariaDb).await.url();
    let raw = sqlx::MySqlPool::connect(url).await.unwrap();
    let table = unique_name("old").replace('-', "_");
    for create in old_layout(&table) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(create))
            .execute(&raw)
            .await
            .unwrap();
    }
    let old_owner = OwnerToken::random().unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO `{table}` VALUES ('legacy', ?, 5, NOW(6) + INTERVAL 1 MINUTE, NOW(6), 'web-1:77')"
    )))
    .bind(old_owner.to_string())
    .execute(&raw)
    .await
    .unwrap();

    let b = MySqlBackend::builder(url)
        .table(&table)
        .connect()
        .await
        .unwrap();
    older_tables_work_until_migrated(&b, old_owner, || b.migrate()).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE `{table}`, `{table}_holds`"
    )))
    .execute(&raw)
    .await
    .unwrap();
}
