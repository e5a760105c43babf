//! The statements.
//!
//! Every statement goes as a simple query, its values as literals made of
//! hex digits and numbers alone: one round trip, and the driver works
//! through PgBouncer's transaction pooling as it does straight to the
//! server. Each statement runs under a `statement_timeout`: a statement
//! that waits on a row lock cannot go on, and grant, long after its
//! caller gave up. Its session has it (a startup option) where no pooler
//! lends the session to others; else it is set with `SET LOCAL` in the
//! same transaction, and a change of a shared kind that commits before it
//! reads whom to wake sets it again for the read.
//!
//! The statements of every call but the rare ones (batches, listing,
//! purging, the DDL) are prepared too: see [`Stmt`].

use std::fmt::Write;
use std::time::Duration;

mod admin;
mod ddl;
mod literal;
mod mutex;
mod shared;
mod stmt;
mod wake;

use literal::{Args, micros};
pub(crate) use literal::{bytes, unhex, validate_identifier};

pub(crate) use shared::SharedRenewal;
pub(crate) use stmt::Id;
pub use stmt::Stmt;

/// The database clock, never the client's, and never `now()`: that is
/// the start of the transaction, stale once a statement waited on a lock.
const NOW: &str = "clock_timestamp()";

/// The database clock in microseconds since the epoch: the floor of every
/// fencing token, so that a row deleted (by a purge, an operator, a
/// restored backup) and created again still gets a token above every
/// earlier one, as long as that clock does not step back.
pub(crate) const CLOCK_US: &str = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";

/// A setting of one transaction: how many rows its release matched (see
/// [`Statements::release_and_notify`], on a table without the count of
/// places).
const RELEASED: &str = "dlock.released";

/// How a prepared statement is planned (set for the connection's session,
/// or in each transaction of a statement that has a part prepared, its
/// parts written out included; see [`Statements::per_session`]):
/// once, for every call (a custom plan, made again on each call, took more
/// of the server's time than running the statement, and the server's
/// choice between the two flipped with the statistics of the moment), and
/// by the key of the name's rows, never a scan of the table: every
/// frequent statement reads one name's rows, and where one name is most of
/// a table (a crowd on one semaphore) its statistics make a scan look
/// cheaper to a plan made for any name; and by a plain index scan, never
/// a bitmap scan: only a plain index scan marks the index entries of rows
/// dead to everyone as dead, for later scans to pass by, so that under a
/// bitmap scan a crowd's name reads every hold and place it had since the
/// last vacuum (thousands of dead rows between two autovacuums; turning
/// bitmap scans off raised a semaphore of 4 among 16 clients from 0.16 to
/// 0.25 of its ceiling, the read-mostly lock from 1.6 to 2.2× its mutex).
/// PostgreSQL 12 or later: the builder prepares nothing on an older
/// server.
pub(crate) const PLANS: &str = "SET LOCAL plan_cache_mode = force_generic_plan; \
     SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; ";

/// What undoes [`PLANS`] for a statement with no part prepared, where the
/// session has them (see [`Statements::per_session`]).
const UNPLANNED: &str = "SET LOCAL enable_seqscan = on; SET LOCAL enable_bitmapscan = on; ";

/// The statements of one table.
#[derive(Debug)]
pub(crate) struct Statements {
    /// `"schema"."table"`: never at the mercy of a `search_path`.
    table: String,
    /// The table's own name, for its index.
    bare: String,
    /// The schema, for the index's full name.
    schema: String,
    /// `"schema"."table_holds"`: the holds and waiters of reader-writer
    /// locks and semaphores.
    holds: String,
    /// `dlock_<table>`: where releases are announced.
    channel: String,
    /// `SET LOCAL …;`, ahead of every statement: the statement timeout
    /// and the isolation (empty where the session has them).
    limit: String,
    /// Ahead of a statement with a part prepared, after `limit`:
    /// [`PLANS`] (empty where the session has them).
    plans: &'static str,
    /// Ahead of a statement with no part prepared, after `limit`:
    /// [`UNPLANNED`] where the session has [`PLANS`].
    unplanned: &'static str,
    /// Whether a statement of one prepared part goes with its values bound
    /// (see `Stmt::bound`): where the session has every setting.
    bind: bool,
    /// Whether the lock table counts the places written in its rows (see
    /// [`Statements::counting_places`]).
    places: bool,
    /// How long a waiter's tombstone stays (see [`Statements::tombstone`]):
    /// well past any look still on its way.
    tomb: Duration,
    /// Whether statements are prepared (see [`Stmt`]).
    prepare: bool,
    /// The statement timeout.
    timeout_ms: u64,
}

