use std::time::Duration;

/// `d` scaled by a random factor in `[0.5, 1.0]`, so that clients that
/// collided once do not collide again on every retry.
pub fn jitter(d: Duration) -> Duration {
    let factor = 0.5 + fastrand::f64() / 2.0;
    // Through f64 the largest durations round up past `Duration::MAX`.
    Duration::try_from_secs_f64(d.as_secs_f64() * factor)
        .unwrap_or(d)
        .min(d)
}

/// Exponential backoff with jitter ("equal jitter"): each delay is drawn from
/// the upper half of a range that doubles up to a cap.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

/// The shortest delay a [`Backoff`] gives: a zero delay would be a busy loop.
pub const MIN_BACKOFF: Duration = Duration::from_millis(1);

impl Backoff {
    /// Delays start near `min` and double up to `max`; both are raised to
    /// at least [`MIN_BACKOFF`].
    pub fn new(min: Duration, max: Duration) -> Self {
        let min = min.max(MIN_BACKOFF);
        let max = max.max(min);
        Backoff {
            min,
            max,
            current: min,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let d = jitter(self.current);
        self.current = self.current.saturating_mul(2).min(self.max);
        d
    }

    /// Start again from the smallest delay.
    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_and_caps() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(40));
        let d: Vec<_> = (0..5).map(|_| b.next_delay()).collect();
        let within = |d: Duration, hi: u64| {
            d >= Duration::from_millis(hi) / 2 && d <= Duration::from_millis(hi)
        };
        assert!(within(d[0], 10) && within(d[1], 20) && within(d[2], 40));
        assert!(within(d[3], 40) && within(d[4], 40));
        b.reset();
        assert!(within(b.next_delay(), 10));
    }

    #[test]
    fn extreme_durations_do_not_panic() {
        for d in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
            assert!(jitter(d) <= d);
            let mut b = Backoff::new(d, d);
            for _ in 0..70 {
                assert!(b.next_delay() <= d.max(MIN_BACKOFF));
            }
        }
        assert!(Backoff::new(Duration::ZERO, Duration::ZERO).next_delay() > Duration::ZERO);
    }
}
