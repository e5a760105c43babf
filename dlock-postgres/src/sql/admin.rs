//! What operators and housekeeping read and clear: a page of names
//! (`list`), a name's holder and holds (`inspect`, `holders`), and the
//! purge of ended rows, a slice of pages at a time.

use dlock_core::MAX_HOLDERS;

use super::literal::{Args, micros, successor};
use super::{NOW, Statements, Stmt, bytes};

impl Statements {
    /// A page of rows, held or not, of names after `cursor` that start
    /// with `prefix`, in order: a range of the primary key, so that each
    /// page is bounded work however many released rows the table keeps.
    /// Each row says whether it is held; the caller keeps those.
    pub fn list(&self, prefix: &[u8], cursor: &[u8], limit: usize) -> Stmt {
        let (t, p, c) = (&self.table, bytes(prefix), bytes(cursor));
        let below = match successor(prefix) {
            Some(s) => format!(" AND name < {}", bytes(&s)),
            None => String::new(),
        };
        let (who, shared) = self.holder_of();
        self.bounded(format!(
            "SELECT encode(l.name, 'hex'), {who}, l.fence,
               (extract(epoch FROM l.expires_at - {NOW}) * 1000000)::bigint,
               l.expires_at > {NOW}
             FROM {t} AS l {shared}
             WHERE l.name > {c} AND l.name >= {p}{below}
             ORDER BY l.name LIMIT {limit}"
        ))
    }

    /// The holder of one name.
    pub fn inspect(&self, name: &[u8]) -> Stmt {
        let mut a = Args::default();
        let (t, n) = (&self.table, a.bytes(name));
        let (who, shared) = self.holder_of();
        self.prepared(
            a,
            format!(
            "SELECT {who}, l.fence, (extract(epoch FROM l.expires_at - {NOW}) * 1000000)::bigint
             FROM {t} AS l {shared} WHERE l.name = {n} AND l.expires_at > {NOW}"
        ),
        )
    }

    /// Every hold of one name, the longest first: the rows `inspect`
    /// reads, for a mutex's holder or each live hold of a shared kind.
    pub fn holders(&self, name: &[u8]) -> Stmt {
        let mut a = Args::default();
        let (t, h, n) = (&self.table, &self.holds, a.bytes(name));
        let left = format!("(extract(epoch FROM expires_at - {NOW}) * 1000000)::bigint");
        let sql = format!(
            "SELECT owner, holder, 'x', fence, {left} AS left_us
             FROM {t} WHERE name = {n} AND owner NOT LIKE '~%' AND expires_at > {NOW}
             UNION ALL
             SELECT owner, holder, mode || kind, fence, {left}
             FROM {h} WHERE name = {n} AND NOT waiting AND expires_at > {NOW}
             ORDER BY left_us DESC LIMIT {MAX_HOLDERS}"
        );
        self.prepared(a, sql)
    }

    /// Who holds the row aliased `l`: its owner, holder description and
    /// kind of hold (mode code, then the name's marker): three columns,
    /// and the join they need. For a reader-writer lock or
    /// a semaphore, whose row holds its marker, the hold that lasts
    /// longest speaks (`NULL`s when none is live).
    fn holder_of(&self) -> (&'static str, String) {
        let columns = "CASE WHEN l.owner LIKE '~%' THEN s.owner ELSE l.owner END,
               CASE WHEN l.owner LIKE '~%' THEN s.holder ELSE l.holder END,
               CASE WHEN l.owner LIKE '~%' THEN s.mode || l.owner ELSE 'x' END";
        let join = format!(
            "LEFT JOIN LATERAL (SELECT x.owner, x.holder, x.mode FROM {h} AS x
               WHERE l.owner LIKE '~%' AND x.name = l.name AND NOT x.waiting
                 AND x.expires_at > {NOW}
               ORDER BY x.expires_at DESC LIMIT 1) AS s ON true",
            h = self.holds
        );
        (columns, join)
    }

    /// Deletes up to `limit` rows of the lock table (with `holds`: ended
    /// holds and places of its holds table) whose lease ended over `age_us`
    /// ago, among the table's pages `pages` (first, and how many): no index
    /// leads to expired rows (see `ddl.rs`), so a purge reads the table a
    /// slice at a time, each slice found by place (a TID range scan). The
    /// rows are locked first, skipping any another transaction holds, and
    /// their expiry is judged again once locked. One row: how many it
    /// deleted, and how many pages the table has.
    pub fn purge(&self, holds: bool, age_us: u64, limit: u32, pages: (u64, u64)) -> Stmt {
        let (t, key, columns) = if holds {
            (&self.holds, "(name, owner)", "name, owner")
        } else {
            (&self.table, "name", "name")
        };
        let (age, (first, end)) = (micros(age_us), (pages.0, pages.0 + pages.1));
        // The slice bounds the outer scan too, whatever plan a large
        // `limit` gets.
        let slice = format!("ctid >= '({first},0)'::tid AND ctid < '({end},0)'::tid");
        self.bounded(format!(
            "WITH d AS (DELETE FROM {t} WHERE {slice} AND {key} IN (
               SELECT {columns} FROM {t} WHERE {slice} AND expires_at < {NOW} - {age}
               LIMIT {limit} FOR UPDATE SKIP LOCKED) RETURNING 1)
             SELECT count(*), {} FROM d",
            self.pages_of(t)
        ))
    }

    /// How many pages the lock table (with `holds`: its holds table) has.
    pub fn pages(&self, holds: bool) -> Stmt {
        let t = if holds { &self.holds } else { &self.table };
        self.bounded(format!("SELECT {}", self.pages_of(t)))
    }

    fn pages_of(&self, table: &str) -> String {
        format!("pg_relation_size('{table}') / current_setting('block_size')::bigint")
    }
}
