//! The measurements. Each returns figures only; judging them is the
//! reader's job (docs/benchmark.md says how).

use std::sync::Arc;
use std::time::Duration;

use dlock::{Backend, LockOptions, Locker};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::time::{Instant, sleep};

use crate::target::{GRANT_TIMEOUT, Op, Result, Target};
pub use crate::turns::ClassicContention;
use crate::turns::{DlockTurns, Turned, take_turns};

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
}

impl Latency {
    pub(crate) fn from(h: &Histogram<u64>) -> Self {
        Latency {
            count: h.len(),
            mean_us: h.mean(),
            p50_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
        }
    }
}

pub(crate) fn histogram() -> Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Operations per second and their latency.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Throughput {
    pub clients: usize,
    pub ops_per_s: f64,
    pub latency: Latency,
}

/// Runs each op in its own task on its own key until `duration` passes.
pub async fn throughput(ops: &[Arc<dyn Op>], run: &str, duration: Duration) -> Result<Throughput> {
    let (h, secs) = timed(ops, run, duration).await?;
    Ok(Throughput {
        clients: ops.len(),
        ops_per_s: h.len() as f64 / secs,
        latency: Latency::from(&h),
    })
}

/// Two sets of ops measured in turns: what [`paired`] gives.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Paired {
    pub a: Throughput,
    pub b: Throughput,
    /// The median over the turns of a's rate / b's rate in each: a burst of
    /// noise that falls on one side of one turn moves it little.
    pub ratio: f64,
}

/// Two sets of ops measured in turns, `SLICES` each, alternating which
/// goes first, so that a noisy machine (a neighbour, a frequency change,
/// the server's own housekeeping) weighs on both alike: their ratio is
/// what the bench reports.
pub async fn paired(
    a: &[Arc<dyn Op>],
    b: &[Arc<dyn Op>],
    run: &str,
    duration: Duration,
) -> Result<Paired> {
    const SLICES: u32 = 10;
    let slice = duration / SLICES;
    let (mut ha, mut hb) = (histogram()?, histogram()?);
    let (mut sa, mut sb) = (0.0, 0.0);
    let mut ratios = Vec::new();
    for i in 0..SLICES {
        let mut rates = [0.0; 2];
        for first in [i % 2 == 0, i % 2 != 0] {
            let (ops, h, secs, rate) = if first {
                (a, &mut ha, &mut sa, &mut rates[0])
            } else {
                (b, &mut hb, &mut sb, &mut rates[1])
            };
            let (part, took) = timed(ops, &format!("{run}{i}{first}"), slice).await?;
            *rate = part.len() as f64 / took;
            h.add(part)?;
            *secs += took;
        }
        if rates[1] > 0.0 {
            ratios.push(rates[0] / rates[1]);
        }
    }
    ratios.sort_by(f64::total_cmp);
    let ratio = match ratios.len() {
        0 => 0.0,
        n if n % 2 == 1 => ratios[n / 2],
        n => f64::midpoint(ratios[n / 2 - 1], ratios[n / 2]),
    };
    let result = |ops: &[Arc<dyn Op>], h: &Histogram<u64>, secs: f64| Throughput {
        clients: ops.len(),
        ops_per_s: h.len() as f64 / secs,
        latency: Latency::from(h),
    };
    Ok(Paired {
        a: result(a, &ha, sa),
        b: result(b, &hb, sb),
        ratio,
    })
}

/// The latencies of every op run, and the seconds it took.
async fn timed(
    ops: &[Arc<dyn Op>],
    run: &str,
    duration: Duration,
) -> Result<(Histogram<u64>, f64)> {
    let started = Instant::now();
    let end = started + duration;
    let mut tasks = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let op = op.clone();
        let key = format!("bench:{run}:{i}:{:x}", std::process::id());
        tasks.push(tokio::spawn(async move {
            let mut h = histogram()?;
            while Instant::now() < end {
                let t = Instant::now();
                op.run(&key).await?;
                h.record(micros(t.elapsed()))?;
            }
            Ok::<_, crate::target::BoxError>(h)
        }));
    }
    let mut all = histogram()?;
    for task in tasks {
        all.add(task.await??)?;
    }
    Ok((all, started.elapsed().as_secs_f64()))
}

