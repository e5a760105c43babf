//! The URL: what sqlx takes of it, checked before any connect.

use std::str::FromStr;

use dlock_core::{Error, Result};
use dlock_sql::check_url;
use sqlx::postgres::PgConnectOptions;

/// The URL parameters sqlx's PostgreSQL driver takes (see the README).
pub(super) const SQLX_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
    "options[",
];

/// Parses a `postgres://` or `postgresql://` URL, refusing what sqlx would
/// only notice when it connects (or would quietly replace by a default).
pub(super) fn parse_url(url: &str) -> Result<PgConnectOptions> {
    check_url(
        url,
        ["postgres", "postgresql"],
        "postgres://user:password@host:port/database",
    )?;
    PgConnectOptions::from_str(url)
        .map(no_startup_extras)
        .map_err(|e| Error::invalid_option("url", format!("not a PostgreSQL URL: {e}")))
}

/// No `extra_float_digits` at startup: a stock PgBouncer refuses a startup
/// parameter it does not know, and no statement here reads a float.
pub(super) fn no_startup_extras(options: PgConnectOptions) -> PgConnectOptions {
    options.extra_float_digits(None)
}
