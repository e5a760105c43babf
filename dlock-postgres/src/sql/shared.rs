//! The statements of reader-writer locks and semaphores.
//!
//! A name held that way keeps a *marker* in its row of the lock table as
//! owner (`~rw`, or `~s<N>` for a semaphore of N), with the expiry of its
//! longest hold, so that a mutex's acquire finds it held, and its fence
//! counts every grant of every kind. The holds and the waiters are rows of
//! `<table>_holds` (mode `r`, `w` or `p`; a waiter's row expires when its
//! place lapses or is granted, and `since` orders the queue; a granted
//! place stays, marked with the grant's fence, until its hold ends, so that
//! an undone grant can give it back). A mutex waiter's place
//! (mode `x`) is there too, and these statements pass it by: a mutex's
//! queue only decides whom its releases wake.
//!
//! Every call that grants, or changes what a grant reads (the markers, a
//! place given back), first locks the name's row (the row made if
//! missing), in a statement of its own: under read
//! committed the next statement of the same transaction reads with a
//! snapshot taken after that lock, so it sees every change of every
//! earlier holder of the lock. A release of a read or a permit only takes
//! a hold away and needs no lock. Every change that may let a waiter in
//! commits, then reads whom to wake ([`Statements::then_wake`]). One round
//! trip still: the statements go as one simple query. The changes that
//! wake, and the release without the lock, are in `wake.rs`.

use std::fmt::Write;

use dlock_core::Mode;
use dlock_sql::SharedStatements;

use super::{Args, CLOCK_US, NOW, Statements, Stmt, bytes};

/// One shared lease of a batch renewal.
pub(crate) struct SharedRenewal<'a> {
    pub name: &'a [u8],
    pub owner: &'a str,
    pub ttl_us: u64,
    pub marker: &'a str,
}

impl Statements {
    /// How many statements of a change of a shared kind may each wait for
    /// their statement timeout (see `Stmt::waits`): the one that locks the
    /// row, and the change, each with its `PREPARE` when prepared.
    pub fn shared_waits(&self) -> u32 {
        2 * (1 + u32::from(self.prepare))
    }

    /// Locks the row of `n`, making it if missing, in one statement: an
    /// `ON CONFLICT DO UPDATE` locks the row it meets even when its
    /// condition (never true here) lets it change nothing, so it writes no
    /// new version of the row. Its lock is `FOR NO KEY UPDATE`, which
    /// every writer of the row takes too (no statement changes a key).
    /// Here and below, the helpers take a statement's values as it has them
    /// (parameters).
    fn lock_row(&self, n: &str) -> String {
        let t = &self.table;
        format!(
            "INSERT INTO {t} AS l (name, owner, fence, expires_at, acquired_at, holder)
             VALUES ({n}, '', {CLOCK_US}, {NOW}, {NOW}, '')
             ON CONFLICT (name) DO UPDATE SET owner = l.owner WHERE false; "
        )
    }

