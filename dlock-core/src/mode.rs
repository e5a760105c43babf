//! What kind of hold an acquire asks for (a mutex, either side of a
//! reader-writer lock, a semaphore's permit) and the one rule that decides
//! whether it may be granted, shared by the in-memory driver, the
//! conformance suite's checker and any driver that keeps its holders in
//! process memory.

use std::fmt;

/// The kind of hold an acquire asks for, set with
/// [`LockOptions::read`](crate::LockOptions::read),
/// [`write`](crate::LockOptions::write) or
/// [`permits`](crate::LockOptions::permits); a mutex unless told otherwise.
///
/// A name is one kind of lock at a time: a mutex, a reader-writer lock or
/// a semaphore of a given size. Asking for a name in a mode of another
/// kind while it is held or waited for (a semaphore of 8 where holders use
/// one of 4, say) is [`Error::ModeConflict`](crate::Error::ModeConflict),
/// never a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Mode {
    /// A mutex: one holder at a time.
    #[default]
    Exclusive,
    /// A reader-writer lock's shared side: readers hold together, never
    /// beside a writer, and no new reader is admitted while a writer waits.
    Read,
    /// A reader-writer lock's exclusive side: a writer holds alone.
    Write,
    /// One permit of a semaphore of this many: at most that many holders.
    Permit(u32),
}

/// What [`Mode::admits`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Grant the hold now.
    Grant,
    /// The hold must wait: a holder or a waiter ahead of it comes first.
    Wait,
    /// The name is in use as another kind of lock: this holder's or
    /// waiter's mode.
    Conflict(Mode),
}

impl Mode {
    /// Whether `self` and `other` are modes of one kind of lock, which may
    /// be held or waited for on a name at the same time.
    pub fn same_kind(self, other: Mode) -> bool {
        match (self, other) {
            (Mode::Exclusive, Mode::Exclusive) => true,
            (Mode::Read | Mode::Write, Mode::Read | Mode::Write) => true,
            (Mode::Permit(a), Mode::Permit(b)) => a == b,
            _ => false,
        }
    }

    /// Whether a request in this mode may be granted, given the modes of
    /// the name's live holders and of the waiters queued ahead of it (every
    /// live waiter, for a request that does not queue):
    ///
    /// - a mutex or a writer only when nobody holds and nobody is ahead;
    /// - a reader when no writer holds and no writer is ahead, so a waiting
    ///   writer keeps new readers out and the readers queued behind a writer
    ///   enter together when it is done;
    /// - a permit when the holders and the waiters ahead number fewer than
    ///   the permits (first come, first served).
    pub fn admits(self, holders: &[Mode], ahead: &[Mode]) -> Admission {
        if let Some(&other) = holders.iter().chain(ahead).find(|m| !self.same_kind(**m)) {
            return Admission::Conflict(other);
        }
        let free = match self {
            Mode::Exclusive | Mode::Write => holders.is_empty() && ahead.is_empty(),
            Mode::Read => !holders.iter().chain(ahead).any(|m| *m == Mode::Write),
            Mode::Permit(permits) => {
                u32::try_from(holders.len() + ahead.len()).is_ok_and(|taken| taken < permits)
            }
        };
        if free {
            Admission::Grant
        } else {
            Admission::Wait
        }
    }

    /// Whether this is a shared mode, whose holders may be many.
    pub fn is_shared(self) -> bool {
        matches!(self, Mode::Read | Mode::Permit(_))
    }

    /// How drivers write the mode in their storage: `x` (mutex), `r`, `w`
    /// or `p` (a permit).
    pub fn code(self) -> &'static str {
        match self {
            Mode::Exclusive => "x",
            Mode::Read => "r",
            Mode::Write => "w",
            Mode::Permit(_) => "p",
        }
    }

    /// How drivers mark a name held as this mode's kind of lock: `~rw` for
    /// a reader-writer lock, `~s<N>` for a semaphore of N, empty for a
    /// mutex. Modes of one kind share their marker, and markers of
    /// different kinds differ.
    pub fn marker(self) -> String {
        match self {
            Mode::Exclusive => String::new(),
            Mode::Read | Mode::Write => "~rw".to_owned(),
            Mode::Permit(n) => format!("~s{n}"),
        }
    }

    /// A semaphore's permits; 0 for the other kinds.
    pub fn permits(self) -> u32 {
        match self {
            Mode::Permit(n) => n,
            _ => 0,
        }
    }

    /// The mode a driver stored as its [`code`](Mode::code) and the name's
    /// [`marker`](Mode::marker) (a permit's count is in the marker), for
    /// `inspect` and `list`; `None` for what no driver writes.
    pub fn of_code(code: &str, marker: &str) -> Option<Mode> {
        match (code, Mode::of_marker(marker)) {
            ("x", _) => Some(Mode::Exclusive),
            ("r", Mode::Write) => Some(Mode::Read),
            ("w", Mode::Write) => Some(Mode::Write),
            ("p", permit @ Mode::Permit(_)) => Some(permit),
            _ => None,
        }
    }

    /// The mode a driver's [`marker`](Mode::marker) names, to report a
    /// conflict: a semaphore's permit, a reader-writer lock's write side,
    /// and anything else (a mutex's `x`) a mutex.
    pub fn of_marker(marker: &str) -> Mode {
        match marker.strip_prefix("~s").and_then(|n| n.parse().ok()) {
            Some(permits) => Mode::Permit(permits),
            None if marker == "~rw" => Mode::Write,
            None => Mode::Exclusive,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exclusive => f.write_str("mutex"),
            Mode::Read => f.write_str("read lock"),
            Mode::Write => f.write_str("write lock"),
            Mode::Permit(n) => write!(f, "semaphore of {n} permits"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Admission::{Conflict, Grant, Wait};
    use super::Mode::{Exclusive, Permit, Read, Write};

    #[test]
    fn the_rules() {
        assert_eq!(Exclusive.admits(&[], &[]), Grant);
        assert_eq!(Exclusive.admits(&[Exclusive], &[]), Wait);
        assert_eq!(Exclusive.admits(&[], &[Exclusive]), Wait);
        assert_eq!(Read.admits(&[Read, Read], &[Read]), Grant);
        assert_eq!(Read.admits(&[Read], &[Write]), Wait);
        assert_eq!(Read.admits(&[Write], &[]), Wait);
        assert_eq!(Write.admits(&[Read], &[]), Wait);
        assert_eq!(Write.admits(&[], &[Read]), Wait);
        assert_eq!(Write.admits(&[], &[]), Grant);
        assert_eq!(Permit(2).admits(&[Permit(2)], &[]), Grant);
        assert_eq!(Permit(2).admits(&[Permit(2)], &[Permit(2)]), Wait);
        assert_eq!(Permit(2).admits(&[Permit(2), Permit(2)], &[]), Wait);
        assert_eq!(Permit(0).admits(&[], &[]), Wait);
        assert_eq!(Permit(3).admits(&[Permit(2)], &[]), Conflict(Permit(2)));
        assert_eq!(Read.admits(&[], &[Exclusive]), Conflict(Exclusive));
        assert_eq!(Exclusive.admits(&[Write], &[]), Conflict(Write));
    }

    #[test]
    fn markers_name_their_kind() {
        for mode in [Exclusive, Read, Write, Permit(1), Permit(8)] {
            let back = super::Mode::of_marker(&mode.marker());
            assert!(back.same_kind(mode), "{mode:?} came back as {back:?}");
        }
        assert_ne!(Permit(1).marker(), Permit(11).marker());
        assert_eq!(super::Mode::of_marker("x"), Exclusive);
    }
}
