//! From histories to holds: when each grant was believed.

use std::collections::HashMap;

use super::{Call, Hold, Seen};
use crate::history::{Event, What};

/// A hold being read from its task's history.
struct Open {
    hold: Hold,
    /// Its validity deadline, as of its last look (`None`: a session's).
    valid_until: Option<u64>,
    /// Whether a look has found it valid (a hold whose first look found
    /// it invalid was never acted on, so never believed).
    seen_valid: bool,
}

/// What the histories say: the holds that were believed, every grant
/// (believed or not: fencing and liveness judge them all), and every call
/// with its times. `events` is sorted by client, task and time.
pub(super) struct Read {
    pub(super) holds: Vec<Hold>,
    pub(super) grants: Vec<Hold>,
    pub(super) calls: Vec<Call>,
}

/// Reads `events` (sorted by client, task and time).
pub(super) fn holds(events: &[Event], seen: &Seen<'_>) -> Read {
    // A process that ended without our kill (a crash) believed nothing
    // after its last event.
    let mut last_seen: HashMap<u32, u64> = HashMap::new();
    for e in events {
        let t = last_seen.entry(e.client).or_default();
        *t = (*t).max(e.t);
    }
    let gone = |client: u32| {
        seen.kills
            .iter()
            .find(|(c, _)| *c == client)
            .map(|k| k.1)
            .or_else(|| last_seen.get(&client).copied())
            .unwrap_or(seen.until_ns)
    };
    let mut holds = Vec::new();
    let mut grants = Vec::new();
    let mut calls = Vec::new();
    let mut open: Option<Open> = None;
    let mut invoked = None;
    let mut release_sent = None;
    let mut task = None;
    for e in events {
        if task != Some((e.client, e.task)) {
            if let Some((client, _)) = task {
                close(&mut open, gone(client), &mut holds);
            }
            task = Some((e.client, e.task));
            invoked = None;
            release_sent = None;
        }
        match &e.what {
            What::Invoke { .. } => {
                close(&mut open, e.t, &mut holds);
                invoked = Some(e.t);
            }
            What::Granted {
                kind,
                token,
                valid_until,
            } => {
                close(&mut open, e.t, &mut holds);
                let sent = invoked.take().unwrap_or(e.t);
                calls.push(("acquire", e.client, sent, e.t));
                let hold = Hold {
                    client: e.client,
                    name: e.name,
                    kind: *kind,
                    invoked: sent,
                    granted: e.t,
                    end: u64::MAX,
                    deadline: *valid_until,
                    token: *token,
                };
                grants.push(hold);
                open = Some(Open {
                    hold,
                    valid_until: *valid_until,
                    seen_valid: false,
                });
            }
            What::Failed { .. } => {
                if let Some(sent) = invoked.take() {
                    calls.push(("acquire", e.client, sent, e.t));
                }
            }
            What::Checked { valid, valid_until } => {
                if let Some(o) = open.as_mut() {
                    o.valid_until = *valid_until;
                    if *valid {
                        o.seen_valid = true;
                    } else if !o.seen_valid {
                        open = None;
                    }
                }
                if !valid {
                    close(&mut open, e.t, &mut holds);
                }
            }
            What::Lost | What::Dropped | What::Abandoned => close(&mut open, e.t, &mut holds),
            What::Release => {
                release_sent = Some(e.t);
                close(&mut open, e.t, &mut holds);
            }
            What::Released { .. } => {
                if let Some(sent) = release_sent.take() {
                    calls.push(("release", e.client, sent, e.t));
                }
            }
        }
    }
    if let Some((client, _)) = task {
        close(&mut open, gone(client), &mut holds);
    }
    Read {
        holds,
        grants,
        calls,
    }
}

/// Ends the open hold at `at`, or at its validity deadline if that came
/// first. A hold that ends as it is granted was never believed.
fn close(open: &mut Option<Open>, at: u64, holds: &mut Vec<Hold>) {
    let Some(o) = open.take() else { return };
    let end = at.min(o.valid_until.unwrap_or(u64::MAX));
    if end > o.hold.granted {
        holds.push(Hold {
            end,
            deadline: o.valid_until,
            ..o.hold
        });
    }
}
