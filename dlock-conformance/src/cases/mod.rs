//! The cases of the suite: one public async fn per rule of the contract,
//! in one file per part of it.
//!
//! | file | the rule |
//! |---|---|
//! | `ownership.rs` | release and extend act only on the caller's own lease |
//! | `expiry.rs` | a lease that is not extended, or whose holder is gone, frees the lock; extending keeps it |
//! | `fencing.rs` | tokens strictly increase; no two clients ever hold one name at once |
//! | `waiting.rs` | waits are bounded, woken by a release, and leave nothing behind when dropped |
//! | `names.rs` | every legal name is its own lock; illegal names and options are refused |
//! | `guard.rs` | guards renew, say when they are lost, and release when dropped |
//! | `batch.rs` | `extend_many` judges each lease on its own |
//! | `hold.rs` | `release_after` holds the name until then, and only its own |
//! | `admin.rs` | `list` and `force_release` see and free what is held, and who holds it |
//! | `election.rs` | one leader at a time, hand-off on resignation, followers read who leads |
//! | `rwlock.rs` | readers share, writers hold alone and are not starved, a downgrade lets no writer in, a name is one kind of lock |
//! | `shared_stress.rs` | many clients on a reader-writer lock and a semaphore, every grant checked |
//! | `semaphore.rs` | exactly N holders, expired permits free their place for good, release is owner-checked, waiters in order |
//!
//! Each case takes a backend, uses fresh random lock names, panics with a
//! message naming the broken rule when the backend breaks it, and skips
//! itself, saying so, when the backend lacks the capability the rule needs.
//! The list of cases grows with releases; it is not a semver promise.

use std::time::Duration;

use dlock_core::{Backend, Error, Guard, Lease, LeaseKind, LockOptions, Locker, OwnerToken};
use tokio::time::Instant;

use crate::support::long;

mod admin;
mod batch;
mod election;
mod expiry;
mod fencing;
mod guard;
mod hold;
mod names;
mod ownership;
mod rwlock;
mod semaphore;
mod shared_stress;
mod waiting;

pub use admin::*;
pub use batch::*;
pub use election::*;
pub use expiry::*;
pub use fencing::*;
pub use guard::*;
pub use hold::*;
pub use names::*;
pub use ownership::*;
pub use rwlock::*;
pub use semaphore::*;
pub use shared_stress::*;
pub use waiting::*;

/// A short TTL, for cases that let leases expire.
const SHORT_TTL: Duration = Duration::from_millis(400);

fn short() -> LockOptions {
    LockOptions::new().ttl(SHORT_TTL)
}

/// How long the server may keep a lock of `ttl` whose holder went silent:
/// the TTL rounded up to the backend's
/// [`ttl_resolution`](dlock_core::Capabilities::ttl_resolution), plus one
/// step (none for backends that count in milliseconds).
fn server_ttl(backend: &dyn Backend, ttl: Duration) -> Duration {
    let step = backend.capabilities().ttl_resolution;
    if step <= Duration::from_millis(1) {
        return ttl;
    }
    let steps = ttl.as_nanos().div_ceil(step.as_nanos()) + 1;
    step * u32::try_from(steps).unwrap_or(u32::MAX)
}