/// Contention on one name.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Contention {
    pub clients: usize,
    pub grants: u64,
    pub grants_per_s: f64,
    /// From the holder's release to the next grant to another client:
    /// what two processes see. Each client has its own backend instance,
    /// connections and pool, so no in-process wake-up helps.
    pub handoff: Latency,
    /// Grants that went back to the client that had just released (not
    /// hand-offs).
    #[serde(default)]
    pub regrants: u64,
    /// Server requests per grant, waiting included (where the server counts
    /// them).
    #[serde(default)]
    pub requests_per_grant: Option<f64>,
    /// The load of waiting: server requests per second per waiting client,
    /// beyond the acquire and release of each grant.
    #[serde(default)]
    pub waiting_requests_per_s: Option<f64>,
    /// The load of waiting alone: server requests per second per waiting
    /// client while one client holds the lock for a while and the others
    /// wait for it.
    #[serde(default)]
    pub idle_waiting_requests_per_s: Option<f64>,
    pub min_grants_per_client: u64,
    pub max_grants_per_client: u64,
    /// Jain's fairness index of grants per client: 1 is perfectly even.
    pub jain: f64,
    /// The same clients and name with the server's bare lock, where it has
    /// one that queues its waiters.
    #[serde(default)]
    pub classic: Option<ClassicContention>,
}

pub async fn contended(
    target: &Target,
    clients: &[Arc<dyn Backend>],
    run: &str,
    duration: Duration,
) -> Result<Contention> {
    let name = format!("bench:{run}:contended:{:x}", std::process::id());
    let requests_before = target.server_stats().await?.map(|(requests, _)| requests);
    let turns = clients.iter().cloned().map(DlockTurns).collect();
    let Turned {
        handoff,
        per_client,
        regrants,
        elapsed,
    } = take_turns(turns, &name, duration).await?;
    let requests_after = target.server_stats().await?.map(|(requests, _)| requests);
    let idle = idle_waiting(target, clients, &name).await?;
    let classic = match target.classic_turns(clients.len()).await? {
        Some(turns) => {
            let turned = take_turns(turns, &format!("{name}:classic"), duration).await?;
            Some(ClassicContention {
                grants_per_s: turned.per_client.iter().sum::<u64>() as f64 / turned.elapsed,
                handoff: Latency::from(&turned.handoff),
            })
        }
        None => None,
    };
    let total: u64 = per_client.iter().sum();
    let squares: f64 = per_client.iter().map(|&g| (g as f64).powi(2)).sum();
    let n = per_client.len() as f64;
    let requests = requests_before
        .zip(requests_after)
        .map(|(before, after)| after.saturating_sub(before) as f64);
    let waiters = clients.len().saturating_sub(1).max(1) as f64;
    Ok(Contention {
        clients: clients.len(),
        grants: total,
        grants_per_s: total as f64 / elapsed,
        handoff: Latency::from(&handoff),
        regrants,
        requests_per_grant: requests.map(|r| r / total.max(1) as f64),
        waiting_requests_per_s: requests
            .map(|r| (r - 2.0 * total as f64).max(0.0) / elapsed / waiters),
        idle_waiting_requests_per_s: idle,
        min_grants_per_client: per_client.iter().copied().min().unwrap_or(0),
        max_grants_per_client: per_client.iter().copied().max().unwrap_or(0),
        jain: if squares > 0.0 {
            (total as f64).powi(2) / (n * squares)
        } else {
            0.0
        },
        classic,
    })
}

