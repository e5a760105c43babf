//! The safety checker: a stand-in for the resource a lock protects.
//!
//! Every holder enters with its fencing token and leaves before it
//! releases. The checker records each grant and reports any overlap of two
//! holders, and any token not greater than the last one it accepted, which
//! is what a fenced store would refuse.

use std::sync::{Mutex, PoisonError};

use dlock_core::Mode;

/// A protected resource that checks the lock's promises.
#[derive(Debug, Default)]
pub struct Checker {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    holder: Option<(usize, u64)>,
    last_token: u64,
    grants: u64,
    violations: Vec<String>,
}

impl Checker {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Client `client` enters with fencing token `token` (`None` when the
    /// backend has no fencing). Records a violation if someone is inside,
    /// or the token does not increase.
    pub fn enter(&self, client: usize, token: Option<u64>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.grants += 1;
        if let Some((other, other_token)) = s.holder {
            let v = format!(
                "overlap: client {client} entered while client {other} (token {other_token}) was inside"
            );
            s.violations.push(v);
        }
        if let Some(token) = token {
            if token <= s.last_token {
                let v = format!(
                    "fencing: client {client} entered with token {token}, not above {}",
                    s.last_token
                );
                s.violations.push(v);
            }
            s.last_token = s.last_token.max(token);
        }
        s.holder = Some((client, token.unwrap_or(0)));
    }

    /// Client `client` leaves (before it releases the lock).
    pub fn leave(&self, client: usize) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.holder.is_some_and(|(c, _)| c == client) {
            s.holder = None;
        }
    }

    /// Whether a write fenced with `token` would be accepted now: what a
    /// fenced store answers a holder whose lease may have ended.
    pub fn would_accept(&self, token: u64) -> bool {
        token
            > self
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .last_token
    }

    /// Grants recorded so far.
    pub fn grants(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .grants
    }

    /// Panics listing every violation recorded, if any.
    pub fn assert_safe(&self) {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        assert_none(&s.violations, s.grants);
    }
}

/// The checker of a name held in shared modes (a reader-writer lock or a
/// semaphore): who is inside, by mode, at every entry.
///
/// Tokens of concurrent readers or permits reach the resource in any
/// order, so the fencing check is what a fenced store can demand of them:
/// a writer's token is above every token seen before it (everyone before
/// it has left), a reader's above the last writer's, and no token twice.
#[derive(Debug, Default)]
pub struct SharedChecker {
    state: Mutex<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    readers: usize,
    writers: usize,
    permits: usize,
    max_readers: usize,
    max_permits: usize,
    last_writer_token: u64,
    max_token: u64,
    tokens: std::collections::HashSet<u64>,
    grants: u64,
    violations: Vec<String>,
}

impl SharedChecker {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Someone enters in `mode` with fencing token `token`.
    pub fn enter(&self, mode: Mode, token: u64) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.grants += 1;
        let inside = (s.readers, s.writers, s.permits);
        match mode {
            Mode::Write | Mode::Exclusive => {
                if inside != (0, 0, 0) {
                    let v = format!(
                        "a writer (token {token}) entered beside {inside:?} (readers, writers, permits)"
                    );
                    s.violations.push(v);
                }
                if token <= s.max_token {
                    let v = format!("a writer's token {token} is not above {}", s.max_token);
                    s.violations.push(v);
                }
                s.writers += 1;
                s.last_writer_token = token;
            }
            Mode::Read => {
                if s.writers > 0 {
                    s.violations
                        .push(format!("a reader (token {token}) entered beside a writer"));
                }
                if token <= s.last_writer_token {
                    let v = format!(
                        "a reader's token {token} is not above the last writer's {}",
                        s.last_writer_token
                    );
                    s.violations.push(v);
                }
                s.readers += 1;
                s.max_readers = s.max_readers.max(s.readers);
            }
            Mode::Permit(n) => {
                s.permits += 1;
                s.max_permits = s.max_permits.max(s.permits);
                if s.permits > n as usize {
                    let v = format!("{} permit holders inside a semaphore of {n}", s.permits);
                    s.violations.push(v);
                }
            }
            other => s.violations.push(format!("unexpected mode {other:?}")),
        }
        if !s.tokens.insert(token) {
            s.violations.push(format!("token {token} granted twice"));
        }
        s.max_token = s.max_token.max(token);
    }

    /// Someone in `mode` leaves (before it releases).
    pub fn leave(&self, mode: Mode) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match mode {
            Mode::Read => s.readers -= 1,
            Mode::Permit(_) => s.permits -= 1,
            _ => s.writers -= 1,
        }
    }

    /// Grants recorded, and the most readers and permit holders seen
    /// inside at once.
    pub fn counts(&self) -> (u64, usize, usize) {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (s.grants, s.max_readers, s.max_permits)
    }

    /// Panics listing every violation recorded, if any.
    pub fn assert_safe(&self) {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        assert_none(&s.violations, s.grants);
    }
}

/// Panics listing the first violations, if any.
fn assert_none(violations: &[String], grants: u64) {
    assert!(
        violations.is_empty(),
        "{} violations in {grants} grants; first ones:\n{}",
        violations.len(),
        violations[..violations.len().min(10)].join("\n")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_overlaps_are_reported() {
        let c = SharedChecker::new();
        c.enter(Mode::Read, 2);
        c.enter(Mode::Read, 1);
        c.leave(Mode::Read);
        c.leave(Mode::Read);
        c.enter(Mode::Write, 3);
        c.leave(Mode::Write);
        c.assert_safe();
        c.enter(Mode::Read, 4);
        c.enter(Mode::Write, 5);
        assert!(std::panic::catch_unwind(|| c.assert_safe()).is_err());

        let c = SharedChecker::new();
        for token in 1..=3 {
            c.enter(Mode::Permit(2), token);
        }
        assert_eq!(c.counts(), (3, 0, 3));
        assert!(std::panic::catch_unwind(|| c.assert_safe()).is_err());
    }

    #[test]
    fn overlap_and_stale_tokens_are_reported() {
        let c = Checker::new();
        c.enter(1, Some(5));
        c.leave(1);
        c.enter(2, Some(6));
        c.leave(2);
        c.assert_safe();
        c.enter(3, Some(7));
        c.enter(4, Some(8));
        let overlap = std::panic::catch_unwind(|| c.assert_safe());
        assert!(overlap.is_err());

        let c = Checker::new();
        c.enter(1, Some(5));
        c.leave(1);
        c.enter(2, Some(5));
        assert!(std::panic::catch_unwind(|| c.assert_safe()).is_err());
        assert_eq!(c.grants(), 2);
    }
}
