//! The checker: every grant of the run judged against what the target's
//! Safety model row promises.
//!
//! A hold is believed from the moment its grant returned until the first
//! of: its release sent, its guard dropped or abandoned, `lost()` fired, a
//! look that found it invalid, its validity deadline (as last renewed),
//! its process killed.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::history::{Event, Kind, PERMITS, What};
use crate::nemesis::Record;
use crate::resource::Write;
use crate::target::{Hazard, Target, ZK_SESSION};

/// One grant and how long it was believed.
#[derive(Debug, Clone, Copy)]
pub struct Hold {
    /// Its client process.
    pub client: u32,
    /// The name's index.
    pub name: u32,
    /// The kind granted.
    pub kind: Kind,
    /// When the acquire was sent (ns).
    pub invoked: u64,
    /// When the grant returned (ns).
    pub granted: u64,
    /// When the holder stopped believing (ns).
    pub end: u64,
    /// Its fencing token.
    pub token: u64,
}

/// Two holds believed at once where the lock allows only one.
#[derive(Debug, Clone, Serialize)]
pub struct Overlap {
    /// The name's index.
    pub name: u32,
    /// The earlier holder: client, token.
    pub first: (u32, u64),
    /// The later one.
    pub second: (u32, u64),
    /// How long both believed (ms).
    pub overlap_ms: f64,
    /// The hazard of the Safety model that explains it, if any.
    pub explained_by: Option<Hazard>,
}

/// A grant whose token is not above a grant that returned before it was asked.
#[derive(Debug, Clone, Serialize)]
pub struct StaleToken {
    /// The name's index.
    pub name: u32,
    /// The grant: client, token.
    pub grant: (u32, u64),
    /// The highest token granted before it was asked.
    pub earlier: u64,
    /// The hazard that explains it, if any.
    pub explained_by: Option<Hazard>,
}

/// The checker's findings.
#[derive(Debug, Default, Serialize)]
pub struct Findings {
    /// Grants.
    pub grants: usize,
    /// Acquires that returned an error.
    pub failed_acquires: usize,
    /// Exclusion violations.
    pub exclusion: Vec<Overlap>,
    /// Fencing violations.
    pub fencing: Vec<StaleToken>,
    /// Writes the resource refused: (name, token, client, believed).
    pub refused: Vec<(u32, u64, u32, bool)>,
    /// The longest time from a batch's heal to a name's next grant (ms).
    pub longest_unavailable_ms: f64,
    /// Heals after which no grant came within the bound.
    pub unavailable: Vec<f64>,
    /// Calls that took longer than their bound: (what, ms).
    pub slow_calls: Vec<(String, f64)>,
    /// The longest call, of those whose process was not stopped meanwhile (ms).
    pub longest_call_ms: f64,
    /// Acquire latencies of grants, p50 and p99 (ms).
    pub acquire_p50_ms: f64,
    /// See `acquire_p50_ms`.
    pub acquire_p99_ms: f64,
}

/// What the run saw besides the histories.
pub struct Seen<'a> {
    /// The target.
    pub target: &'a Target,
    /// Lease TTL.
    pub ttl: Duration,
    /// The nemesis's faults.
    pub nemesis: &'a Record,
    /// Processes killed, and when: by the nemesis and at the end.
    pub kills: &'a [(u32, u64)],
    /// The resource's log.
    pub writes: &'a [Write],
    /// When clients stopped starting holds (ns).
    pub until_ns: u64,
}

const MS: f64 = 1e6;

fn ms(ns: u64) -> f64 {
    ns as f64 / MS
}

/// Judges `events` (every client's, any order).
pub fn check(mut events: Vec<Event>, seen: &Seen<'_>) -> Findings {
    events.sort_by_key(|e| (e.client, e.task, e.t));
    let (holds, calls) = holds(&events, seen);
    let mut f = Findings {
        grants: holds.len(),
        failed_acquires: events
            .iter()
            .filter(|e| matches!(e.what, What::Failed { .. }))
            .count(),
        ..Findings::default()
    };
    let mut by_name: BTreeMap<u32, Vec<Hold>> = BTreeMap::new();
    for h in &holds {
        by_name.entry(h.name).or_default().push(*h);
    }
    for holds in by_name.values_mut() {
        holds.sort_by_key(|h| h.granted);
        exclusion(holds, seen, &mut f.exclusion);
        fencing(holds, seen, &mut f.fencing);
    }
    f.refused = seen
        .writes
        .iter()
        .filter(|w| !w.accepted)
        .map(|w| (w.name, w.token, w.client, w.believed))
        .collect();
    liveness(&holds, seen, &mut f);
    judge_calls(calls, seen, &mut f);
    f
}