/// Requests per second per waiter while the first client holds `name`
/// for a while and the others wait for it (each is served afterwards).
async fn idle_waiting(
    target: &Target,
    clients: &[Arc<dyn Backend>],
    name: &str,
) -> Result<Option<f64>> {
    let Some((holder, waiting)) = clients.split_first() else {
        return Ok(None);
    };
    if waiting.is_empty() {
        return Ok(None);
    }
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(GRANT_TIMEOUT);
    let lease = holder.acquire(name, &opts).await?;
    let mut tasks = Vec::new();
    for backend in waiting {
        let (backend, name, opts) = (backend.clone(), name.to_owned(), opts.clone());
        tasks.push(tokio::spawn(async move {
            let lease = backend.acquire(&name, &opts).await?;
            backend.release(&lease).await
        }));
    }
    // Past the waiters' first quick looks: what a long wait costs.
    sleep(Duration::from_secs(1)).await;
    let before = target.server_stats().await?;
    let window = Duration::from_secs(3);
    sleep(window).await;
    let after = target.server_stats().await?;
    holder.release(&lease).await?;
    for task in tasks {
        task.await??;
    }
    Ok(before.zip(after).map(|((before, _), (after, _))| {
        after.saturating_sub(before) as f64 / window.as_secs_f64() / waiting.len() as f64
    }))
}

/// Many leases held at once, renewed by their guards.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Held {
    pub leases: usize,
    pub ttl_ms: u64,
    /// Requests the server handled per renewal period (a third of the TTL),
    /// from every client, while the leases were held.
    pub requests_per_tick: f64,
    pub memory_per_lock_bytes: f64,
    /// Heap bytes this process holds per held lease: its guard, its place
    /// in the renewal schedule, and whatever the driver keeps for it.
    #[serde(default)]
    pub client_memory_per_lease_bytes: Option<f64>,
    /// Leases whose guard reported them lost during the measurement.
    pub lost: usize,
}

pub async fn held(
    target: &Target,
    backend: Arc<dyn Backend>,
    leases: usize,
) -> Result<Option<Held>> {
    let Some((_, memory_before)) = target.server_stats().await? else {
        return Ok(None);
    };
    // A wave as wide as the acquiring ones first, so that the client's
    // connections (and their buffers) are open before the heap is counted:
    // what is counted is what each held lease adds.
    let warm = format!("bench:held-warm:{:x}", std::process::id());
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let (backend, name) = (backend.clone(), format!("{warm}:{i}"));
        tasks.spawn(async move {
            if let Some(lease) = backend.try_acquire(&name, &LockOptions::new()).await? {
                backend.release(&lease).await?;
            }
            Ok::<_, dlock::Error>(())
        });
    }
    for done in tasks.join_all().await {
        done?;
    }
    let heap = crate::heap::Count::open();
    let ttl = Duration::from_secs(6);
    let tick = ttl / 3;
    let locker = Locker::from_arc(backend);
    let opts = LockOptions::new().ttl(ttl);
    let prefix = format!("bench:held:{:x}", std::process::id());
    let mut guards = Vec::with_capacity(leases);
    // Acquire in waves so that a slow backend is not flooded.
    for wave in (0..leases).collect::<Vec<_>>().chunks(64) {
        let mut tasks = Vec::new();
        for &i in wave {
            let locker = locker.clone();
            let opts = opts.clone();
            let name = format!("{prefix}:{i}");
            tasks.push(tokio::spawn(async move {
                locker.try_acquire(&name, &opts).await
            }));
        }
        for task in tasks {
            guards.push(task.await??.ok_or("a held-lease name was taken")?);
        }
    }
    sleep(tick / 2).await;
    let client_bytes = heap.net() as f64;
    let (requests_a, memory_after) = target.server_stats().await?.unwrap_or_default();
    let ticks = 3;
    sleep(tick * ticks).await;
    let (requests_b, _) = target.server_stats().await?.unwrap_or_default();
    let lost = guards.iter().filter(|g| !g.is_valid()).count();
    let mut releases = tokio::task::JoinSet::new();
    for guard in guards {
        releases.spawn(guard.release());
        // Bound the requests in flight, as the acquire waves do.
        if releases.len() >= 64 {
            releases.join_next().await;
        }
    }
    releases.join_all().await;
    Ok(Some(Held {
        leases,
        ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        requests_per_tick: requests_b.saturating_sub(requests_a) as f64 / f64::from(ticks),
        memory_per_lock_bytes: memory_after.saturating_sub(memory_before) as f64 / leases as f64,
        client_memory_per_lease_bytes: Some(client_bytes / leases as f64),
        lost,
    }))
}
