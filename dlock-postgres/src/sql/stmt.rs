//! A statement as the driver runs it: written out with its values as
//! literals, or its parts prepared. Parsing and planning a statement cost
//! more than running it, and for the shared kinds the planning happened
//! under the name's row lock. Each part is prepared with SQL's `PREPARE`
//! under a name made of a hash of its text, and run with `EXECUTE` and its
//! values as literals: still one simple query, and wherever a pooler sends
//! it, a statement of that name there is this statement (see `pool.rs` for
//! how a connection that lacks one gets it).

use std::fmt::Write;

use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::literal::Args;
use super::{PLANS, Statements};

/// The name a prepared part goes by: a hash of its text, its
/// parameters' types and the planner settings it runs under ([`PLANS`]).
pub(crate) type Id = [u8; 16];

/// A statement to run: written out in full, and, where the backend
/// prepares statements, with its parts (never `BEGIN`, `COMMIT` or `SET`,
/// and none after a commit unless sending the whole again is harmless:
/// see [`Statements::prepared_until`]) as `EXECUTE`s of prepared
/// statements, the others written out around them.
#[derive(Debug)]
pub struct Stmt {
    /// `SET LOCAL …;`: the statement timeout, and the planner settings
    /// when a part is prepared (none where the session has them; the
    /// seqscan ban lifted for an unprepared statement where it has it).
    limit: String,
    /// The statement, its values as parameters.
    body: String,
    args: Args,
    /// With statements prepared: which parts are, and the names they go
    /// by, in the order they run.
    pub(crate) ids: Vec<(usize, Id)>,
    /// Whether it goes in the extended protocol, prepared by sqlx on each
    /// connection and its values bound (see [`Stmt::bound`]).
    bind: bool,
}

impl Stmt {
    /// Whether the statement opens a transaction block (`BEGIN`), which a
    /// failure inside leaves open and aborted until a `ROLLBACK`.
    pub(crate) fn opens_block(&self) -> bool {
        Self::parts(&self.body)
            .iter()
            .any(|part| part.eq_ignore_ascii_case("BEGIN"))
    }
}

impl Stmt {
    /// The statement as sqlx's prepared statement, its values bound, when
    /// it is one part and its session has every setting it needs: no
    /// pooler lends the session to others, and sqlx prepares it once per
    /// connection. Parsing an `EXECUTE` of a simple query and evaluating
    /// its literals took the server more than running the statement (76
    /// µs against 21 µs a call, the acquire of an uncontended cycle).
    pub(crate) fn bound(
        &self,
    ) -> Option<sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>> {
        if !self.bind {
            return None;
        }
        let part = *Self::parts(&self.body).first()?;
        Some(self.args.bind(sqlx::query(AssertSqlSafe(part.to_owned()))))
    }

    /// The whole statement as one simple query, its values as literals.
    pub(crate) fn written_out(&self) -> SqlStr {
        // Every value is a literal of hex digits or a number, and the
        // identifiers have passed `validate_identifier`.
        AssertSqlSafe(format!(
            "{}{}",
            self.limit,
            self.args.written_out(&self.body)
        ))
        .into_sql_str()
    }

    /// The statement's parts.
    fn parts(body: &str) -> Vec<&str> {
        body.split(';')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect()
    }

    /// Whether a part may be prepared: not a transaction's control.
    fn preparable(part: &str) -> bool {
        let word = part.split_whitespace().next().unwrap_or_default();
        !["BEGIN", "COMMIT", "SET"]
            .iter()
            .any(|w| word.eq_ignore_ascii_case(w))
    }

    /// How many statements of one simple query that runs this one may each
    /// wait for their own statement timeout: its parts, and the `PREPARE`s
    /// when prepared.
    pub(crate) fn waits(&self) -> u32 {
        let parts = Self::parts(&self.body).len() + self.ids.len();
        u32::try_from(parts).unwrap_or(u32::MAX)
    }

