//! How a holding session names its hold: its mark, `<kind letter><owner>
//! <fence>`, as its `application_name`, and its holder in its row of the
//! holders' table (a downgraded session's row has both holds' marks, each
//! with its holder).

use dlock_core::{LockInfo, Mode, OwnerToken};

/// The start of a hold's mark, before its fence (ASCII, at most 34
/// bytes: with a fence, within `application_name`'s 63).
pub(crate) fn mark_prefix(mode: Mode, owner: OwnerToken) -> String {
    let letter = match mode {
        Mode::Exclusive => 'm',
        Mode::Read => 'r',
        Mode::Write => 'w',
        // Not granted in this mode: core refuses kinds a driver lacks.
        _ => 'p',
    };
    format!("{letter}{owner} ")
}

/// The fence of a mark.
pub(crate) fn fence_of(mark: &str) -> Option<u64> {
    mark.split(' ').nth(1)?.parse().ok()
}

/// The kind of lock a holder's letter says (`+`: a downgrade's read and
/// write), `None` for a hold not made by this mode.
pub(crate) fn kind_of(letter: char) -> Option<Mode> {
    match letter {
        'm' => Some(Mode::Exclusive),
        'r' | '+' => Some(Mode::Read),
        'w' => Some(Mode::Write),
        _ => None,
    }
}

/// A holder as `pg_locks` and its session show it: the session's
/// `application_name` is the mark of its one hold (the holder in its
/// row), or `+` with both holds' whole marks in its row. `None` when the
/// session has no mark of the lock's mode.
pub(crate) fn info(
    application_name: &str,
    holder: &str,
    marks: &str,
    lock_mode: &str,
) -> Option<LockInfo> {
    let shared = lock_mode == "ShareLock";
    let parse = |mark: &str, holder: Option<&str>| {
        let mut parts = mark.splitn(3, ' ');
        let (held, fence) = (parts.next()?, parts.next()?);
        let holder = holder.or(parts.next())?;
        let mut chars = held.chars();
        let kind = kind_of(chars.next()?)?;
        if shared != (kind == Mode::Read) {
            return None;
        }
        let owner = chars.as_str().parse::<OwnerToken>().ok()?;
        let info = LockInfo::new(owner, fence.parse().ok()?, None).with_mode(kind);
        Some(if holder.is_empty() {
            info
        } else {
            info.with_holder(holder)
        })
    };
    if application_name == "+" {
        marks.lines().find_map(|mark| parse(mark, None))
    } else {
        parse(application_name, Some(holder))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_says_the_holder_and_its_fence() {
        let owner = OwnerToken::from_u128(0xabc);
        let mark = format!("{}1796529103293980", mark_prefix(Mode::Write, owner));
        assert!(mark.len() <= 63, "application_name keeps 63 bytes");
        let held = info(&mark, "worker 7 · Zürich", "", "ExclusiveLock").expect("a holder");
        assert_eq!(
            (held.owner, held.fencing_token),
            (owner, 1_796_529_103_293_980)
        );
        assert_eq!(held.mode, Some(Mode::Write));
        assert_eq!(held.holder.as_deref(), Some("worker 7 · Zürich"));
        assert_eq!(fence_of(&mark), Some(1_796_529_103_293_980));
        assert!(info(&mark, "x", "", "ShareLock").is_none());
        // A downgraded session: its read and its write, each by its lock.
        let read = format!("{}1235 reader", mark_prefix(Mode::Read, owner));
        let both = format!("{read}\n{mark} writer");
        let shared = info("+", "", &both, "ShareLock").expect("the read");
        assert_eq!(
            (shared.fencing_token, shared.holder.as_deref()),
            (1235, Some("reader"))
        );
        let write = info("+", "", &both, "ExclusiveLock").expect("the write");
        assert_eq!(write.holder.as_deref(), Some("writer"));
        assert!(info("psql", "", "", "ExclusiveLock").is_none());
    }
}
