//! The session mode's statements (how a holding session names its hold is
//! in `mark.rs`).
//!
//! The connections are dedicated, so the statements are prepared (sqlx's
//! cache, per connection). Each one that locks or unlocks names the
//! server session it is for (`$1`, its pid): one that reaches another
//! session (a pooler in transaction mode) changes nothing there.

use dlock_core::Mode;
use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::marker::{conflicts, marker, marker_key};
use crate::sql::CLOCK_US;

/// A statement's text, shared: sqlx's statement cache finds it by its
/// text, and a clone copies nothing.
fn sql(text: String) -> SqlStr {
    AssertSqlSafe(text).into_sql_str()
}

/// A name's advisory-lock key: 64 bits of a hash of it, the same for
/// every kind of hold, so that one name is one lock. Two names of the same
/// key contend for one lock (a false conflict, never a false grant).
pub(crate) fn key(name: &str) -> i64 {
    let hash = Sha256::digest(name.as_bytes());
    let mut first = [0; 8];
    first.copy_from_slice(&hash[..8]);
    i64::from_be_bytes(first)
}

/// The statements, for one table of holders.
#[derive(Debug)]
pub(crate) struct SessionSql {
    sessions: String,
    /// The grants: `[holder kept, holder written]` × `[exclusive,
    /// shared]` × `[try, wait]`.
    grants: [[[SqlStr; 2]; 2]; 2],
    kinds: SqlStr,
    downgrade: SqlStr,
    /// `[alone, beside another hold]` × `[exclusive, shared]`.
    releases: [[SqlStr; 2]; 2],
    holders: SqlStr,
    list: SqlStr,
    terminate: SqlStr,
    undo: SqlStr,
}

/// `pg_locks` (aliased `l`) of the granted holds of the key `key` in this
/// database, with their sessions' activity (`a`) and row (`s`, joined by
/// `join`: a `LEFT JOIN` keeps a hold whose session has no row). A bigint
/// key is kept split: its high half as `classid`, its low half as
/// `objid`, with `objsubid` 1.
fn holds_of(key: &str, sessions: &str, join: &str) -> String {
    format!(
        "pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
         {join} {sessions} s ON s.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted \
         AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database()) \
         AND l.classid = (({key} >> 32) & 4294967295)::oid \
         AND l.objid = ({key} & 4294967295)::oid AND l.objsubid = 1"
    )
}

