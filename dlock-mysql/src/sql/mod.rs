//! The statements, written once per table name.

use std::sync::atomic::AtomicBool;

use dlock_core::{Error, MAX_HOLDERS, Result};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

mod call;
mod queue;
mod shared;

/// The database's clock decides expiry, never the client's. UTC so that
/// the session time zone cannot shift it.
const NOW: &str = "UTC_TIMESTAMP(6)";

/// The fencing token never falls below the database clock in microseconds,
/// so a row deleted (by a purge, an operator, a restored backup) and
/// created again still gets a token above every earlier one, as long as
/// that clock does not step back. Counted from the epoch in UTC, so that
/// no session time zone (nor its daylight saving) can move it.
const CLOCK: &str =
    "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) AS UNSIGNED)";

/// What the mutex's acquire reports for a name held as a reader-writer
/// lock or a semaphore: no grant's token is ever this small.
pub(crate) const HELD_AS_ANOTHER_KIND: u64 = 1;

/// The longest table name: the holds table, `<table>_holds`, must fit
/// MySQL's 64-character identifiers.
const MAX_TABLE: usize = 58;

/// The named lock (at most 64 characters) that a registered waiter holds;
/// `name` is an SQL expression for the bytes of the lock's name and the
/// waiter's token. Named
/// locks are global to the server: the database is part of the key.
pub(super) fn wait_key(table: &str, name: &str) -> String {
    format!("CONCAT('dlock-w:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.{table}:', {name})))")
}

/// A table name that is safe to splice into SQL: a plain identifier.
pub(crate) fn validate_table(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let ok = name.len() <= MAX_TABLE
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_option(
            "table",
            format!(
                "must be 1 to {MAX_TABLE} ASCII letters, digits, `_` or `$`, not starting with a digit; got {name:?}"
            ),
        ))
    }
}

/// Every statement the driver runs, for one table.
#[derive(Debug)]
pub(crate) struct Statements {
    pub create: SqlStr,
    pub exists: SqlStr,
    /// The plain acquire of a client with wake-ups: refused while a
    /// waiter queues.
    pub acquire: SqlStr,
    /// The plain acquire of a client without wake-ups.
    pub acquire_unqueued: SqlStr,
    pub release: SqlStr,
    pub extend: SqlStr,
    pub hold: SqlStr,
    pub purge_candidates: SqlStr,
    pub list: SqlStr,
    pub inspect: SqlStr,
    pub holders: SqlStr,
    pub register: SqlStr,
    pub unregister: SqlStr,
    pub sleep: SqlStr,
    pub anchor: SqlStr,
    /// The connection that holds the anchor, as a pool's connection sees it.
    pub anchor_holder: SqlStr,
    /// The owner column of a name: a marker for the shared kinds.
    pub kind: SqlStr,
    /// The lock table's name.
    pub table: String,
    /// A shared kind's acquire calls the table's procedure (see
    /// `call.rs`): `connect` found it there, and no call has found it gone.
    pub call: AtomicBool,
}

/// The leases of one batch renewal, as SQL literals: a batch has no fixed
/// shape, so its statements are written out (text protocol, one round trip,
/// no prepared statement per batch size) from hex and digits alone.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    names: String,
    owned: String,
    len: usize,
}

impl Batch {
    /// Adds a lease: its name and the row's `CONCAT(owner, name)` when the
    /// lease still owns it (the owner is 32 characters, so the pair is
    /// unambiguous).
    pub fn push(&mut self, name: &[u8], owner: &str) {
        use std::fmt::Write;
        let sep = if self.names.is_empty() { "" } else { ", " };
        let _ = write!(self.names, "{sep}X'{}'", hex(name));
        let _ = write!(self.owned, "{sep}X'{}{}'", hex(owner.as_bytes()), hex(name));
        self.len += 1;
    }

    /// How many leases it holds.
    pub fn len(&self) -> usize {
        self.len
    }
}

use hex::encode as hex;

/// The owner, the holder description and the kind of hold (mode code,
/// then the name's marker): three columns, the last two as bytes, that
/// `list` and `inspect` show for the row `l`. A name held as a
/// reader-writer lock or a semaphore shows its longest hold's.
fn shown_owner(table: &str) -> String {
    let longest = |column: &str| {
        format!(
            "(SELECT h.{column} FROM `{table}_holds` AS h
              WHERE h.name = l.name AND NOT h.waiting AND h.expires_at > {NOW}
              ORDER BY h.expires_at DESC LIMIT 1)"
        )
    };
    format!(
        "IF(l.owner LIKE '~%', COALESCE({}, l.owner), l.owner),
         CAST(IF(l.owner LIKE '~%', {}, l.holder) AS BINARY),
         CAST(IF(l.owner LIKE '~%', CONCAT({}, l.owner), 'x') AS BINARY)",
        longest("owner"),
        longest("holder"),
        longest("mode")
    )
}

