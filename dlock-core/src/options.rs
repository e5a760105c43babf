use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::settings::{check_duration, check_holder, deadline_after};
use crate::{Error, Mode, Result};

/// The shortest TTL accepted: below it the drift allowance and one round
/// trip eat the whole lease.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The longest TTL accepted. Long jobs keep a short TTL and let the guard
/// renew it, so a crashed holder does not block everyone for hours.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest [`LockOptions::max_hold`] accepted: a year. Longer is no
/// bound.
const MAX_HOLD: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// The longest holder description ([`LockOptions::holder`]) accepted, in
/// bytes: what every backend stores as it is.
pub const MAX_HOLDER_LEN: usize = 255;

/// This process's `host:pid`, read once: the holder a grant stores when
/// its options name none.
static DEFAULT_HOLDER: LazyLock<Arc<str>> = LazyLock::new(|| crate::driver::host_and_pid().into());

/// How a lock is acquired and held: lease time, wait bound, drift allowance,
/// background renewal, and the kind of hold ([`Mode`]: a mutex unless
/// [`read`](LockOptions::read), [`write`](LockOptions::write) or
/// [`permits`](LockOptions::permits) says otherwise).
///
/// Each setter takes its option's name and the getter adds `get_`, as
/// sqlx's `PoolOptions` does: `ttl(…)` sets, `get_ttl()` reads.
///
/// ```
/// use std::time::Duration;
/// let opts = dlock_core::LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(2));
/// assert!(opts.validate().is_ok());
/// assert_eq!(opts.get_ttl(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockOptions {
    ttl: Duration,
    wait: Option<Duration>,
    drift: Option<Duration>,
    renew: bool,
    max_hold: Option<Duration>,
    lock_delay: Option<Duration>,
    /// How much of `ttl` is a lock-delay the client does not trust: set
    /// only on the options a driver gets ([`LockOptions::for_server`]).
    delay_in_ttl: Duration,
    mode: Mode,
    holder: Option<Arc<str>>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: None,
            drift: None,
            renew: true,
            max_hold: None,
            lock_delay: None,
            delay_in_ttl: Duration::ZERO,
            mode: Mode::Exclusive,
            holder: None,
        }
    }
}

impl LockOptions {
    /// TTL 30 s, no wait bound, default drift allowance, renewal on.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lease time on TTL backends: the server frees the lock this long
    /// after the last grant or extension. Session backends (ZooKeeper)
    /// ignore it: their leases live as long as the session.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long `acquire` may wait for a held lock before it gives up with
    /// [`Error::Timeout`]. `Duration::ZERO` makes one attempt.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Let `acquire` wait as long as it takes (the default).
    pub fn wait_forever(mut self) -> Self {
        self.wait = None;
        self
    }

    /// How much of the TTL the client gives up to cover clock drift between
    /// client and server. Default: 1 % of the TTL plus 2 ms.
    pub fn drift(mut self, drift: Duration) -> Self {
        self.drift = Some(drift);
        self
    }

    /// Whether guards renew the lease in the background (default `true`).
    /// Without renewal a guard's lease simply ends at its TTL.
    pub fn renew(mut self, renew: bool) -> Self {
        self.renew = renew;
        self
    }