    /// The statement with its prepared parts `EXECUTE`d, those of
    /// `prepare` prepared first, in front; `None` when statements are not
    /// prepared.
    pub(crate) fn execute(&self, prepare: &[Id]) -> Option<SqlStr> {
        if self.ids.is_empty() {
            return None;
        }
        let (types, values) = (self.args.types(), self.args.literals());
        let (types, values) = if types.is_empty() {
            (String::new(), String::new())
        } else {
            (format!(" ({types})"), format!(" ({values})"))
        };
        let mut sql = self.limit.clone();
        let parts = Self::parts(&self.body);
        for (at, (i, id)) in self.ids.iter().enumerate() {
            // A part twice in one statement is prepared once.
            let again = self.ids[..at].iter().any(|(_, earlier)| earlier == id);
            if prepare.contains(id) && !again {
                let (id, part) = (hex::encode(id), parts.get(*i)?);
                let _ = write!(sql, "PREPARE dlock_{id}{types} AS {part}; ");
            }
        }
        for (i, part) in parts.iter().enumerate() {
            match self.ids.iter().find(|(at, _)| *at == i) {
                Some((_, id)) => {
                    let _ = write!(sql, "EXECUTE dlock_{}{values}; ", hex::encode(id));
                }
                None => {
                    let _ = write!(sql, "{}; ", self.args.written_out(part));
                }
            }
        }
        Some(AssertSqlSafe(sql).into_sql_str())
    }
}

impl Statements {
    /// A statement that is never prepared: its values are literals in
    /// `statement`.
    pub(super) fn bounded(&self, statement: String) -> Stmt {
        self.with(Args::default(), statement, None)
    }

    /// A statement whose values are `args`, prepared where statements
    /// are: every part but a transaction's control. A part after a
    /// `COMMIT` may be prepared only where the whole statement sent again
    /// changes nothing more (see `pool.rs`).
    pub(super) fn prepared(&self, args: Args, body: String) -> Stmt {
        self.with(args, body, Some(usize::MAX))
    }

    /// [`Statements::prepared`], only its parts up to `last` (counted from
    /// 0) prepared: a statement that commits part way has no part that
    /// can be missing (see `pool.rs`) after its commit, so that a try that
    /// fails for one has changed nothing.
    pub(super) fn prepared_until(&self, args: Args, body: String, last: usize) -> Stmt {
        self.with(args, body, Some(last))
    }

