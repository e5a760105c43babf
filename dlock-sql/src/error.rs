//! sqlx's errors as dlock's: what the server or the network said, in the
//! words an operator looks for. Each driver reads its server's codes into
//! a [`Known`] cause; the words are the same for both.

use dlock_core::Error;

/// A cause both drivers name, read from the server's error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// Bad credentials, or no right to the database: the words the
    /// server's documentation uses ("access denied", "authentication
    /// failed").
    Refused(&'static str),
    /// The database in the URL does not exist.
    UnknownDatabase,
    /// The lock table does not exist.
    MissingTable,
    /// The lock table lacks a column a later release added.
    OlderTable,
    /// The server ended the session (an administrator, an idle timeout, a
    /// shutdown): the connection is gone.
    SessionEnded,
}

/// `e`, met while `doing`, as a dlock error of the driver `driver`, whose
/// backend type `backend` (`MySqlBackend`, `PgBackend`) the hints name;
/// `known` is what the driver read from the server's error code.
pub fn sql_error(
    driver: &'static str,
    backend: &'static str,
    known: Option<Known>,
    e: sqlx::Error,
    doing: &str,
) -> Error {
    let migrate = |what: &str| format!("{doing}: {what}; call {backend}::migrate() once");
    match known {
        Some(Known::Refused(what)) => Error::backend(driver, format!("{doing}: {what}"), e),
        Some(Known::UnknownDatabase) => {
            Error::backend(driver, format!("{doing}: unknown database"), e)
        }
        Some(Known::MissingTable) => {
            Error::backend(driver, migrate("the lock table is missing"), e)
        }
        Some(Known::OlderTable) => Error::backend(
            driver,
            migrate("the lock table was made by an older release"),
            e,
        ),
        Some(Known::SessionEnded) => {
            Error::connection(driver, format!("{doing}: the server ended the session"), e)
        }
        None => match e {
            // Say what the network said ("connection refused"), not just
            // that it failed.
            sqlx::Error::Io(ref io) => Error::connection(driver, format!("{doing}: {io}"), e),
            sqlx::Error::PoolTimedOut => Error::connection(
                driver,
                format!("{doing}: no free connection in the pool"),
                e,
            ),
            sqlx::Error::Tls(_)
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_) => Error::connection(driver, doing, e),
            sqlx::Error::Configuration(_) => Error::invalid_option("url", e.to_string()),
            _ => Error::backend(driver, doing, e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_says_what_to_do() {
        let e = || sqlx::Error::Protocol("x".into());
        let said = |known| sql_error("mysql", "MySqlBackend", known, e(), "acquire").to_string();
        assert!(said(Some(Known::MissingTable)).contains("call MySqlBackend::migrate() once"));
        assert!(said(Some(Known::Refused("access denied"))).contains("acquire: access denied"));
        let ended = sql_error(
            "postgres",
            "PgBackend",
            Some(Known::SessionEnded),
            e(),
            "extend",
        );
        assert!(ended.is_retryable(), "{ended:?}");
        assert!(matches!(said(None), s if s.contains("acquire")));
    }
}
