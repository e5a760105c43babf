//! The statements of a mutex's acquire and release, and of the release's
//! announcement to the waiters (see `wake.rs` for the shared kinds').

use super::{Args, CLOCK_US, NOW, RELEASED, Statements, Stmt, micros};

impl Statements {
    /// One statement, race-free: the insert of a missing row, or the update
    /// of an expired or released one, returns the new fencing token;
    /// otherwise the row as the statement's snapshot saw it (its owner and
    /// µs left: a marker for a name held as another kind of lock). One row
    /// either way, unless the row appeared after the snapshot: then none,
    /// and the lock is held. Concurrent first inserts of a name are
    /// ordered by the primary key: the second waits, then finds the row
    /// held. The update's condition and values are judged after any wait
    /// for the row, on the clock as it is then.
    ///
    /// `waiter` (not `""`) is a queued waiter's token: unless granted, it
    /// keeps (or takes) a place of `place_us` in the name's queue, so
    /// that a release wakes the first place only; granted, it gives the
    /// place up. `ON CONFLICT DO UPDATE` locks the row even when its
    /// condition fails, so the place is written under the row's lock. A
    /// place that was not live before (or could lapse before a release
    /// that waits for this lock is done: two statement timeouts) also
    /// counts one more place in the row, where the table counts them: a
    /// release that waited for this lock reads the queue with a snapshot
    /// taken before the place's commit, but frees the row as it is after,
    /// and so learns that a place came that it cannot see (see
    /// [`Statements::release_and_notify`]). (A row inserted by another
    /// after this statement's snapshot, a name's first or one purged and
    /// made again, is not counted in: that waiter is let in by its next
    /// look.)
    pub fn acquire(
        &self,
        name: &[u8],
        owner: &str,
        ttl_us: u64,
        holder: &str,
        waiter: &str,
        place_us: u64,
    ) -> Stmt {
        let mut a = Args::default();
        let (t, n, o) = (&self.table, a.bytes(name), a.token(owner));
        let (h, ttl) = (a.text(holder), a.micros(ttl_us));
        let queue = if waiter.is_empty() {
            String::new()
        } else {
            let (q, me, place) = (&self.holds, a.token(waiter), a.micros(place_us));
            let swept = self.swept();
            let counted = if self.places {
                let margin = micros(self.timeout_ms.saturating_mul(2000));
                format!(
                    ",
                 was AS (SELECT 1 FROM {q} WHERE name = {n} AND owner = {me} AND waiting
                   AND since >= 0 AND expires_at > {NOW} + {margin}),
                 counted AS (UPDATE {t} SET places = places + 1 WHERE name = {n}
                   AND EXISTS (SELECT 1 FROM queued) AND NOT EXISTS (SELECT 1 FROM was))"
                )
            } else {
                String::new()
            };
            format!(
                ", gone AS (DELETE FROM {q} WHERE name = {n} AND (
                     (owner = {me} AND since >= 0 AND EXISTS (SELECT 1 FROM a))
                     OR (owner <> {me} AND {swept}))),
                 queued AS (INSERT INTO {q} AS x (name, owner, mode, kind, fence, expires_at, waiting, since)
                   SELECT {n}, {me}, 'x', 'x', 0, {NOW} + {place}, true, {CLOCK_US}
                   WHERE NOT EXISTS (SELECT 1 FROM a) AND NOT EXISTS (SELECT 1 FROM {t}
                     WHERE name = {n} AND owner LIKE '~%' AND expires_at > {NOW})
                   ON CONFLICT (name, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at,
                     since = CASE WHEN x.expires_at > {NOW} THEN x.since ELSE EXCLUDED.since END
                   WHERE x.since >= 0 RETURNING 1){counted}"
            )
        };
        self.prepared(
            a,
            format!(
            "WITH a AS (INSERT INTO {t} AS l (name, owner, fence, expires_at, acquired_at, holder)
             VALUES ({n}, {o}, {CLOCK_US}, {NOW} + {ttl}, {NOW}, {h})
             ON CONFLICT (name) DO UPDATE SET
               owner = EXCLUDED.owner,
               fence = GREATEST(l.fence + 1, {CLOCK_US}),
               expires_at = {NOW} + {ttl},
               acquired_at = {NOW},
               holder = EXCLUDED.holder
             WHERE l.expires_at <= {NOW}
             RETURNING fence){queue}
             SELECT fence, NULL::text, NULL::bigint FROM a
             UNION ALL
             SELECT NULL, owner, (extract(epoch FROM expires_at - {NOW}) * 1000000)::bigint
             FROM {t} WHERE name = {n} AND NOT EXISTS (SELECT 1 FROM a)"
        ),
        )
    }

    /// Frees the row `owner` holds; the row stays, so its token keeps
    /// counting up.
    pub fn release(&self, name: &[u8], owner: &str) -> Stmt {
        let mut a = Args::default();
        let (t, n, o) = (&self.table, a.bytes(name), a.token(owner));
        self.prepared(
            a,
            format!(
                "UPDATE {t} SET owner = '', expires_at = {NOW}
             WHERE name = {n} AND owner = {o} AND expires_at > {NOW}"
            ),
        )
    }

    /// Where releases of this table are announced.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    /// A notification on the table's channel that no release sends
    /// (`probe:<token>`, a token of hex digits), for a listener to hear.
    pub fn probe(&self, token: &str) -> Stmt {
        self.bounded(format!(
            "SELECT pg_notify('{}', 'probe:{token}')",
            self.channel
        ))
    }

    /// [`Statements::release`], announcing the release on the table's
    /// channel, in the same transaction: the announcement goes out at its
    /// commit, as `<name in hex>:<token>`, naming the first live place in
    /// the name's queue, the only waiter a release wakes (no place, no
    /// announcement: a notifying commit takes a lock that every notifying
    /// commit of the database shares). One row back when released.
    ///
    /// Where the table counts places ([`Statements::counting_places`]),
    /// one statement, which reads the queue with its own snapshot: that
    /// lacks a place written by an acquire whose lock on the row this
    /// release waited for, but such a place counted itself in the row,
    /// which the release frees as it is after that wait. The row: whether
    /// a place came that the snapshot lacks (then
    /// [`Statements::announce_head`] after the commit), and the token
    /// announced. Else two statements, the queue read in the second,
    /// whose snapshot comes after the lock; the release says whether it
    /// matched in a setting of its transaction (`dlock.released`). The
    /// row: the token, `''` for none.
    pub fn release_and_notify(&self, name: &[u8], owner: &str) -> Stmt {
        let mut a = Args::default();
        let (t, c, n, o) = (&self.table, &self.channel, a.bytes(name), a.token(owner));
        let head = self.head(&n);
        if !self.places {
            return self.prepared(
                a,
                format!(
                    "WITH released AS (
               UPDATE {t} SET owner = '', expires_at = {NOW}
               WHERE name = {n} AND owner = {o} AND expires_at > {NOW}
               RETURNING 1)
             SELECT FROM (SELECT set_config('{RELEASED}', count(*)::text, true) FROM released) AS r;
             SELECT who, CASE WHEN who <> ''
               THEN pg_notify('{c}', encode({n}, 'hex') || ':' || who) END::text
             FROM (SELECT COALESCE(({head}), '') AS who) AS head
             WHERE current_setting('{RELEASED}') = '1'"
                ),
            );
        }
        self.prepared(
            a,
            format!(
                "WITH seen AS (SELECT places FROM {t} WHERE name = {n}),
             released AS (
               UPDATE {t} SET owner = '', expires_at = {NOW}
               WHERE name = {n} AND owner = {o} AND expires_at > {NOW}
               RETURNING places),
             head AS ({head})
             SELECT r.places IS DISTINCT FROM (SELECT places FROM seen), h.who,
               CASE WHEN h.who IS NOT NULL
                 THEN pg_notify('{c}', encode({n}, 'hex') || ':' || h.who) END::text
             FROM released AS r LEFT JOIN head AS h ON true"
            ),
        )
    }

    /// The first live place in the queue of `n` (a value as the statement
    /// has it), as `who`.
    fn head(&self, n: &str) -> String {
        format!(
            "SELECT owner AS who FROM {q}
               WHERE name = {n} AND waiting AND mode = 'x' AND expires_at > {NOW} AND since >= 0
               ORDER BY since, owner LIMIT 1",
            q = self.holds
        )
    }

    /// Announces the first live place in the queue of `name`, as
    /// [`Statements::release_and_notify`] does, read after the release's
    /// commit. One row when there is one: its token.
    pub fn announce_head(&self, name: &[u8]) -> Stmt {
        let mut a = Args::default();
        let (c, n) = (&self.channel, a.bytes(name));
        let head = self.head(&n);
        self.prepared(
            a,
            format!(
                "SELECT who, pg_notify('{c}', encode({n}, 'hex') || ':' || who)::text
             FROM ({head}) AS h"
            ),
        )
    }
}
