//! Where a lock lives in the tree: Curator's layout, so Curator (Java) and
//! kazoo (Python) clients contend on the same locks.
//!
//! `/<root>/<E>/_c_<uuid>-lock-<10-digit sequence>` for a mutex, and in
//! the same folder `_c_<uuid>-__READ__<seq>` and `_c_<uuid>-__WRIT__<seq>`
//! for a reader-writer lock (Curator's `InterProcessReadWriteLock`). One
//! folder and one sequence for both kinds: each node's place in the queue,
//! and so what is ahead of it, is decided by the server, whatever its kind.
//! A semaphore's nodes are in two folders of its own below (see
//! [`crate::semaphore`]); a permit is `_c_<uuid>-__PERM<N>__<seq>` (ours:
//! the count in the name, so that two sizes meet as a conflict). `E` is the
//! lock name with `%`, `/` and every character ZooKeeper refuses in a path
//! written as `%XX` per UTF-8 byte, and with `.` and `..` written `%2E` and
//! `%2E%2E` (ZooKeeper refuses them as path components). The escape is
//! injective: every name gets its own node.

use dlock_core::{Lease, Mode, OwnerToken};

use crate::backend::ZkBackend;

/// The marker between the protected prefix and the sequence number.
pub(crate) const LOCK_MARKER: &str = "-lock-";

/// The markers of every recipe whose nodes queue for the same lock, and
/// the kind each one's node asks for: Curator's and our mutex (`-lock-`),
/// kazoo's `Lock` and `WriteLock` (`__lock__`), kazoo's `ReadLock`
/// (`__rlock__`), Curator's and our read and write locks; and Curator's
/// semaphore leases (`-lease-`), which are only in a lease folder.
const MARKERS: [(&str, Node); 6] = [
    (LOCK_MARKER, Node::Mutex),
    ("-lease-", Node::CuratorLease),
    ("__lock__", Node::KazooLock),
    ("__rlock__", Node::KazooRead),
    ("__READ__", Node::Read),
    ("__WRIT__", Node::Write),
];

/// What a queue node asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Node {
    Mutex,
    /// kazoo's `Lock` and `WriteLock`, which write the same nodes.
    KazooLock,
    /// kazoo's `ReadLock`.
    KazooRead,
    Read,
    Write,
    Permit(u32),
    /// A permit of Curator's `InterProcessSemaphoreV2`, which does not
    /// say its semaphore's size (only ever in a semaphore's lease folder).
    CuratorLease,
}

impl Node {
    /// A kazoo node, of whichever kind asks (see [`Node::mode_for`]).
    pub(crate) fn is_kazoo(self) -> bool {
        matches!(self, Node::KazooLock | Node::KazooRead)
    }

    /// The mode this node holds or waits for, as a request in `asker`
    /// sees it: kazoo's nodes are a reader-writer lock's to a reader or
    /// writer, and exclusive to a mutex (as they always were to ours).
    pub(crate) fn mode_for(self, asker: Mode) -> Mode {
        let rw = matches!(asker, Mode::Read | Mode::Write);
        match self {
            Node::Mutex => Mode::Exclusive,
            Node::KazooLock if rw => Mode::Write,
            Node::KazooRead if rw => Mode::Read,
            Node::KazooLock | Node::KazooRead => Mode::Exclusive,
            Node::Read => Mode::Read,
            Node::Write => Mode::Write,
            Node::Permit(n) => Mode::Permit(n),
            Node::CuratorLease => match asker {
                Mode::Permit(n) => Mode::Permit(n),
                _ => Mode::Permit(0),
            },
        }
    }
}

/// The name of our queue node for `mode`, up to its sequence number.
pub(crate) fn node_prefix(owner: OwnerToken, mode: Mode) -> String {
    let prefix = protected_prefix(owner);
    match mode {
        Mode::Read => format!("{prefix}__READ__"),
        Mode::Write => format!("{prefix}__WRIT__"),
        Mode::Permit(n) => format!("{prefix}__PERM{n}__"),
        // The mutex; and any mode added later holds alone here.
        _ => format!("{prefix}lock-"),
    }
}

