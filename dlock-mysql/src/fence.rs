//! Fenced writes to MySQL and MariaDB: the resource's side of fencing, for
//! data the application keeps there (whatever backend its locks are on).
//!
//! A table keeps the greatest fencing token written per resource. In the
//! write's own transaction, [`MySqlFence::admit`] raises the resource's
//! token to the writer's, or finds a greater one and refuses with
//! [`Error::Fenced`]; the row stays locked until
//! the transaction ends, so an older holder cannot slip in between the
//! check and the write.

use std::time::Duration;

use dlock_core::{Error, Result, check_fence};
use sqlx::{MySql, MySqlConnection, Transaction};

use crate::pool::My;
use crate::sql::validate_table;

/// Fencing through a table of the greatest token per resource.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool, guard: dlock_core::Guard) -> dlock_core::Result<()> {
/// use dlock_mysql::fence::MySqlFence;
/// let fence = MySqlFence::new("dlock_fences")?;
/// let mut conn = pool.acquire().await.expect("a connection");
/// fence.create_table(&mut conn).await?;
/// let mut tx = pool.begin().await.expect("a transaction");
/// fence.admit(&mut tx, "account:7", guard.fencing_token()).await?;
/// sqlx::query("UPDATE accounts SET balance = balance - 10 WHERE id = 7")
///     .execute(&mut *tx)
///     .await
///     .expect("the write");
/// tx.commit().await.expect("commit");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MySqlFence {
    table: String,
    timeout: Duration,
}

impl MySqlFence {
    /// Fencing through `table` (ASCII letters, digits, `_`, `$`).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for another name.
    pub fn new(table: &str) -> Result<Self> {
        validate_table(table)?;
        Ok(MySqlFence {
            table: table.to_owned(),
            timeout: Duration::from_secs(2),
        })
    }

    /// How long each statement may take (default 2 s); one that takes
    /// longer fails the call, and its transaction must be dropped.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The table's DDL, for an administrator to run.
    pub fn table_ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS `{}` (resource VARBINARY(255) PRIMARY KEY, \
             token BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB",
            self.table
        )
    }

    /// Creates the table if it is missing.
    ///
    /// # Errors
    /// The server's (a user that may not create tables: have an
    /// administrator run [`table_ddl`](Self::table_ddl)).
    pub async fn create_table(&self, conn: &mut MySqlConnection) -> Result<()> {
        let run = sqlx::raw_sql(sqlx::AssertSqlSafe(self.table_ddl())).execute(conn);
        dlock_sql::bounded::<My, _>(self.timeout, run, "create the fence table").await?;
        Ok(())
    }

    /// Admits a write to `resource` (at most 255 bytes) with `token`, in
    /// the write's transaction: raises the resource's token to `token`, or
    /// refuses when it is greater, and keeps the resource's row locked
    /// until the transaction ends. Write only if this returns `Ok`, in the
    /// same transaction. Fence a resource with the tokens of one lock name
    /// only, and of a mutex or a write lock: readers and permits hold
    /// together, and a lower token of one of them would be refused.
    ///
    /// # Errors
    /// [`Error::Fenced`] for a stale token (roll the transaction back:
    /// another holder has written since this lease ended);
    /// [`Error::InvalidOption`] for an empty or longer resource; the
    /// server's.
    pub async fn admit(
        &self,
        tx: &mut Transaction<'_, MySql>,
        resource: &str,
        token: u64,
    ) -> Result<()> {
        let conn: &mut MySqlConnection = tx;
        if resource.is_empty() || resource.len() > 255 {
            return Err(Error::invalid_option(
                "resource",
                format!("must be 1 to 255 bytes, got {}", resource.len()),
            ));
        }
        // The upsert locks the row; the read in the same transaction sees
        // the token it left: the writer's, or a greater one.
        let raise = format!(
            "INSERT INTO `{}` (resource, token) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE token = GREATEST(token, VALUES(token))",
            self.table
        );
        // A locking read: the latest committed token, whatever snapshot
        // the transaction read from before (REPEATABLE READ's plain read
        // would show the token as it was then).
        let read = format!(
            "SELECT token FROM `{}` WHERE resource = ? FOR UPDATE",
            self.table
        );
        let run = async {
            sqlx::query(sqlx::AssertSqlSafe(raise))
                .persistent(false)
                .bind(resource.as_bytes())
                .bind(token)
                .execute(&mut *conn)
                .await?;
            sqlx::query_scalar::<_, u64>(sqlx::AssertSqlSafe(read))
                .persistent(false)
                .bind(resource.as_bytes())
                .fetch_one(&mut *conn)
                .await
        };
        let highest =
            dlock_sql::bounded::<My, _>(self.timeout, run, "admit a fenced write").await?;
        check_fence(resource, token, Some(highest))
    }
}