/// The mutex's acquire of the row `name` for `owner`, with a lease of
/// `ttl` µs and the description `holder` (SQL for each value, used in that
/// order: `?` for a prepared statement), when nobody counts ahead in its
/// queue: no place of the holds matches `ahead` (a condition on them).
///
/// One statement, race-free: the row lock taken by the insert or the
/// duplicate-key update orders concurrent acquirers. The update only fires
/// on an expired or released row. The statement reports its outcome
/// through LAST_INSERT_ID(expr), whose last value lands in the OK packet:
/// the clock for a new row, the greater of version + 1 and the clock for a
/// takeover, 0 when the lock is held, and [`HELD_AS_ANOTHER_KIND`] when it
/// is held as a reader-writer lock or a semaphore (its owner a marker).
/// The held branch must set 0 itself, because the VALUES row (and its
/// LAST_INSERT_ID(clock)) is evaluated before the duplicate key is found.
/// MySQL applies the assignments left to right: the first decides, and
/// the others test whether the row now has this acquire's owner (a fresh
/// random token: granted). Values are written twice instead of using
/// VALUES() (deprecated in MySQL 8) or `AS new` (not in MariaDB).
fn acquire(table: &str, [name, owner, ttl, holder]: [&str; 4], ahead: &str) -> String {
    format!(
        "INSERT INTO `{table}` (name, owner, version, expires_at, acquired_at, holder)
         VALUES ({name}, {owner}, LAST_INSERT_ID({CLOCK}), {NOW} + INTERVAL {ttl} MICROSECOND, {NOW}, {holder})
         ON DUPLICATE KEY UPDATE
           owner = IF(expires_at <= {NOW} AND NOT EXISTS (SELECT 1 FROM `{table}_holds` AS q
             WHERE {ahead}), {owner}, owner),
           version = IF(owner = {owner}, LAST_INSERT_ID(GREATEST(version + 1, {CLOCK})), version + LAST_INSERT_ID(owner LIKE '~%') * 0),
           acquired_at = IF(owner = {owner}, {NOW}, acquired_at),
           holder = IF(owner = {owner}, {holder}, holder),
           expires_at = IF(owner = {owner}, {NOW} + INTERVAL {ttl} MICROSECOND, expires_at)"
    )
}

/// `table` has passed [`validate_table`]: a plain identifier, quoted.
fn safe(sql: String) -> SqlStr {
    AssertSqlSafe(sql).into_sql_str()
}

