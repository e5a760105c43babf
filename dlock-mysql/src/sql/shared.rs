//! The statements of reader-writer locks and semaphores.
//!
//! A name held that way keeps a *marker* as owner in its row of the lock
//! table (`~rw`, or `~s<N>` for a semaphore of N), with the expiry of its
//! longest hold, so that a mutex's acquire finds it held and its version
//! counts every grant of every kind. The holds and the waiters are rows of
//! `<table>_holds` (mode `r`, `w` or `p`; a waiter's row expires when its
//! place lapses or is granted, and `since` orders the queue; a granted
//! place stays, marked with the grant's fence, until its hold ends, so that
//! an undone grant can give it back), as in the PostgreSQL driver. A waiter
//! that gives up deletes its row, a granted place with it.
//!
//! MySQL has no statement that changes two tables and returns rows, so
//! each call is a short transaction of several statements sent as one
//! text query: one round trip. Its first statement locks the name's row
//! (making it if missing, with an update, not `INSERT IGNORE`, whose
//! shared lock on the duplicate would deadlock with a second such
//! transaction); under read committed every later read of the transaction
//! sees what the lock's earlier holders committed. The answer is read
//! from user variables after the commit. Every literal is hex, digits or
//! a fixed marker: nothing a caller wrote is spliced in as text.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use dlock_core::Mode;
use dlock_sql::SharedStatements;
use sqlx::SqlStr;

use super::{Batch, CLOCK, NOW, Statements, hex, safe};

/// `X'<hex>'`.
pub(super) fn bytes(b: &[u8]) -> String {
    format!("X'{}'", hex(b))
}

/// `ttl_us` from now.
pub(super) fn after(us: u64) -> String {
    format!("{NOW} + INTERVAL {us} MICROSECOND")
}

/// The waiters of `n` (a literal or a `?`) that the acquire's rule lets
/// in now, as the tail of a query on the holds of the lock table `t`
/// (`q.owner` is each one's token): the first writer once nobody holds,
/// the readers before the first writer once no writer holds, a
/// semaphore's first waiters while they fit, a mutex's first waiter once
/// the name's row is free.
pub(super) fn admitted(t: &str, n: &str) -> String {
    format!(
        "(SELECT owner, mode, kind, ROW_NUMBER() OVER w AS i, SUM(mode = 'w') OVER w AS writers
           FROM `{t}_holds` WHERE name = {n} AND waiting AND expires_at > {NOW} AND {counts}
           WINDOW w AS (ORDER BY since, owner)) AS q
         CROSS JOIN (SELECT COUNT(*) AS held, COALESCE(SUM(mode = 'w'), 0) AS held_w
           FROM `{t}_holds` WHERE name = {n} AND NOT waiting AND expires_at > {NOW}) AS c
         WHERE ((mode = 'w' AND i = 1 AND held = 0)
           OR (mode = 'r' AND writers = 0 AND held_w = 0)
           OR (mode = 'p' AND i + held <= CAST(SUBSTRING(kind, 3) AS UNSIGNED))
           OR (mode = 'x' AND i = 1 AND NOT EXISTS (SELECT 1 FROM `{t}`
             WHERE name = {n} AND expires_at > {NOW})))",
        counts = counts(t, "")
    )
}

/// The token of the first live place in the queue of `n` (an SQL
/// expression), as a subquery: NULL when nobody queues.
pub(super) fn head(t: &str, n: &str) -> String {
    format!(
        "(SELECT q.owner FROM `{t}_holds` AS q WHERE q.name = {n} AND {}
           ORDER BY q.since, q.owner LIMIT 1)",
        queued(t)
    )
}

/// The places of the holds `q` of `t` that count in a queue (with their
/// name's condition, the whole queue): live, and [`counts`].
pub(super) fn queued(t: &str) -> String {
    format!("q.waiting AND q.expires_at > {NOW} AND {}", counts(t, "q."))
}

