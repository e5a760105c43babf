//! The calls of reader-writer locks and semaphores (the shared kinds) that
//! both SQL drivers make alike. Each dialect writes the statements and
//! runs them its own way (MySQL in a transaction it retries after a
//! deadlock, PostgreSQL as one simple query) and reads their answers; what
//! it does with a grant, a refusal or an answer that never came is here.

use std::time::Duration;

use async_trait::async_trait;
use dlock_core::driver::micros_up;
use dlock_core::driver::undo::UndoOnDrop;
use dlock_core::driver::wait::{Attempt, on_arrival};
use dlock_core::driver::{Driver, admin};
use dlock_core::{Error, Lease, LockInfo, LockOptions, Mode, OwnerToken, Result};
use tokio::time::Instant;

/// The statements [`SharedKinds`] sends, in a dialect. Each changes one
/// name's holds under a lock on the name's row; `wake` asks the change to
/// wake the waiters it may let in across processes too.
pub trait SharedStatements: Send + Sync {
    /// A statement, as the dialect runs it.
    type Stmt: Send + Sync + 'static;

    /// Ends `owner`'s live hold of `name`, and gives the queue place it
    /// was granted from back to `waiter` (`""`: to nobody) if it is that
    /// waiter's, live for `place_us`: the undo of a grant whose reply was
    /// lost, to a waiter still waiting, which must not queue anew behind
    /// writers that came later. Counts the holds it ended (0 or 1).
    fn release_shared(
        &self,
        name: &[u8],
        owner: &str,
        waiter: &str,
        place_us: u64,
        wake: bool,
    ) -> Self::Stmt;

    /// `release_after` of a shared hold: it stays under `hold_owner` until
    /// `hold_us` from now. Its value: 1 when set, 0 when not held.
    fn hold_shared(&self, name: &[u8], owner: &str, hold_owner: &str, hold_us: u64) -> Self::Stmt;

    /// A read hold for `reader` beside the live write hold of `writer`,
    /// waiters or not. Its value: the read hold's fencing token, when
    /// granted.
    fn downgrade(
        &self,
        name: &[u8],
        writer: &str,
        reader: &str,
        ttl_us: u64,
        holder: &str,
    ) -> Self::Stmt;

    /// Ends every hold of a name held as a reader-writer lock or a
    /// semaphore (an operator's force release). Counts 1 when it did.
    fn clear_shared(&self, name: &[u8], wake: bool) -> Self::Stmt;
}

