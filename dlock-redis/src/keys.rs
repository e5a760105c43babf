//! Where a lock lives in Redis.
//!
//! For the name `N` and the prefix `P` (default `dlock`):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P:{E}` | string, with a PX expiry | the holder's owner token, 32 hex digits, then its holder description; for a reader-writer lock or semaphore, its marker (`~rw`, `~s<N>`) |
//! | `P:{E}:h` | sorted set, with a PX expiry | a reader-writer lock's or semaphore's holds (owner token and mode code), by expiry (server µs) |
//! | `P:{E}:hw` | hash, with a PX expiry | the holder description of each of those holds |
//! | `P:{E}:qm` | hash, with a PX expiry | the mode code and marker of each of their waiters |
//! | `P:{E}:fence` | string | the last fencing token granted |
//! | `P:{E}:q` | sorted set, with a PX expiry | the waiters, by arrival (server µs) |
//! | `P:{E}:qexp` | sorted set, with a PX expiry | when each waiter's place lapses (server ms) |
//! | `P:{E}:qv` | hash, with a PX expiry | for a mutex waiter that takes hand-overs: its TTL in ms, when it last asked (server ms) and its lock value, `:`-separated |
//! | `P:{E}:done` | string, with a PX expiry | on a cluster, the id of the last release or hold request, for a few request timeouts |
//! | `P:wake:C` | pub/sub channel | the lock key, when the client `C`'s waiter for it is next; `+<fencing token> <waiter> <owner token> <lock key>` when a release handed the lock over to that waiter |
//!
//! `E` is `N` with `%` written `%25` and `}` written `%7D`. Without a `}`
//! inside, the hash tag is exactly `E`, never empty (a name starting with
//! `}` would otherwise leave `{}` and no tag), so a lock and its fencing
//! counter always share a cluster slot. The escape is injective: every name
//! gets its own keys.

use dlock_core::{Error, Lease, Mode, OwnerToken, Result};

/// A mutex lock key's value: the owner token, then the holder description.
/// The scripts compare the whole value, so a grant's value is its owner's
/// alone as before, and `inspect` reads both from one key.
pub(crate) fn value(owner: OwnerToken, holder: &str) -> String {
    use std::fmt::Write;
    let mut value = String::with_capacity(32 + holder.len());
    let _ = write!(value, "{owner}"); // writing to a String cannot fail
    value.push_str(holder);
    value
}

/// A mutex lease's lock key value.
pub(crate) fn value_of(lease: &Lease) -> String {
    value(lease.owner(), lease.holder())
}

/// A shared hold's member of the holds set: the owner token, then the
/// mode code (the layout every release's scripts read; the holder
/// description is kept beside it, in `P:{E}:hw`).
pub(crate) fn member(owner: OwnerToken, mode: Mode) -> String {
    format!("{owner}{}", mode.code())
}

/// A shared lease's member of the holds set.
pub(crate) fn member_of(lease: &Lease) -> String {
    member(lease.owner(), lease.mode())
}

/// The owner token and holder description of a lock key's value
/// (`shared`: of a holds member followed by its description); `None` for
/// what this driver did not write.
pub(crate) fn holder_parts(stored: &str, shared: bool) -> Option<(OwnerToken, &str)> {
    let owner = stored.get(..32)?.parse().ok()?;
    let holder = stored.get(if shared { 33.. } else { 32.. })?;
    Some((owner, holder))
}

/// The key names of one lock, in one allocation (an acquire and a release
/// each need several).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    all: String,
    /// Where each of [`SUFFIXES`]' keys ends in `all`.
    ends: [usize; SUFFIXES.len()],
}

/// What follows the lock key in each of a lock's keys, in `Keys` order.
const SUFFIXES: [&str; 7] = ["", ":fence", ":q", ":qexp", ":h", ":qm", ":qv"];

impl Keys {
    fn part(&self, i: usize) -> &str {
        let start = i.checked_sub(1).map_or(0, |j| self.ends[j]);
        &self.all[start..self.ends[i]]
    }

    /// `P:{E}`.
    pub fn lock(&self) -> &str {
        self.part(0)
    }

    /// `P:{E}:fence`.
    pub fn fence(&self) -> &str {
        self.part(1)
    }

    /// `P:{E}:q`.
    pub fn queue(&self) -> &str {
        self.part(2)
    }

    /// `P:{E}:qexp`.
    pub fn queue_expiry(&self) -> &str {
        self.part(3)
    }

    /// `P:{E}:h`.
    pub fn holds(&self) -> &str {
        self.part(4)
    }

    /// `P:{E}:qm`.
    pub fn queue_modes(&self) -> &str {
        self.part(5)
    }

    /// `P:{E}:qv`.
    pub fn queue_values(&self) -> &str {
        self.part(6)
    }
}

