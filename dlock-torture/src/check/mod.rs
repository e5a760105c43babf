//! The checker: every grant of the run judged against what the target's
//! Safety model row promises.
//!
//! A hold is believed from the moment its grant returned until the first
//! of: its release sent, its guard dropped or abandoned, `lost()` fired, a
//! look that found it invalid, its validity deadline (as last renewed),
//! its process killed.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use crate::client::lock_name;
use crate::history::{Event, Kind, PERMITS, What};
use crate::nemesis::Record;
use crate::resource::Write;
use crate::target::{FaultKind, Hazard, Target, ZK_SESSION};

mod holds;
mod timing;

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
    /// Its validity deadline as last renewed (ns), `None` for a session's.
    pub deadline: Option<u64>,
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
    /// Writes refused by the resource while their hold was believed (and
    /// not made late on purpose): exclusion broken on the server.
    pub refused_in_belief: Vec<Overlap>,
    /// Acquire errors a fault does not explain (not a timeout, connection
    /// or availability error), with how often each came.
    pub unexpected_errors: BTreeMap<String, usize>,
    /// Kinds of hold on a name that were never granted.
    pub ungranted: Vec<String>,
    /// Fencing violations.
    pub fencing: Vec<StaleToken>,
    /// Writes the resource refused: (name, token, client, believed, late).
    pub refused: Vec<(u32, u64, u32, bool, bool)>,
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
    /// Lock-delay (zero: none): a lease its holder stopped renewing keeps
    /// its name this long after the TTL.
    pub lock_delay: Duration,
    /// The nemesis's faults.
    pub nemesis: &'a Record,
    /// Processes killed, and when: by the nemesis and at the end.
    pub kills: &'a [(u32, u64)],
    /// The resource's log.
    pub writes: &'a [Write],
    /// When clients stopped starting holds (ns).
    pub until_ns: u64,
    /// Names in the workload.
    pub names: u32,
}

const MS: f64 = 1e6;

fn ms(ns: u64) -> f64 {
    ns as f64 / MS
}

/// Judges `events` (every client's, any order).
pub fn check(mut events: Vec<Event>, seen: &Seen<'_>) -> Findings {
    events.sort_by_key(|e| (e.client, e.task, e.t));
    let holds::Read {
        holds,
        grants,
        calls,
    } = holds::holds(&events, seen);
    let mut f = Findings::default();
    for e in &events {
        match &e.what {
            What::Granted { .. } => f.grants += 1,
            What::Failed { error, unexpected } => {
                f.failed_acquires += 1;
                if *unexpected {
                    *f.unexpected_errors.entry(error.clone()).or_default() += 1;
                }
            }
            _ => {}
        }
    }
    for holds in by_name(&holds).values() {
        exclusion(holds, seen, &mut f.exclusion);
    }
    for grants in by_name(&grants).values() {
        fencing(grants, seen, &mut f.fencing);
    }
    refused_in_belief(&holds, &grants, seen, &mut f.refused_in_belief);
    f.refused = seen
        .writes
        .iter()
        .filter(|w| !w.accepted)
        .map(|w| (w.name, w.token, w.client, w.believed, w.late))
        .collect();
    // A control is judged by the violations it must show; its long holds
    // may starve a writer for the whole of a short run.
    if seen.target.expect.is_none() {
        f.ungranted = ungranted(&grants, seen.names);
    }
    timing::liveness(&grants, seen, &mut f);
    if seen.target.expect.is_some() {
        // A control's quiet periods are too short to judge recovery by.
        f.unavailable.clear();
    }
    timing::judge_calls(calls, seen, &mut f);
    f
}

impl Findings {
    /// Exclusion violations, refused writes while believed included, that
    /// the target's Safety model row does not explain.
    pub fn unexplained_exclusion(&self) -> usize {
        let unexplained = |v: &[Overlap]| v.iter().filter(|o| o.explained_by.is_none()).count();
        unexplained(&self.exclusion) + unexplained(&self.refused_in_belief)
    }

    /// Fencing violations the row does not explain.
    pub fn unexplained_fencing(&self) -> usize {
        self.fencing
            .iter()
            .filter(|s| s.explained_by.is_none())
            .count()
    }