/// One lease of a batch renewal.
pub(crate) struct Renewal<'a> {
    pub name: &'a [u8],
    pub owner: &'a str,
    pub ttl_us: u64,
}

impl Statements {
    /// `schema` and `table` must have passed [`validate_identifier`];
    /// statements are cut off by the server after `limit`.
    /// With `prepare`, the statements of every frequent call are
    /// prepared.
    pub fn new(schema: &str, table: &str, limit: Duration, prepare: bool) -> Self {
        let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX).max(1);
        Statements {
            table: format!("\"{schema}\".\"{table}\""),
            holds: format!("\"{schema}\".\"{table}_holds\""),
            bare: table.to_owned(),
            schema: schema.to_owned(),
            channel: format!("dlock_{table}"),
            tomb: (limit * 8).max(Duration::from_secs(60)),
            prepare,
            timeout_ms: ms,
            // Read committed, whatever the role's default: a waiter that
            // finds the row changed under it must see the row as it is now
            // (held), not fail with a serialization error.
            limit: format!(
                "SET LOCAL transaction_isolation = 'read committed'; \
                 SET LOCAL statement_timeout = {ms}; "
            ),
            plans: PLANS,
            unplanned: "",
            bind: false,
            places: false,
        }
    }

    /// The statements for a lock table that counts, in each row, the
    /// waiters' places written under that row's lock (its `places`
    /// column, which tables made by older releases get from `migrate`):
    /// a mutex's release with wake-ups is then one statement (see
    /// [`Statements::release_and_notify`]).
    pub fn counting_places(mut self, places: bool) -> Self {
        self.places = places;
        self
    }

    /// Whether the lock table counts places ([`Statements::counting_places`]).
    pub fn counts_places(&self) -> bool {
        self.places
    }

    /// The settings of [`Statements::per_session`], as a connection's
    /// startup options (`-c name=value`).
    pub fn session_settings(&self) -> Vec<(&'static str, String)> {
        let mut settings = vec![
            ("statement_timeout", self.timeout_ms.to_string()),
            ("default_transaction_isolation", "read committed".to_owned()),
        ];
        if self.prepare {
            settings.push(("plan_cache_mode", "force_generic_plan".to_owned()));
            settings.push(("enable_seqscan", "off".to_owned()));
            settings.push(("enable_bitmapscan", "off".to_owned()));
        }
        settings
    }

    /// A statement answering whether its session has every setting of
    /// [`Statements::session_settings`] from its startup options (`source`
    /// `client`): a pooler may drop them without a word, or apply them with
    /// `SET` to a server session it lends to others (Odyssey), and a
    /// setting equal by chance (the server's default, a role's) says
    /// nothing. A setting the server lacks counts as missing.
    pub fn has_session_settings(&self) -> String {
        let settings = self.session_settings();
        let wanted: Vec<String> = settings
            .iter()
            .map(|(name, value)| format!("('{name}', '{value}')"))
            .collect();
        format!(
            "SELECT count(*) = {} FROM pg_settings WHERE source = 'client' \
             AND (name, setting) IN ({})",
            settings.len(),
            wanted.join(", ")
        )
    }

    /// The statements for connections opened with
    /// [`Statements::session_settings`]: no `SET LOCAL` of the timeout,
    /// the isolation or [`PLANS`] (five statements, and their replies, in
    /// every call: 15 % of the server's throughput in uncontended cycles).
    /// Only where no pooler lends a server session to other clients: the
    /// settings are the session's. A statement with no part prepared,
    /// which plans as the server chooses, lifts the bans on scans again.
    pub fn per_session(mut self) -> Self {
        self.limit = String::new();
        self.plans = "";
        if self.prepare {
            self.unplanned = UNPLANNED;
            self.bind = true;
        }
        self
    }

    /// What a statement's transaction after its commit sets first:
    /// `limit`, and [`PLANS`] where statements are prepared (see
    /// `Stmt`'s own, set before its first transaction).
    fn limit_again(&self) -> String {
        if self.prepare {
            format!("{}{}", self.limit, self.plans)
        } else {
            self.limit.clone()
        }
    }

    /// Gives a mutex waiter's place up: leaves its tombstone (see
    /// [`Statements::tombstone`]).
    pub fn leave(&self, name: &[u8], waiter: &str) -> Stmt {
        let mut a = Args::default();
        let tombstone = self.tombstone(&a.bytes(name), &a.token(waiter));
        self.prepared(a, format!("WITH d AS ({tombstone}) SELECT count(*) FROM d"))
    }

    /// Which rows of others an acquire sweeps away as it goes: ended over
    /// a minute ago, tombstones only once no look can revive them.
    pub fn swept(&self) -> String {
        let tomb = micros(u64::try_from(self.tomb.as_micros()).unwrap_or(u64::MAX));
        format!(
            "expires_at < {NOW} - interval '1 minute' AND (since >= 0 OR expires_at < {NOW} - {tomb})"
        )
    }

    /// Ends `waiter`'s place (`n` and `waiter`: values as the statement
    /// has them) for good, returning a row `(inserted)` when
    /// it made one: the place's row stays, as a tombstone (expired, `since`
    /// -1) that no later look of that waiter revives. A look still on its
    /// way when the waiter gave up (its future dropped mid-statement) would
    /// otherwise put the place back after its removal, and keep the queue
    /// behind a waiter that left until the place lapsed. Tombstones go with
    /// the other ended rows.
    pub fn tombstone(&self, n: &str, waiter: &str) -> String {
        format!(
            "INSERT INTO {q} AS x (name, owner, mode, kind, fence, expires_at, waiting, since)
             VALUES ({n}, {waiter}, 'x', 'x', 0, {NOW}, true, -1)
             ON CONFLICT (name, owner) DO UPDATE SET expires_at = {NOW}, since = -1
             WHERE x.waiting RETURNING (xmax = 0) AS inserted",
            q = self.holds
        )
    }

    /// Moves the expiry of the row `owner` holds to `ttl_us` from now.
    pub fn extend(&self, name: &[u8], owner: &str, ttl_us: u64) -> Stmt {
        let mut a = Args::default();
        let (t, n, o, ttl) = (&self.table, a.bytes(name), a.token(owner), a.micros(ttl_us));
        self.prepared(
            a,
            format!(
                "UPDATE {t} SET expires_at = {NOW} + {ttl}
             WHERE name = {n} AND owner = {o} AND expires_at > {NOW}"
            ),
        )
    }

    /// A delayed release: the row gets the hold's owner, so that the
    /// released lease can no longer touch it, and expires on the database
    /// clock.
    pub fn hold(&self, name: &[u8], owner: &str, hold_owner: &str, hold_us: u64) -> Stmt {
        let mut a = Args::default();
        let (t, n, o) = (&self.table, a.bytes(name), a.token(owner));
        let (ho, hold) = (a.token(hold_owner), a.micros(hold_us));
        self.prepared(
            a,
            format!(
                "UPDATE {t} SET owner = {ho}, expires_at = {NOW} + {hold}
             WHERE name = {n} AND owner = {o} AND expires_at > {NOW}"
            ),
        )
    }

    /// Extends every lease of the batch whose row it still owns, in one
    /// statement, and returns those rows' names and owners.
    pub fn extend_many(&self, batch: &[Renewal<'_>]) -> Stmt {
        let mut values = String::new();
        for (i, lease) in batch.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(
                values,
                "{sep}({}, '{}', {}::bigint)",
                bytes(lease.name),
                lease.owner,
                lease.ttl_us
            );
        }
        let t = &self.table;
        self.bounded(format!(
            "UPDATE {t} AS l SET expires_at = {NOW} + v.ttl * interval '1 microsecond'
             FROM (VALUES {values}) AS v(name, owner, ttl)
             WHERE l.name = v.name AND l.owner = v.owner AND l.expires_at > {NOW}
             RETURNING encode(l.name, 'hex'), l.owner"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_hex_literals() {
        assert_eq!(bytes(b"a'b"), "decode('612762', 'hex')");
        assert_eq!(bytes(b""), "decode('', 'hex')");
        let sql = Statements::new("public", "t", Duration::from_millis(1500), false)
            .release(b"x", "00ff")
            .written_out();
        assert!(
            sql.as_str()
                .contains("SET LOCAL statement_timeout = 1500; ")
        );
        assert!(
            sql.as_str().contains("UPDATE \"public\".\"t\" SET"),
            "{}",
            sql.as_str()
        );
        assert!(
            sql.as_str().contains("name = decode('78', 'hex')"),
            "{}",
            sql.as_str()
        );
    }
}