/// A call: what, which client, sent and returned (ns).
type Call = (&'static str, u32, u64, u64);

fn holds(events: &[Event], seen: &Seen<'_>) -> (Vec<Hold>, Vec<Call>) {
    let mut holds = Vec::new();
    let mut calls = Vec::new();
    let mut open: Option<(Hold, Option<u64>)> = None;
    let mut invoked = None;
    let mut release_sent = None;
    let mut last = (u32::MAX, u32::MAX);
    let close = |open: &mut Option<(Hold, Option<u64>)>, at: u64, holds: &mut Vec<Hold>| {
        if let Some((mut h, valid_until)) = open.take() {
            h.end = at.min(valid_until.unwrap_or(u64::MAX)).max(h.granted);
            holds.push(h);
        }
    };
    for e in events {
        if (e.client, e.task) != last {
            // The task's history ended with its process.
            let killed = kill_time(seen, last.0);
            close(&mut open, killed.unwrap_or(seen.until_ns), &mut holds);
            last = (e.client, e.task);
            invoked = None;
        }
        match &e.what {
            What::Invoke { .. } => invoked = Some(e.t),
            What::Granted {
                kind,
                token,
                valid_until,
            } => {
                let sent = invoked.take().unwrap_or(e.t);
                calls.push(("acquire", e.client, sent, e.t));
                let hold = Hold {
                    client: e.client,
                    name: e.name,
                    kind: *kind,
                    invoked: sent,
                    granted: e.t,
                    end: u64::MAX,
                    token: *token,
                };
                open = Some((hold, *valid_until));
            }
            What::Failed { .. } => {
                if let Some(sent) = invoked.take() {
                    calls.push(("acquire", e.client, sent, e.t));
                }
            }
            What::Checked { valid, valid_until } => {
                if let Some((_, until)) = open.as_mut() {
                    *until = *valid_until;
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
    close(
        &mut open,
        kill_time(seen, last.0).unwrap_or(seen.until_ns),
        &mut holds,
    );
    (holds, calls)
}

fn kill_time(seen: &Seen<'_>, client: u32) -> Option<u64> {
    seen.kills.iter().find(|(c, _)| *c == client).map(|k| k.1)
}

/// Holds believed at once that the kinds do not allow together. `holds`
/// is in grant order.
fn exclusion(holds: &[Hold], seen: &Seen<'_>, out: &mut Vec<Overlap>) {
    let mut active: Vec<Hold> = Vec::new();
    for b in holds {
        active.retain(|a| a.end > b.granted);
        let conflicting: Vec<&Hold> = match b.kind {
            Kind::Mutex | Kind::Write => active.iter().collect(),
            Kind::Read => active.iter().filter(|a| a.kind.exclusive()).collect(),
            Kind::Permit if active.len() >= PERMITS as usize => active.iter().collect(),
            Kind::Permit => Vec::new(),
        };
        // The pair the model explains, if there is one.
        let first = conflicting
            .iter()
            .find(|a| explain(a, seen).is_some())
            .or(conflicting.first());
        if let Some(a) = first {
            out.push(Overlap {
                name: b.name,
                first: (a.client, a.token),
                second: (b.client, b.token),
                overlap_ms: ms(a.end.min(b.end).saturating_sub(b.granted)),
                explained_by: explain(a, seen),
            });
        }
        active.push(*b);
    }
}

/// The hazard of the target's row that lets `a` be believed after another
/// grant, if one happened during it.
fn explain(a: &Hold, seen: &Seen<'_>) -> Option<Hazard> {
    seen.target.hazards.iter().copied().find(|h| match h {
        Hazard::Mutant => true,
        Hazard::RestartForgets => seen.nemesis.faults.iter().any(|f| {
            f.kind == crate::target::FaultKind::ServerKill
                && f.start >= a.invoked
                && f.start <= a.end
        }),
        Hazard::PausedSessionHolder => seen.nemesis.faults.iter().any(|f| {
            f.kind == crate::target::FaultKind::ClientStop
                && f.client == Some(a.client)
                && f.start < a.end
                && f.end > a.granted
                && f.end - f.start >= duration_ns(ZK_SESSION) * 2 / 3
        }),
    })
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Every grant's token is above every grant of the name that returned
/// before it was asked for, whatever the kinds.
fn fencing(holds: &[Hold], seen: &Seen<'_>, out: &mut Vec<StaleToken>) {
    // `holds` is in grant order: the highest token of the first k grants.
    let highest: Vec<u64> = holds
        .iter()
        .scan(0, |max, h| {
            *max = h.token.max(*max);
            Some(*max)
        })
        .collect();
    for b in holds {
        let before = holds.partition_point(|a| a.granted < b.invoked);
        let Some(&earlier) = before.checked_sub(1).and_then(|k| highest.get(k)) else {
            continue;
        };
        if earlier >= b.token {
            out.push(StaleToken {
                name: b.name,
                grant: (b.client, b.token),
                earlier,
                explained_by: seen
                    .target
                    .hazards
                    .iter()
                    .copied()
                    .find(|h| *h == Hazard::Mutant),
            });
        }
    }
}

/// After each batch of faults heals, every name is granted again within
/// the target's bound (a lease of a holder lost in the fault ends first).
fn liveness(holds: &[Hold], seen: &Seen<'_>, f: &mut Findings) {
    let bound = duration_ns(seen.target.liveness_bound(seen.ttl));
    let mut by_name: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for h in holds {
        by_name.entry(h.name).or_default().push(h.granted);
    }
    for grants in by_name.values_mut() {
        grants.sort_unstable();
    }
    for (i, &heal) in seen.nemesis.heals.iter().enumerate() {
        let next_batch = seen
            .nemesis
            .batches
            .get(i + 1)
            .copied()
            .unwrap_or(seen.until_ns);
        let mut longest = 0;
        for grants in by_name.values() {
            let first = grants[grants.partition_point(|&g| g <= heal)..].first();
            longest = longest.max(match first {
                Some(&g) if g <= next_batch => g - heal,
                // The next faults came first: what is known is that the
                // name waited at least until then.
                _ => next_batch.saturating_sub(heal),
            });
        }
        f.longest_unavailable_ms = f.longest_unavailable_ms.max(ms(longest));
        if longest > bound {
            f.unavailable.push(ms(longest));
        }
    }
}

/// Every acquire returns within its wait bound (3 s; the drivers' request
/// timeouts are shorter), every release within the request timeout, plus
/// [`crate::target::SLACK`] — unless its process was stopped meanwhile.
fn judge_calls(calls: Vec<Call>, seen: &Seen<'_>, f: &mut Findings) {
    let mut acquires = Vec::new();
    for (what, client, sent, returned) in calls {
        let took = returned.saturating_sub(sent);
        if what == "acquire" {
            acquires.push(took);
        }
        let stopped = seen.nemesis.faults.iter().any(|x| {
            x.kind == crate::target::FaultKind::ClientStop
                && x.client == Some(client)
                && x.start < returned
                && x.end > sent
        });
        let bound = match what {
            "acquire" => crate::client::WAIT,
            _ => Duration::from_secs(2),
        } + crate::target::SLACK;
        if stopped {
            continue;
        }
        f.longest_call_ms = f.longest_call_ms.max(ms(took));
        if took > duration_ns(bound) {
            f.slow_calls.push((format!("{what} by client {client}"), ms(took)));
        }
    }
    acquires.sort_unstable();
    let at = |q: f64| {
        acquires
            .get(((acquires.len() as f64 * q) as usize).min(acquires.len().saturating_sub(1)))
            .map_or(0.0, |&t| ms(t))
    };
    f.acquire_p50_ms = at(0.5);
    f.acquire_p99_ms = at(0.99);
}