    /// The marker's expiry once `gone` (an owner) no longer holds: that of
    /// the longest live hold left, at least `floor`.
    pub(super) fn marker_until(&self, n: &str, gone: &str, floor: &str) -> String {
        format!(
            "GREATEST(COALESCE((SELECT max(expires_at) FROM {h} WHERE name = {n} AND NOT waiting
               AND expires_at > {NOW} AND owner <> {gone}), {NOW}), {floor})",
            h = self.holds
        )
    }

    /// The CTEs of the acquire's rule for `me` (`""`: behind every waiter)
    /// on the name `n` asked as `mode`: `hs` (the live holds), `q` (the
    /// live places), `ahead` (the places ahead of `me`'s), and `v`: the kind
    /// the name is in use as when another (`conflict`), and whether the
    /// rule lets `me` in (`admit`).
    fn rule(&self, n: &str, mode: Mode, me: &str) -> String {
        let (t, h, k) = (&self.table, &self.holds, mode.marker());
        let admit = match mode.code() {
            "w" => "NOT EXISTS (SELECT 1 FROM hs) AND NOT EXISTS (SELECT 1 FROM ahead)".to_owned(),
            "r" => "NOT EXISTS (SELECT 1 FROM hs WHERE mode = 'w') \
                    AND NOT EXISTS (SELECT 1 FROM ahead WHERE mode = 'w')"
                .to_owned(),
            _ => format!(
                "(SELECT count(*) FROM hs) + (SELECT count(*) FROM ahead) < {}",
                mode.permits()
            ),
        };
        format!(
            "r AS (SELECT owner, expires_at > {NOW} AS live FROM {t} WHERE name = {n}),
             hs AS (SELECT mode, expires_at FROM {h}
                    WHERE name = {n} AND NOT waiting AND expires_at > {NOW}),
             q AS (SELECT owner, mode, kind, since FROM {h}
                   WHERE name = {n} AND waiting AND mode <> 'x' AND expires_at > {NOW}
                     AND since >= 0),
             mine AS (SELECT since, owner FROM q WHERE owner = {me}),
             ahead AS (SELECT mode, kind FROM q WHERE owner <> {me} AND (NOT EXISTS (SELECT 1 FROM mine)
                       OR (since, owner) < (SELECT since, owner FROM mine))),
             v AS (SELECT COALESCE(
                     (SELECT CASE WHEN NOT live THEN NULL WHEN owner LIKE '~%'
                             THEN NULLIF(owner, '{k}') ELSE 'x' END FROM r),
                     (SELECT kind FROM ahead WHERE kind <> '{k}' LIMIT 1)) AS conflict,
                   {admit} AS admit)"
        )
    }

    /// Queues `waiter` for `name` asked as `mode`, without the lock that
    /// changes of the name hold while they run, then reads, after the
    /// commit and in the same round trip, whether the acquire's rule lets
    /// the waiter in now. The read sees every change committed before it,
    /// and every change that may let a waiter in reads whom to wake after
    /// its own commit ([`Statements::then_wake`]), so that it sees this
    /// place if committed first: one of the two sees the other. In a crowd
    /// most first looks are refused, and none holds up a change. No place
    /// while the name is in use as another kind, or another kind waits: it
    /// would refuse the right kind's waiters until given up. The place is
    /// written again as it is if the query is sent again (see `pool.rs`),
    /// so its parts after the commit are prepared too; it is a transaction
    /// block of its own, as in [`Statements::then_wake`]. The name's row is
    /// made only if the statement's snapshot lacks it: `ON CONFLICT` alone
    /// checks the row's newest version, and waits for the grant that is
    /// changing it to end (a millisecond a look in a crowd). The last row: the kind
    /// the name is in use as when another, whether the rule lets the
    /// waiter in, and the µs until the first hold ends.
    pub fn enqueue_shared(&self, name: &[u8], mode: Mode, waiter: &str, place_us: u64) -> Stmt {
        let mut a = Args::default();
        let (t, h, n, me) = (&self.table, &self.holds, a.bytes(name), a.token(waiter));
        let (m, k, place) = (mode.code(), mode.marker(), a.micros(place_us));
        let (rule, limit) = (self.rule(&n, mode, &me), self.limit_again());
        self.prepared(
            a,
            format!(
                "BEGIN;
             INSERT INTO {t} (name, owner, fence, expires_at, acquired_at, holder)
             SELECT {n}, '', {CLOCK_US}, {NOW}, {NOW}, ''
             WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE name = {n}) ON CONFLICT (name) DO NOTHING;
             INSERT INTO {h} AS x (name, owner, mode, kind, fence, expires_at, waiting, since)
             SELECT {n}, {me}, '{m}', '{k}', 0, {NOW} + {place}, true, {CLOCK_US}
             WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE name = {n} AND expires_at > {NOW}
               AND owner <> '' AND owner <> '{k}')
               AND NOT EXISTS (SELECT 1 FROM {h} WHERE name = {n} AND waiting AND mode <> 'x'
                 AND since >= 0 AND expires_at > {NOW} AND kind <> '{k}')
             ON CONFLICT (name, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at,
               fence = 0, since = CASE WHEN x.expires_at > {NOW} OR x.fence > 0
                 THEN x.since ELSE EXCLUDED.since END
             WHERE x.since >= 0;
             COMMIT;
             {limit}
             WITH {rule}
             SELECT conflict, admit,
               (SELECT (extract(epoch FROM min(expires_at) - {NOW}) * 1000000)::bigint FROM hs)
             FROM v"
            ),
        )
    }

    /// An acquire of a shared kind by `owner`, queued as `waiter` (`""`:
    /// behind every waiter, and not queued) with a place of `place_us`.
    /// One row: the fencing token when granted, the kind the name is in
    /// use as when that is another, and the µs until the first hold ends.
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
    ) -> Stmt {
        let mut a = Args::default();
        let (m, k) = (mode.code(), mode.marker());
        let (t, h, n, o) = (&self.table, &self.holds, a.bytes(name), a.token(owner));
        let (ttl, who) = (a.micros(ttl_us), a.text(holder));
        let (me, place) = (a.token(waiter), a.micros(place_us));
        let (lock, swept) = (self.lock_row(&n), self.swept());
        let rule = self.rule(&n, mode, &me);
        self.prepared(a, format!(
            "{lock}
             WITH {rule},
             f AS (UPDATE {t} SET owner = '{k}', fence = GREATEST(fence + 1, {CLOCK_US}),
                     expires_at = CASE WHEN owner = '{k}' AND expires_at > {NOW}
                       THEN GREATEST(expires_at, {NOW} + {ttl}) ELSE {NOW} + {ttl} END,
                     acquired_at = {NOW}, holder = {who}
                   WHERE name = {n} AND (SELECT admit AND conflict IS NULL FROM v)
                   RETURNING fence),
             g AS (INSERT INTO {h} (name, owner, mode, kind, fence, expires_at, waiting, since, holder)
                   SELECT {n}, {o}, '{m}', '{k}', fence, {NOW} + {ttl}, false, 0, {who} FROM f),
             gone AS (DELETE FROM {h} WHERE name = {n} AND (
                        (owner = {me} AND waiting AND since >= 0 AND EXISTS (SELECT 1 FROM f)
                          AND NOT EXISTS (SELECT 1 FROM mine))
                        OR (owner <> {me} AND {swept}))),
             kept AS (UPDATE {h} SET expires_at = {NOW}, fence = (SELECT fence FROM f)
                   WHERE name = {n} AND owner = {me} AND waiting AND since >= 0
                     AND EXISTS (SELECT 1 FROM mine) AND EXISTS (SELECT 1 FROM f)),
             queued AS (INSERT INTO {h} AS x (name, owner, mode, kind, fence, expires_at, waiting, since)
                   SELECT {n}, {me}, '{m}', '{k}', 0, {NOW} + {place}, true, {CLOCK_US}
                   WHERE {me} <> '' AND NOT EXISTS (SELECT 1 FROM f)
                     AND (SELECT conflict IS NULL FROM v)
                   ON CONFLICT (name, owner) DO UPDATE SET expires_at = EXCLUDED.expires_at,
                     fence = 0, since = CASE WHEN x.expires_at > {NOW} OR x.fence > 0
                       THEN x.since ELSE EXCLUDED.since END
                   WHERE x.since >= 0)
             SELECT (SELECT fence FROM f), (SELECT conflict FROM v),
               (SELECT (extract(epoch FROM min(expires_at) - {NOW}) * 1000000)::bigint FROM hs)"
        ))
    }

    /// Gives a waiter's place up under the name's row lock (a grant from
    /// that place cannot cross it), announcing the waiters it may let in
    /// (a writer that leaves may let readers in). Rows: how many places it
    /// gave up, then the waiters to wake ([`Statements::then_wake`]).
    pub fn abandon(&self, name: &[u8], waiter: &str, notify: bool) -> Stmt {
        let mut a = Args::default();
        let (n, me) = (a.bytes(name), a.token(waiter));
        let (lock, tombstone) = (self.lock_row(&n), self.tombstone(&n, &me));
        let change =
            format!("{lock} WITH t AS ({tombstone}) SELECT count(*) FROM t WHERE NOT inserted");
        self.then_wake(a, &n, &change, notify)
    }

    /// Extends every shared lease of the batch that still holds, and the
    /// markers of their names; the names' rows are locked first, in name
    /// order, so that two renewals never wait for each other. Rows back:
    /// the names and owners extended.
    pub fn extend_shared(&self, batch: &[SharedRenewal<'_>]) -> Stmt {
        let (t, h) = (&self.table, &self.holds);
        let mut values = String::new();
        let mut names: Vec<&[u8]> = batch.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        let names: Vec<String> = names.into_iter().map(bytes).collect();
        for (i, r) in batch.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let _ = write!(
                values,
                "{sep}({}, '{}', {}::bigint, '{}')",
                bytes(r.name),
                r.owner,
                r.ttl_us,
                r.marker
            );
        }
        let names = names.join(", ");
        self.bounded(format!(
            "SELECT FROM {t} WHERE name IN ({names}) ORDER BY name FOR UPDATE;
             WITH v(name, owner, ttl, kind) AS (VALUES {values}),
             e AS (UPDATE {h} AS x SET expires_at = {NOW} + v.ttl * interval '1 microsecond'
                   FROM v WHERE x.name = v.name AND x.owner = v.owner AND NOT x.waiting
                     AND x.expires_at > {NOW}
                   RETURNING x.name, x.owner, x.expires_at, v.kind),
             m AS (UPDATE {t} AS l SET expires_at = GREATEST(l.expires_at, u.until)
                   FROM (SELECT name, kind, max(expires_at) AS until FROM e GROUP BY name, kind) AS u
                   WHERE l.name = u.name AND l.owner = u.kind)
             SELECT encode(name, 'hex'), owner FROM e"
        ))
    }
}

