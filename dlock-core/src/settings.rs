//! The checks and conversions of settings that the lock options and the
//! drivers' builders share: duration bounds, holder descriptions, the hold
//! of a delayed release, durations as servers count them, and deadlines
//! that saturate instead of overflowing.

use std::time::Duration;

use tokio::time::Instant;

use crate::options::{MAX_HOLDER_LEN, MAX_TTL};
use crate::{Error, Result};

/// The longest a driver's duration setting (a timeout, a poll interval)
/// may be: beyond a day it is surely a mistake, and it overflows client
/// libraries' arithmetic.
pub const MAX_SETTING: Duration = Duration::from_secs(24 * 60 * 60);

/// Checks the duration setting `option`: [`Error::InvalidOption`] unless
/// `value` is within `min..=max`. For drivers' builders as for the options.
pub fn check_duration(
    option: &'static str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<()> {
    if value < min || value > max {
        return Err(Error::invalid_option(
            option,
            format!("must be between {min:?} and {max:?}, got {value:?}"),
        ));
    }
    Ok(())
}

/// Checks a holder description: [`Error::InvalidOption`] when it is longer
/// than [`MAX_HOLDER_LEN`] bytes or has a control character (a line break
/// or an escape would garble an operator's terminal).
pub fn check_holder(holder: &str) -> Result<()> {
    if holder.len() > MAX_HOLDER_LEN {
        return Err(Error::invalid_option(
            "holder",
            format!("at most {MAX_HOLDER_LEN} bytes, got {} bytes", holder.len()),
        ));
    }
    // Line and paragraph separators and bidirectional overrides garble a
    // terminal as control characters do.
    let garbles = |c: char| {
        c.is_control()
            || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if let Some(c) = holder.chars().find(|&c| garbles(c)) {
        return Err(Error::invalid_option(
            "holder",
            format!("no control characters, got {c:?}"),
        ));
    }
    Ok(())
}

/// Checks the hold of a delayed release
/// ([`Backend::release_after`](crate::Backend::release_after)): at most
/// [`MAX_TTL`], like a lease.
pub fn check_hold(hold: Duration) -> Result<()> {
    check_duration("hold", hold, Duration::ZERO, MAX_TTL)
}

/// `d` in whole milliseconds, rounded up: how a TTL, a hold or a timeout
/// goes to a server that counts in milliseconds. Rounded down, a TTL of
/// 20.9 ms would end on the server 0.9 ms before the client stops trusting
/// it (with no drift allowance), and a timeout of 0.5 ms would become 0,
/// which some servers read as "forever".
pub fn millis_up(d: Duration) -> u64 {
    let ms = d.as_millis() + u128::from(!d.subsec_nanos().is_multiple_of(1_000_000));
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// `d` in whole microseconds, rounded up, for servers that count in
/// microseconds; see [`millis_up`].
pub fn micros_up(d: Duration) -> u64 {
    let us = d.as_micros() + u128::from(!d.subsec_nanos().is_multiple_of(1_000));
    u64::try_from(us).unwrap_or(u64::MAX)
}

/// `start + d`, saturating far in the future instead of overflowing.
pub(crate) fn deadline_after(start: Instant, d: Duration) -> Instant {
    start
        .checked_add(d)
        .unwrap_or_else(|| start + Duration::from_secs(100 * 365 * 24 * 60 * 60))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_go_to_servers_rounded_up() {
        assert_eq!(millis_up(Duration::from_micros(20_900)), 21);
        assert_eq!(millis_up(Duration::from_millis(20)), 20);
        assert_eq!(millis_up(Duration::from_nanos(1)), 1);
        assert_eq!(millis_up(Duration::ZERO), 0);
        assert_eq!(micros_up(Duration::from_nanos(30_999_001)), 31_000);
        assert_eq!(micros_up(Duration::from_micros(7)), 7);
        assert_eq!(millis_up(Duration::MAX), u64::MAX);
        assert_eq!(micros_up(Duration::MAX), u64::MAX);
    }
}
