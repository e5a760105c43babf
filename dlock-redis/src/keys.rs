//! Where a lock lives in Redis.
//!
//! For the name `N` and the prefix `P` (default `dlock`):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P:{E}` | string, with a PX expiry | the holder's owner token, 32 hex digits |
//! | `P:{E}:fence` | string | the last fencing token granted |
//! | `P:{E}:released` | pub/sub channel | a message with `N` on every release |
//!
//! `E` is `N` with `%` written `%25` and `}` written `%7D`. Without a `}`
//! inside, the hash tag is exactly `E`, never empty (a name starting with
//! `}` would otherwise leave `{}` and no tag), so a lock and its fencing
//! counter always share a cluster slot. The escape is injective: every name
//! gets its own keys.

use dlock_core::{Error, Result};

/// The key names of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    pub lock: String,
    pub fence: String,
    pub channel: String,
}

pub(crate) fn keys(prefix: &str, name: &str) -> Keys {
    let mut lock = String::with_capacity(prefix.len() + name.len() + 3);
    lock.push_str(prefix);
    lock.push_str(":{");
    for c in name.chars() {
        match c {
            '%' => lock.push_str("%25"),
            '}' => lock.push_str("%7D"),
            c => lock.push(c),
        }
    }
    lock.push('}');
    Keys {
        fence: format!("{lock}:fence"),
        channel: format!("{lock}:released"),
        lock,
    }
}

/// A key prefix must not contain braces: they would move the hash tag.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.contains(['{', '}']) {
        return Err(Error::invalid_option(
            "prefix",
            format!("must not contain `{{` or `}}`, got {prefix:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let k = keys("dlock", "job:nightly");
        assert_eq!(k.lock, "dlock:{job:nightly}");
        assert_eq!(k.fence, "dlock:{job:nightly}:fence");
        assert_eq!(k.channel, "dlock:{job:nightly}:released");
    }

    #[test]
    fn braces_and_percent_are_escaped_injectively() {
        assert_eq!(keys("p", "}x").lock, "p:{%7Dx}");
        assert_eq!(keys("p", "a{b}").lock, "p:{a{b%7D}");
        let names = ["}", "%7D", "%257D", "%", "%25", "a}b", "a%7Db"];
        let mut locks: Vec<_> = names.iter().map(|n| keys("p", n).lock).collect();
        locks.sort();
        locks.dedup();
        assert_eq!(locks.len(), names.len());
    }

    #[test]
    fn prefix_with_braces_is_refused() {
        assert!(validate_prefix("dlock").is_ok());
        assert!(validate_prefix("a{b").is_err());
    }
}