    fn with(&self, args: Args, body: String, last: Option<usize>) -> Stmt {
        let ids = match last.filter(|_| self.prepare) {
            None => Vec::new(),
            Some(last) => Stmt::parts(&body)
                .into_iter()
                .enumerate()
                .take_while(|(i, _)| *i <= last)
                .filter(|(_, part)| Stmt::preparable(part))
                .map(|(i, part)| {
                    // The plans' settings too: a statement prepared
                    // under others may hold a plan made under them.
                    let digest = Sha256::new()
                        .chain_update(PLANS)
                        .chain_update(args.types())
                        .chain_update("\n")
                        .chain_update(part)
                        .finalize();
                    let mut id = [0; 16];
                    id.copy_from_slice(&digest[..16]);
                    (i, id)
                })
                .collect(),
        };
        let limit = if ids.is_empty() {
            format!("{}{}", self.limit, self.unplanned)
        } else {
            format!("{}{}", self.limit, self.plans)
        };
        let bind = self.bind && limit.is_empty() && ids.len() == 1 && Stmt::parts(&body).len() == 1;
        Stmt {
            limit,
            body,
            args,
            ids,
            bind,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_prepared_statement_is_named_by_its_text_not_its_values() {
        let sql = Statements::new("public", "t", Duration::from_millis(1500), true);
        let (one, two) = (sql.release(b"x", "00ff"), sql.release(b"y", "0a"));
        assert_eq!(one.ids, two.ids);
        let other = Statements::new("public", "u", Duration::from_millis(1500), true);
        assert_ne!(one.ids, other.release(b"x", "00ff").ids);
        let id = hex::encode(one.ids[0].1);
        let run = one.execute(&[]).expect("prepared");
        assert!(
            run.as_str().ends_with(&format!(
                "; EXECUTE dlock_{id} (decode('78', 'hex'), '00ff'); "
            )),
            "{}",
            run.as_str()
        );
        let settle = sql.settle_marker(b"x");
        let ids: Vec<Id> = settle.ids.iter().map(|(_, id)| *id).collect();
        let first = settle.execute(&ids).expect("prepared");
        // The lock of the row and the change, each prepared, in front,
        // then run in that order.
        let first = first.as_str();
        assert_eq!(first.matches("PREPARE dlock_").count(), 2, "{first}");
        let lock = first.find("(bytea) AS SELECT FROM");
        let change = first.find("(bytea) AS UPDATE");
        let (run_lock, run_change) = (
            first.find(&format!("EXECUTE dlock_{}", hex::encode(ids[0]))),
            first.find(&format!("EXECUTE dlock_{}", hex::encode(ids[1]))),
        );
        assert!(lock.is_some() && lock < change, "{first}");
        assert!(change < run_lock && run_lock < run_change, "{first}");
        let plain = Statements::new("public", "t", Duration::from_millis(1500), false);
        assert!(plain.release(b"x", "00ff").execute(&[]).is_none());
    }

    #[test]
    fn with_settings_per_session_no_statement_sets_them_and_the_unprepared_plan_freely() {
        let sql = Statements::new("public", "t", Duration::from_millis(1500), true);
        let settings = sql.session_settings();
        assert!(settings.contains(&("statement_timeout", "1500".to_owned())));
        assert!(settings.contains(&("enable_seqscan", "off".to_owned())));
        assert!(settings.contains(&("enable_bitmapscan", "off".to_owned())));
        let sql = sql.per_session();
        let run = sql.release(b"x", "00ff").execute(&[]).expect("prepared");
        assert!(
            run.as_str().starts_with("EXECUTE dlock_"),
            "{}",
            run.as_str()
        );
        let purge = sql.purge(false, 1, 10, (0, 1)).written_out();
        assert!(
            purge
                .as_str()
                .starts_with("SET LOCAL enable_seqscan = on; SET LOCAL enable_bitmapscan = on; ")
                && !purge.as_str().contains("statement_timeout"),
            "{}",
            purge.as_str()
        );
        // Without prepared statements, no planner setting at all.
        let plain = Statements::new("public", "t", Duration::from_millis(1500), false);
        assert_eq!(plain.session_settings().len(), 2);
        let plain = plain.per_session();
        assert!(
            plain
                .release(b"x", "00ff")
                .written_out()
                .as_str()
                .starts_with("UPDATE")
        );
    }

    #[test]
    fn a_change_that_commits_part_way_prepares_nothing_after_its_commit() {
        let sql = Statements::new("public", "t", Duration::from_millis(1500), true);
        let release = sql.release_unlocked(b"x", "00ff", true);
        let commit = Stmt::parts(&release.body)
            .iter()
            .position(|part| part.eq_ignore_ascii_case("COMMIT"))
            .expect("commits");
        assert!(!release.ids.is_empty());
        assert!(release.ids.iter().all(|(i, _)| *i < commit), "{release:?}");
    }

    #[test]
    fn only_one_prepared_part_on_a_session_with_every_setting_goes_bound() {
        let new = |prepare| Statements::new("public", "t", Duration::from_millis(1500), prepare);
        let direct = new(true).per_session();
        let bound = direct.release(b"x", "00ff");
        let query = bound.bound().expect("one part, settings in the session");
        let sql = sqlx::Execute::sql(query);
        assert_eq!(sql.as_str(), Stmt::parts(&bound.body)[0]);
        // Two parts (the row's lock, then the change; a waking release on
        // a table that does not count places), or a part run after a `SET
        // LOCAL`, go as one simple query.
        assert!(direct.release_and_notify(b"x", "00ff").bound().is_none());
        let counting = new(true).per_session().counting_places(true);
        assert!(counting.release_and_notify(b"x", "00ff").bound().is_some());
        assert!(direct.settle_marker(b"x").bound().is_none());
        assert!(new(true).release(b"x", "00ff").bound().is_none());
        assert!(
            new(false)
                .per_session()
                .release(b"x", "00ff")
                .bound()
                .is_none()
        );
        assert!(direct.purge(false, 1, 10, (0, 1)).bound().is_none());
    }
}
