//! sqlx's errors as dlock's: what the server or the network said, in the
//! words an operator looks for.

use std::time::Duration;

use dlock_core::Error;
use dlock_sql::error::Known;
use sqlx::mysql::MySqlDatabaseError;
use tokio::time::Instant;

use crate::backend::NAME;

// MySQL / MariaDB server error numbers the driver tells apart.
const ER_ACCESS_DENIED: u16 = 1045;
const ER_DBACCESS_DENIED: u16 = 1044;
const ER_BAD_DB: u16 = 1049;
const ER_NO_SUCH_TABLE: u16 = 1146;
const ER_BAD_FIELD_ERROR: u16 = 1054;
pub(crate) const ER_TABLEACCESS_DENIED: u16 = 1142;
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
const ER_LOCK_DEADLOCK: u16 = 1213;
pub(crate) const ER_NO_SUCH_THREAD: u16 = 1094;

/// The server's error number, when the server answered with an error.
pub(crate) fn server_error_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

/// A call of a stored procedure that did nothing because the procedure
/// cannot be called: it does not exist, this user may not execute it, or
/// its definer is gone.
pub(crate) fn procedure_gone(e: &sqlx::Error) -> bool {
    matches!(
        server_error_number(e),
        Some(ER_SP_DOES_NOT_EXIST | ER_PROCACCESS_DENIED | ER_NO_SUCH_USER)
    )
}

/// `PROCEDURE … does not exist`.
const ER_SP_DOES_NOT_EXIST: u16 = 1305;
/// `execute command denied to user … for routine …`.
const ER_PROCACCESS_DENIED: u16 = 1370;
/// `The user specified as a definer (…) does not exist`.
const ER_NO_SUCH_USER: u16 = 1449;

/// How many times in a row a statement that InnoDB rolled back (a
/// deadlock, a lock wait timeout) is sent again before its error counts.
const ROLLED_BACK_RETRIES: u32 = 10;

/// The retries of one call's statement that InnoDB rolled back: safe to
/// send again, since nothing of it stayed. Concurrent first inserts of a
/// name, and transactions of one name's shared holds, deadlock on its
/// index rows.
#[derive(Debug, Default)]
pub(crate) struct RolledBack {
    tries: u32,
}

impl RolledBack {
    /// Whether `e` says the server rolled the statement back and it may be
    /// sent again (after [`RolledBack::pause`]).
    pub fn again(&mut self, e: &sqlx::Error) -> bool {
        if !self.would_retry(e) {
            return false;
        }
        self.tries += 1;
        true
    }

    /// Whether [`RolledBack::again`] would say so now.
    pub fn would_retry(&self, e: &sqlx::Error) -> bool {
        let rolled_back = matches!(
            server_error_number(e),
            Some(ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT)
        );
        rolled_back && self.tries < ROLLED_BACK_RETRIES
    }

    /// A short random pause, longer at each try, within the call's bound
    /// `by`: clients that deadlocked at once would otherwise meet again at
    /// once.
    pub async fn pause(&self, by: Instant) {
        let pause = Duration::from_micros(fastrand::u64(500..5_000 * u64::from(self.tries.max(1))));
        tokio::time::sleep_until(by.min(Instant::now() + pause)).await;
    }
}

/// `e`, met while `doing`, as a dlock error.
pub(crate) fn sql_error(e: sqlx::Error, doing: &str) -> Error {
    let known = match server_error_number(&e) {
        Some(ER_ACCESS_DENIED | ER_DBACCESS_DENIED) => Some(Known::Refused("access denied")),
        Some(ER_BAD_DB) => Some(Known::UnknownDatabase),
        Some(ER_NO_SUCH_TABLE) => Some(Known::MissingTable),
        Some(ER_BAD_FIELD_ERROR) => Some(Known::OlderTable),
        _ => None,
    };
    dlock_sql::error::sql_error(NAME, "MySqlBackend", known, e, doing)
}

/// A connection error for a request that got no answer in time.
pub(crate) fn timed_out(message: String) -> Error {
    Error::timed_out(NAME, message)
}
