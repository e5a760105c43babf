//! Where a lock lives in etcd, and what its keys hold.
//!
//! Every hold and every waiter of a name is one key, attached to an etcd
//! lease (its locker's session, or a lease of its own): the key goes when
//! the lease ends or the key is deleted. A mutex's key is etcd's own
//! layout, `{prefix}{name}/{lease id in lowercase hex}`, the one Go's
//! `concurrency.Mutex`, `etcdctl lock` and etcd's Lock RPC write, so that
//! they and dlock exclude each other; the shared kinds' keys are
//! `{prefix}{name}\0{lease id:016x}`, which no Go client reads. A key
//! belongs to the name before its last `/` (mutex) or its first NUL
//! (names have no NUL). The keys of a name form its queue, in the order of
//! their create revisions (as Go's mutex orders them); a downgrade's read
//! hold takes its writer's place.
//!
//! A mutex key's value is its holder description, as a Go election's is its
//! candidate's (Go's mutex writes none), so that `etcdctl elect` and dlock's
//! elections read each other's leader; its owner token is made of its lease
//! and create revision. A shared kind's value is
//! `{mode}|{place}|{owner}|{holder}`: the mode's code and its kind's marker
//! (`r~rw`, `w~rw`, `p~s3`; an older dlock's mutex, `x`), the create
//! revision of the writer whose place a downgrade takes (0 for any other
//! key), the owner token in hex, and the holder description.

use dlock_core::{Admission, Error, Mode, OwnerToken, Result};

use crate::backend::NAME;
use crate::proto::event::EventType;
use crate::proto::{Event, KeyValue};

/// The key of the hold or waiter of `name` in `mode` under etcd lease
/// `lease`.
pub(crate) fn hold_key(prefix: &str, name: &str, mode: Mode, lease: i64) -> Vec<u8> {
    if mode == Mode::Exclusive {
        format!("{prefix}{name}/{lease:x}").into_bytes()
    } else {
        format!("{prefix}{name}\0{lease:016x}").into_bytes()
    }
}

/// The two ranges (key, range end) that hold `name`'s keys: the shared
/// kinds' and the mutex's. The second also holds the keys of names below
/// `name/`, which [`queue`] leaves out.
pub(crate) fn name_ranges(prefix: &str, name: &str) -> [(Vec<u8>, Vec<u8>); 2] {
    let shared = format!("{prefix}{name}\0").into_bytes();
    let mutex = format!("{prefix}{name}/").into_bytes();
    [
        (shared, format!("{prefix}{name}\x01").into_bytes()),
        (mutex.clone(), prefix_end(&mutex)),
    ]
}

/// One range that covers both of [`name_ranges`], for a watch (one watch
/// per name): it also covers names that continue `name` with a byte below
/// `/` (`name-1`, `name.x`), whose changes the waiter reads and leaves out.
pub(crate) fn name_span(prefix: &str, name: &str) -> (Vec<u8>, Vec<u8>) {
    (
        format!("{prefix}{name}\0").into_bytes(),
        format!("{prefix}{name}0").into_bytes(),
    )
}

/// The end of the range of keys that start with `start`: `start` with its
/// last byte below 0xff raised by one.
pub(crate) fn prefix_end(start: &[u8]) -> Vec<u8> {
    let mut end = start.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the keyspace.
    vec![0]
}

/// The value stored under a key.
pub(crate) fn record(mode: Mode, place: i64, owner: OwnerToken, holder: &str) -> Vec<u8> {
    if mode == Mode::Exclusive {
        return holder.as_bytes().to_vec();
    }
    let (code, marker) = (mode.code(), mode.marker());
    format!("{code}{marker}|{place}|{owner}|{holder}").into_bytes()
}

/// A mutex key's owner token: its lease and its create revision, which no
/// other key of the cluster has together (a delayed release's hold, moved
/// to a lease of its own, has another).
pub(crate) fn mutex_owner(lease: i64, create_revision: i64) -> OwnerToken {
    let (high, low) = (lease.cast_unsigned(), create_revision.cast_unsigned());
    OwnerToken::from_u128((u128::from(high) << 64) | u128::from(low))
}

/// A value as [`record`] writes it: (mode, place, owner, holder).
fn parse_record(value: &[u8]) -> Option<(Mode, i64, OwnerToken, String)> {
    let value = std::str::from_utf8(value).ok()?;
    let mut parts = value.splitn(4, '|');
    let (code, place, owner, holder) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let split = code.char_indices().nth(1).map_or(code.len(), |(i, _)| i);
    let mode = Mode::of_code(&code[..split], &code[split..])?;
    let place: i64 = place.parse().ok()?;
    let owner = u128::from_str_radix(owner, 16).ok()?;
    Some((mode, place, OwnerToken::from_u128(owner), holder.to_owned()))
}

/// The name a key under `prefix` belongs to, if it is a lock key of either
/// layout.
pub(crate) fn name_of<'a>(prefix: &str, key: &'a [u8]) -> Option<&'a str> {
    let rest = std::str::from_utf8(key.strip_prefix(prefix.as_bytes())?).ok()?;
    match rest.split_once('\0') {
        Some((name, _)) => Some(name),
        None => rest
            .rsplit_once('/')
            .filter(|(_, lease)| is_lease_hex(lease))
            .map(|(name, _)| name),
    }
}

