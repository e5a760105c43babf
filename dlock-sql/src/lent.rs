//! A connection lent by the [`Pool`] to one call, and how it goes back.

use dlock_core::Result;
use sqlx::{Execute, Executor};
use tokio::sync::SemaphorePermit;
use tokio::time::{Instant, timeout_at};

use crate::pool::{Conn, Dialect, Pool};

/// A connection lent to one call. It goes back to the pool only through
/// [`Lent::give_back`]; dropped otherwise (a timeout, a dropped future, a
/// broken link), it is closed, because a statement may still be in flight
/// on it.
pub struct Lent<'a, D: Dialect> {
    pool: &'a Pool<D>,
    conn: Option<(Conn<D>, D::Mark)>,
    _permit: SemaphorePermit<'a>,
}

impl<'a, D: Dialect> Lent<'a, D> {
    pub(crate) fn new(
        pool: &'a Pool<D>,
        conn: Conn<D>,
        mark: D::Mark,
        permit: SemaphorePermit<'a>,
    ) -> Self {
        Lent {
            pool,
            conn: Some((conn, mark)),
            _permit: permit,
        }
    }

    fn pooled(&mut self) -> &mut (Conn<D>, D::Mark) {
        match &mut self.conn {
            Some(pooled) => pooled,
            None => unreachable!("a lent connection is present until given back"),
        }
    }

    /// The connection.
    pub fn conn(&mut self) -> &mut Conn<D> {
        &mut self.pooled().0
    }

    /// What the driver keeps with the connection.
    pub fn mark(&mut self) -> D::Mark {
        self.pooled().1.clone()
    }

    /// The connection, and what the driver keeps with it, to change.
    pub fn parts(&mut self) -> (&mut Conn<D>, &mut D::Mark) {
        let (conn, mark) = self.pooled();
        (conn, mark)
    }

    /// Runs `create` (a `CREATE … IF NOT EXISTS`) by `by`. A user without
    /// the right to create is fine when `exists` finds the table there
    /// already; otherwise the error says what to run (`missing`).
    ///
    /// # Errors
    /// As [`Pool::answer`]; a backend error naming `missing` when the
    /// table is missing and may not be created.
    pub async fn create_unless_there<'q, Q>(
        &mut self,
        (create, exists): (Q, Q),
        by: Instant,
        missing: impl FnOnce() -> String,
    ) -> Result<()>
    where
        Q: Execute<'q, D::Db> + 'q,
        for<'c> &'c mut Conn<D>: Executor<'c, Database = D::Db>,
    {
        const DOING: &str = "create the lock table";
        let denied = match timeout_at(by, self.conn().execute(create)).await {
            Ok(Err(e)) if D::may_not_create(&e) => e,
            done => return self.pool.answer(done, DOING).map(drop),
        };
        if let Ok(Ok(_)) = timeout_at(by, self.conn().execute(exists)).await {
            return Ok(());
        }
        Err(D::error(denied, &missing()))
    }

    /// The statement finished: the connection is fit for the next one.
    pub fn give_back(mut self) {
        if let Some((conn, mark)) = self.conn.take() {
            self.pool.idle().push((conn, mark, Instant::now()));
        }
    }
}
