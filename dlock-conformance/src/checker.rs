//! The safety checker: a stand-in for the resource a lock protects.
//!
//! Every holder enters with its fencing token and leaves before it
//! releases. The checker records each grant and reports any overlap of two
//! holders, and any token not greater than the last one it accepted, which
//! is what a fenced store would refuse.

use std::sync::{Mutex, PoisonError};

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
        assert!(
            s.violations.is_empty(),
            "{} violations in {} grants; first ones:\n{}",
            s.violations.len(),
            s.grants,
            s.violations
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