/// A SQL driver's side of the shared kinds: its statements and how it runs
/// them. The calls both drivers make alike are provided.
#[async_trait]
pub trait SharedKinds: Driver + Clone + 'static {
    /// A statement, as the dialect runs it.
    type Stmt: Send + Sync + 'static;

    /// The dialect's statements, for this backend's table.
    fn statements(&self) -> &dyn SharedStatements<Stmt = Self::Stmt>;

    /// Whether changes wake waiters in other processes.
    fn wakes_others(&self) -> bool;

    /// The longest a waiter goes without looking again.
    fn max_poll(&self) -> Duration;

    /// A fencing token as the server answered it, for a call `doing`.
    ///
    /// # Errors
    /// [`Error::Backend`] when the server's answer is no token.
    fn token(&self, fence: i64, doing: &str) -> Result<u64>;

    /// Runs a change of a name's holds or queue (`doing`), and returns
    /// its count; the waiters it may have let in are woken (in this
    /// process when that is not 0, and across processes as the driver
    /// can: PostgreSQL's announcement follows the queue as read after the
    /// change's commit, whatever the count).
    async fn change(&self, sql: Self::Stmt, name: &str, doing: &str) -> Result<i64>;

    /// Runs a statement of one value (`doing`): the first column of its
    /// answer's last row, `None` when NULL (and, where the dialect's
    /// statement answers no row for "nothing", when missing).
    async fn value(&self, sql: Self::Stmt, doing: &str) -> Result<Option<i64>>;

    /// Releases `lease`, a read hold that a downgrade sent at `sent` may
    /// have granted: it got no answer.
    async fn undo_downgrade(&self, lease: Lease, sent: Instant);

    /// How long a queued waiter keeps its place without asking again: a
    /// few of its longest sleeps, plus the round trips of its asking.
    fn place(&self) -> Duration {
        self.max_poll() * 3 + self.request_timeout() * 2
    }

    /// The outcome of an acquire of a shared kind sent at `sent` by
    /// `owner`, from its answer: the fencing token when granted, the kind
    /// the name is in use as when that is another (the refusal), and the
    /// µs until the first hold ends.
    ///
    /// # Errors
    /// [`Error::ModeConflict`], or a malformed token.
    fn shared_outcome(
        &self,
        name: &str,
        opts: &LockOptions,
        (owner, sent): (OwnerToken, Instant),
        (fence, conflict, left): (Option<i64>, Option<String>, Option<i64>),
    ) -> Result<Attempt> {
        if let Some(fence) = fence {
            let lease = Lease::with_ttl(name, owner, self.token(fence, "acquire")?, opts, sent);
            return Ok(on_arrival(self, lease));
        }
        self.refused(name, opts, conflict, left)
    }

    /// The outcome of a look that granted nothing: the kind the name is in
    /// use as when that is another (the refusal), else held, with the µs
    /// until the first hold ends.
    ///
    /// # Errors
    /// [`Error::ModeConflict`].
    fn refused(
        &self,
        name: &str,
        opts: &LockOptions,
        conflict: Option<String>,
        left: Option<i64>,
    ) -> Result<Attempt> {
        if let Some(kind) = conflict {
            return Err(Error::ModeConflict {
                name: name.to_owned(),
                held: Mode::of_marker(&kind),
                asked: opts.get_mode(),
            });
        }
        let left = left.and_then(|us| u64::try_from(us).ok());
        Ok(Attempt::Held {
            expires_in: left.map(Duration::from_micros),
        })
    }

    /// Ends a shared hold.
    async fn release_shared(&self, lease: &Lease) -> Result<()> {
        self.end_shared(lease, "").await
    }

    /// Ends a shared hold, giving the place it was granted from back to
    /// `waiter` (see [`SharedStatements::release_shared`]).
    async fn end_shared(&self, lease: &Lease, waiter: &str) -> Result<()> {
        let owner = lease.owner().to_string();
        let sql = self.statements().release_shared(
            lease.name().as_bytes(),
            &owner,
            waiter,
            micros_up(self.place()),
            self.wakes_others(),
        );
        if self.change(sql, lease.name(), "release").await? != 1 {
            return Err(Error::not_held(lease.name()));
        }
        Ok(())
    }

    /// `release_after` of a shared hold.
    async fn hold_shared(&self, lease: &Lease, hold: Duration) -> Result<()> {
        let (owner, hold_owner) = (lease.owner().to_string(), lease.owner().for_hold());
        let sql = self.statements().hold_shared(
            lease.name().as_bytes(),
            &owner,
            &hold_owner.to_string(),
            micros_up(hold).max(1),
        );
        if self.value(sql, "release_after").await? != Some(1) {
            return Err(Error::not_held(lease.name()));
        }
        Ok(())
    }

    /// [`Driver::downgrade`]: a read hold of unknown outcome is released,
    /// as an acquire's is.
    async fn downgrade_lease(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        let reader = OwnerToken::random()?;
        let sent = Instant::now();
        let sql = self.statements().downgrade(
            write.name().as_bytes(),
            &write.owner().to_string(),
            &reader.to_string(),
            micros_up(opts.get_ttl()),
            opts.get_holder(),
        );
        let mut undo = {
            let backend = self.clone();
            let lease = Lease::with_ttl(write.name(), reader, 0, opts, sent);
            UndoOnDrop::new(async move { backend.undo_downgrade(lease, sent).await })
        };
        let fence = self.value(sql, "downgrade").await;
        if !matches!(&fence, Err(e) if e.is_retryable()) {
            undo.disarm();
        }
        let fence = fence?.ok_or_else(|| Error::not_held(write.name()))?;
        let fence = self.token(fence, "downgrade")?;
        Ok(Lease::with_ttl(write.name(), reader, fence, opts, sent))
    }

    /// [`Driver::force_release`] of every kind: a mutex's holder by its
    /// token, a shared kind's holds all at once.
    async fn force_release_any(&self, name: &str) -> Result<Option<LockInfo>> {
        admin::force_release_with(
            self.driver(),
            name,
            || async { Ok(self.holders(name, 1).await?.pop()) },
            || async {
                let sql = self
                    .statements()
                    .clear_shared(name.as_bytes(), self.wakes_others());
                Ok(self.change(sql, name, "force_release").await? > 0)
            },
            |lease| async move { self.release(&lease).await },
        )
        .await
    }
}