    /// Bounds how long a guard renews (default: unbounded). Once the hold
    /// has lasted `max_hold`, renewal stops and the lease ends at its TTL:
    /// the guard's [`lost`](crate::Guard::lost) fires then, and
    /// [`with_lock`](crate::Locker::with_lock), a scheduled run or a
    /// leader's term ([`Election::lead`](crate::Election::lead)) end as
    /// for any lost lease. So a holder stuck on a dead socket or a hung
    /// task frees the name within `max_hold` plus one TTL, instead of
    /// renewing it for as long as its process lives. Without renewal
    /// ([`renew(false)`](LockOptions::renew)) it changes nothing. Session
    /// backends (ZooKeeper), whose leases live with the session, refuse it
    /// with [`Error::Unsupported`]: nothing would end their leases.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The bound on renewal, `None` for none.
    pub fn get_max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// Lock-delay (off by default), as Chubby and Consul have it: when a
    /// lease ends without a release (its holder stopped renewing: paused,
    /// cut off, dead), the name is granted to nobody for `delay` more,
    /// judged by the server's clock, so that a holder that was paused or
    /// cut off has that long to notice ([`Guard::lost`](crate::Guard::lost)
    /// fires at the lease's end as before) before anyone else acts. A
    /// released name is not delayed. The server keeps each grant `delay`
    /// longer than its holder trusts it (a TTL of `ttl + delay`), so a
    /// crashed holder's name is free after `ttl + delay`. Session backends
    /// (ZooKeeper), whose server frees a lost session's locks at once,
    /// refuse it with [`Error::Unsupported`].
    /// `Duration::ZERO` turns it off.
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = Some(delay);
        self
    }

    /// The lock-delay, `None` for none.
    pub fn get_lock_delay(&self) -> Option<Duration> {
        self.lock_delay
    }

    /// The options a driver gets (core makes them for every
    /// [`Driver`](crate::driver::Driver); a [`Backend`](crate::Backend)
    /// written without one makes them itself): with a lock-delay, a TTL
    /// that much longer for the server, and validity counted from the TTL
    /// asked for ([`valid_until`](Self::valid_until)); else these.
    pub fn for_server(&self) -> std::borrow::Cow<'_, LockOptions> {
        match self.lock_delay.filter(|delay| !delay.is_zero()) {
            Some(delay) => std::borrow::Cow::Owned(LockOptions {
                ttl: self.ttl.saturating_add(delay),
                drift: Some(self.get_drift()),
                lock_delay: None,
                delay_in_ttl: self.delay_in_ttl.saturating_add(delay),
                ..self.clone()
            }),
            None => std::borrow::Cow::Borrowed(self),
        }
    }

    /// The part of the TTL given to a lock-delay, which the client does not
    /// trust (zero but on the options a driver gets).
    pub(crate) fn delay_in_ttl(&self) -> Duration {
        self.delay_in_ttl
    }

    /// How long after a grant or an extension its holder trusts the lease,
    /// before the drift allowance: the TTL, less the lock-delay on the
    /// options a driver gets ([`for_server`](Self::for_server)). Drivers
    /// time what must happen within a lease (a waiter's renewals, a
    /// hand-over's freshness) by this, and what the server keeps by
    /// [`get_ttl`](Self::get_ttl).
    pub fn trusted_ttl(&self) -> Duration {
        self.ttl.saturating_sub(self.delay_in_ttl)
    }

    /// The lease time.
    pub fn get_ttl(&self) -> Duration {
        self.ttl
    }

    /// The wait bound, `None` for no bound.
    pub fn get_wait(&self) -> Option<Duration> {
        self.wait
    }

    /// The drift allowance in effect.
    pub fn get_drift(&self) -> Duration {
        self.drift
            .unwrap_or_else(|| (self.ttl / 100).saturating_add(Duration::from_millis(2)))
    }

    /// Asks for the name's reader-writer lock, shared side: readers hold
    /// together, never beside a writer (see [`Mode::Read`]).
    pub fn read(mut self) -> Self {
        self.mode = Mode::Read;
        self
    }

    /// Asks for the name's reader-writer lock, exclusive side (see
    /// [`Mode::Write`]).
    pub fn write(mut self) -> Self {
        self.mode = Mode::Write;
        self
    }

    /// Asks for one permit of the name's semaphore of `permits` (see
    /// [`Mode::Permit`]). Everyone using the name must agree on `permits`.
    pub fn permits(mut self, permits: u32) -> Self {
        self.mode = Mode::Permit(permits);
        self
    }

    /// Sets the mode directly.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The kind of hold asked for.
    pub fn get_mode(&self) -> Mode {
        self.mode
    }

    /// Whether guards renew the lease.
    pub fn get_renew(&self) -> bool {
        self.renew
    }

    /// Who the grant is for, as [`inspect`](crate::Backend::inspect),
    /// [`list`](crate::Backend::list) and `dlock watch` show it: a short
    /// description an operator can map to a machine or a service instance
    /// (at most [`MAX_HOLDER_LEN`] bytes, no control characters, line
    /// separators or bidirectional overrides). Every
    /// backend stores it with the grant. Default: this process's
    /// `host:pid`. An empty description stores none.
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into().into());
        self
    }

    /// The holder description grants made with these options store.
    pub fn get_holder(&self) -> &str {
        self.holder.as_deref().unwrap_or(&DEFAULT_HOLDER)
    }

    /// [`LockOptions::get_holder`], shared, for the lease to keep.
    pub(crate) fn holder_shared(&self) -> Arc<str> {
        self.holder
            .clone()
            .unwrap_or_else(|| DEFAULT_HOLDER.clone())
    }

    /// Checks the options; every backend calls this before it talks to its
    /// server.
    pub fn validate(&self) -> Result<()> {
        check_duration("ttl", self.ttl, MIN_TTL, MAX_TTL)?;
        check_holder(self.get_holder())?;
        if let Some(max_hold) = self.max_hold {
            check_duration("max_hold", max_hold, Duration::from_millis(1), MAX_HOLD)?;
        }
        if let Some(delay) = self.lock_delay {
            let room = MAX_TTL.saturating_sub(self.ttl);
            check_duration("lock_delay", delay, Duration::ZERO, room)?;
        }
        if self.mode == Mode::Permit(0) {
            return Err(Error::invalid_option(
                "permits",
                "a semaphore needs at least one permit",
            ));
        }
        if self.get_drift() >= self.ttl / 2 {
            return Err(Error::invalid_option(
                "drift",
                format!(
                    "must be less than half the TTL ({:?}), got {:?}",
                    self.ttl / 2,
                    self.get_drift()
                ),
            ));
        }
        Ok(())
    }

    /// The validity deadline of a lease granted by a request sent at
    /// `sent`: the TTL minus the drift allowance, on the client's monotonic
    /// clock.
    pub fn valid_until(&self, sent: Instant) -> Instant {
        // Saturating: options that were never validated give a lease that
        // is invalid at once, not a panic.
        deadline_after(sent, self.trusted_ttl().saturating_sub(self.get_drift()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_enforced() {
        let bad = [
            LockOptions::new().ttl(Duration::ZERO),
            LockOptions::new().ttl(Duration::from_millis(9)),
            LockOptions::new().ttl(MAX_TTL + Duration::from_secs(1)),
            LockOptions::new().drift(Duration::from_secs(15)),
        ];
        for opts in bad {
            assert!(
                matches!(opts.validate(), Err(Error::InvalidOption { .. })),
                "{opts:?}"
            );
        }
        assert!(LockOptions::new().ttl(MIN_TTL).validate().is_ok());
        assert!(LockOptions::new().wait(Duration::MAX).validate().is_ok());
    }

    #[test]
    fn holders_are_checked() {
        let ok = ["", "web-7:4211", "Zürich 🔒", &"x".repeat(MAX_HOLDER_LEN)];
        for holder in ok {
            assert!(LockOptions::new().holder(holder).validate().is_ok());
        }
        let long = "é".repeat(128);
        for holder in [long.as_str(), "a\nb", "\u{1b}[31m", "a\0", "a\u{202e}b"] {
            assert!(
                matches!(
                    LockOptions::new().holder(holder).validate(),
                    Err(Error::InvalidOption {
                        option: "holder",
                        ..
                    })
                ),
                "{holder:?}"
            );
        }
        assert_eq!(
            LockOptions::new().get_holder(),
            crate::driver::host_and_pid()
        );
    }

    #[test]
    fn validity_is_ttl_minus_drift() {
        let opts = LockOptions::new().ttl(Duration::from_secs(10));
        let now = Instant::now();
        assert_eq!(
            opts.valid_until(now) - now,
            Duration::from_millis(10_000 - 100 - 2)
        );
    }
}
