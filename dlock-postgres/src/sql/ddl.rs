//! The lock table's DDL: creating it (only what is missing, without
//! locking a table in use), and upgrading an older release's.

use super::literal::text;
use super::{Statements, Stmt};

impl Statements {
    /// Creates the tables and their expiry index, if missing: the locks,
    /// and the holds and waiters of reader-writer locks and semaphores.
    pub fn create(&self) -> String {
        let (t, h, index) = (&self.table, &self.holds, self.index());
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                name bytea PRIMARY KEY,
                owner text NOT NULL,
                fence bigint NOT NULL,
                expires_at timestamptz NOT NULL,
                acquired_at timestamptz NOT NULL,
                holder text NOT NULL
            );
            {index}
            CREATE TABLE IF NOT EXISTS {h} (
                name bytea NOT NULL,
                owner text NOT NULL,
                mode text NOT NULL,
                kind text NOT NULL,
                fence bigint NOT NULL,
                expires_at timestamptz NOT NULL,
                waiting boolean NOT NULL,
                since bigint NOT NULL,
                holder text NOT NULL DEFAULT '',
                PRIMARY KEY (name, owner)
            );"
        )
    }

    /// Gives tables made by older releases this one's layout: the holds
    /// table's holder column. Only `migrate` runs it: adding a column
    /// locks the table for a moment, and needs its owner's rights, which an
    /// application's role may lack.
    pub fn upgrade(&self) -> String {
        let h = &self.holds;
        format!(
            "DO $$ BEGIN
              IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{h}'::regclass
                             AND attname = 'holder' AND NOT attisdropped) THEN
                ALTER TABLE {h} ADD COLUMN holder text NOT NULL DEFAULT '';
              END IF;
            END $$;"
        )
    }

    /// [`Statements::create`], ready to run. `IF NOT EXISTS` is no guard
    /// against a concurrent creator (the loser fails on a catalog index),
    /// so creators take turns on a transaction-scoped advisory lock,
    /// which PgBouncer's transaction pooling keeps on one connection.
    /// With `upgrade`, [`Statements::upgrade`] too.
    pub fn create_sql(&self, upgrade: bool) -> Stmt {
        let upgrade = if upgrade {
            self.upgrade()
        } else {
            String::new()
        };
        self.bounded(format!(
            "SELECT pg_advisory_xact_lock(hashtext({})); {} {upgrade}",
            text(&format!("dlock create {}", self.table)),
            self.create_if_missing()
        ))
    }

    /// [`Statements::create`], with the index created only when the
    /// catalog lacks it: `CREATE INDEX IF NOT EXISTS` takes its SHARE lock
    /// on the table before it looks for the index, so on a table in use it
    /// waits for every write in flight, and every write after it waits for
    /// it: each client's start stalled the lock table for every other.
    fn create_if_missing(&self) -> String {
        let index = format!("\"{}\".\"{}_expires_at\"", self.schema, self.bare);
        let plain = self.index();
        self.create().replace(
            &plain,
            &format!(
                "DO $$ BEGIN IF to_regclass({}) IS NULL THEN {plain} END IF; END $$;",
                text(&index)
            ),
        )
    }

    /// The expiry index's statement, as [`Statements::create`] has it.
    fn index(&self) -> String {
        format!(
            "CREATE INDEX IF NOT EXISTS \"{}_expires_at\" ON {} (expires_at);",
            self.bare, self.table
        )
    }

    /// Reads nothing, but fails when a table is missing or not ours.
    pub fn exists(&self) -> Stmt {
        self.bounded(format!(
            "SELECT 1 FROM {} LIMIT 0; SELECT 1 FROM {} LIMIT 0",
            self.table, self.holds
        ))
    }
}