/// Whether `suffix` is a lease id as Go's mutex writes it (`%x`).
fn is_lease_hex(suffix: &str) -> bool {
    (1..=16).contains(&suffix.len())
        && suffix
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// One key of a name's queue.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) key: Vec<u8>,
    pub(crate) name: String,
    pub(crate) lease: i64,
    pub(crate) create_revision: i64,
    pub(crate) mod_revision: i64,
    pub(crate) mode: Mode,
    /// The place in the queue: the create revision, or a downgrade's
    /// writer's.
    pub(crate) place: i64,
    /// A downgrade's read hold: granted with its writer, whatever waits.
    pub(crate) downgrade: bool,
    pub(crate) owner: OwnerToken,
    pub(crate) holder: String,
}

impl Entry {
    /// Reads a key under `prefix`: `None` for a key of neither layout (a
    /// key of some other use under a mutex's range).
    pub(crate) fn parse(prefix: &str, kv: &KeyValue) -> Result<Option<Entry>> {
        let bad = || Error::malformed(NAME, "a lock key", String::from_utf8_lossy(&kv.key));
        let key = std::str::from_utf8(&kv.key).map_err(|_| bad())?;
        let rest = key.strip_prefix(prefix).ok_or_else(bad)?;
        let (name, (mode, place, owner, holder)) = match rest.split_once('\0') {
            Some((name, _)) => (name, parse_record(&kv.value).ok_or_else(bad)?),
            None => match rest.rsplit_once('/') {
                Some((name, lease)) if is_lease_hex(lease) => {
                    let owner = mutex_owner(kv.lease, kv.create_revision);
                    let holder = String::from_utf8_lossy(&kv.value).into_owned();
                    (name, (Mode::Exclusive, 0, owner, holder))
                }
                _ => return Ok(None),
            },
        };
        Ok(Some(Entry {
            key: kv.key.clone(),
            name: name.to_owned(),
            lease: kv.lease,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            mode,
            place: if place > 0 { place } else { kv.create_revision },
            downgrade: place > 0,
            owner,
            holder,
        }))
    }
}

/// `name`'s keys among `kvs`, in queue order.
pub(crate) fn queue<'a>(
    prefix: &str,
    name: &str,
    kvs: impl IntoIterator<Item = &'a KeyValue>,
) -> Result<Vec<Entry>> {
    let mut entries = Vec::new();
    // Other names' keys (read through a watch's wider range) are not
    // parsed: a malformed one of theirs is no error of this name's.
    for kv in kvs
        .into_iter()
        .filter(|kv| name_of(prefix, &kv.key) == Some(name))
    {
        entries.extend(Entry::parse(prefix, kv)?);
    }
    sort(&mut entries);
    Ok(entries)
}

/// Queue order: by place, a downgrade's read hold right behind its writer.
pub(crate) fn sort(queue: &mut [Entry]) {
    queue.sort_by_key(|e| (e.place, e.downgrade, e.create_revision));
}

/// Whether the entry at `at` of `queue` is granted, waits, or asks for
/// another kind of lock than those ahead of it.
pub(crate) fn judge(queue: &[Entry], at: usize) -> Admission {
    let Some(entry) = queue.get(at) else {
        return Admission::Wait;
    };
    if entry.downgrade {
        return Admission::Grant;
    }
    let ahead: Vec<Mode> = queue[..at].iter().map(|e| e.mode).collect();
    entry.mode.admits(&[], &ahead)
}

/// The holds of a queue: the entries that are granted.
pub(crate) fn holds(queue: &[Entry]) -> impl Iterator<Item = &Entry> {
    (0..queue.len())
        .filter(|&i| judge(queue, i) == Admission::Grant)
        .filter_map(|i| queue.get(i))
}