    /// Violations the target's Safety model row does not predict, missed
    /// bounds, unexpected errors and kinds never granted.
    pub fn unpredicted(&self) -> usize {
        self.unexplained_exclusion()
            + self.unexplained_fencing()
            + self.unavailable.len()
            + self.slow_calls.len()
            + self.unexpected_errors.values().sum::<usize>()
            + self.ungranted.len()
    }
}

/// `holds` by name, each in grant order.
fn by_name(holds: &[Hold]) -> BTreeMap<u32, Vec<Hold>> {
    let mut by_name: BTreeMap<u32, Vec<Hold>> = BTreeMap::new();
    for h in holds {
        by_name.entry(h.name).or_default().push(*h);
    }
    for holds in by_name.values_mut() {
        holds.sort_by_key(|h| h.granted);
    }
    by_name
}

/// A call: what, which client, sent and returned (ns).
type Call = (&'static str, u32, u64, u64);

/// Holds believed at once that the kinds do not allow together. `holds`
/// is in grant order.
fn exclusion(holds: &[Hold], seen: &Seen<'_>, out: &mut Vec<Overlap>) {
    let mut active: Vec<Hold> = Vec::new();
    for b in holds {
        active.retain(|a| a.end > b.granted);
        let conflicting: Vec<&Hold> = match b.kind {
            Kind::Mutex | Kind::Write => active.iter().collect(),
            Kind::Read => active.iter().filter(|a| a.kind.exclusive()).collect(),
            Kind::Permit => active.iter().collect(),
        };
        let allowed = if b.kind == Kind::Permit {
            PERMITS as usize - 1
        } else {
            0
        };
        if conflicting.len() > allowed {
            // Unexplained unless the model explains enough of the pairs
            // that what is left is allowed.
            let (explained, unexplained): (Vec<&Hold>, Vec<&Hold>) = conflicting
                .iter()
                .partition(|a| explain_pair(a, b, seen).is_some());
            let (a, why) = match unexplained.len() > allowed {
                true => (unexplained[0], None),
                false => (explained[0], explain_pair(explained[0], b, seen)),
            };
            out.push(Overlap {
                name: b.name,
                first: (a.client, a.token),
                second: (b.client, b.token),
                overlap_ms: ms(a.end.min(b.end).saturating_sub(b.granted)),
                explained_by: why,
            });
        }
        active.push(*b);
    }
}

/// The hazard that explains two holds believed at once (the later one
/// granted at `b.granted`), if either hold met one of its target's before
/// the overlap began.
fn explain_pair(a: &Hold, b: &Hold, seen: &Seen<'_>) -> Option<Hazard> {
    explain(a, b.granted, seen).or_else(|| explain(b, b.granted, seen))
}

/// The hazard of the target's row that `h` met before `at` (when it began
/// to be believed beside another), if any: one that lets it be believed
/// after the lock went to another.
fn explain(h: &Hold, at: u64, seen: &Seen<'_>) -> Option<Hazard> {
    seen.target
        .hazards
        .iter()
        .copied()
        .find(|hazard| match hazard {
            Hazard::Mutant => true,
            // Granted before the server came back, believed when it died: a
            // single server, or a data node of a Redis topology (of the
            // hold's shard on a cluster).
            Hazard::RestartForgets => seen.nemesis.faults.iter().any(|f| {
                let kill = match f.kind {
                    FaultKind::ServerKill => true,
                    FaultKind::NodeKill => {
                        f.node
                            .zip(seen.target.topology)
                            .is_some_and(|(i, topo)| topo.fails_over(i))
                            && f.touches(&lock_name(h.name))
                    }
                    _ => false,
                };
                kill && h.granted < f.end && h.end > f.start && f.start < at
            }),
            // Granted before the old primary was demoted (or its answer was
            // on the way: the clients' request timeout is 1 s), believed when
            // the fault began; on a cluster, a primary of the hold's shard.
            Hazard::FailoverForgets => seen.nemesis.faults.iter().any(|f| {
                f.failed_over
                    && f.touches(&lock_name(h.name))
                    && f.settled
                        .is_some_and(|settled| h.granted < settled + duration_ns(LATE_ANSWER))
                    && h.end > f.start
                    && f.start < at
            }),
            // Paused while it asked counts too: the grant it then learns of may
            // already be gone. Half a session: a starved client's last ping may
            // have gone well before the stop.
            Hazard::PausedSessionHolder => seen.nemesis.faults.iter().any(|f| {
                f.kind == FaultKind::ClientStop
                    && f.client == Some(h.client)
                    && f.start < at
                    && f.end > h.invoked
                    && f.end - f.start >= duration_ns(ZK_SESSION) / 2
            }),
            Hazard::WallClockStep => clock_stepped(h, at, seen),
        })
}

/// Whether steps of the wall clock explain `h` being believed after
/// another's grant at `at`: the server counted `h`'s lease (stamped by its
/// last renewal, `deadline` less the TTL less the drift allowance) on its
/// wall clock, so the steps between that stamp and `at` ended it early by
/// their sum, and the holder's belief outlasts that end by no more. Only
/// the earlier hold is explained so.
fn clock_stepped(h: &Hold, at: u64, seen: &Seen<'_>) -> bool {
    let Some(deadline) = h.deadline else {
        return false;
    };
    let opts = dlock::LockOptions::new().ttl(seen.ttl);
    let counted = seen.ttl.saturating_sub(opts.get_drift());
    let stamped = deadline.saturating_sub(duration_ns(counted));
    let stepped: i64 = seen
        .nemesis
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::ClockStep && f.end > stamped && f.start < at)
        .filter_map(|f| f.step_ns)
        .sum();
    h.granted < at && stepped > 0 && h.end <= at.saturating_add(u64::try_from(stepped).unwrap_or(0))
}

