//! Fenced writes to PostgreSQL: the resource's side of fencing, for data
//! the application keeps in PostgreSQL (whatever backend its locks are on).
//!
//! A table keeps the greatest fencing token written per resource. In the
//! write's own transaction, [`PgFence::admit`] raises the resource's token
//! to the writer's, or finds a greater one and refuses with
//! [`Error::Fenced`]; the row stays locked until
//! the transaction ends, so an older holder cannot slip in between the
//! check and the write.

use std::time::Duration;

use dlock_core::{Error, Result, check_fence};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::pool::Pg;
use crate::sql::validate_identifier;

/// Fencing through a table of the greatest token per resource.
///
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, guard: dlock_core::Guard) -> dlock_core::Result<()> {
/// use dlock_postgres::fence::PgFence;
/// let fence = PgFence::new("dlock_fences")?;
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
pub struct PgFence {
    table: String,
    timeout: Duration,
}

impl PgFence {
    /// Fencing through `table`: a plain identifier (lower-case letters,
    /// digits, `_`), optionally `schema.table`.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for another name.
    pub fn new(table: &str) -> Result<Self> {
        let mut parts = table.split('.');
        let (first, second) = (parts.next().unwrap_or_default(), parts.next());
        validate_identifier("table", first)?;
        if let Some(table) = second {
            validate_identifier("table", table)?;
        }
        if parts.next().is_some() {
            return Err(Error::invalid_option("table", "at most `schema.table`"));
        }
        Ok(PgFence {
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
            "CREATE TABLE IF NOT EXISTS {} (resource TEXT PRIMARY KEY, token BIGINT NOT NULL)",
            self.table
        )
    }

    /// Creates the table if it is missing.
    ///
    /// # Errors
    /// The server's (a role that may not create tables: have an
    /// administrator run [`table_ddl`](Self::table_ddl)).
    pub async fn create_table(&self, conn: &mut PgConnection) -> Result<()> {
        let ddl = self.table_ddl();
        let run = sqlx::raw_sql(sqlx::AssertSqlSafe(ddl)).execute(conn);
        dlock_sql::bounded::<Pg, _>(self.timeout, run, "create the fence table").await?;
        Ok(())
    }

    /// Admits a write to `resource` with `token`, in the write's
    /// transaction: raises the resource's token to `token`, or refuses when
    /// it is greater, and keeps the resource's row locked until the
    /// transaction ends. Write only if this returns `Ok`, in the same
    /// transaction. Under `REPEATABLE READ` or `SERIALIZABLE`, a newer
    /// holder's token committed after the transaction's snapshot fails the
    /// statement with a serialization failure (a backend error) rather
    /// than [`Error::Fenced`]: either way, nothing is written. Fence a
    /// resource with the tokens of one lock name only, and of a mutex or a
    /// write lock: readers and permits hold together, and a lower token of
    /// one of them would be refused.
    ///
    /// # Errors
    /// [`Error::Fenced`] for a stale token (roll the transaction back:
    /// another holder has written since this lease ended);
    /// [`Error::InvalidOption`] for a token above `i64::MAX`; the server's.
    pub async fn admit(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        resource: &str,
        token: u64,
    ) -> Result<()> {
        let conn: &mut PgConnection = tx;
        let mine = i64::try_from(token)
            .map_err(|_| Error::invalid_option("token", "above what a BIGINT holds"))?;
        let sql = format!(
            "INSERT INTO {t} (resource, token) VALUES ($1, $2) ON CONFLICT (resource) \
             DO UPDATE SET token = GREATEST({t}.token, EXCLUDED.token) RETURNING token",
            t = self.table
        );
        // Unnamed: the application's connection may pass through a pooler
        // that keeps no prepared statements.
        let run = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql))
            .persistent(false)
            .bind(resource)
            .bind(mine)
            .fetch_one(conn);
        let highest =
            dlock_sql::bounded::<Pg, _>(self.timeout, run, "admit a fenced write").await?;
        check_fence(resource, token, u64::try_from(highest).ok())
    }
}
