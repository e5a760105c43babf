//! The session mode's statements, and what a holding session's row says
//! of its hold (its mark: `<kind letter><owner> <fence> <holder>`).
//!
//! Each is one simple query (one round trip), its values written out as
//! literals.

use dlock_core::{LockInfo, Mode, OwnerToken};
use sha2::{Digest, Sha256};

use crate::sql::text;

/// A name's advisory-lock key: 64 bits of a hash of it, the same for
/// every kind of hold, so that one name is one lock. Two names of the same
/// key contend for one lock (a false conflict, never a false grant).
pub(crate) fn key(name: &str) -> i64 {
    let hash = Sha256::digest(name.as_bytes());
    let mut first = [0; 8];
    first.copy_from_slice(&hash[..8]);
    i64::from_be_bytes(first)
}

/// The letter of a kind of hold in a mark.
fn letter(mode: Mode) -> char {
    match mode {
        Mode::Exclusive => 'm',
        Mode::Read => 'r',
        Mode::Write => 'w',
        // Not granted in this mode: core refuses kinds a driver lacks.
        _ => 'p',
    }
}

/// The statements, for one fencing sequence and one table of holders.
#[derive(Debug)]
pub(crate) struct SessionSql {
    /// The fencing sequence, schema-qualified.
    sequence: String,
    /// Who holds, a row per server session (`pid`), schema-qualified.
    sessions: String,
    /// The `idle_session_timeout` of a holding session, in milliseconds.
    silence_ms: u64,
}

impl SessionSql {
    pub(crate) fn new(schema: &str, table: &str, silence_ms: u64) -> Self {
        SessionSql {
            sequence: format!("{schema}.{table}_fence"),
            sessions: format!("{schema}.{table}_sessions"),
            silence_ms,
        }
    }

    /// Creates the fencing sequence and the holders' table when missing.
    /// The table is unlogged (a crash loses it with the sessions it
    /// describes) and its rows are updated in place (HOT).
    pub(crate) fn create(&self) -> String {
        format!(
            "CREATE SEQUENCE IF NOT EXISTS {}; \
             CREATE UNLOGGED TABLE IF NOT EXISTS {} (pid integer PRIMARY KEY, hold text NOT NULL) \
             WITH (fillfactor = 50)",
            self.sequence, self.sessions
        )
    }

    /// The next fencing token, as text: the sequence's next value or the
    /// server clock's microseconds, whichever is more, and the sequence set
    /// to it. A reset or recreated sequence goes on from the clock; a clock
    /// set back goes on from the sequence.
    fn fence(&self) -> String {
        let seq = &self.sequence;
        format!(
            "setval('{seq}', GREATEST(nextval('{seq}'), \
             (extract(epoch FROM clock_timestamp()) * 1000000)::bigint))::text"
        )
    }

    /// A grant's statement: `take` (true when taken) first, then, when
    /// taken, the hold's mark written to the session's row and its
    /// `idle_session_timeout` set, so that a holder gone silent loses the
    /// session. `(pid, mark or NULL, the letters of the holders when
    /// refused)`: the holders are read only when refused, for a conflict
    /// of kinds.
    fn grant(&self, take: &str, key: i64, mode: Mode, owner: OwnerToken, holder: &str) -> String {
        format!(
            "WITH g AS MATERIALIZED (SELECT {take} AS got), \
             f AS MATERIALIZED (SELECT '{}{owner} ' || {} || ' ' || {} AS mark, \
               set_config('idle_session_timeout', '{}', false) FROM g WHERE g.got), \
             w AS (INSERT INTO {s} (pid, hold) SELECT pg_backend_pid(), f.mark FROM f \
               ON CONFLICT (pid) DO UPDATE SET hold = EXCLUDED.hold) \
             SELECT pg_backend_pid(), (SELECT mark FROM f), \
             CASE WHEN NOT g.got THEN (SELECT string_agg(DISTINCT left(s.hold, 1), '') \
               FROM {}) END FROM g",
            letter(mode),
            self.fence(),
            text(holder),
            self.silence_ms,
            self.holders_of(key),
            s = self.sessions,
        )
    }

    /// One attempt (see [`grant`](Self::grant)).
    pub(crate) fn attempt(&self, key: i64, mode: Mode, owner: OwnerToken, holder: &str) -> String {
        let try_lock = match mode {
            Mode::Read => "pg_try_advisory_lock_shared",
            _ => "pg_try_advisory_lock",
        };
        self.grant(&format!("{try_lock}({key})"), key, mode, owner, holder)
    }