impl Statements {
    /// `table` must have passed [`validate_table`].
    pub fn new(table: &str) -> Self {
        Statements {
            table: table.to_owned(),
            call: AtomicBool::new(false),
            // `name` is VARBINARY: compared byte for byte. A `utf8mb4_bin`
            // VARCHAR would be PAD SPACE, making `a` and `a ` one lock.
            create: safe(format!(
                "CREATE TABLE IF NOT EXISTS `{table}` (
                    name VARBINARY(255) NOT NULL PRIMARY KEY,
                    owner CHAR(32) CHARACTER SET ascii NOT NULL,
                    version BIGINT UNSIGNED NOT NULL,
                    expires_at DATETIME(6) NOT NULL,
                    acquired_at DATETIME(6) NOT NULL,
                    holder VARBINARY(255) NOT NULL DEFAULT '',
                    KEY expires_at (expires_at)
                ) ENGINE=InnoDB"
            )),
            exists: safe(format!("SELECT 1 FROM `{table}` LIMIT 0")),
            acquire: safe(acquire(table, ["?"; 4], &format!("name = ? AND {}", shared::queued(table)))),
            // A client without wake-ups does not queue, nor wait for those
            // who do: it looks as it always did (the impossible condition
            // keeps the parameters of `acquire`, and reads nothing).
            acquire_unqueued: safe(acquire(table, ["?"; 4], "name = ? AND FALSE")),
            // The row stays, so the version keeps counting up. The reply's
            // LAST_INSERT_ID is the connection the first waiter in the
            // name's queue sleeps on (0: none, or not asleep), which the
            // releaser then wakes: only that one, the one the lock goes
            // to. `* 0` rather than a test of the value: an optimizer may
            // drop an expression whose result cannot matter (`IS NULL` of
            // a non-null argument), and the side effect with it.
            release: safe(format!(
                "UPDATE `{table}` AS l SET owner = '', expires_at = {NOW},
                   version = version + LAST_INSERT_ID(COALESCE(IS_USED_LOCK({wait_key}), 0)) * 0
                 WHERE name = ? AND owner = ? AND expires_at > {NOW}",
                wait_key = wait_key(
                    table,
                    &format!("CONCAT(l.name, X'00', {})", shared::head(table, "l.name"))
                )
            )),
            extend: safe(format!(
                "UPDATE `{table}` SET expires_at = {NOW} + INTERVAL ? MICROSECOND
                 WHERE name = ? AND owner = ? AND expires_at > {NOW}"
            )),
            // A delayed release: the row gets the hold's owner, so that
            // the released lease can no longer touch it.
            hold: safe(format!(
                "UPDATE `{table}` SET owner = ?, expires_at = {NOW} + INTERVAL ? MICROSECOND
                 WHERE name = ? AND owner = ? AND expires_at > {NOW}"
            )),
            // Only rows whose lease ended long ago; a later acquire of the
            // name starts from the clock, above every token of the row. The
            // names are read first (a plain read takes no locks), then
            // deleted by primary key (see `Statements::purge`).
            purge_candidates: safe(format!(
                "SELECT name FROM `{table}` WHERE expires_at < {NOW} - INTERVAL ? MICROSECOND LIMIT ?"
            )),
            // A range of the primary key: from the cursor, within the
            // prefix (`!` escapes LIKE's wildcards). A released row has no
            // owner: `{NOW}` is the statement's start, and a release that
            // commits after it, before the row is read, leaves an
            // `expires_at` (its own start) later than that.
            list: safe(format!(
                "SELECT name, {owner}, version, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)
                 FROM `{table}` AS l
                 WHERE name > ? AND name LIKE ? ESCAPE '!' AND expires_at > {NOW} AND owner <> ''
                 ORDER BY name LIMIT ?",
                owner = shown_owner(table)
            )),
            // A waiter with wake-ups on registers under its own key (the
            // name and its token): a named lock on a connection of its own,
            // where it sleeps until a change may let it in, or the holder's
            // lease ends. The change kills the sleep. The sleep reads the
            // state itself: one the rule lets in now does not sleep (a
            // change between its last look and this sleep killed nothing);
            // a free name that does not let it in (a waiter queued ahead
            // is about to go in) gives it a short nap (the last `?`), not
            // a sleep until woken.
            //
            // It sleeps by waiting for the backend's anchor, a named lock its
            // anchor connection holds for good, not with SLEEP(): MariaDB's
            // SLEEP() and KILL take two mutexes in opposite orders, and a kill
            // that loses that race spins for 2 s (a release stalled, the sleep
            // ran on past its end). A lock wait is cut short without it.
            register: safe(format!("SELECT GET_LOCK({}, 0)", wait_key(table, "?"))),
            unregister: safe(format!("SELECT RELEASE_LOCK({})", wait_key(table, "?"))),
            sleep: safe(format!(
                "SELECT GET_LOCK(?, COALESCE((SELECT 0 FROM {admitted} AND q.owner = ?),
                   (SELECT LEAST(GREATEST(TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at), 0) / 1000000 + 0.002, ?)
                    FROM `{table}` WHERE name = ? AND expires_at > {NOW}), ?))",
                admitted = shared::admitted(table, "?")
            )),
            // MySQL rounds GET_LOCK's timeout to whole seconds; MariaDB
            // waits for fractions of one, which the sleep needs.
            anchor: safe(
                "SELECT GET_LOCK(?, 0), VERSION() LIKE '%MariaDB%',
                 CAST(CONNECTION_ID() AS SIGNED)".to_owned(),
            ),
            anchor_holder: safe("SELECT CAST(IS_USED_LOCK(?) AS SIGNED)".to_owned()),
            inspect: safe(format!(
                "SELECT {owner}, version, TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)
                 FROM `{table}` AS l WHERE name = ? AND expires_at > {NOW} AND owner <> ''",
                owner = shown_owner(table)
            )),
            // A mutex's holder, or each hold of a shared kind (its row's
            // mode code then the name's marker): the rows `inspect` reads.
            holders: safe(format!(
                "SELECT owner, CAST(holder AS BINARY), CAST('x' AS BINARY), version,
                        TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at) AS left_us
                 FROM `{table}`
                 WHERE name = ? AND owner NOT LIKE '~%' AND owner <> '' AND expires_at > {NOW}
                 UNION ALL
                 SELECT owner, holder, CAST(CONCAT(mode, kind) AS BINARY), fence,
                        TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at)
                 FROM `{table}_holds` WHERE name = ? AND NOT waiting AND expires_at > {NOW}
                 ORDER BY left_us DESC LIMIT {MAX_HOLDERS}"
            )),
            kind: safe(format!("SELECT owner FROM `{table}` WHERE name = ?")),
        }
    }
}

