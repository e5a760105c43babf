use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::settings::deadline_after;
use crate::{Error, LockOptions, Mode, Result};

/// A random 128-bit value that identifies one grant of a lock. Release and
/// extend act only when the server still stores this token.
///
/// Shown as 32 lowercase hex digits, which is how drivers store it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerToken(u128);

impl OwnerToken {
    /// The owner a delayed release ([`Backend::release_after`](crate::Backend::release_after))
    /// leaves on the server for its hold: derived from this token and never
    /// equal to it, so that the released lease can no longer release or
    /// extend the hold (a renewal still in flight, say), while an operator
    /// can still see and end it.
    pub fn for_hold(self) -> OwnerToken {
        OwnerToken(!self.0)
    }

    /// A fresh token from the operating system's CSPRNG.
    ///
    /// # Errors
    /// [`Error::Backend`] in the rare case the OS has no randomness to give.
    pub fn random() -> Result<Self> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| Error::backend("dlock", "the OS random number generator failed", e))?;
        Ok(OwnerToken(u128::from_le_bytes(bytes)))
    }

    /// The token's value.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// A token with a given value, for drivers that read one back.
    pub fn from_u128(value: u128) -> Self {
        OwnerToken(value)
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({self})")
    }
}

impl FromStr for OwnerToken {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        if s.len() != 32 {
            return Err(Error::invalid_option(
                "owner token",
                format!("expected 32 hex digits, got {s:?}"),
            ));
        }
        u128::from_str_radix(s, 16)
            .map(OwnerToken)
            .map_err(|_| Error::invalid_option("owner token", format!("not hex: {s:?}")))
    }
}

/// One grant of a lock: what a successful acquire returns and what release
/// and extend need.
///
/// A lease is a plain value. The [`Guard`](crate::Guard) wraps one to renew
/// it and to release it on drop; use a bare lease only when you manage its
/// life yourself.
#[derive(Debug, Clone)]
#[must_use = "a lease holds its lock until it is released or its TTL ends: keep it to release or extend it"]
pub struct Lease {
    name: String,
    owner: OwnerToken,
    fencing_token: u64,
    mode: Mode,
    ttl: Option<Duration>,
    /// The part of `ttl` that is a lock-delay, not trusted.
    delay: Duration,
    drift: Duration,
    valid_until: Option<Instant>,
    handle: Option<String>,
    holder: Arc<str>,
    lost: CancellationToken,
}

impl Lease {
    /// A lease with a TTL, granted by a request sent at `sent`. Drivers of
    /// TTL backends call this; the validity deadline is computed from the
    /// options (TTL minus drift, counted from `sent`), and the mode is the
    /// options' mode.
    pub fn with_ttl(
        name: impl Into<String>,
        owner: OwnerToken,
        fencing_token: u64,
        opts: &LockOptions,
        sent: Instant,
    ) -> Self {
        Lease {
            name: name.into(),
            owner,
            fencing_token,
            mode: opts.get_mode(),
            ttl: Some(opts.get_ttl()),
            delay: opts.delay_in_ttl(),
            drift: opts.get_drift(),
            valid_until: Some(opts.valid_until(sent)),
            handle: None,
            holder: opts.holder_shared(),
            lost: CancellationToken::new(),
        }
    }

    /// A lease that lives as long as a session (ZooKeeper). `lost` is
    /// cancelled by the driver the moment the session can no longer be
    /// trusted.
    pub fn with_session(
        name: impl Into<String>,
        owner: OwnerToken,
        fencing_token: u64,
        lost: CancellationToken,
    ) -> Self {
        Lease {
            name: name.into(),
            owner,
            fencing_token,
            mode: Mode::Exclusive,
            ttl: None,
            delay: Duration::ZERO,
            drift: Duration::ZERO,
            valid_until: None,
            handle: None,
            holder: LockOptions::new().holder_shared(),
            lost,
        }
    }

