//! sqlx's errors as dlock's: what the server or the network said, in the
//! words an operator looks for.

use dlock_core::Error;
use dlock_sql::error::Known;

use crate::backend::NAME;

// PostgreSQL SQLSTATEs the driver tells apart.
const INVALID_PASSWORD: &str = "28P01";
const INVALID_AUTHORIZATION: &str = "28000";
const INVALID_CATALOG_NAME: &str = "3D000";
const UNDEFINED_TABLE: &str = "42P01";
const UNDEFINED_COLUMN: &str = "42703";
pub(crate) const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// The server's SQLSTATE, when the server answered with an error.
pub(crate) fn sql_state(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

/// Whether the server answered `e` and the connection stays usable: an
/// error answer, but not one that ends the session (an administrator's
/// `pg_terminate_backend`, an idle timeout, a shutdown: class 08 or 57P,
/// or severity FATAL).
pub(crate) fn answered(e: &sqlx::Error) -> bool {
    let Some(db) = e.as_database_error() else {
        return false;
    };
    !ends_session(db)
}

fn ends_session(db: &dyn sqlx::error::DatabaseError) -> bool {
    let fatal = db
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some_and(|pg| {
            matches!(
                pg.severity(),
                sqlx::postgres::PgSeverity::Fatal | sqlx::postgres::PgSeverity::Panic
            )
        });
    let code = db.code().unwrap_or_default();
    fatal || code.starts_with("08") || code.starts_with("57P")
}

/// `e`, met while `doing`, as a dlock error.
pub(crate) fn sql_error(e: sqlx::Error, doing: &str) -> Error {
    let known = match sql_state(&e).as_deref() {
        Some(INVALID_PASSWORD | INVALID_AUTHORIZATION) => {
            Some(Known::Refused("authentication failed"))
        }
        Some(INVALID_CATALOG_NAME) => Some(Known::UnknownDatabase),
        Some(UNDEFINED_TABLE) => Some(Known::MissingTable),
        Some(UNDEFINED_COLUMN) => Some(Known::OlderTable),
        _ if e.as_database_error().is_some_and(ends_session) => Some(Known::SessionEnded),
        _ => None,
    };
    dlock_sql::error::sql_error(NAME, "PgBackend", known, e, doing)
}

/// A connection error for a request that got no answer in time.
pub(crate) fn timed_out(message: String) -> Error {
    Error::timed_out(NAME, message)
}
