//! Liveness after heals, and the bound of every call.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Call, Findings, Hold, Seen, duration_ns, ms};
use crate::target::FaultKind;

/// After each batch of faults heals, every name is granted again within
/// the target's bound (a lease of a holder lost in the fault ends first).
pub(super) fn liveness(holds: &[Hold], seen: &Seen<'_>, f: &mut Findings) {
    let bound = duration_ns(seen.target.liveness_bound(seen.ttl + seen.lock_delay));
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
pub(super) fn judge_calls(calls: Vec<Call>, seen: &Seen<'_>, f: &mut Findings) {
    let mut acquires = Vec::new();
    for (what, client, sent, returned) in calls {
        let took = returned.saturating_sub(sent);
        if what == "acquire" {
            acquires.push(took);
        }
        let stopped = seen.nemesis.faults.iter().any(|x| {
            x.kind == FaultKind::ClientStop
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
            f.slow_calls
                .push((format!("{what} by client {client}"), ms(took)));
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