impl SharedStatements for Statements {
    type Stmt = Stmt;

    /// Also sets the marker's expiry to the longest hold left. Rows: the
    /// count, then the waiters to wake ([`Statements::then_wake`]). A
    /// waiter that gave up has left a tombstone (`since` -1) instead of
    /// its place, which stays.
    fn release_shared(
        &self,
        name: &[u8],
        owner: &str,
        waiter: &str,
        place_us: u64,
        wake: bool,
    ) -> Stmt {
        let mut a = Args::default();
        let (t, h, n, o) = (&self.table, &self.holds, a.bytes(name), a.token(owner));
        let (me, place) = (a.token(waiter), a.micros(place_us));
        let (lock, until) = (self.lock_row(&n), self.marker_until(&n, &o, NOW));
        let from = "waiting AND since >= 0 AND fence > 0 AND fence IN (SELECT granted FROM gone)";
        let change = format!(
            "{lock}
             WITH gone AS (DELETE FROM {h} WHERE name = {n} AND owner = {o}
                             AND NOT waiting AND expires_at > {NOW} RETURNING fence AS granted),
             back AS (UPDATE {h} SET expires_at = {NOW} + {place}, fence = 0
                      WHERE name = {n} AND owner = {me} AND {from}),
             spent AS (DELETE FROM {h} WHERE name = {n} AND owner <> {me} AND {from}),
             m AS (UPDATE {t} SET expires_at = {until}
                   WHERE name = {n} AND owner LIKE '~%' AND EXISTS (SELECT 1 FROM gone))
             SELECT count(*) FROM gone"
        );
        self.then_wake(a, &n, &change, wake)
    }