    /// A wait: the lock taken as the server queues it, for at most
    /// `wait_ms` (`None`: no bound); as [`grant`](Self::grant).
    pub(crate) fn wait(
        &self,
        key: i64,
        mode: Mode,
        owner: OwnerToken,
        holder: &str,
        wait_ms: Option<u64>,
    ) -> String {
        let lock = match mode {
            Mode::Read => "pg_advisory_lock_shared",
            _ => "pg_advisory_lock",
        };
        format!(
            "SET LOCAL statement_timeout = {}; {}",
            // 0 is no bound; the setting's largest is `i32::MAX`.
            wait_ms.map_or(0, |ms| ms.clamp(1, i32::MAX as u64)),
            self.grant(
                &format!("{lock}({key})::text = ''"),
                key,
                mode,
                owner,
                holder
            )
        )
    }

    /// Gives one hold up: `(pid, whether it was held)`. The session's row
    /// then names the hold it keeps (a downgrade's read); a session that
    /// keeps none may idle again. A row of no live hold is never read.
    pub(crate) fn release(&self, key: i64, mode: Mode, after: Option<&str>) -> String {
        let unlock = match mode {
            Mode::Read => "pg_advisory_unlock_shared",
            _ => "pg_advisory_unlock",
        };
        match after {
            Some(mark) => format!(
                "WITH u AS (UPDATE {} SET hold = {} WHERE pid = pg_backend_pid()) \
                 SELECT pg_backend_pid(), {unlock}({key})",
                self.sessions,
                text(mark)
            ),
            None => format!(
                "SELECT pg_backend_pid(), {unlock}({key}), \
                 set_config('idle_session_timeout', '0', false)"
            ),
        }
    }

    /// The live holds of `key`: `(pid, hold, lock mode)`, a writer's
    /// (`ExclusiveLock`) before readers'.
    pub(crate) fn holders(&self, key: i64, limit: usize) -> String {
        format!(
            "SELECT l.pid, s.hold, l.mode FROM {} ORDER BY l.mode LIMIT {limit}",
            self.holders_of(key)
        )
    }

    /// Ends the sessions that hold `key`, for an operator, waiting up to
    /// `wait_ms` for each to be gone (and its locks freed): `(pid, hold,
    /// lock mode)` of each. The holders are read before any is ended.
    pub(crate) fn terminate(&self, key: i64, wait_ms: u64) -> String {
        format!(
            "WITH h AS MATERIALIZED (SELECT l.pid, s.hold, l.mode FROM {} \
               AND l.pid <> pg_backend_pid()) \
             SELECT pid, hold, mode FROM h WHERE pg_terminate_backend(pid, {wait_ms})",
            self.holders_of(key)
        )
    }

    /// `pg_locks` (aliased `l`) of the granted holds of `key` in this
    /// database, joined with their session's row (`s`).
    fn holders_of(&self, key: i64) -> String {
        // A bigint key is stored split: its high half as `classid`, its
        // low half as `objid`, with `objsubid` 1.
        let bits = key as u64;
        let (high, low) = (bits >> 32, bits & 0xffff_ffff);
        format!(
            "pg_locks l JOIN {} s ON s.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND l.classid = {high} AND l.objid = {low} AND l.objsubid = 1",
            self.sessions
        )
    }
}

/// The fence a grant's mark carries.
pub(crate) fn fence_of(mark: &str) -> Option<u64> {
    mark.split(' ').nth(1)?.parse().ok()
}

/// The kind of lock a holder's letter says, `None` for a hold not made
/// by this mode (another library's lock of the same key).
pub(crate) fn kind_of(letter: char) -> Option<Mode> {
    match letter {
        'm' => Some(Mode::Exclusive),
        'r' => Some(Mode::Read),
        'w' => Some(Mode::Write),
        _ => None,
    }
}

/// A holder as `pg_locks` and its session's row show it: `None` for a
/// lock the row does not describe. A session that holds a write and a
/// read (a downgrade, until the write is released) describes the read.
pub(crate) fn info(mark: &str, lock_mode: &str) -> Option<LockInfo> {
    let mut parts = mark.splitn(3, ' ');
    let (held, fence, holder) = (parts.next()?, parts.next()?, parts.next()?);
    let mut chars = held.chars();
    let kind = kind_of(chars.next()?)?;
    let shared = lock_mode == "ShareLock";
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_says_the_holder_and_its_fence() {
        let owner = OwnerToken::from_u128(0xabc);
        let mark = format!("w{owner} 1234 worker 7 · Zürich");
        let held = info(&mark, "ExclusiveLock").expect("a holder");
        assert_eq!((held.owner, held.fencing_token), (owner, 1234));
        assert_eq!(held.mode, Some(Mode::Write));
        assert_eq!(held.holder.as_deref(), Some("worker 7 · Zürich"));
        assert_eq!(fence_of(&mark), Some(1234));
        // A downgrade's write lock, while its row describes the read.
        assert!(info(&format!("r{owner} 1235 x"), "ExclusiveLock").is_none());
        assert!(info("psql", "ExclusiveLock").is_none());
    }

    #[test]
    fn a_key_is_the_names_alone() {
        assert_eq!(key("a"), key("a"));
        assert_ne!(key("a"), key("b"));
    }
}