/// Characters that ZooKeeper refuses in a path (PathUtils.validatePath),
/// plus `/` and our escape character. ZooKeeper checks UTF-16 code units,
/// so every character beyond the BMP (a surrogate pair, inside the refused
/// `\ud800-\uf8ff`) is refused too.
fn must_escape(c: char) -> bool {
    matches!(c,
        '%' | '/'
        | '\u{1}'..='\u{1f}'
        | '\u{7f}'..='\u{9f}'
        | '\u{e000}'..='\u{f8ff}'
        | '\u{fff0}'..)
}

/// The path component of a lock name.
pub(crate) fn escape(name: &str) -> String {
    if name == "." || name == ".." {
        return "%2E".repeat(name.len());
    }
    let mut out = String::with_capacity(name.len());
    let mut buf = [0u8; 4];
    for c in name.chars() {
        if must_escape(c) {
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The lock name of a path component made by [`escape`]; `None` for
/// components it cannot have made.
pub(crate) fn unescape(component: &str) -> Option<String> {
    let bytes = component.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The protected-creation prefix of a node: `_c_<uuid>-`, with the owner
/// token written as a UUID, as Curator writes its own.
pub(crate) fn protected_prefix(owner: OwnerToken) -> String {
    let h = owner.to_string();
    format!(
        "_c_{}-{}-{}-{}-{}-",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The owner token in a node name made by us or by Curator
/// (`_c_<uuid>-lock-…`); `None` for other recipes.
pub(crate) fn owner_of(node: &str) -> Option<OwnerToken> {
    let rest = node.strip_prefix("_c_")?;
    let uuid = rest.get(..36)?;
    let hex: String = uuid.chars().filter(|&c| c != '-').collect();
    hex.parse().ok()
}

/// The sequence number of a lock node of any recipe in [`MARKERS`] or a
/// permit; the queue is sorted by it (the parent's counter numbers every
/// child, so sequences of different recipes compare). `None` for other
/// nodes.
pub(crate) fn sequence(node: &str) -> Option<i64> {
    parse(node).map(|(_, sequence)| sequence)
}

/// The kind of a queue node and its sequence number.
pub(crate) fn parse(node: &str) -> Option<(Node, i64)> {
    let (kind, digits) = MARKERS
        .iter()
        .find_map(|(marker, kind)| Some((*kind, &node[node.rfind(marker)? + marker.len()..])))
        .or_else(|| {
            let rest = &node[node.rfind("__PERM")? + "__PERM".len()..];
            let (permits, digits) = rest.split_once("__")?;
            Some((Node::Permit(permits.parse().ok()?), digits))
        })?;
    // `%010d` of the parent's counter: negative once it wraps past 2^31,
    // and 19 digits from clients that print it as a long.
    let unsigned = digits.strip_prefix('-').unwrap_or(digits);
    let ok = matches!(unsigned.len(), 10 | 19) && unsigned.bytes().all(|b| b.is_ascii_digit());
    Some((kind, digits.parse().ok().filter(|_| ok)?))
}

/// The read node a downgrade of the write node `writer` makes: a reader
/// with the writer's own sequence number (see `crate::downgrade`).
pub(crate) fn downgraded_node(owner: OwnerToken, writer: &str) -> Option<String> {
    let digits = &writer[writer.rfind("__WRIT__")? + "__WRIT__".len()..];
    Some(format!("{}{digits}", node_prefix(owner, Mode::Read)))
}

/// The prefix of a reader's delayed release (see `crate::hold`): a read
/// node to every recipe, which sort by what follows `__READ__`, and a hold
/// to us by its name alone.
pub(crate) const READ_HOLD: &str = "dlock-rhold-";

/// The read node that takes the place of the reader `node` (its sequence
/// number) for a reader's delayed release whose hold's owner is `owner`.
pub(crate) fn read_hold_node(owner: OwnerToken, node: &str) -> Option<String> {
    let digits = &node[node.rfind("__READ__")? + "__READ__".len()..];
    Some(format!("{READ_HOLD}{owner}-__READ__{digits}"))
}

/// Whether a queue node is a reader's delayed release.
pub(crate) fn is_read_hold(node: &str) -> bool {
    node.starts_with(READ_HOLD)
}

impl ZkBackend {
    /// The folder of the lock `name`: its queue and its hold.
    pub(crate) fn lock_dir(&self, name: &str) -> String {
        format!("{}/{}", self.inner.root, escape(name))
    }

    /// The lease's node, if the lease is one of ours.
    pub(crate) fn node_of<'a>(&self, lease: &'a Lease) -> Option<&'a str> {
        let path = lease.handle()?;
        let node = path.rsplit('/').next()?;
        (path.starts_with(&self.lock_dir(lease.name()))
            && node.starts_with(&protected_prefix(lease.owner())))
        .then_some(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_single_legal_components() {
        assert_eq!(escape("a/b"), "a%2Fb");
        assert_eq!(escape("a%2Fb"), "a%252Fb");
        assert_eq!(escape("."), "%2E");
        assert_eq!(escape(".."), "%2E%2E");
        assert_eq!(escape("..."), "...");
        assert_eq!(escape("tab\t"), "tab%09");
        assert_eq!(escape("é x"), "é x");
        assert_eq!(escape("🔒"), "%F0%9F%94%92");
        assert_eq!(escape("\u{e000}"), "%EE%80%80");
    }

    #[test]
    fn unescape_undoes_escape() {
        for name in ["a/b", "%", ".", "..", "🔒 x", "tab\t", "\u{e000}"] {
            assert_eq!(unescape(&escape(name)).as_deref(), Some(name));
        }
        assert_eq!(unescape("%zz"), None);
    }

    #[test]
    fn escaping_is_injective_on_tricky_names() {
        let names = [
            "a/b", "a%2Fb", "a%252Fb", ".", "..", "%2E", "%2E%2E", "/", "%2F", "%",
        ];
        let mut escaped: Vec<_> = names.iter().map(|n| escape(n)).collect();
        escaped.sort();
        escaped.dedup();
        assert_eq!(escaped.len(), names.len());
    }

    #[test]
    fn node_names_round_trip() {
        let owner = OwnerToken::random().unwrap();
        let node = format!("{}lock-0000000042", protected_prefix(owner));
        assert_eq!(owner_of(&node), Some(owner));
        assert_eq!(sequence(&node), Some(42));
        assert_eq!(owner_of("lock-0000000001"), None);
        assert_eq!(sequence("_c_x-lock-abc"), None);
    }

    #[test]
    fn other_recipes_nodes_queue_too() {
        assert_eq!(
            sequence("2b1e4f0c9a8d4e7f8a6b5c4d3e2f1a0b__lock__0000000007"),
            Some(7)
        );
        assert_eq!(sequence("2b1e4f0c__rlock__0000000008"), Some(8));
        assert_eq!(sequence("_c_9f0e-lock-0000000009"), Some(9));
        assert_eq!(
            parse("_c_9f0e-lease-0000000010"),
            Some((Node::CuratorLease, 10))
        );
        assert_eq!(
            Node::CuratorLease.mode_for(Mode::Permit(3)),
            Mode::Permit(3)
        );
        assert_eq!(sequence("lease_holder"), None);
        assert_eq!(sequence("x__lock__12"), None);
        assert_eq!(sequence("x-lock--2147483648"), Some(-2_147_483_648));
        assert_eq!(sequence("x-lock-0000000002147483648"), Some(2_147_483_648));
    }

    #[test]
    fn every_kind_has_its_node() {
        let owner = OwnerToken::random().unwrap();
        for (mode, kind) in [
            (Mode::Exclusive, Node::Mutex),
            (Mode::Read, Node::Read),
            (Mode::Write, Node::Write),
            (Mode::Permit(12), Node::Permit(12)),
        ] {
            let node = format!("{}0000000042", node_prefix(owner, mode));
            assert_eq!(parse(&node), Some((kind, 42)), "{node}");
            assert_eq!(owner_of(&node), Some(owner), "{node}");
            assert_eq!(kind.mode_for(mode), mode);
        }
        assert_eq!(parse("_c_x-__PERMx__0000000001"), None);
        assert_eq!(parse("_c_x-__PERM2__00001"), None);
        let writer = format!("{}0000000042", node_prefix(owner, Mode::Write));
        let reader = OwnerToken::random().unwrap();
        let downgraded = downgraded_node(reader, &writer).unwrap();
        assert_eq!(parse(&downgraded), Some((Node::Read, 42)));
        assert_eq!(owner_of(&downgraded), Some(reader));
        assert_eq!(downgraded_node(reader, "_c_x-lock-0000000001"), None);
        assert_eq!(Node::KazooRead.mode_for(Mode::Exclusive), Mode::Exclusive);
        assert_eq!(Node::KazooRead.mode_for(Mode::Write), Mode::Read);
        assert_eq!(Node::KazooLock.mode_for(Mode::Read), Mode::Write);
    }
}