/// Brings `name`'s queue, read at revision `after`, up to date with a
/// watch's `events`. Events at or before `after` are in the read already
/// (the watch may start before it); those of other names are left out.
pub(crate) fn apply_changes(
    prefix: &str,
    name: &str,
    queue: &mut Vec<Entry>,
    events: &[Event],
    after: i64,
) -> Result<()> {
    for kv in events
        .iter()
        .filter_map(|e| e.kv.as_ref().map(|kv| (e.r#type, kv)))
    {
        let (kind, kv) = kv;
        if kv.mod_revision <= after {
            continue;
        }
        if name_of(prefix, &kv.key) != Some(name) {
            continue;
        }
        queue.retain(|e| e.key != kv.key);
        if kind == EventType::Put as i32 {
            queue.extend(Entry::parse(prefix, kv)?);
        }
    }
    sort(queue);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, create: i64, value: &str) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: create,
            version: 1,
            value: value.as_bytes().to_vec(),
            lease: create,
        }
    }

    fn owner() -> String {
        OwnerToken::from_u128(7).to_string()
    }

    #[test]
    fn names_map_to_disjoint_ranges() {
        let within = |key: &[u8], (start, end): &(Vec<u8>, Vec<u8>)| {
            start.as_slice() <= key && key < end.as_slice()
        };
        let a = name_ranges("dlock/", "a");
        for mode in [Mode::Exclusive, Mode::Read] {
            let own = hold_key("dlock/", "a", mode, i64::MAX);
            assert!(a.iter().any(|r| within(&own, r)), "{own:?}");
            assert!(within(&own, &name_span("dlock/", "a")), "{own:?}");
            for other in ["a\u{1}", "a-b", "b"] {
                let theirs = hold_key("dlock/", other, mode, 1);
                assert!(!a.iter().any(|r| within(&theirs, r)), "{theirs:?}");
            }
        }
        // Go's layout: the lease in lowercase hex, unpadded.
        assert_eq!(hold_key("p/", "n", Mode::Exclusive, 0x694d), b"p/n/694d");
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
    }

    #[test]
    fn keys_belong_to_the_name_before_their_last_slash_or_first_nul() {
        let o = owner();
        let kvs = [
            kv("p/n/b/1f", 3, ""),
            kv("p/n/b\0a", 4, &format!("r~rw|0|{o}|")),
            kv("p/n/2a", 5, ""),
            kv("p/n/not-a-lease", 6, ""),
            kv("p/n/3b", 7, "me"),
        ];
        let q = queue("p/", "n", &kvs).expect("parses");
        let order: Vec<i64> = q.iter().map(|e| e.create_revision).collect();
        assert_eq!(order, [5, 7]);
        // Go's key: a mutex with no holder named, its owner its own.
        assert_eq!((q[0].mode, q[0].holder.as_str()), (Mode::Exclusive, ""));
        assert_eq!(q[0].owner, mutex_owner(5, 5));
        assert_ne!(q[1].owner, q[0].owner);
        assert_eq!(q[1].holder, "me");
        assert_eq!(judge(&q, 0), Admission::Grant);
        assert_eq!(judge(&q, 1), Admission::Wait);
        // Another name's malformed key, seen through a watch's range, is
        // no error of this name's.
        let theirs = [kv("p/n-1\0a", 8, "garbage"), kv("p/n.x\0b", 9, "x|?")];
        assert!(queue("p/", "n", &theirs).expect("left out").is_empty());
        let sub = queue("p/", "n/b", &kvs).expect("parses");
        assert_eq!(sub.len(), 2);
        // A shared kind behind a Go holder is another kind of lock.
        let mixed = [
            kv("p/n/2a", 5, ""),
            kv("p/n\0a", 6, &format!("r~rw|0|{o}|")),
        ];
        let q = queue("p/", "n", &mixed).expect("parses");
        assert!(matches!(judge(&q, 1), Admission::Conflict(Mode::Exclusive)));
    }

    #[test]
    fn the_queue_follows_create_revisions_and_downgrades_take_their_writers_place() {
        let o = owner();
        let kvs = [
            kv("p/n\0c", 9, &format!("w~rw|0|{o}|")),
            kv("p/n\0a", 5, &format!("w~rw|0|{o}|")),
            kv("p/n\0b", 7, &format!("r~rw|5|{o}|h|x")),
        ];
        let q = queue("p/", "n", &kvs).expect("parses");
        let order: Vec<i64> = q.iter().map(|e| e.create_revision).collect();
        assert_eq!(order, [5, 7, 9]);
        assert_eq!(q[1].holder, "h|x");
        assert_eq!(judge(&q, 0), Admission::Grant);
        assert_eq!(judge(&q, 1), Admission::Grant);
        assert_eq!(judge(&q, 2), Admission::Wait);
    }

    #[test]
    fn changes_after_the_read_update_the_queue() {
        let o = owner();
        let mut q = queue("p/", "n", &[kv("p/n/a", 5, "")]).expect("parses");
        let put = |key: &str, rev: i64| Event {
            r#type: EventType::Put as i32,
            kv: Some(kv(key, rev, &format!("x|0|{o}|"))),
            prev_kv: None,
        };
        let mut delete = put("p/n/a", 8);
        delete.r#type = EventType::Delete as i32;
        // The put at 6 is in the read at 6 already; the one at 7 is new;
        // `n-1` is another name.
        let events = [put("p/n/b", 6), put("p/n/c", 7), put("p/n-1/d", 7), delete];
        apply_changes("p/", "n", &mut q, &events, 6).expect("applies");
        let keys: Vec<&[u8]> = q.iter().map(|e| e.key.as_slice()).collect();
        assert_eq!(keys, [b"p/n/c".as_slice()]);
    }

    #[test]
    fn malformed_values_are_errors() {
        for value in [
            "",
            "x",
            "q|0|00|",
            "x|a|00|",
            "x|0|zz|",
            "w|0|00|",
            "p~sx|0|00|",
        ] {
            assert!(
                Entry::parse("p/", &kv("p/n\0a", 1, value)).is_err(),
                "{value}"
            );
        }
        assert!(Entry::parse("other/", &kv("p/n\0a", 1, &format!("x|0|{}|", owner()))).is_err());
    }
}