/// Whether a live place of the holds of `t` (its columns prefixed by `p`:
/// `""` or `"q."`) counts in the queue: every place of a shared kind, and
/// a mutex waiter's only while its waiter is registered (its sleeper
/// connection holds the waiter's key). A mutex waiter queues only once
/// registered, so a waiter whose process died (and took its connection
/// along) keeps nobody waiting behind its place.
pub(super) fn counts(t: &str, p: &str) -> String {
    let key = super::wait_key(t, &format!("CONCAT({p}name, X'00', {p}owner)"));
    format!("({p}mode <> 'x' OR IS_USED_LOCK({key}) IS NOT NULL)")
}

impl Statements {
    /// `<table>_holds`.
    pub fn holds(&self) -> String {
        format!("`{}_holds`", self.table)
    }

    /// With `wake`, a query of the connections that the waiters of `n`
    /// that a change has let in sleep on (the rule of `acquire_shared`:
    /// the first writer when nobody holds, the readers before the first
    /// writer when no writer holds, the permits that fit; registered under
    /// `CONCAT(name, X'00', owner)`, the waiter's key), when `changed` (a
    /// condition) holds: one row each, NULL for a waiter not sleeping.
    /// Sent after the change's commit, in a read of its own: a waiter that
    /// registers after this read sleeps after the commit too, and its
    /// sleep, which reads the rule first, finds itself let in; a waiter
    /// registered before it is found here, and its sleep ended. Read
    /// inside the transaction, it could miss a waiter that registered
    /// while the commit was under way, whose sleep then read the state
    /// before the change. Without `wake`, nothing.
    pub(super) fn wake_set(&self, n: &str, changed: &str, wake: bool) -> String {
        if !wake {
            return String::new();
        }
        let key = super::wait_key(&self.table, &format!("CONCAT({n}, X'00', owner)"));
        format!(
            "SELECT CAST(IS_USED_LOCK({key}) AS SIGNED) FROM {} AND {changed};",
            admitted(&self.table, n)
        )
    }

    /// The start of every shared call's transaction: its isolation, and
    /// the lock on the name's row.
    fn begin(&self, n: &str) -> String {
        let t = &self.table;
        format!(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;
             INSERT INTO `{t}` (name, owner, version, expires_at, acquired_at, holder)
               VALUES ({n}, '', {CLOCK}, {NOW}, {NOW}, '')
               ON DUPLICATE KEY UPDATE version = version; "
        )
    }

    /// The live places queued ahead of `me` in the queue of `n`, as a
    /// condition on the holds (all of them when `me` has none: `@dl_since`,
    /// its place's, is NULL).
    fn ahead(&self, n: &str, me: &str) -> String {
        format!(
            "name = {n} AND expires_at > {NOW} AND waiting AND owner <> '{me}' AND {counts}
             AND (@dl_since IS NULL OR since < @dl_since OR (since = @dl_since AND owner < '{me}'))",
            counts = counts(&self.table, "")
        )
    }

