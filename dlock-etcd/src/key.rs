//! Where a lock lives in etcd, and what its keys hold.
//!
//! Every hold and every waiter of a name is one key,
//! `{prefix}{name}\0{lease id:016x}`, attached to its own etcd lease: the
//! key goes when the lease expires or is revoked. Names have no NUL, so the
//! mapping is injective and one name's keys are exactly the range
//! `{prefix}{name}\0` to `{prefix}{name}\x01`. The keys of a name form its
//! queue, in the order of their create revisions; a downgrade's read hold
//! takes its writer's place.
//!
//! A key's value is `{mode}|{place}|{owner}|{holder}`: the mode's code and
//! its kind's marker (`x`, `r~rw`, `w~rw`, `p~s3`), the create revision of the writer whose
//! place a downgrade takes (0 for any other key), the owner token in hex,
//! and the holder description.

use dlock_core::{Admission, Error, Mode, OwnerToken, Result};

use crate::backend::NAME;
use crate::proto::event::EventType;
use crate::proto::{Event, KeyValue};

/// The key of the hold or waiter with lease `lease` of `name`.
pub(crate) fn hold_key(prefix: &str, name: &str, lease: i64) -> Vec<u8> {
    format!("{prefix}{name}\0{lease:016x}").into_bytes()
}

/// The range of `name`'s keys: (key, range end).
pub(crate) fn name_range(prefix: &str, name: &str) -> (Vec<u8>, Vec<u8>) {
    (
        format!("{prefix}{name}\0").into_bytes(),
        format!("{prefix}{name}\x01").into_bytes(),
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
    let (code, marker) = (mode.code(), mode.marker());
    format!("{code}{marker}|{place}|{owner}|{holder}").into_bytes()
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
    /// Reads a key of the range under `prefix`.
    pub(crate) fn parse(prefix: &str, kv: &KeyValue) -> Result<Entry> {
        let bad = || Error::malformed(NAME, "a lock key", String::from_utf8_lossy(&kv.key));
        let key = std::str::from_utf8(&kv.key).map_err(|_| bad())?;
        let rest = key.strip_prefix(prefix).ok_or_else(bad)?;
        let (name, _) = rest.split_once('\0').ok_or_else(bad)?;
        let value = std::str::from_utf8(&kv.value).map_err(|_| bad())?;
        let mut parts = value.splitn(4, '|');
        let (Some(code), Some(place), Some(owner), Some(holder)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let split = code.char_indices().nth(1).map_or(code.len(), |(i, _)| i);
        let mode = Mode::of_code(&code[..split], &code[split..]).ok_or_else(bad)?;
        let place: i64 = place.parse().map_err(|_| bad())?;
        let owner = u128::from_str_radix(owner, 16).map_err(|_| bad())?;
        Ok(Entry {
            key: kv.key.clone(),
            name: name.to_owned(),
            lease: kv.lease,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            mode,
            place: if place > 0 { place } else { kv.create_revision },
            downgrade: place > 0,
            owner: OwnerToken::from_u128(owner),
            holder: holder.to_owned(),
        })
    }
}

/// A name's keys in queue order.
pub(crate) fn queue(prefix: &str, kvs: &[KeyValue]) -> Result<Vec<Entry>> {
    let mut entries = kvs
        .iter()
        .map(|kv| Entry::parse(prefix, kv))
        .collect::<Result<Vec<_>>>()?;
    sort(&mut entries);
    Ok(entries)
}

/// Queue order: by place, a downgrade's read hold right behind its writer.
fn sort(queue: &mut [Entry]) {
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

/// Brings a queue read at revision `after` up to date with a watch's
/// `events`; returns the revision it is now current at. Events at or
/// before `after` are in the read already (the watch may start before it).
pub(crate) fn apply_changes(
    prefix: &str,
    queue: &mut Vec<Entry>,
    events: &[Event],
    after: i64,
) -> Result<i64> {
    let mut revision = after;
    for kv in events
        .iter()
        .filter_map(|e| e.kv.as_ref().map(|kv| (e.r#type, kv)))
    {
        let (kind, kv) = kv;
        if kv.mod_revision <= after {
            continue;
        }
        revision = revision.max(kv.mod_revision);
        queue.retain(|e| e.key != kv.key);
        if kind == EventType::Put as i32 {
            queue.push(Entry::parse(prefix, kv)?);
        }
    }
    sort(queue);
    Ok(revision)
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
        let (a_start, a_end) = name_range("dlock/", "a");
        let ab = hold_key("dlock/", "a/b", 1);
        let a_ = hold_key("dlock/", "a\u{1}", 1);
        for other in [ab, a_] {
            assert!(!(a_start <= other && other < a_end), "{other:?}");
        }
        let own = hold_key("dlock/", "a", i64::MAX);
        assert!(a_start <= own && own < a_end);
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
    }

    #[test]
    fn the_queue_follows_create_revisions_and_downgrades_take_their_writers_place() {
        let o = owner();
        let kvs = [
            kv("p/n\0c", 9, &format!("w~rw|0|{o}|")),
            kv("p/n\0a", 5, &format!("w~rw|0|{o}|")),
            kv("p/n\0b", 7, &format!("r~rw|5|{o}|h|x")),
        ];
        let q = queue("p/", &kvs).expect("parses");
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
        let mut q = queue("p/", &[kv("p/n\0a", 5, &format!("x|0|{o}|"))]).expect("parses");
        let put = |key: &str, rev: i64| Event {
            r#type: EventType::Put as i32,
            kv: Some(kv(key, rev, &format!("x|0|{o}|"))),
            prev_kv: None,
        };
        let mut delete = put("p/n\0a", 8);
        delete.r#type = EventType::Delete as i32;
        // The put at 6 is in the read at 6 already; the one at 7 is new.
        let events = [put("p/n\0b", 6), put("p/n\0c", 7), delete];
        assert_eq!(apply_changes("p/", &mut q, &events, 6).ok(), Some(8));
        let keys: Vec<&[u8]> = q.iter().map(|e| e.key.as_slice()).collect();
        assert_eq!(keys, [b"p/n\0c".as_slice()]);
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
