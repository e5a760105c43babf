//! Values and names as SQL text: byte strings as hex literals (whatever
//! `standard_conforming_strings` or `bytea_output` say), text, intervals,
//! and the identifiers that may be spliced into a statement; and the
//! values of a statement that is prepared ([`Args`]).

use dlock_core::{Error, Result};

/// The longest table name: the expiry index of older releases, which
/// `migrate` drops, `<table>_expires_at`, had to fit PostgreSQL's 63-byte
/// identifiers.
const MAX_TABLE: usize = 52;

/// A schema or table name that is safe to splice into SQL: a plain
/// identifier, in lower case (PostgreSQL folds unquoted names; quoted here,
/// so that `Locks` and `locks` cannot be mixed up). `option` names the
/// setting in the error.
pub(crate) fn validate_identifier(option: &'static str, name: &str) -> Result<()> {
    let mut chars = name.chars();
    let ok = name.len() <= MAX_TABLE
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_option(
            option,
            format!(
                "must be 1 to {MAX_TABLE} lower-case ASCII letters, digits or `_`, not starting \
                 with a digit; got {name:?}"
            ),
        ))
    }
}

/// `bytes` as a `bytea` literal, whatever `standard_conforming_strings` says.
pub(crate) fn bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2 + 20);
    out.push_str("decode('");
    out.push_str(&hex::encode(bytes));
    out.push_str("', 'hex')");
    out
}

/// The bytes of `hex` (what `encode(…, 'hex')` returns, so that no
/// `bytea_output` setting changes what is read); `None` when it is not hex.
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    hex::decode(text).ok()
}

/// `text` as a `text` literal.
pub(super) fn text(text: &str) -> String {
    format!("convert_from({}, 'UTF8')", bytes(text.as_bytes()))
}

/// The values of one statement, each standing in its text as a parameter
/// (`$1`, `$2`, …) of a declared type, and kept as a literal: what an
/// `EXECUTE` passes, or what the statement written out in full has in the
/// parameter's place.
#[derive(Debug, Default)]
pub(crate) struct Args {
    /// Each parameter's type and literal, in order.
    values: Vec<(&'static str, String)>,
    /// Each parameter's value, for a statement sent with its values
    /// bound instead (see `Stmt::bound`).
    bound: Vec<Value>,
}

/// A parameter's value.
#[derive(Debug)]
enum Value {
    Bytes(Vec<u8>),
    Text(String),
    Int(i64),
}

impl Args {
    fn push(&mut self, kind: &'static str, literal: String, value: Value) -> String {
        self.values.push((kind, literal));
        self.bound.push(value);
        format!("${}", self.values.len())
    }

    /// A byte string.
    pub fn bytes(&mut self, value: &[u8]) -> String {
        self.push("bytea", bytes(value), Value::Bytes(value.to_vec()))
    }

    /// A text of any characters.
    pub fn text(&mut self, value: &str) -> String {
        self.push("text", text(value), Value::Text(value.to_owned()))
    }

    /// An owner or waiter token (hex digits, or empty): as text.
    pub fn token(&mut self, token: &str) -> String {
        debug_assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
        self.push("text", format!("'{token}'"), Value::Text(token.to_owned()))
    }

    /// Microseconds, as an interval.
    pub fn micros(&mut self, us: u64) -> String {
        let us = i64::try_from(us).unwrap_or(i64::MAX);
        format!(
            "({} * interval '1 microsecond')",
            self.push("bigint", us.to_string(), Value::Int(us))
        )
    }

    /// `query` with the values bound, in order.
    pub fn bind<'q>(
        &self,
        mut query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        for value in &self.bound {
            query = match value {
                Value::Bytes(b) => query.bind(b.clone()),
                Value::Text(t) => query.bind(t.clone()),
                Value::Int(i) => query.bind(*i),
            };
        }
        query
    }

    /// The parameters' types, as `PREPARE` declares them.
    pub fn types(&self) -> String {
        let types: Vec<&str> = self.values.iter().map(|(kind, _)| *kind).collect();
        types.join(", ")
    }

    /// The parameters' values, as `EXECUTE` passes them.
    pub fn literals(&self) -> String {
        let literals: Vec<&str> = self.values.iter().map(|(_, l)| l.as_str()).collect();
        literals.join(", ")
    }

    /// `sql` with every parameter replaced by its literal. Only this
    /// module's parameters hold a `$` in the statements.
    pub fn written_out(&self, sql: &str) -> String {
        let mut out = String::with_capacity(sql.len() + self.values.len() * 24);
        let mut rest = sql;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let digits = rest[at + 1..]
                .bytes()
                .take_while(u8::is_ascii_digit)
                .count();
            let value = rest[at + 1..at + 1 + digits]
                .parse::<usize>()
                .ok()
                .and_then(|i| self.values.get(i.checked_sub(1)?));
            match value {
                Some((_, literal)) => out.push_str(literal),
                None => out.push_str(&rest[at..=at + digits]),
            }
            rest = &rest[at + 1 + digits..];
        }
        out.push_str(rest);
        out
    }
}

/// The least byte string above every string that starts with `prefix`:
/// `None` when there is none (an empty prefix, or one of `0xFF` bytes).
pub(super) fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut next = prefix.to_vec();
    while let Some(last) = next.pop() {
        if last < 0xFF {
            next.push(last + 1);
            return Some(next);
        }
    }
    None
}

/// Microseconds as an interval.
pub(super) fn micros(us: u64) -> String {
    format!("({us}::bigint * interval '1 microsecond')")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_have_successors() {
        assert_eq!(successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(successor(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(successor(b"\xff\xff"), None);
        assert_eq!(successor(b""), None);
    }

    #[test]
    fn parameters_are_written_out_as_their_literals() {
        let mut a = Args::default();
        let (n, o, t) = (a.bytes(b"a'"), a.token("00ff"), a.micros(7));
        assert_eq!((n.as_str(), o.as_str()), ("$1", "$2"));
        assert_eq!(a.types(), "bytea, text, bigint");
        let sql = format!("x = {n} AND {n} <> {o} AND e < {t}");
        assert_eq!(
            a.written_out(&sql),
            "x = decode('6127', 'hex') AND decode('6127', 'hex') <> '00ff' \
             AND e < (7 * interval '1 microsecond')"
        );
        for _ in 0..9 {
            a.token("");
        }
        assert_eq!(a.written_out("$12 $1"), "'' decode('6127', 'hex')");
    }

    #[test]
    fn table_names_are_identifiers() {
        for ok in ["dlock_locks", "_t", "locks2", &"x".repeat(MAX_TABLE)] {
            assert!(validate_identifier("table", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "Locks",
            "a-b",
            "a\"b",
            "a b",
            "t; DROP TABLE x",
            "schema.t",
            &"x".repeat(MAX_TABLE + 1),
        ] {
            assert!(validate_identifier("table", bad).is_err(), "{bad}");
        }
    }
}