    /// The marker's expiry once the holds of the name have changed: that
    /// of the longest live hold, at least `floor`.
    fn marker_until(&self, n: &str, floor: &str) -> String {
        format!(
            "GREATEST(COALESCE((SELECT MAX(expires_at) FROM {h} WHERE name = {n} AND NOT waiting
               AND expires_at > {NOW}), {NOW}), {floor})",
            h = self.holds()
        )
    }

    /// An acquire of a shared kind by `owner`, queued as `waiter` (`""`:
    /// behind every waiter, and not queued) with a place of `place_us`.
    /// One row: the fencing token when granted, the kind the name is in
    /// use as when that is another (bytes), and the µs until the first
    /// hold ends.
    ///
    /// A grant from a live place does not delete it: the place lapses,
    /// marked with the grant's fence, its `since` kept. If the reply is
    /// lost, the undo's release puts the place back where it was
    /// ([`SharedStatements::release_shared`]), and so does the waiter's next look
    /// if it comes first: a waiter sent to the back would queue behind a
    /// writer that queued later, which waits for the readers let in beside
    /// it, while they wait for this reader.
    #[allow(clippy::too_many_arguments)] // one statement's values
    pub fn acquire_shared(
        &self,
        name: &[u8],
        owner: &str,
        mode: Mode,
        ttl_us: u64,
        holder: &str,
        waiter: &str,
        place_us: u64,
    ) -> SqlStr {
        if self.call.load(Relaxed) {
            return self.call_acquire_shared(name, owner, mode, ttl_us, holder, waiter, place_us);
        }
        let (code, k) = (mode.code(), mode.marker());
        let (t, h, n) = (&self.table, self.holds(), bytes(name));
        let me = waiter;
        let live = format!("name = {n} AND expires_at > {NOW}");
        let ahead = self.ahead(&n, me);
        // Over the places ahead (`COUNT(*)`, and their writers).
        let admit = match code {
            "w" => "@dl_held = 0 AND COUNT(*) = 0".to_owned(),
            "r" => "@dl_held_w = 0 AND COALESCE(SUM(mode = 'w'), 0) = 0".to_owned(),
            _ => format!("@dl_held + COUNT(*) < {}", mode.permits()),
        };
        let conflict = format!(
            "COALESCE(IF(@dl_o LIKE '~%', NULLIF(@dl_o, '{k}'),
               IF(@dl_o IS NULL OR @dl_o = '', NULL, 'x')), MAX(NULLIF(kind, '{k}')))"
        );
        let who = bytes(holder.as_bytes());
        let begin = self.begin(&n);
        let (ttl, place) = (after(ttl_us), after(place_us));
        // Few statements, each reading what the last ones set: every
        // statement of this transaction runs under the name's row lock,
        // and their count is most of what a grant costs the server.
        safe(format!(
            "{begin}
             SELECT (SELECT IF(expires_at > {NOW}, owner, NULL) FROM `{t}` WHERE name = {n}),
               (SELECT since FROM {h} WHERE {live} AND waiting AND owner = '{me}'),
               COUNT(*), COALESCE(SUM(mode = 'w'), 0)
             INTO @dl_o, @dl_since, @dl_held, @dl_held_w FROM {h} WHERE {live} AND NOT waiting;
             SELECT {conflict}, {conflict} IS NULL AND {admit} INTO @dl_conflict, @dl_admit
             FROM {h} WHERE {ahead};
             UPDATE `{t}` SET
               expires_at = IF(owner = '{k}' AND expires_at > {NOW}, GREATEST(expires_at, {ttl}), {ttl}),
               owner = '{k}', version = LAST_INSERT_ID(GREATEST(version + 1, {CLOCK})),
               acquired_at = {NOW}, holder = {who}
             WHERE name = {n} AND @dl_admit;
             UPDATE {h} SET expires_at = {NOW}, fence = LAST_INSERT_ID()
             WHERE name = {n} AND owner = '{me}' AND waiting AND @dl_admit AND @dl_since IS NOT NULL;
             DELETE FROM {h} WHERE name = {n} AND (
               (owner = '{me}' AND waiting AND @dl_admit AND @dl_since IS NULL)
               OR (owner <> '{me}' AND expires_at < {NOW} - INTERVAL 1 MINUTE));
             INSERT INTO {h} (name, owner, mode, kind, fence, expires_at, waiting, since, holder)
               SELECT {n}, IF(@dl_admit, '{owner}', '{me}'), '{code}', '{k}',
                 IF(@dl_admit, LAST_INSERT_ID(), 0), IF(@dl_admit, {ttl}, {place}), NOT @dl_admit,
                 IF(@dl_admit, 0, {CLOCK}), IF(@dl_admit, {who}, '') FROM DUAL
               WHERE @dl_admit OR ('{me}' <> '' AND @dl_conflict IS NULL)
               ON DUPLICATE KEY UPDATE since = IF(expires_at > {NOW} OR fence > 0, since, {CLOCK}),
                 fence = 0, expires_at = {place};
             COMMIT;
             SELECT CAST(IF(@dl_admit, LAST_INSERT_ID(), NULL) AS SIGNED), CAST(@dl_conflict AS BINARY),
               (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, {NOW}, MIN(expires_at)) AS SIGNED) FROM {h}
                WHERE {live} AND NOT waiting)"
        ))
    }

    /// Gives a waiter's place up, and sweeps the name's places that lapsed
    /// over a minute ago. Rows: the waiters to wake (a writer that leaves
    /// may let readers in), then how many places it gave up.
    pub fn abandon(&self, name: &[u8], waiter: &str, wake: bool) -> SqlStr {
        let (h, n) = (self.holds(), bytes(name));
        // In the name's transaction, as a release: each sees the other's
        // change when it decides whom to wake (after both commits).
        let begin = self.begin(&n);
        let wake = self.wake_set(&n, "@dl_n > 0", wake);
        safe(format!(
            "{begin}
             DELETE FROM {h} WHERE name = {n} AND owner = '{waiter}' AND waiting;
             SET @dl_n = ROW_COUNT();
             DELETE FROM {h} WHERE name = {n} AND waiting AND expires_at < {NOW} - INTERVAL 1 MINUTE;
             COMMIT;
             {wake}
             SELECT CAST(@dl_n AS SIGNED)"
        ))
    }

    /// Ends a read or permit hold of `owner` without the name's row lock,
    /// then reads whom the holds left let in ([`Statements::wake_set`]).
    /// Taking a hold away admits no one by itself: a look that read it
    /// still there refuses, and its waiter's sleep reads the rule again
    /// (see the `sleep` statement); what needs the lock is lowering the
    /// marker ([`Statements::settle_marker`]), asked for when no hold is
    /// left under a live marker, or when the ended hold was the longest.
    /// The hold and its spent place are found by a plain read and deleted
    /// by primary key. Rows: the waiters to wake, then
    /// [`Statements::released`].
    pub fn release_unlocked(&self, name: &[u8], owner: &str, wake: bool) -> SqlStr {
        if self.call.load(Relaxed) {
            return self.call_release_unlocked(name, owner, wake);
        }
        let (h, n) = (self.holds(), bytes(name));
        let wake = self.wake_set(&n, "@dl_n > 0", wake);
        let mine =
            format!("name = {n} AND owner = '{owner}' AND NOT waiting AND expires_at > {NOW}");
        let answer = self.released(&n, "@dl_n", "@dl_until");
        // The hold and its spent place go in one statement, which takes
        // their row locks in the key's order, as a sweep's scan does: two
        // deletes in turn could each wait for the other's.
        safe(format!(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;
             SELECT COUNT(*), MAX(fence), MAX(expires_at), (SELECT p.owner FROM {h} AS p
                 WHERE p.name = {n} AND p.waiting
                   AND p.fence = (SELECT MAX(fence) FROM {h} WHERE {mine}) LIMIT 1)
             INTO @dl_n, @dl_granted, @dl_until, @dl_from FROM {h} WHERE {mine};
             DELETE FROM {h} WHERE name = {n} AND owner IN ('{owner}', @dl_from)
               AND IF(owner = '{owner}', NOT waiting, waiting AND fence = @dl_granted);
             COMMIT;
             {wake}
             {answer}"
        ))
    }

    /// The last row of a release without the lock of `n`, which ended
    /// `count` holds, the longest until `until` (SQL expressions): the
    /// count, the live holds left, whether the marker is live, and
    /// whether it ends no later than the ended hold (which was then the
    /// longest, and the marker may come down to the next).
    pub(super) fn released(&self, n: &str, count: &str, until: &str) -> String {
        let (t, h) = (&self.table, self.holds());
        format!(
            "SELECT CAST({count} AS SIGNED),
               (SELECT COUNT(*) FROM {h} WHERE name = {n} AND NOT waiting AND expires_at > {NOW}),
               CAST(COALESCE((SELECT expires_at > {NOW} FROM `{t}`
                 WHERE name = {n} AND owner LIKE '~%'), FALSE) AS SIGNED),
               CAST(COALESCE((SELECT expires_at <= {until} FROM `{t}`
                 WHERE name = {n} AND owner LIKE '~%'), FALSE) AS SIGNED)"
        )
    }

    /// Lowers the marker of `name` to the end of its longest live hold,
    /// under the row's lock: a statement after the lock reads every hold
    /// granted before it, and a grant after it raises the marker again.
    pub fn settle_marker(&self, name: &[u8]) -> SqlStr {
        let (t, n) = (&self.table, bytes(name));
        let until = self.marker_until(&n, NOW);
        safe(format!(
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;
             SELECT COUNT(*) INTO @dl_x FROM `{t}` WHERE name = {n} FOR UPDATE;
             UPDATE `{t}` SET expires_at = {until}
             WHERE name = {n} AND owner LIKE '~%' AND expires_at > {NOW};
             COMMIT"
        ))
    }

    /// Extends every shared lease of the batch that still holds, by
    /// `ttl_us`, and the markers of their names; the names' rows are
    /// locked first, in one scan of the primary key (in name order), so
    /// that two renewals never wait for each other. Rows back: `CONCAT(owner, name)` of the leases held
    /// after it, which are those it extended.
    pub fn extend_shared(&self, batch: &Batch, ttl_us: u64) -> SqlStr {
        let (t, h, ttl) = (&self.table, self.holds(), after(ttl_us));
        let (names, owned) = (&batch.names, &batch.owned);
        let mine = format!(
            "name IN ({names}) AND CONCAT(owner, name) IN ({owned}) AND NOT waiting AND expires_at > {NOW}"
        );
        let mut s = String::new();
        let _ = write!(
            s,
            "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION;
             SELECT COUNT(*) INTO @dl_n FROM `{t}` WHERE name IN ({names}) FOR UPDATE;
             UPDATE {h} SET expires_at = {ttl} WHERE {mine};
             UPDATE `{t}` AS l SET expires_at = GREATEST(expires_at, COALESCE((SELECT MAX(x.expires_at)
               FROM {h} AS x WHERE x.name = l.name AND NOT x.waiting AND x.expires_at > {NOW}), expires_at))
             WHERE name IN ({names}) AND owner LIKE '~%';
             COMMIT;
             SELECT CONCAT(owner, name) FROM {h} WHERE {mine}"
        );
        safe(s)
    }
}