impl SessionSql {
    pub(crate) fn new(schema: &str, table: &str) -> Self {
        let sessions = format!("{schema}.{table}_sessions");
        // Every grant takes `$1` the session's pid, `$2` the key, `$3` the
        // mark's start, `$4` a wait's `lock_timeout` (ms, text; 0: none),
        // which it sets before it queues (the server reads it when the
        // wait begins), `$5` the kind's marker ([`marker`]), and, where the
        // session's row names another, `$6` the holder and `$7` the name
        // (bytes, read by `list`). Before the lock: the
        // wait's `lock_timeout` (a try's is unused, so that every grant
        // has the same parameters), and the mark's start as
        // `application_name`, so that while the lock is held its kind is
        // never another hold's. Then a try; a wait's, refused, looks for
        // holds of a conflicting kind, and queues only when there is none
        // (the server's queue would only wait them out). Once the lock is held,
        // the kind's marker, and the fence, drawn into the whole mark. Its
        // answer, one column: the mark, `''` when refused, `!` and the
        // letters of the conflicting kinds (a wait's), or NULL from another
        // session.
        // One expression of nested `CASE`s and `COALESCE`s, which the
        // server evaluates in order and no further than needed: the CTEs
        // this replaced cost a third of the server's throughput in grants
        // (pgbench, 16 clients), and a wait's refused try, read of kinds
        // and queueing were three round trips. Nothing is written but the
        // holder and the name, when the connection's row names others.
        // The fence is the database clock in µs: a grant writes nothing
        // for it and takes no shared page's lock (a sequence's did, and
        // held grants up for a value that never passed the clock).
        let fence = CLOCK_US;
        // The mark once the lock is held and the marker `kind` taken, set
        // as `application_name` when `set` (a downgrade's session names its
        // two holds with `+`).
        let marked = |take: &str, kind: &str, set: bool| {
            let mark = format!("$3 || {fence}::text");
            let then = if set {
                format!("set_config('application_name', {mark}, false)")
            } else {
                mark
            };
            let then = format!(
                "CASE WHEN pg_advisory_lock_shared({})::text = '' THEN {then} END",
                marker_key(kind)
            );
            let take = take.replace("{then}", &then);
            format!(
                "CASE WHEN pg_backend_pid() = $1 THEN \
                   CASE WHEN (set_config('lock_timeout', $4, true) \
                              || set_config('application_name', $3, false)) IS NOT NULL THEN \
                     {take} END END"
            )
        };
        // A try's plan leaves the look for conflicting kinds out: a plan's
        // expressions are set up on every run, run or not (10 % of the
        // server's throughput in uncontended grants); a refused try looks
        // in a statement of its own ([`Self::kinds`]).
        let take = |shared: &str, wait: bool| {
            if wait {
                // `lock_timeout` bounds each lock's wait: the key's gets
                // what the look left of the wait's.
                format!(
                    "CASE WHEN pg_try_advisory_lock{shared}($2) THEN {{then}} \
                     ELSE COALESCE('!' || {}, \
                       CASE WHEN set_config('lock_timeout', GREATEST(1, $4::bigint - (extract(epoch FROM \
                           clock_timestamp() - statement_timestamp()) * 1000)::bigint)::text, true) IS NULL \
                         THEN NULL \
                       WHEN pg_advisory_lock{shared}($2)::text = '' THEN {{then}} END) END",
                    conflicts("$5", true)
                )
            } else {
                format!("CASE WHEN pg_try_advisory_lock{shared}($2) THEN {{then}} ELSE '' END")
            }
        };
        let grant = |take: &str, holder: bool| {
            let mark = marked(take, "$5", true);
            if holder {
                format!(
                    "WITH g AS MATERIALIZED (SELECT {mark} AS mark), \
                     w AS (UPDATE {sessions} SET holder = $6, name = $7 WHERE pid = $1 \
                       AND left((SELECT mark FROM g), 1) NOT IN ('', '!')) \
                     SELECT mark FROM g"
                )
            } else {
                format!("SELECT {mark}")
            }
        };
        let takes = ["", "_shared"].map(|shared| [false, true].map(|wait| take(shared, wait)));
        let grants = [false, true].map(|holder| {
            takes
                .each_ref()
                .map(|kind| kind.each_ref().map(|take| sql(grant(take, holder))))
        });
        // The kind's marker goes first, then the lock: a look for
        // conflicting kinds never finds a marker without its hold.
        let unlock = |unlock: &str, kind: &str| {
            format!(
                "CASE WHEN pg_backend_pid() = $1 THEN \
                   CASE WHEN pg_advisory_unlock_shared({}) IS NOT NULL THEN {unlock}($2) END END",
                marker_key(kind)
            )
        };
        let release = |lock: &str| format!("SELECT {}", unlock(lock, "$3"));
        // `$3`: the mark of the hold the session keeps, `$4` its holder,
        // `$5` the marker of the hold given up.
        let release_kept = |lock: &str| {
            format!(
                "WITH u AS MATERIALIZED (SELECT {} AS held), \
                 w AS (UPDATE {sessions} SET holder = $4, hold = '' WHERE pid = $1 AND (SELECT held FROM u)) \
                 SELECT held, CASE WHEN held THEN set_config('application_name', $3, false) END FROM u",
                unlock(lock, "$5")
            )
        };
        SessionSql {
            grants,
            // `$1` the session's pid, `$2` the key, `$3` the marker.
            kinds: sql(format!(
                "SELECT CASE WHEN pg_backend_pid() = $1 THEN {} END",
                conflicts("$3", false)
            )),
            // A session with two holds names them in its row, and `+` as
            // its `application_name`: `$1` to `$4` as a grant's, `$5` the
            // read's holder, `$6` the write's whole mark. Its own write
            // lets the read in at once, ahead of any queue.
            downgrade: sql(format!(
                "WITH g AS MATERIALIZED (SELECT {} AS mark), \
                 w AS (UPDATE {sessions} SET hold = g.mark || ' ' || $5 || chr(10) || $6 \
                   FROM g WHERE pid = $1 AND g.mark <> '') \
                 SELECT mark, set_config('application_name', '+', false) FROM g",
                marked(
                    "CASE WHEN pg_advisory_lock_shared($2)::text = '' THEN {then} ELSE '' END",
                    &marker(Mode::Read).to_string(),
                    false
                )
            )),
            releases: [
                [
                    sql(release("pg_advisory_unlock")),
                    sql(release("pg_advisory_unlock_shared")),
                ],
                [
                    sql(release_kept("pg_advisory_unlock")),
                    sql(release_kept("pg_advisory_unlock_shared")),
                ],
            ],
            // `$1`: the key; `$2`: the most rows. A hold whose session has
            // no row (deleted by hand) is shown all the same, by its mark.
            holders: sql(format!(
                "SELECT l.pid, a.application_name, COALESCE(s.holder, ''), COALESCE(s.hold, ''), \
                 l.mode FROM {} ORDER BY l.mode LIMIT $2",
                holds_of("$1", &sessions, "LEFT JOIN")
            )),
            // `$1`: the prefix, `$2`: the last name of the page before
            // (`''`: none), `$3`: the most names. A row names its
            // session's hold when the session holds that name's key: a row
            // left by an earlier hold names a key no longer held.
            list: sql(format!(
                "SELECT DISTINCT ON (s.name) s.name, a.application_name, s.holder, s.hold, l.mode \
                 FROM {} AND substr(s.name, 1, octet_length($1)) = $1 AND s.name > $2 \
                 ORDER BY s.name, l.mode LIMIT $3",
                holds_of(
                    "('x' || encode(substr(sha256(s.name), 1, 8), 'hex'))::bit(64)::bigint",
                    &sessions,
                    "JOIN"
                )
            )),
            // The holders are read before any is ended, and shown whether
            // or not its end came within `$2` ms. Every session that holds
            // the key is ended, a row or none.
            terminate: sql(format!(
                "WITH h AS MATERIALIZED (SELECT l.pid, a.application_name, \
                   COALESCE(s.holder, '') AS holder, COALESCE(s.hold, '') AS hold, l.mode \
                   FROM {} AND l.pid <> pg_backend_pid()) \
                 SELECT pid, application_name, holder, hold, mode, pg_terminate_backend(pid, $2) FROM h",
                holds_of("$1", &sessions, "LEFT JOIN")
            )),
            // A dropped wait's session `$1`, if it still waits for or holds
            // `$2`, or waits to look for conflicting kinds of it (its
            // checkers' lock): not a later session of the same pid.
            undo: SqlStr::from_static(
                "SELECT pg_terminate_backend(l.pid) FROM pg_catalog.pg_locks l \
                 WHERE l.pid = $1 AND l.locktype = 'advisory' \
                 AND l.objid = ($2 & 4294967295)::oid \
                 AND ((l.classid = (($2 >> 32) & 4294967295)::oid AND l.objsubid = 1) \
                   OR (l.classid = ((($2 >> 32) # 4) & 4294967295)::oid AND l.objsubid = 2))",
            ),
            sessions,
        }
    }