impl Statements {
    /// Extends the rows of the batch its leases still own, by `ttl_us`.
    /// `name IN (…)` keeps the update to those primary keys: it locks no
    /// other row.
    pub fn extend_many(&self, batch: &Batch, ttl_us: u64) -> SqlStr {
        safe(format!(
            "UPDATE `{}` SET expires_at = UTC_TIMESTAMP(6) + INTERVAL {ttl_us} MICROSECOND
             WHERE name IN ({}) AND CONCAT(owner, name) IN ({}) AND expires_at > UTC_TIMESTAMP(6)",
            self.table, batch.names, batch.owned
        ))
    }

    /// Deletes the rows of `names` still expired for over `age_us`: point
    /// lookups of the primary key, the condition checked again. A `DELETE
    /// … WHERE expires_at …` would lock every row it scans, held ones too.
    pub fn purge(&self, names: &[Vec<u8>], age_us: u64) -> SqlStr {
        use std::fmt::Write;
        let mut list = String::new();
        for (i, name) in names.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(list, "{sep}X'{}'", hex(name));
        }
        safe(format!(
            "DELETE FROM `{}` WHERE name IN ({list})
             AND expires_at < UTC_TIMESTAMP(6) - INTERVAL {age_us} MICROSECOND",
            self.table
        ))
    }

    /// `CONCAT(owner, name)` of the rows the batch's leases still own: after
    /// [`Statements::extend_many`] matched fewer rows than the batch has,
    /// these are the ones it extended.
    pub fn owned_of(&self, batch: &Batch) -> SqlStr {
        safe(format!(
            "SELECT CONCAT(owner, name) FROM `{}`
             WHERE name IN ({}) AND CONCAT(owner, name) IN ({}) AND expires_at > UTC_TIMESTAMP(6)",
            self.table, batch.names, batch.owned
        ))
    }

    /// What creates the lock table and its holds table, for an
    /// administrator to run.
    pub fn ddl(&self) -> String {
        format!(
            "{};\n{};",
            self.create.as_str(),
            self.create_holds().as_str()
        )
    }

    /// The holds table, made if missing.
    pub fn create_holds(&self) -> SqlStr {
        safe(format!(
            "CREATE TABLE IF NOT EXISTS {} (
                name VARBINARY(255) NOT NULL,
                owner CHAR(32) CHARACTER SET ascii NOT NULL,
                mode CHAR(1) CHARACTER SET ascii NOT NULL,
                kind VARCHAR(16) CHARACTER SET ascii NOT NULL,
                fence BIGINT UNSIGNED NOT NULL,
                expires_at DATETIME(6) NOT NULL,
                waiting BOOLEAN NOT NULL,
                since BIGINT UNSIGNED NOT NULL,
                holder VARBINARY(255) NOT NULL DEFAULT '',
                PRIMARY KEY (name, owner)
            ) ENGINE=InnoDB",
            self.holds()
        ))
    }

    /// The type of the `holder` column of each of the two tables that has
    /// one: tables made by older releases have a `VARCHAR` in the lock
    /// table (whose character set may not hold every description) and
    /// none in the holds table.
    pub fn holder_columns(&self) -> SqlStr {
        safe(format!(
            "SELECT CAST(table_name AS BINARY), CAST(data_type AS BINARY)
             FROM information_schema.columns
             WHERE table_schema = DATABASE() AND column_name = 'holder'
               AND table_name IN ('{t}', '{t}_holds')",
            t = self.table
        ))
    }

    /// Brings the `holder` columns of older tables to this release's:
    /// bytes, in both tables.
    pub fn upgrade_holder(&self, in_holds: bool) -> SqlStr {
        let (table, change) = if in_holds {
            (self.holds(), "ADD COLUMN")
        } else {
            (format!("`{}`", self.table), "MODIFY COLUMN")
        };
        safe(format!(
            "ALTER TABLE {table} {change} holder VARBINARY(255) NOT NULL DEFAULT ''"
        ))
    }

    /// Reads nothing, but fails when the holds table is missing.
    pub fn holds_exist(&self) -> SqlStr {
        safe(format!("SELECT 1 FROM {} LIMIT 0", self.holds()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_written_in_hex() {
        let mut batch = Batch::default();
        batch.push(b"a'b", "00ff");
        batch.push(b"", "01");
        let sql = Statements::new("t").extend_many(&batch, 5);
        let sql = sql.as_str();
        assert!(sql.contains("name IN (X'612762', X'')"), "{sql}");
        assert!(sql.contains("IN (X'30306666612762', X'3031')"), "{sql}");
        assert!(sql.contains("INTERVAL 5 MICROSECOND"), "{sql}");
    }

    #[test]
    fn table_names_are_identifiers() {
        for ok in ["dlock_locks", "_t", "Locks$2", &"x".repeat(58)] {
            assert!(validate_table(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "a-b",
            "a`b",
            "a b",
            "t; DROP TABLE x",
            "schema.t",
            &"x".repeat(59),
        ] {
            assert!(validate_table(bad).is_err(), "{bad}");
        }
    }
}