/// One row (after the waiters to wake, for a change): the count or value.
impl SharedStatements for Statements {
    type Stmt = SqlStr;

    /// Also sets the marker's expiry to the longest hold left. Rows: the
    /// waiters to wake ([`Statements::wake_set`]), then the count. A
    /// waiter that gave up has deleted its place: nothing comes back. The
    /// hold's fence is read before the hold goes; the place is found by a
    /// plain read and changed by its primary key, so that a release does
    /// not lock the name's rows one by one.
    fn release_shared(
        &self,
        name: &[u8],
        owner: &str,
        waiter: &str,
        place_us: u64,
        wake: bool,
    ) -> SqlStr {
        let (t, h, n) = (&self.table, self.holds(), bytes(name));
        let begin = self.begin(&n);
        let wake = self.wake_set(&n, "@dl_n > 0", wake);
        let mine =
            format!("name = {n} AND owner = '{owner}' AND NOT waiting AND expires_at > {NOW}");
        let until = self.marker_until(&n, NOW);
        let (place, from) = (after(place_us), "waiting AND fence = @dl_granted");
        safe(format!(
            "{begin}
             SELECT COUNT(*), MAX(fence), (SELECT p.owner FROM {h} AS p WHERE p.name = {n}
                 AND p.waiting AND p.fence = (SELECT MAX(fence) FROM {h} WHERE {mine}) LIMIT 1)
             INTO @dl_n, @dl_granted, @dl_from FROM {h} WHERE {mine};
             DELETE FROM {h} WHERE {mine};
             UPDATE {h} SET expires_at = {place}, fence = 0
             WHERE name = {n} AND owner = '{waiter}' AND {from};
             DELETE FROM {h} WHERE name = {n} AND owner = @dl_from AND owner <> '{waiter}' AND {from};
             UPDATE `{t}` SET expires_at = {until} WHERE name = {n} AND owner LIKE '~%' AND @dl_n > 0;
             COMMIT;
             {wake}
             SELECT CAST(@dl_n AS SIGNED)"
        ))
    }

