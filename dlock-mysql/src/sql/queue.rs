//! The statements of a waiter's place in a name's queue taken outside the
//! name's transaction: a shared kind's first look, and a mutex waiter's
//! queued acquire.

use std::sync::atomic::Ordering::Relaxed;

use dlock_core::Mode;
use sqlx::SqlStr;

use super::shared::{admitted, after, bytes, queued};
use super::{CLOCK, NOW, Statements, safe};

impl Statements {
    /// Queues `waiter` for `name` asked as `mode`, without the name's row
    /// lock, then reads whether the acquire's rule lets it in now: two
    /// statements, each its own transaction, so the place is committed
    /// before the read. A change committed before the place is seen by the
    /// read; one committed after it finds the place when it reads whom to
    /// wake. A waiter that would be refused thus costs the name's other
    /// users nothing. No place while the name is in use as another kind,
    /// or another kind waits (the read then says which): it would refuse
    /// the right kind's waiters until it was given up. Read committed, so
    /// that the insert's reads take no lock on the name's row. One row: the kind the name is in use as when another
    /// (bytes), whether the rule lets the waiter in, and the µs until the
    /// first hold ends.
    pub fn enqueue_shared(&self, name: &[u8], mode: Mode, waiter: &str, place_us: u64) -> SqlStr {
        if self.call.load(Relaxed) {
            return self.call_enqueue_shared(name, mode, waiter, place_us);
        }
        let (code, k) = (mode.code(), mode.marker());
        let (t, h, n, me, place) = (
            &self.table,
            self.holds(),
            bytes(name),
            waiter,
            after(place_us),
        );
        let admitted = admitted(t, &n);
        // A live place of another kind, which refuses this one.
        let other = format!(
            "name = {n} AND waiting AND mode <> 'x' AND expires_at > {NOW} AND kind <> '{k}'"
        );
        safe(format!(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
             INSERT INTO {h} (name, owner, mode, kind, fence, expires_at, waiting, since)
               SELECT {n}, '{me}', '{code}', '{k}', 0, {place}, TRUE, {CLOCK} FROM DUAL
               WHERE NOT EXISTS (SELECT 1 FROM `{t}` WHERE name = {n} AND expires_at > {NOW}
                 AND owner <> '' AND owner <> '{k}')
                 AND NOT EXISTS (SELECT 1 FROM {h} WHERE {other})
               ON DUPLICATE KEY UPDATE since = IF(expires_at > {NOW} OR fence > 0, since, {CLOCK}),
                 fence = 0, expires_at = {place};
             SELECT CAST(COALESCE((SELECT IF(owner LIKE '~%', NULLIF(owner, '{k}'),
                   IF(owner = '', NULL, 'x')) FROM `{t}` WHERE name = {n} AND expires_at > {NOW}),
                 (SELECT kind FROM {h} WHERE {other} LIMIT 1)) AS BINARY),
               CAST(EXISTS (SELECT 1 FROM {admitted} AND q.owner = '{me}') AS SIGNED),
               (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, {NOW}, MIN(expires_at)) AS SIGNED) FROM {h}
                WHERE name = {n} AND expires_at > {NOW} AND NOT waiting)"
        ))
    }

    /// A mutex's acquire by `owner`, queued as `waiter` with a place of
    /// `place_us`: granted when no place counts ahead of the waiter's (see
    /// [`counts`](super::shared::counts)), which it then gives up. One row: the plain acquire's
    /// outcome (its `LAST_INSERT_ID`). Each statement touches the holds by
    /// primary key or reads them: a sweep of lapsed places here (a range
    /// of row locks) deadlocked with releases in the bench; lapsed places
    /// go when a waiter of the name leaves ([`Statements::abandon`]).
    ///
    /// Three statements, no transaction, and the order matters: the place
    /// is committed first, on its own, before the acquire locks the name's
    /// row. A release then either reads the head after that commit (its
    /// read of the holds is a locking one, and waits for the insert), and
    /// wakes this waiter when it is first, or commits before the acquire
    /// locks the row, which the acquire then finds free. A transaction
    /// with the row locked first orders them as well, at some ten more
    /// statements per look (238 grants/s against 377 in the bench's
    /// hand-off storm).
    pub fn acquire_queued(
        &self,
        name: &[u8],
        owner: &str,
        (ttl_us, holder): (u64, &str),
        waiter: &str,
        place_us: u64,
    ) -> SqlStr {
        let (h, n, me, place) = (self.holds(), bytes(name), waiter, after(place_us));
        let values = [
            &*n,
            &format!("'{owner}'"),
            &ttl_us.to_string(),
            &bytes(holder.as_bytes()),
        ];
        // Without its place (given up by a wait dropped meanwhile), every
        // place is ahead.
        let ahead = format!(
            "q.name = {n} AND {queued} AND q.owner <> '{me}' AND COALESCE((q.since, q.owner) <
               (SELECT m.since, m.owner FROM {h} AS m WHERE m.name = {n} AND m.owner = '{me}'), TRUE)",
            queued = queued(&self.table)
        );
        safe(format!(
            "INSERT INTO {h} (name, owner, mode, kind, fence, expires_at, waiting, since)
               VALUES ({n}, '{me}', 'x', '', 0, {place}, TRUE, {CLOCK})
               ON DUPLICATE KEY UPDATE since = IF(expires_at > {NOW}, since, {CLOCK}), expires_at = {place};
             {acquire};
             DELETE FROM {h} WHERE name = {n} AND owner = '{me}' AND waiting AND LAST_INSERT_ID() > 1;
             SELECT CAST(LAST_INSERT_ID() AS SIGNED)",
            acquire = super::acquire(&self.table, values, &ahead)
        ))
    }
}
