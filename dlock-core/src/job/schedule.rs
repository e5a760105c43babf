use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(feature = "cron")]
use crate::Error;
use crate::Result;
use crate::driver::check_duration;

/// When a job's occurrences are due. All times are UTC wall-clock times,
/// the same on every node whose clock is synchronised.
#[derive(Debug, Clone)]
pub struct Schedule(Kind);

#[derive(Debug, Clone)]
enum Kind {
    Every(Duration),
    #[cfg(feature = "cron")]
    Cron(Box<croner::Cron>),
}

impl Schedule {
    /// Every `period`, at the multiples of it since the Unix epoch, so that
    /// every node computes the same occurrences (`every(1 hour)` is due on
    /// the hour).
    pub fn every(period: Duration) -> Schedule {
        Schedule(Kind::Every(period))
    }

    /// A cron expression, evaluated in UTC: five fields (minute hour
    /// day-of-month month day-of-week) or six with seconds first, with the
    /// usual ranges, lists, steps, names and `@hourly`-style nicknames.
    ///
    /// ```
    /// let nightly = dlock_core::Schedule::cron("30 2 * * *").unwrap();
    /// assert!(dlock_core::Schedule::cron("61 * * * *").is_err());
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidOption`] (`schedule`) with the parser's reason.
    #[cfg(feature = "cron")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cron")))]
    pub fn cron(expression: &str) -> Result<Schedule> {
        let cron = croner::parser::CronParser::new()
            .parse(expression)
            .map_err(|e| Error::invalid_option("schedule", format!("{expression:?}: {e}")))?;
        Ok(Schedule(Kind::Cron(Box::new(cron))))
    }

    /// The first occurrence strictly after `t`; `None` when there is none.
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        match &self.0 {
            Kind::Every(period) => {
                let period = period.as_nanos();
                if period == 0 {
                    return None;
                }
                let since = t.duration_since(UNIX_EPOCH).ok()?.as_nanos();
                let next = (since / period).checked_add(1)?.checked_mul(period)?;
                let secs = u64::try_from(next / 1_000_000_000).ok()?;
                // The remainder of a division by 10^9 fits.
                let nanos = u32::try_from(next % 1_000_000_000).ok()?;
                UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
            }
            #[cfg(feature = "cron")]
            Kind::Cron(cron) => {
                let from = chrono::DateTime::<chrono::Utc>::from(t);
                let next = cron.find_next_occurrence(&from, false).ok()?;
                Some(SystemTime::from(next))
            }
        }
    }

    pub(super) fn validate(&self) -> Result<()> {
        match &self.0 {
            Kind::Every(period) => {
                check_duration("schedule", *period, Duration::from_millis(1), Duration::MAX)
            }
            #[cfg(feature = "cron")]
            Kind::Cron(_) => Ok(()),
        }
    }
}
