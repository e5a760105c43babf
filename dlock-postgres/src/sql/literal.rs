//! Values and names as SQL text: byte strings as hex literals (whatever
//! `standard_conforming_strings` or `bytea_output` say), text, intervals,
//! and the identifiers that may be spliced into a statement.

use dlock_core::{Error, Result};

/// The longest table name: its index, `<table>_expires_at`, must fit
/// PostgreSQL's 63-byte identifiers.
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
