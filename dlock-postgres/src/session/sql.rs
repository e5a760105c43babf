//! The session mode's statements, and what a holding session's row says
//! of its holds (a mark a hold: `<kind letter><owner> <fence> <holder>`;
//! a downgraded session's row has two, a line each).
//!
//! The connections are dedicated, so the statements are prepared (sqlx's
//! cache, per connection). Each one that locks or unlocks names the
//! server session it is for (`$1`, its pid): one that reaches another
//! session (a pooler in transaction mode) changes nothing there.

use dlock_core::{LockInfo, Mode, OwnerToken};
use sha2::{Digest, Sha256};

/// A name's advisory-lock key: 64 bits of a hash of it, the same for
/// every kind of hold, so that one name is one lock. Two names of the same
/// key contend for one lock (a false conflict, never a false grant).
pub(crate) fn key(name: &str) -> i64 {
    let hash = Sha256::digest(name.as_bytes());
    let mut first = [0; 8];
    first.copy_from_slice(&hash[..8]);
    i64::from_be_bytes(first)
}

/// The start of a hold's mark, before its fence.
pub(crate) fn mark_prefix(mode: Mode, owner: OwnerToken) -> String {
    let letter = match mode {
        Mode::Exclusive => 'm',
        Mode::Read => 'r',
        Mode::Write => 'w',
        // Not granted in this mode: core refuses kinds a driver lacks.
        _ => 'p',
    };
    format!("{letter}{owner} ")
}

/// The statements, for one fencing sequence and one table of holders.
#[derive(Debug)]
pub(crate) struct SessionSql {
    sequence: String,
    sessions: String,
    /// The grants: `[try, wait]` × `[exclusive, shared]`.
    grants: [[String; 2]; 2],
    releases: [String; 2],
    holders: String,
    terminate: String,
    undo: String,
}

/// `pg_locks` (aliased `l`) of the granted holds of the key `key` in this
/// database, joined with their session's row (`s`). A bigint key is kept
/// split: its high half as `classid`, its low half as `objid`, with
/// `objsubid` 1.
fn holds_of(key: &str, sessions: &str) -> String {
    format!(
        "pg_locks l JOIN {sessions} s ON s.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND l.classid = (({key} >> 32) & 4294967295)::oid \
         AND l.objid = ({key} & 4294967295)::oid AND l.objsubid = 1"
    )
}

impl SessionSql {
    pub(crate) fn new(schema: &str, table: &str) -> Self {
        let sequence = format!("{schema}.{table}_fence");
        let sessions = format!("{schema}.{table}_sessions");
        let grant = |take: &str| {
            // `$3`: the mark's start; `$4`: the holder; `$5`: what the row
            // keeps beside it (a downgrade's write mark, after a newline).
            // The lock is taken first, and the fence drawn only then.
            format!(
                "WITH g AS MATERIALIZED (SELECT CASE WHEN pg_backend_pid() = $1 THEN {take} END AS got), \
                 f AS MATERIALIZED (SELECT $3 || GREATEST(nextval('{sequence}'), \
                   (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)::text || ' ' || $4 AS mark \
                   FROM g WHERE g.got), \
                 w AS (UPDATE {sessions} SET hold = f.mark || $5 FROM f WHERE pid = $1) \
                 SELECT g.got, (SELECT mark FROM f), \
                 CASE WHEN NOT g.got THEN (SELECT string_agg(DISTINCT left(s.hold, 1), '') FROM {}) END \
                 FROM g",
                holds_of("$2", &sessions)
            )
        };
        // A wait sets its `lock_timeout` (`$6`, ms; 0: none) before it
        // queues: the server reads it when the wait begins.
        let wait = |lock: &str| {
            grant(&format!(
                "(SELECT {lock}($2)::text = '' FROM (SELECT set_config('lock_timeout', $6, true)) t)"
            ))
        };
        let release = |unlock: &str| {
            // `$3`: the marks the row keeps.
            format!(
                "WITH u AS MATERIALIZED (SELECT CASE WHEN pg_backend_pid() = $1 THEN {unlock}($2) END AS held), \
                 w AS (UPDATE {sessions} SET hold = $3 WHERE pid = $1 AND (SELECT held FROM u)) \
                 SELECT held FROM u"
            )
        };
        SessionSql {
            grants: [
                [grant("pg_try_advisory_lock($2)"), wait("pg_advisory_lock")],
                [
                    grant("pg_try_advisory_lock_shared($2)"),
                    wait("pg_advisory_lock_shared"),
                ],
            ],
            releases: [
                release("pg_advisory_unlock"),
                release("pg_advisory_unlock_shared"),
            ],
            // `$1`: the key; `$2`: the most rows.
            holders: format!(
                "SELECT l.pid, s.hold, l.mode FROM {} ORDER BY l.mode LIMIT $2",
                holds_of("$1", &sessions)
            ),
            // The holders are read before any is ended, and shown whether
            // or not its end came within `$2` ms.
            terminate: format!(
                "WITH h AS MATERIALIZED (SELECT l.pid, s.hold, l.mode FROM {} \
                   AND l.pid <> pg_backend_pid()) \
                 SELECT pid, hold, mode, pg_terminate_backend(pid, $2) FROM h",
                holds_of("$1", &sessions)
            ),
            // A dropped wait's session `$1`, if it still waits for or holds
            // `$2` (not a later session of the same pid).
            undo: format!(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
                 WHERE l.pid = $1 AND l.locktype = 'advisory' \
                 AND l.classid = (($2 >> 32) & 4294967295)::oid \
                 AND l.objid = ($2 & 4294967295)::oid AND l.objsubid = 1"
            ),
            sequence,
            sessions,
        }
    }