    /// Creates the holders' table when missing.
    /// The table is unlogged (a crash loses it with the sessions it
    /// describes): a row per server session, its holder and the name it
    /// holds (written when they change, for `list`: `pg_locks` has only
    /// keys), and its holds' marks while it has two.
    pub(crate) fn create(&self) -> String {
        format!(
            "CREATE UNLOGGED TABLE IF NOT EXISTS {} (pid integer PRIMARY KEY, \
               holder text NOT NULL, hold text NOT NULL, name bytea NOT NULL DEFAULT '') \
               WITH (fillfactor = 50)",
            self.sessions
        )
    }

    /// Deletes the rows of server sessions that have ended: a session's
    /// row outlives it (a connection closed, a server restarted), and is
    /// made again only by a later session of the same pid. A row is
    /// committed by a live session, so one whose pid the server no longer
    /// runs (read after the transaction's snapshot) is of an ended
    /// session. Repeatable read: a row that a new session of the same pid
    /// takes over meanwhile fails the delete (a serialization error)
    /// instead of being deleted on a check of the older list of sessions.
    pub(crate) fn prune(&self) -> String {
        format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; \
             DELETE FROM {} AS s WHERE NOT EXISTS \
               (SELECT 1 FROM pg_catalog.pg_stat_activity a WHERE a.pid = s.pid); \
             COMMIT",
            self.sessions
        )
    }

    /// What a new connection runs once: the server ends it after
    /// `silence_ms` without a statement (a holder gone silent loses its
    /// session), and its session's row. Answers its pid.
    pub(crate) fn open(&self, silence_ms: u64) -> String {
        format!(
            "SET idle_session_timeout = {silence_ms}; \
             INSERT INTO {} (pid, holder, hold, name) VALUES (pg_backend_pid(), '', '', '') \
             ON CONFLICT (pid) DO UPDATE SET holder = '', hold = '', name = ''; \
             SELECT pg_backend_pid()",
            self.sessions
        )
    }

    /// A grant, tried (`wait` false) or waited for, with the holder
    /// written or not: its mark (`''`: refused; `!` and letters: refused
    /// for the conflicting kinds of those holds; NULL: another session); see [`new`](Self::new) for its
    /// parameters.
    pub(crate) fn grant(&self, mode: Mode, wait: bool, holder: bool) -> SqlStr {
        self.grants[usize::from(holder)][usize::from(mode == Mode::Read)][usize::from(wait)].clone()
    }

    /// The letters of the held kinds that conflict with a refused try's
    /// (see [`new`](Self::new) for its parameters), NULL when none.
    pub(crate) fn kinds(&self) -> SqlStr {
        self.kinds.clone()
    }

    /// A downgrade's read hold (see [`new`](Self::new) for its
    /// parameters): its mark, as a grant's.
    pub(crate) fn downgrade(&self) -> SqlStr {
        self.downgrade.clone()
    }

    /// Gives one hold up: whether it was held (NULL: another session
    /// answered). `kept`: the session keeps another hold (`$3` its mark,
    /// `$4` its holder, and `$5` the marker of the hold given up; `$3`
    /// that marker when not `kept`).
    pub(crate) fn release(&self, mode: Mode, kept: bool) -> SqlStr {
        self.releases[usize::from(kept)][usize::from(mode == Mode::Read)].clone()
    }

    /// The live holds of a key: `(pid, application_name, holder, marks,
    /// lock mode)`, a writer's (`ExclusiveLock`) before readers'.
    pub(crate) fn holders(&self) -> SqlStr {
        self.holders.clone()
    }

    /// A page of the held names under a prefix: `(name, application_name,
    /// holder, marks, lock mode)`, one hold of each, a writer's first.
    pub(crate) fn list(&self) -> SqlStr {
        self.list.clone()
    }

    /// Ends the sessions that hold a key.
    pub(crate) fn terminate(&self) -> SqlStr {
        self.terminate.clone()
    }

    /// Ends a dropped wait's session.
    pub(crate) fn undo(&self) -> SqlStr {
        self.undo.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_the_names_alone() {
        assert_eq!(key("a"), key("a"));
        assert_ne!(key("a"), key("b"));
    }
}