/// One `try_acquire` of `name`, whose last holder went silent long enough
/// ago for the server to have freed it. On a backend that starts every
/// lease's TTL again when its leader changes, a leader change meanwhile
/// (an election on a loaded machine) keeps it later, never sooner: there
/// it is waited for, up to ten such TTLs.
async fn acquire_after_expiry(
    backend: &dyn Backend,
    name: &str,
    opts: &LockOptions,
    ttl: Duration,
) -> dlock_core::Result<Option<dlock_core::Lease>> {
    let first = backend.try_acquire(name, opts).await;
    if !backend.capabilities().ttl_restarts_on_leader_change || !matches!(first, Ok(None)) {
        return first;
    }
    let wait = opts.clone().wait(server_ttl(backend, ttl) * 10);
    match backend.acquire(name, &wait).await {
        Ok(lease) => Ok(Some(lease)),
        Err(dlock_core::Error::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether the backend `has` what `case` needs. A case that cannot apply
/// says why on stderr and passes: an unsupported feature is a declared
/// fact, not a silent pass.
pub(crate) fn needs(case: &str, has: bool, why_not: &str) -> bool {
    if !has {
        eprintln!("{case}: not applicable: {why_not}");
    }
    has
}

pub(crate) fn needs_ttl(backend: &dyn Backend, case: &str) -> bool {
    let ttl = backend.capabilities().lease == LeaseKind::Ttl;
    needs(case, ttl, "the backend has session leases, not TTLs")
}

fn needs_fencing(backend: &dyn Backend, case: &str) -> bool {
    let fencing = backend.capabilities().fencing;
    needs(case, fencing, "the backend has no fencing tokens")
}

fn needs_delayed_release(backend: &dyn Backend, case: &str) -> bool {
    let delayed = backend.capabilities().delayed_release;
    needs(case, delayed, "the backend has no delayed release")
}

async fn assert_held(backend: &dyn Backend, name: &str, why: &str) {
    match backend.try_acquire(name, &long()).await {
        Ok(None) => {}
        Ok(Some(_)) => panic!("{name:?} was granted twice: {why}"),
        Err(e) => panic!("try_acquire({name:?}) failed: {e}"),
    }
}

/// That `guard`'s name is held, checked with a grant asked of `backend`:
/// a second grant fails the case only if the guard still trusted its
/// lease when that grant came back. Otherwise its lease ran out first (a
/// renewal late on a loaded machine), and the round cannot judge.
async fn assert_held_by(backend: &dyn Backend, guard: &Guard, why: &str) -> Result<(), Judged> {
    let name = guard.name();
    let lease = match backend.try_acquire(name, &long()).await {
        Ok(None) => return Ok(()),
        Ok(Some(lease)) => lease,
        Err(e) => panic!("try_acquire({name:?}) failed: {e}"),
    };
    let answered = Instant::now();
    if let Some(until) = guard.valid_until().filter(|until| *until > answered) {
        panic!("{name:?} was granted twice ({why}): its guard trusted its lease until {until:?}");
    }
    drop(backend.release(&lease).await);
    Err(Judged::No(format!(
        "{name:?}'s lease ran out before the check was answered"
    )))
}

fn assert_not_held<T: std::fmt::Debug>(result: dlock_core::Result<T>, what: &str) {
    match result {
        Err(Error::NotHeld { .. }) => {}
        other => panic!("{what}: expected Error::NotHeld, got {other:?}"),
    }
}

/// Whether a round of a case that judges within a TTL could judge, and
/// if not, why.
enum Judged {
    Yes,
    No(String),
}

/// Runs `round` with `ttl`, then with twice it, and so on for at most
/// three rounds, until one could judge. A case whose every step must fit
/// in a TTL cannot judge a round whose server answered too slowly for it
/// (a loaded machine); a driver that fails the case fails every round.
async fn judged_with_doubling_ttl<F, Fut>(case: &str, mut ttl: Duration, mut round: F)
where
    F: FnMut(Duration) -> Fut,
    Fut: std::future::Future<Output = Judged>,
{
    let mut why = Vec::new();
    for _ in 0..3 {
        match round(ttl).await {
            Judged::Yes => return,
            Judged::No(reason) => {
                println!("{case}: a round with a {ttl:?} TTL could not judge: {reason}");
                why.push(format!("with a {ttl:?} TTL, {reason}"));
            }
        }
        ttl *= 2;
    }
    panic!("{case}: no round could judge: {}", why.join("; "));
}

/// Why a short lease on a fresh name could not be had: its grant came
/// back after the lease had ended (a loaded machine), which the driver
/// rightly calls no grant, so the name looks held. A fresh name is held
/// by no one else; a driver that calls it held every round fails. How long
/// the answer took since `sent` is said: a grant undone for coming back
/// late comes back after most of its TTL, a plain refusal may not.
fn late_grant(ttl: Duration, sent: Instant) -> Judged {
    Judged::No(format!(
        "a free name was found held {:?} after the ask (a grant that came back after \
         its {ttl:?} lease had ended is no grant)",
        sent.elapsed()
    ))
}

/// One `try_acquire` of the fresh name `name`, with a lease short enough
/// that its grant may come back too late: see [`late_grant`].
async fn fresh_lease(
    backend: &dyn Backend,
    name: &str,
    opts: &LockOptions,
) -> Result<Lease, Judged> {
    let sent = Instant::now();
    match backend.try_acquire(name, opts).await {
        Ok(Some(lease)) => Ok(lease),
        Ok(None) => Err(late_grant(opts.get_ttl(), sent)),
        Err(e) => panic!("try_acquire({name:?}) failed: {e}"),
    }
}

/// [`fresh_lease`] through `locker`: its guard.
async fn fresh_guard(locker: &Locker, name: &str, opts: &LockOptions) -> Result<Guard, Judged> {
    let sent = Instant::now();
    match locker.try_acquire(name, opts).await {
        Ok(Some(guard)) => Ok(guard),
        Ok(None) => Err(late_grant(opts.get_ttl(), sent)),
        Err(e) => panic!("try_acquire({name:?}) failed: {e}"),
    }
}

/// A lease for `name` that the server never granted: what a client that
/// guessed or forged a lease holds.
fn foreign_lease(name: &str, opts: &LockOptions) -> Lease {
    let owner = OwnerToken::random().expect("the OS has randomness");
    Lease::with_ttl(name, owner, 1, opts, Instant::now())
}

/// How long a stress case's clients keep asking for more grants, once each
/// has made a tenth of its count: a stress of 10,000 grants takes a few
/// seconds on Redis or in memory, but a minute on a driver whose every
/// grant is several statements or a consensus write (etcd, MySQL's shared
/// kinds), and the suite runs it on every kind of lock of every driver
/// (twelve stress cases in PostgreSQL's binary), beside nothing else: at
/// 15 s they took 75 s of that binary's 183. Every grant made is judged;
/// the case says how many it made. The long random campaign under faults
/// is `dlock-torture`'s.
pub const STRESS_TIME: Duration = Duration::from_secs(5);

/// One stress client's budget: all `count` grants, or, once
/// [`STRESS_TIME`] has passed since `started`, the tenth of them that a
/// backend polling for its turn gets (the suite's floor for a backend
/// without wake-ups).
#[derive(Debug, Clone, Copy)]
struct StressBudget {
    started: Instant,
    count: u64,
}

impl StressBudget {
    fn new(count: u64) -> Self {
        StressBudget {
            started: Instant::now(),
            count,
        }
    }

    /// Whether a client that has made `done` grants asks for another.
    fn more(&self, done: u64) -> bool {
        done < self.count.div_ceil(10).max(1)
            || (done < self.count && self.started.elapsed() < STRESS_TIME)
    }

    /// The fewest grants a client makes.
    fn floor(&self) -> u64 {
        self.count.div_ceil(10).max(1)
    }
}