    /// Creates the fencing sequence and the holders' table when missing.
    /// The table is unlogged (a crash loses it with the sessions it
    /// describes), and its rows are updated in place (HOT).
    pub(crate) fn create(&self) -> String {
        format!(
            "CREATE SEQUENCE IF NOT EXISTS {}; \
             CREATE UNLOGGED TABLE IF NOT EXISTS {} (pid integer PRIMARY KEY, hold text NOT NULL) \
             WITH (fillfactor = 50)",
            self.sequence, self.sessions
        )
    }

    /// What a new connection runs once: the server ends it after
    /// `silence_ms` without a statement (a holder gone silent loses its
    /// session), and its session's row. Answers its pid.
    pub(crate) fn open(&self, silence_ms: u64) -> String {
        format!(
            "SET idle_session_timeout = {silence_ms}; \
             INSERT INTO {} (pid, hold) VALUES (pg_backend_pid(), '') \
             ON CONFLICT (pid) DO UPDATE SET hold = ''; \
             SELECT pg_backend_pid()",
            self.sessions
        )
    }

    /// A grant, tried (`wait` false) or waited for: `(got, mark)`; see
    /// [`new`](Self::new) for its parameters.
    pub(crate) fn grant(&self, mode: Mode, wait: bool) -> &str {
        &self.grants[usize::from(mode == Mode::Read)][usize::from(wait)]
    }

    /// Gives one hold up: whether it was held (NULL: another session
    /// answered).
    pub(crate) fn release(&self, mode: Mode) -> &str {
        &self.releases[usize::from(mode == Mode::Read)]
    }

    /// The live holds of a key: `(pid, marks, lock mode)`, a writer's
    /// (`ExclusiveLock`) before readers'.
    pub(crate) fn holders(&self) -> &str {
        &self.holders
    }

    /// Ends the sessions that hold a key.
    pub(crate) fn terminate(&self) -> &str {
        &self.terminate
    }

    /// Ends a dropped wait's session.
    pub(crate) fn undo(&self) -> &str {
        &self.undo
    }
}

/// The fence of a mark.
pub(crate) fn fence_of(mark: &str) -> Option<u64> {
    mark.split(' ').nth(1)?.parse().ok()
}

/// The kind of lock a holder's letter says, `None` for a hold not made
/// by this mode.
pub(crate) fn kind_of(letter: char) -> Option<Mode> {
    match letter {
        'm' => Some(Mode::Exclusive),
        'r' => Some(Mode::Read),
        'w' => Some(Mode::Write),
        _ => None,
    }
}

/// A holder as `pg_locks` and its session's row show it: the row's mark
/// of the lock's mode, `None` when it has none.
pub(crate) fn info(marks: &str, lock_mode: &str) -> Option<LockInfo> {
    let shared = lock_mode == "ShareLock";
    marks.lines().find_map(|mark| {
        let mut parts = mark.splitn(3, ' ');
        let (held, fence, holder) = (parts.next()?, parts.next()?, parts.next()?);
        let mut chars = held.chars();
        let kind = kind_of(chars.next()?)?;
        if shared != (kind == Mode::Read) {
            return None;
        }
        let owner = chars.as_str().parse::<OwnerToken>().ok()?;
        let info = LockInfo::new(owner, fence.parse().ok()?, None).with_mode(kind);
        Some(if holder.is_empty() {
            info
        } else {
            info.with_holder(holder)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_says_the_holder_and_its_fence() {
        let owner = OwnerToken::from_u128(0xabc);
        let mark = format!("{}1234 worker 7 · Zürich", mark_prefix(Mode::Write, owner));
        let held = info(&mark, "ExclusiveLock").expect("a holder");
        assert_eq!((held.owner, held.fencing_token), (owner, 1234));
        assert_eq!(held.mode, Some(Mode::Write));
        assert_eq!(held.holder.as_deref(), Some("worker 7 · Zürich"));
        assert_eq!(fence_of(&mark), Some(1234));
        // A downgraded session: its read and its write, each by its lock.
        let read = format!("{}1235 x", mark_prefix(Mode::Read, owner));
        let both = format!("{read}\n{mark}");
        assert_eq!(
            info(&both, "ShareLock").map(|i| i.fencing_token),
            Some(1235)
        );
        assert_eq!(
            info(&both, "ExclusiveLock").map(|i| i.fencing_token),
            Some(1234)
        );
        assert!(info(&read, "ExclusiveLock").is_none());
        assert!(info("", "ExclusiveLock").is_none());
    }

    #[test]
    fn a_key_is_the_names_alone() {
        assert_eq!(key("a"), key("a"));
        assert_ne!(key("a"), key("b"));
    }
}