    fn hold_shared(&self, name: &[u8], owner: &str, hold_owner: &str, hold_us: u64) -> SqlStr {
        let (t, h, n, hold) = (&self.table, self.holds(), bytes(name), after(hold_us));
        let begin = self.begin(&n);
        let mine =
            format!("name = {n} AND owner = '{owner}' AND NOT waiting AND expires_at > {NOW}");
        let until = self.marker_until(&n, &hold);
        safe(format!(
            "{begin}
             SET @dl_n = (SELECT COUNT(*) FROM {h} WHERE {mine});
             UPDATE {h} SET owner = '{hold_owner}', expires_at = {hold} WHERE {mine};
             UPDATE `{t}` SET expires_at = {until} WHERE name = {n} AND owner LIKE '~%' AND @dl_n > 0;
             COMMIT;
             SELECT CAST(@dl_n AS SIGNED)"
        ))
    }

    fn downgrade(
        &self,
        name: &[u8],
        writer: &str,
        reader: &str,
        ttl_us: u64,
        holder: &str,
    ) -> SqlStr {
        let (t, h, n, ttl) = (&self.table, self.holds(), bytes(name), after(ttl_us));
        let who = bytes(holder.as_bytes());
        let begin = self.begin(&n);
        safe(format!(
            "{begin}
             SET @dl_w = EXISTS (SELECT 1 FROM {h} WHERE name = {n} AND owner = '{writer}'
               AND mode = 'w' AND NOT waiting AND expires_at > {NOW})
               AND EXISTS (SELECT 1 FROM `{t}` WHERE name = {n} AND owner = '~rw');
             UPDATE `{t}` SET expires_at = GREATEST(expires_at, {ttl}),
               version = GREATEST(version + 1, {CLOCK}) WHERE name = {n} AND @dl_w;
             SET @dl_fence = IF(@dl_w, (SELECT version FROM `{t}` WHERE name = {n}), NULL);
             INSERT INTO {h} (name, owner, mode, kind, fence, expires_at, waiting, since, holder)
               SELECT {n}, '{reader}', 'r', '~rw', @dl_fence, {ttl}, FALSE, 0, {who} FROM DUAL WHERE @dl_w;
             COMMIT;
             SELECT CAST(@dl_fence AS SIGNED)"
        ))
    }

    /// Rows: the waiters to wake, then the count.
    fn clear_shared(&self, name: &[u8], wake: bool) -> SqlStr {
        let (t, h, n) = (&self.table, self.holds(), bytes(name));
        let begin = self.begin(&n);
        let wake = self.wake_set(&n, "@dl_n > 0", wake);
        safe(format!(
            "{begin}
             DELETE FROM {h} WHERE name = {n} AND NOT waiting;
             UPDATE `{t}` SET expires_at = {NOW} WHERE name = {n} AND owner LIKE '~%' AND expires_at > {NOW};
             SET @dl_n = ROW_COUNT();
             COMMIT;
             {wake}
             SELECT CAST(@dl_n AS SIGNED)"
        ))
    }
}