/// How long after the server acted its answer may reach the history: the
/// clients' request timeout (a later answer is no answer), and a second
/// for a loaded machine.
const LATE_ANSWER: Duration = Duration::from_secs(2);

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

/// Writes the resource refused while their hold was believed, not sent
/// late on purpose: another grant with a higher token came in while this
/// one was believed, which the belief intervals alone can miss (a grant
/// whose reply was still on its way).
fn refused_in_belief(holds: &[Hold], grants: &[Hold], seen: &Seen<'_>, out: &mut Vec<Overlap>) {
    let by_hold: HashMap<(u32, u32, u64), &Hold> = holds
        .iter()
        .map(|h| ((h.client, h.name, h.token), h))
        .collect();
    for w in seen.writes.iter().filter(|w| !w.accepted && !w.late) {
        let Some(h) = by_hold.get(&(w.client, w.name, w.token)) else {
            continue;
        };
        if w.t <= h.end {
            // The write that made the resource refuse this one (the first
            // accepted before it that the refusal rule counts), whose hold
            // began to be believed at its grant, if its history has it.
            let other = seen
                .writes
                .iter()
                .filter(|o| o.accepted && o.name == w.name && o.t <= w.t)
                .filter(|o| match w.exclusive {
                    true => o.token >= w.token && (o.client, o.hold) != (w.client, w.hold),
                    false => o.exclusive && o.token > w.token,
                })
                .min_by_key(|o| o.t)
                .map_or(w.t, |o| {
                    grants
                        .iter()
                        .find(|g| g.name == o.name && g.token == o.token)
                        .map_or(o.t, |g| g.granted)
                });
            out.push(Overlap {
                name: w.name,
                first: (w.client, w.token),
                second: (w.client, w.token),
                overlap_ms: 0.0,
                explained_by: explain(h, other, seen),
            });
        }
    }
}

/// Kinds of the workload never granted: a run that never granted one
/// judged nothing about it.
fn ungranted(holds: &[Hold], names: u32) -> Vec<String> {
    let mut missing = Vec::new();
    for name in 0..names {
        for kind in crate::client::name_kinds(name) {
            let granted = holds.iter().any(|h| h.name == name && h.kind == *kind);
            let line = format!("{kind:?} of name {name}");
            if !granted && !missing.contains(&line) {
                missing.push(line);
            }
        }
    }
    missing
}

#[cfg(test)]
mod tests;