pub(crate) fn keys(prefix: &str, name: &str) -> Keys {
    // Room for every key with an unescaped name; escapes grow it.
    let lock_len = prefix.len() + name.len() + 3;
    let suffixes: usize = SUFFIXES.iter().map(|s| s.len()).sum();
    let mut all = String::with_capacity(lock_len * SUFFIXES.len() + suffixes);
    all.push_str(prefix);
    all.push_str(":{");
    for c in name.chars() {
        match c {
            '%' => all.push_str("%25"),
            '}' => all.push_str("%7D"),
            c => all.push(c),
        }
    }
    all.push('}');
    let lock_end = all.len();
    let mut ends = [lock_end; SUFFIXES.len()];
    for (i, suffix) in SUFFIXES.iter().enumerate().skip(1) {
        all.extend_from_within(..lock_end);
        all.push_str(suffix);
        ends[i] = all.len();
    }
    Keys { all, ends }
}

/// The `SCAN MATCH` pattern of the lock keys whose names start with
/// `name_prefix`: only lock keys end with `}` (escaped names have none).
pub(crate) fn lock_pattern(prefix: &str, name_prefix: &str) -> String {
    let keys = keys(prefix, name_prefix);
    let escaped = keys.lock();
    let open = escaped.len() - 1; // without the closing brace
    format!("{}*}}", glob_escape(&escaped[..open]))
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The lock name of a lock key, `None` for other keys.
pub(crate) fn name_of(prefix: &str, key: &str) -> Option<String> {
    let escaped = key
        .strip_prefix(prefix)?
        .strip_prefix(":{")?
        .strip_suffix('}')?;
    let mut name = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(at) = rest.find('%') {
        name.push_str(&rest[..at]);
        match rest.get(at..at + 3)? {
            "%25" => name.push('%'),
            "%7D" => name.push('}'),
            _ => return None,
        }
        rest = &rest[at + 3..];
    }
    name.push_str(rest);
    Some(name)
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

/// The Redis Cluster hash slot of the lock `name` (all of a lock's keys
/// share it, whatever the prefix): which shard keeps the lock, and so
/// which locks a failover or restart of one shard can touch.
///
/// ```
/// assert_eq!(dlock_redis::cluster_slot("123456789"), 12739);
/// ```
pub fn cluster_slot(name: &str) -> u16 {
    let keys = keys("", name);
    let lock = keys.lock();
    let tag = lock
        .strip_prefix(":{")
        .and_then(|rest| rest.strip_suffix('}'))
        .unwrap_or(lock);
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_cluster_slots() {
        // The example of the cluster specification.
        assert_eq!(cluster_slot("123456789"), 12739);
        // Escaped like the keys: `}` cannot end the tag early, so `a}b`
        // hashes as `a%7Db`, not as `a`.
        let crc = |tag: &str| crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16384;
        assert_eq!(cluster_slot("a}b"), crc("a%7Db"));
        assert_ne!(cluster_slot("a}b"), crc("a"));
    }

    #[test]
    fn layout() {
        let k = keys("dlock", "job:nightly");
        assert_eq!(k.lock(), "dlock:{job:nightly}");
        assert_eq!(k.fence(), "dlock:{job:nightly}:fence");
        assert_eq!(k.queue(), "dlock:{job:nightly}:q");
        assert_eq!(k.queue_expiry(), "dlock:{job:nightly}:qexp");
    }

    #[test]
    fn braces_and_percent_are_escaped_injectively() {
        assert_eq!(keys("p", "}x").lock(), "p:{%7Dx}");
        assert_eq!(keys("p", "a{b}").lock(), "p:{a{b%7D}");
        let names = ["}", "%7D", "%257D", "%", "%25", "a}b", "a%7Db"];
        let mut locks: Vec<_> = names
            .iter()
            .map(|n| keys("p", n).lock().to_owned())
            .collect();
        locks.sort();
        locks.dedup();
        assert_eq!(locks.len(), names.len());
    }

    #[test]
    fn names_come_back_from_keys_and_patterns_are_escaped() {
        for name in ["a", "}x%", "a{b}", "%7D", "é f", "a*b?[c]\\"] {
            assert_eq!(name_of("p", keys("p", name).lock()).as_deref(), Some(name));
        }
        assert_eq!(name_of("p", "p:{a}:fence"), None);
        assert_eq!(name_of("p", "q:{a}"), None);
        assert_eq!(lock_pattern("p", "a*}"), "p:{a\\*%7D*}");
    }

    #[test]
    fn prefix_with_braces_is_refused() {
        assert!(validate_prefix("dlock").is_ok());
        assert!(validate_prefix("a{b").is_err());
    }
}
