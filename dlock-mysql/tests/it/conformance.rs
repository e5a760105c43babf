//! The whole conformance suite against a real MariaDB in a container, on
//! a table without the shared kinds' stored procedures (as a user who may
//! not create routines, or whose table an older release made, has it):
//! every shared call goes as text. The suite with wake-ups
//! (`conformance_wake_ups.rs`) runs on the procedures.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::sync::Arc;

use dlock_conformance::harness::{Service, shared};
use dlock_core::Backend;
use dlock_mysql::MySqlBackend;
use tokio::sync::OnceCell;

/// The lock table of this suite: made from `table_ddl`, which makes no
/// procedure, and never migrated.
const TABLE: &str = "dlock_text";

async fn mariadb() -> Arc<dyn Backend> {
    static MADE: OnceCell<()> = OnceCell::const_new();
    let server = shared(Service::MariaDb).await;
    MADE.get_or_init(|| async {
        let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect(server.url())
            .await
            .unwrap();
        let ddl = MySqlBackend::table_ddl(TABLE).unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
            .execute(&mut conn)
            .await
            .unwrap();
    })
    .await;
    let backend = MySqlBackend::builder(server.url())
        .table(TABLE)
        .create_table(false)
        // Waiters across processes learn of their turn when they poll:
        // often, so that the stress cases hand over quickly.
        .max_poll_interval(std::time::Duration::from_millis(100))
        .connect()
        .await
        .expect("connect to the test MariaDB");
    assert!(
        !backend.calls_procedures(),
        "the table `{TABLE}` has procedures: this suite would not run the text"
    );
    Arc::new(backend)
}

dlock_conformance::conformance_tests!(mariadb);
