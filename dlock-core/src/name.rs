use crate::{Error, Result};

/// The longest lock name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = 255;

/// Checks that `name` is a legal lock name: 1 to [`MAX_NAME_LEN`] bytes of
/// UTF-8 with no NUL character.
///
/// Every other string is legal on every backend: drivers map names to keys,
/// paths and rows injectively, so `a/b`, `a{b}`, `Job` and `job` are four
/// distinct locks.
///
/// ```
/// assert!(dlock_core::validate_name("job:nightly-report").is_ok());
/// assert!(dlock_core::validate_name("").is_err());
/// ```
pub fn validate_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "a lock name must not be empty".to_owned()
    } else if name.len() > MAX_NAME_LEN {
        format!(
            "a lock name is at most {MAX_NAME_LEN} bytes of UTF-8, this one has {}",
            name.len()
        )
    } else if let Some(at) = name.find('\0') {
        format!("a lock name must not contain NUL (found at byte {at})")
    } else {
        return Ok(());
    };
    Err(Error::InvalidName { reason })
}

/// `url` with the password of its user-info part, if any, written `***`,
/// for `Debug` output and messages: `redis://app:hunter2@host/0` becomes
/// `redis://app:***@host/0`.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    // The user info ends at an `@`, and a password may hold a raw `/`, `?`
    // or `#` (malformed, yet some drivers' parsers take it): the authority
    // is cut at the first of those after the first `@`, not before it.
    // Hiding a little too much of a strange URL is the safe mistake: an
    // `@` in a path with no user info (`etcd://h:1/team@x`) hides the
    // host's port too.
    let Some(first_at) = rest.find('@') else {
        return url.to_owned();
    };
    let authority_end = rest[first_at..]
        .find(['/', '?', '#'])
        .map_or(rest.len(), |i| first_at + i);
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_owned();
    };
    let Some(colon) = authority[..at].find(':') else {
        return url.to_owned();
    };
    format!(
        "{}{}:***{}",
        &url[..scheme_end],
        &authority[..colon],
        &rest[at..]
    )
}

/// Whether every `%` in `s` (a part of a URL: user name, password, path)
/// starts a two-digit hex escape and the decoded bytes are UTF-8: what a
/// driver checks before a client library would quietly take a malformed
/// password as it stands.
pub fn percent_decodes(s: &str) -> bool {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok());
            match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                Some(b) => out.push(b),
                None => return false,
            }
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).is_ok()
}

/// `host:pid` of this process, at most 255 bytes, for the rows and nodes
/// drivers write with a grant, so that an operator can tell who holds a
/// lock.
pub fn host_and_pid() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        // A control character would make every default holder invalid.
        .map(|h| h.trim().replace(char::is_control, ""))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    let mut info = format!("{host}:{}", std::process::id());
    info.truncate(info.floor_char_boundary(255));
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_checked() {
        assert!(percent_decodes("a%20b%C3%A9"));
        assert!(!percent_decodes("%"));
        assert!(!percent_decodes("%2"));
        assert!(!percent_decodes("%zz"));
        assert!(!percent_decodes("%FF"));
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("redis://app:hunter2@host:6379/0"),
            "redis://app:***@host:6379/0"
        );
        assert_eq!(
            redact_url("mysql://u:p@ss:w@h/db?x=@"),
            "mysql://u:***@h/db?x=@"
        );
        for url in ["etcd://alice:pa?ss@h:2379", "etcd://alice:p/ss@h:2379"] {
            assert_eq!(redact_url(url), "etcd://alice:***@h:2379");
        }
        assert_eq!(redact_url("redis://host/0"), "redis://host/0");
        assert_eq!(redact_url("redis://user@host"), "redis://user@host");
        assert_eq!(redact_url("not a url"), "not a url");
    }

    #[test]
    fn lengths_are_counted_in_bytes() {
        assert!(validate_name(&"é".repeat(127)).is_ok()); // 254 bytes
        assert!(validate_name(&"x".repeat(255)).is_ok());
        assert!(validate_name(&"é".repeat(128)).is_err()); // 256 bytes
        assert!(validate_name(&"x".repeat(256)).is_err());
    }

    #[test]
    fn nul_and_empty_are_refused() {
        assert!(matches!(validate_name(""), Err(Error::InvalidName { .. })));
        assert!(matches!(
            validate_name("a\0b"),
            Err(Error::InvalidName { .. })
        ));
    }

    #[test]
    fn odd_but_legal_names_pass() {
        for name in ["a/b", "a{b}", "}x", "Job", "🔒 lock", " ", "..", "/"] {
            assert!(validate_name(name).is_ok(), "{name:?}");
        }
    }
}