    fn hold_shared(&self, name: &[u8], owner: &str, hold_owner: &str, hold_us: u64) -> Stmt {
        let mut a = Args::default();
        let (t, h, n, o) = (&self.table, &self.holds, a.bytes(name), a.token(owner));
        let (ho, hold) = (a.token(hold_owner), a.micros(hold_us));
        let until = self.marker_until(&n, &o, &format!("{NOW} + {hold}"));
        let lock = self.lock_row(&n);
        self.prepared(
            a,
            format!(
                "{lock}
             WITH x AS (UPDATE {h} SET owner = {ho}, expires_at = {NOW} + {hold}
                        WHERE name = {n} AND owner = {o} AND NOT waiting
                          AND expires_at > {NOW} RETURNING 1),
             m AS (UPDATE {t} SET expires_at = {until}
                   WHERE name = {n} AND owner LIKE '~%' AND EXISTS (SELECT 1 FROM x))
             SELECT count(*) FROM x"
            ),
        )
    }

    /// No row when not granted.
    fn downgrade(
        &self,
        name: &[u8],
        writer: &str,
        reader: &str,
        ttl_us: u64,
        holder: &str,
    ) -> Stmt {
        let mut a = Args::default();
        let (t, h, n) = (&self.table, &self.holds, a.bytes(name));
        let (w, r) = (a.token(writer), a.token(reader));
        let (ttl, who) = (a.micros(ttl_us), a.text(holder));
        let lock = self.lock_row(&n);
        self.prepared(a, format!(
            "{lock}
             WITH w AS (SELECT 1 FROM {h} WHERE name = {n} AND owner = {w} AND mode = 'w'
                        AND NOT waiting AND expires_at > {NOW}),
             f AS (UPDATE {t} SET fence = GREATEST(fence + 1, {CLOCK_US}),
                     expires_at = GREATEST(expires_at, {NOW} + {ttl})
                   WHERE name = {n} AND owner = '~rw' AND EXISTS (SELECT 1 FROM w) RETURNING fence),
             g AS (INSERT INTO {h} (name, owner, mode, kind, fence, expires_at, waiting, since, holder)
                   SELECT {n}, {r}, 'r', '~rw', fence, {NOW} + {ttl}, false, 0, {who} FROM f)
             SELECT fence FROM f"
        ))
    }

    /// Rows: the count, then the waiters to wake (see
    /// [`Statements::then_wake`]).
    fn clear_shared(&self, name: &[u8], wake: bool) -> Stmt {
        let mut a = Args::default();
        let (t, h, n) = (&self.table, &self.holds, a.bytes(name));
        let lock = self.lock_row(&n);
        let change = format!(
            "{lock}
             WITH d AS (DELETE FROM {h} WHERE name = {n} AND NOT waiting),
             m AS (UPDATE {t} SET expires_at = {NOW}
                   WHERE name = {n} AND owner LIKE '~%' AND expires_at > {NOW} RETURNING 1)
             SELECT count(*) FROM m"
        );
        self.then_wake(a, &n, &change, wake)
    }
}
