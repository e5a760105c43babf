//! A statement as the driver runs it: written out with its values as
//! literals, or its main part prepared. Parsing and planning a statement
//! cost more than running it, and for the shared kinds the planning
//! happened under the name's row lock. The main part is prepared with
//! SQL's `PREPARE` under a name made of a hash of its text, and run with
//! `EXECUTE` and its values as literals: still one simple query, and
//! wherever a pooler sends it, a statement of that name there is this
//! statement (see `pool.rs` for how a connection that lacks it gets it).

use std::fmt::Write;

use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use super::Statements;
use super::literal::Args;

/// A statement to run: written out in full, and, where the backend
/// prepares statements, with its main part (the longest of its
/// `;`-separated parts unless chosen: the others lock a row, or read after
/// a commit) as the `EXECUTE` of a prepared statement, the other parts
/// written out around it. One prepared
/// statement per call, so that a server session has it or lacks it, never
/// part of it (`PREPARE` is not undone with a transaction).
#[derive(Debug)]
pub struct Stmt {
    /// `SET LOCAL …;`.
    limit: String,
    /// The statement, its values as parameters.
    body: String,
    args: Args,
    /// With statements prepared: the hash of the main part and its
    /// parameters' types, which names its prepared statement.
    pub(crate) id: Option<[u8; 16]>,
    /// Which part is prepared: the longest unless set.
    main: Option<usize>,
}

impl Stmt {
    /// Whether the statement opens a transaction block (`BEGIN`), which a
    /// failure inside leaves open and aborted until a `ROLLBACK`.
    pub(crate) fn opens_block(&self) -> bool {
        Self::parts(&self.body, self.main)
            .0
            .iter()
            .any(|part| part.eq_ignore_ascii_case("BEGIN"))
    }
}

impl Stmt {
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

    /// The statement's parts, and which of them is prepared: `main`, else
    /// the longest.
    fn parts(body: &str, main: Option<usize>) -> (Vec<&str>, usize) {
        let parts: Vec<&str> = body
            .split(';')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        let main = main.unwrap_or_else(|| {
            (0..parts.len())
                .max_by_key(|&i| parts[i].len())
                .unwrap_or(0)
        });
        (parts, main)
    }

    /// How many statements of one simple query that runs this one may each
    /// wait for their own statement timeout: its parts, and the `PREPARE`
    /// when prepared.
    pub(crate) fn waits(&self) -> u32 {
        let parts = u32::try_from(Self::parts(&self.body, self.main).0.len()).unwrap_or(u32::MAX);
        parts + u32::from(self.id.is_some())
    }

    /// The statement with its main part `EXECUTE`d, prepared first when
    /// `prepare` says; `None` when statements are not prepared.
    pub(crate) fn execute(&self, prepare: bool) -> Option<SqlStr> {
        let id = hex::encode(self.id?);
        let (types, values) = (self.args.types(), self.args.literals());
        let (types, values) = if types.is_empty() {
            (String::new(), String::new())
        } else {
            (format!(" ({types})"), format!(" ({values})"))
        };
        let mut sql = self.limit.clone();
        let (parts, main) = Self::parts(&self.body, self.main);
        if prepare {
            let part = parts.get(main)?;
            let _ = write!(sql, "PREPARE dlock_{id}{types} AS {part}; ");
        }
        for (i, part) in parts.iter().enumerate() {
            if i == main {
                let _ = write!(sql, "EXECUTE dlock_{id}{values}; ");
            } else {
                let _ = write!(sql, "{}; ", self.args.written_out(part));
            }
        }
        Some(AssertSqlSafe(sql).into_sql_str())
    }
}

impl Statements {
    /// A statement that is never prepared: its values are literals in
    /// `statement`.
    pub(super) fn bounded(&self, statement: String) -> Stmt {
        self.with(Args::default(), statement, false, None)
    }

    /// A statement whose values are `args`, prepared where statements are:
    /// its longest part.
    pub(super) fn prepared(&self, args: Args, body: String) -> Stmt {
        self.with(args, body, self.prepare, None)
    }

    /// [`Statements::prepared`], its part `main` (counted from 0)
    /// prepared: a statement that commits part way must have the part
    /// that can be missing (see `pool.rs`) before its commit, so that a
    /// try that fails for it has changed nothing.
    pub(super) fn prepared_part(&self, args: Args, body: String, main: usize) -> Stmt {
        self.with(args, body, self.prepare, Some(main))
    }

    fn with(&self, args: Args, body: String, prepare: bool, main: Option<usize>) -> Stmt {
        let id = prepare.then(|| {
            let (parts, main) = Stmt::parts(&body, main);
            let digest = Sha256::new()
                .chain_update(args.types())
                .chain_update("\n")
                .chain_update(parts.get(main).copied().unwrap_or_default())
                .finalize();
            let mut id = [0; 16];
            id.copy_from_slice(&digest[..16]);
            id
        });
        Stmt {
            limit: self.limit.clone(),
            body,
            args,
            id,
            main,
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
        assert_eq!(one.id, two.id);
        let other = Statements::new("public", "u", Duration::from_millis(1500), true);
        assert_ne!(one.id, other.release(b"x", "00ff").id);
        let id = hex::encode(one.id.expect("prepared"));
        let run = one.execute(false).expect("prepared");
        assert!(
            run.as_str().ends_with(&format!(
                "; EXECUTE dlock_{id} (decode('78', 'hex'), '00ff'); "
            )),
            "{}",
            run.as_str()
        );
        let first = sql
            .release_and_notify(b"x", "00ff")
            .execute(true)
            .expect("prepared");
        // The row's lock written out, the release that reads the queue
        // prepared, and run in that order.
        let first = first.as_str();
        assert_eq!(first.matches("PREPARE dlock_").count(), 1, "{first}");
        assert!(first.contains("(bytea, text) AS WITH released"), "{first}");
        let lock = first.find("WHERE name = decode('78', 'hex') FOR UPDATE; ");
        let execute = first.find("EXECUTE dlock_");
        assert!(lock.is_some() && lock < execute, "{first}");
        let plain = Statements::new("public", "t", Duration::from_millis(1500), false);
        assert!(plain.release(b"x", "00ff").execute(false).is_none());
    }
}
