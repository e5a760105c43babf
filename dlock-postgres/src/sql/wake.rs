//! Whom a change of a reader-writer lock or a semaphore lets in, read
//! after the change's commit and announced; and the release of a read or
//! a permit, which takes no lock (see `shared.rs` for the rest).

use super::{Args, NOW, Statements, Stmt};

impl Statements {
    /// The CTEs `q` (the live waiters of `n`, in order), `c` (the live
    /// holds: `held`, of which writes `held_w`) and `wake` (`who`: the
    /// tokens, comma-separated, of those the acquire's rule lets in: the
    /// first writer when nothing is held, the readers before the first
    /// writer when no writer holds, the waiters of a semaphore that fit
    /// beside its holds). Only they look again: a waiter woken to be
    /// refused would take the name's row lock for nothing, in every
    /// grant's way.
    pub(super) fn wake_set(&self, n: &str) -> String {
        format!(
            "q AS (SELECT owner, mode, kind, row_number() OVER w AS i,
                     count(*) FILTER (WHERE mode = 'w') OVER w AS writers
                   FROM {h} WHERE name = {n} AND waiting AND mode <> 'x'
                     AND expires_at > {NOW} AND since >= 0
                   WINDOW w AS (ORDER BY since, owner)),
             c AS (SELECT count(*) AS held, count(*) FILTER (WHERE mode = 'w') AS held_w
                   FROM {h} WHERE name = {n} AND NOT waiting AND expires_at > {NOW}),
             wake AS (SELECT string_agg(owner, ',') AS who FROM q, c
                      WHERE (mode = 'w' AND i = 1 AND held = 0)
                        OR (mode = 'r' AND writers = 0 AND held_w = 0)
                        OR i + held <= CASE WHEN mode = 'p' THEN substr(kind, 3)::int END)",
            h = self.holds
        )
    }

    /// A change of a name's holds or queue (`change`: its statements,
    /// the last one answering its count), committed, then a read in a
    /// transaction of its own of whom the holds and places left let in
    /// ([`Statements::wake_set`]), who are announced. Every change that
    /// may let a waiter in reads after its commit, and a waiter's first
    /// look reads the rule after its place's commit: of a change and a
    /// waiter that cross, one sees the other, with no lock between them
    /// (see [`Statements::enqueue_shared`]). Only the change's parts
    /// are prepared, so that a session lacking one fails before the
    /// commit (see `pool.rs`). Rows: the change's, then the live holds left, the
    /// waiters to wake, the count announced, and whether the name's
    /// marker is live. The change is a transaction block of its own
    /// (`BEGIN`): a `COMMIT` that ends the implicit one warns in the
    /// server's log; a failed block is rolled back by `pool.rs`. The read
    /// changes nothing worth a synchronous commit.
    pub(super) fn then_wake(&self, a: Args, n: &str, change: &str, notify: bool) -> Stmt {
        let (t, limit) = (&self.table, self.limit_again());
        let (wake, say) = (self.wake_set(n), self.announce_to(n, notify));
        let before = format!("BEGIN; {change}");
        let main = before.split(';').filter(|p| !p.trim().is_empty()).count() - 1;
        self.prepared_until(
            a,
            format!(
                "{before};
             COMMIT;
             {limit}
             SET LOCAL synchronous_commit = off;
             WITH {wake}
             SELECT (SELECT held FROM c), (SELECT who FROM wake),
               (SELECT count(*) FROM (SELECT {say} FROM wake WHERE who IS NOT NULL) AS z),
               EXISTS (SELECT 1 FROM {t} WHERE name = {n} AND owner LIKE '~%' AND expires_at > {NOW})"
            ),
            main,
        )
    }

    /// `pg_notify` of a change of `n` that may let the waiters of `wake`
    /// in (`<name in hex>:<tokens>`), or nothing without wake-ups. Sent only
    /// when it lets someone in: a notifying commit takes a lock that every
    /// notifying commit of the database shares. A payload is under 8000
    /// bytes: past about 200 tokens the name goes alone, which wakes every
    /// waiter of the name in each process that hears it.
    fn announce_to(&self, n: &str, notify: bool) -> String {
        if notify {
            format!(
                "pg_notify('{}', encode({n}, 'hex') || CASE WHEN octet_length(who) < 7000
                   THEN ':' || who ELSE '' END)",
                self.channel
            )
        } else {
            "1".to_owned()
        }
    }

    /// Ends a read or permit hold of `owner` without the name's row lock,
    /// then reads whom the holds left let in, and announces them
    /// ([`Statements::then_wake`]). A release only takes a hold away,
    /// which admits no one by itself, so it needs no lock; what needs one
    /// is lowering the marker ([`Statements::settle_marker`]), asked for
    /// when the read finds no live hold under a live marker.
    pub fn release_unlocked(&self, name: &[u8], owner: &str, notify: bool) -> Stmt {
        let mut a = Args::default();
        let (h, n, o) = (&self.holds, a.bytes(name), a.token(owner));
        let change = format!(
            "WITH gone AS (DELETE FROM {h} WHERE name = {n} AND owner = {o} AND NOT waiting
                             AND expires_at > {NOW} RETURNING fence),
             spent AS (DELETE FROM {h} WHERE name = {n} AND waiting AND since >= 0 AND fence > 0
                         AND fence IN (SELECT fence FROM gone))
             SELECT count(*) FROM gone"
        );
        self.then_wake(a, &n, &change, notify)
    }

    /// Lowers the marker of `name` to the end of its longest live hold,
    /// under the row's lock: a statement after the lock reads every hold
    /// granted before it, and a grant after it raises the marker again.
    pub fn settle_marker(&self, name: &[u8]) -> Stmt {
        let mut a = Args::default();
        let (t, n) = (&self.table, a.bytes(name));
        let until = self.marker_until(&n, "''", NOW);
        self.prepared(
            a,
            format!(
                "SELECT FROM {t} WHERE name = {n} FOR UPDATE;
             UPDATE {t} SET expires_at = {until}
             WHERE name = {n} AND owner LIKE '~%' AND expires_at > {NOW}"
            ),
        )
    }
}