    /// Sets the kind of hold (a session lease is a mutex's unless set).
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The kind of hold this lease is: a mutex's, a reader's, a writer's or
    /// a semaphore permit.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Sets the holder description the grant stored (a session lease's is
    /// this process's `host:pid` unless set; a TTL lease's comes from its
    /// options).
    pub fn with_holder(mut self, holder: impl Into<Arc<str>>) -> Self {
        self.holder = holder.into();
        self
    }

    /// The holder description stored with this grant (see
    /// [`LockOptions::holder`]).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Attaches a driver's own datum (a znode path, say) to the lease.
    pub fn with_handle(mut self, handle: impl Into<String>) -> Self {
        self.handle = Some(handle.into());
        self
    }

    /// The lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The owner token of this grant.
    pub fn owner(&self) -> OwnerToken {
        self.owner
    }

    /// The fencing token: strictly greater for every later grant of the same
    /// name. Pass it to the protected resource, which must reject tokens
    /// older than the newest it has seen.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// The lease time the server keeps the lock for after each grant or
    /// extension, `None` for session leases. With a
    /// [`lock_delay`](LockOptions::lock_delay) it is the TTL asked for plus
    /// the delay; the client trusts the lease for the TTL asked for
    /// ([`trusted_ttl`](Self::trusted_ttl)).
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The lock-delay the server keeps beyond the trusted TTL
    /// ([`LockOptions::lock_delay`]); zero without one.
    pub fn lock_delay(&self) -> Duration {
        self.delay
    }

    /// How long after each grant or extension the client trusts the lease
    /// (before the drift allowance): the TTL asked for, without a
    /// lock-delay; `None` for session leases.
    pub fn trusted_ttl(&self) -> Option<Duration> {
        self.ttl.map(|ttl| ttl.saturating_sub(self.delay))
    }

    /// Until when the client may trust the lease, on the monotonic clock;
    /// `None` for session leases, which the driver's lost signal ends.
    pub fn valid_until(&self) -> Option<Instant> {
        self.valid_until
    }

    /// The driver's datum attached with [`Lease::with_handle`].
    pub fn handle(&self) -> Option<&str> {
        self.handle.as_deref()
    }

    /// Ends the lease's trust when `trust` is cancelled, as well as at its
    /// deadline: for a driver that can learn its server no longer keeps
    /// its grants (Redis set to evict keys at run time) and then cancels
    /// one token for every lease it granted. A token already cancelled
    /// (the server was found unsafe while the grant was on its way) gives
    /// a lease already lost. A session lease (whose lost token is its
    /// session's) is returned as it is.
    pub fn trusted_while(mut self, trust: &CancellationToken) -> Self {
        if self.ttl.is_some() {
            self.lost = trust.child_token();
        }
        self
    }

    /// Cancelled by the driver when it knows the lease is gone (session
    /// loss, or [`Lease::trusted_while`]'s token); TTL leases are otherwise
    /// judged by [`Lease::valid_until`].
    pub fn lost_token(&self) -> &CancellationToken {
        &self.lost
    }

    /// Whether the lease can still be trusted now: not past its deadline and
    /// not reported lost by the driver.
    pub fn is_valid(&self) -> bool {
        !self.lost.is_cancelled() && self.valid_until.is_none_or(|t| Instant::now() < t)
    }

    /// Records a successful extension whose request was sent at `sent`.
    pub fn extended(&mut self, sent: Instant) {
        if let Some(ttl) = self.trusted_ttl() {
            self.valid_until = Some(deadline_after(sent, ttl.saturating_sub(self.drift)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_token_round_trips_as_hex() {
        let t = OwnerToken::random().unwrap();
        let s = t.to_string();
        assert_eq!(s.len(), 32);
        assert_eq!(s.parse::<OwnerToken>().unwrap(), t);
        assert!("xyz".parse::<OwnerToken>().is_err());
        assert_ne!(OwnerToken::random().unwrap(), t);
    }
}
