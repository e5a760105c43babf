//! The lock table's DDL: creating it, and upgrading an older release's.
//!
//! The tables have no index but their primary keys, and half of each page
//! is left free: a renewal (or a mutex's acquire, its release) then
//! changes no indexed column and finds room on its row's page, so
//! PostgreSQL updates the row in place (a HOT update), and the old versions
//! are cleared from the page as it is next read, once no snapshot may see
//! them. An index on the expiry made every renewal a new row version with
//! new index entries: at 100,000 held leases the table grew to ~2 KB a
//! lease between vacuums. The purge reads the table a slice at a time
//! instead (see [`Statements::purge`]).

use super::literal::text;
use super::{Statements, Stmt};

/// The share of each page that inserts fill (%): the rest is room for the
/// new versions of its rows.
const FILL: u8 = 50;

impl Statements {
    /// Creates the tables, if missing: the locks, and the holds and
    /// waiters of reader-writer locks and semaphores.
    pub fn create(&self) -> String {
        let (t, h) = (&self.table, &self.holds);
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                name bytea PRIMARY KEY,
                owner text NOT NULL,
                fence bigint NOT NULL,
                expires_at timestamptz NOT NULL,
                acquired_at timestamptz NOT NULL,
                holder text NOT NULL,
                places bigint NOT NULL DEFAULT 0
            ) WITH (fillfactor = {FILL});
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
            ) WITH (fillfactor = {FILL});"
        )
    }

    /// Gives tables made by older releases this one's layout: the holds
    /// table's holder column, the lock table's count of places (see
    /// [`Statements::counting_places`]), no expiry index, pages left half free (for
    /// the pages written from then on). Only `migrate` runs it: adding a
    /// column or dropping an index locks the table for a moment, and needs
    /// its owner's rights, which an application's role may lack. Each
    /// change is made only when missing, so on tables of this release it
    /// changes nothing and locks nothing.
    pub fn upgrade(&self) -> String {
        let (t, h) = (&self.table, &self.holds);
        let index = format!("\"{}\".\"{}_expires_at\"", self.schema, self.bare);
        let unfilled = |table: &str| {
            format!(
                "NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = '{table}'::regclass
                   AND reloptions @> ARRAY['fillfactor={FILL}'])"
            )
        };
        let (t_unfilled, h_unfilled) = (unfilled(t), unfilled(h));
        format!(
            "DO $$ BEGIN
              IF to_regclass({index_name}) IS NOT NULL THEN
                DROP INDEX {index};
              END IF;
              IF {t_unfilled} THEN
                ALTER TABLE {t} SET (fillfactor = {FILL});
              END IF;
              IF {h_unfilled} THEN
                ALTER TABLE {h} SET (fillfactor = {FILL});
              END IF;
              IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{h}'::regclass
                             AND attname = 'holder' AND NOT attisdropped) THEN
                ALTER TABLE {h} ADD COLUMN holder text NOT NULL DEFAULT '';
              END IF;
              IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{t}'::regclass
                             AND attname = 'places' AND NOT attisdropped) THEN
                ALTER TABLE {t} ADD COLUMN places bigint NOT NULL DEFAULT 0;
              END IF;
            END $$;",
            index_name = text(&index)
        )
    }

    /// [`Statements::create`], ready to run. `IF NOT EXISTS` is no guard
    /// against a concurrent creator (the loser fails on a catalog index),
    /// so creators take turns on a transaction-scoped advisory lock,
    /// which PgBouncer's transaction pooling keeps on one connection.
    /// With `upgrade`, [`Statements::upgrade`] too, waiting at most three
    /// quarters of the statement timeout for a table's lock: a change that
    /// waits for the table's lock holds up every statement on the table
    /// queued behind it, until it has it and is done; and an autovacuum in
    /// its way is cancelled only after `deadlock_timeout` (1 s by default).
    pub fn create_sql(&self, upgrade: bool) -> Stmt {
        let upgrade = if upgrade {
            let wait = (self.timeout_ms / 4 * 3).max(1);
            format!("SET LOCAL lock_timeout = {wait}; {}", self.upgrade())
        } else {
            String::new()
        };
        self.bounded(format!(
            "SELECT pg_advisory_xact_lock(hashtext({})); {} {upgrade}",
            text(&format!("dlock create {}", self.table)),
            self.create()
        ))
    }

    /// Whether the lock table has the count of places (made by this
    /// release, or given it by `migrate`).
    pub fn has_places(&self) -> String {
        format!(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass({})
               AND attname = 'places' AND NOT attisdropped)",
            text(&self.table)
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
