//! The settings both SQL builders have, their defaults and checks, and the
//! checks of a URL that sqlx would only make when it connects.

use std::time::Duration;

use dlock_core::driver::{MAX_SETTING, UrlParams, check_duration, percent_decodes, redact_url};
use dlock_core::{Error, Result};

/// What both builders set; each builder adds its own (a schema) and keeps
/// its setters' docs.
#[derive(Clone)]
pub struct Settings {
    /// The server's URL, its query's settings not taken yet.
    pub params: UrlParams,
    /// The lock table.
    pub table: String,
    /// The most connections the pool opens.
    pub max_connections: u32,
    /// How long to wait for a new connection.
    pub connect_timeout: Duration,
    /// How long one call may take.
    pub request_timeout: Duration,
    /// The longest a waiter goes without looking again.
    pub max_poll: Duration,
    /// Whether waiters in other processes are woken.
    pub wake_ups: bool,
    /// Whether `connect` creates a missing lock table.
    pub create_table: bool,
}

impl Settings {
    /// The settings `url` gives in its query (`?table=locks&wake_ups=true`:
    /// each setting under its setter's name, durations as `2s` or
    /// `500ms`), else the defaults: table `dlock_locks`, 10 connections, a
    /// 5 s connect timeout, a 2 s request timeout, polls 1 s apart at most,
    /// wake-ups as the driver's default (`wake_ups`), and the table created
    /// when missing.
    pub fn new(url: &str, wake_ups: bool) -> Self {
        let mut params = UrlParams::parse(url);
        Settings {
            table: params
                .text("table")
                .unwrap_or_else(|| "dlock_locks".to_owned()),
            max_connections: params.number("max_connections").unwrap_or(10),
            connect_timeout: params.duration_or("connect_timeout", Duration::from_secs(5)),
            request_timeout: params.duration_or("request_timeout", Duration::from_secs(2)),
            max_poll: params.duration_or("max_poll_interval", Duration::from_secs(1)),
            wake_ups: params.flag("wake_ups").unwrap_or(wake_ups),
            create_table: params.flag("create_table").unwrap_or(true),
            params,
        }
    }

    /// The URL for sqlx: without the settings taken from it, with the
    /// parameters sqlx knows (`library`).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a malformed setting in the URL, or a
    /// parameter neither takes.
    pub fn url(&self, library: &[&str]) -> Result<String> {
        self.params.finish(library)
    }

    /// Checks the numbers; the builder checks the names and the URL.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the setting out of range.
    pub fn check(&self) -> Result<()> {
        if self.max_connections == 0 {
            return Err(Error::invalid_option(
                "max_connections",
                "must be at least 1",
            ));
        }
        let ms = Duration::from_millis(1);
        check_duration("connect_timeout", self.connect_timeout, ms, MAX_SETTING)?;
        check_duration("request_timeout", self.request_timeout, ms, MAX_SETTING)?;
        let min_poll = Duration::from_millis(10);
        check_duration("max_poll_interval", self.max_poll, min_poll, MAX_SETTING)
    }

    /// A builder's `Debug`: `builder` and its own fields, then these, the
    /// URL without its password.
    pub fn debug(
        &self,
        f: &mut std::fmt::Formatter<'_>,
        builder: &str,
        own: &[(&str, &dyn std::fmt::Debug)],
    ) -> std::fmt::Result {
        let mut d = f.debug_struct(builder);
        d.field("url", &redact_url(self.params.base()));
        for (name, value) in own {
            d.field(name, value);
        }
        d.field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_poll", &self.max_poll)
            .field("wake_ups", &self.wake_ups)
            .field("create_table", &self.create_table)
            .finish()
    }
}

/// `common_setters!(Builder)`: the setters both SQL builders document
/// alike, on a `Builder` whose field `s` holds its [`Settings`].
#[macro_export]
macro_rules! common_setters {
    ($builder:ident) => {
        impl $builder {
            /// The most connections the pool opens (default 10).
            pub fn max_connections(mut self, n: u32) -> Self {
                self.s.max_connections = n;
                self
            }

            /// How long to wait for a new connection (default 5 s).
            pub fn connect_timeout(mut self, timeout: ::std::time::Duration) -> Self {
                self.s.connect_timeout = timeout;
                self
            }

            /// How long a call may take, the wait for a pooled connection
            /// included, before it counts as failed (default 2 s). A
            /// statement that times out may still have run: its connection
            /// is discarded, and an acquire is undone by its owner token.
            pub fn request_timeout(mut self, timeout: ::std::time::Duration) -> Self {
                self.s.request_timeout = timeout;
                self
            }
        }
    };
}

/// Checks what sqlx would only notice when it connects (or would quietly
/// replace by a default): one of `schemes`, a host, and %-escapes that
/// decode to UTF-8 in the user name, password and database. `example` is
/// the URL's form, as the errors show it.
///
/// # Errors
/// [`Error::InvalidOption`] for `url`; a password is never shown.
pub fn check_url(url: &str, schemes: [&str; 2], example: &str) -> Result<()> {
    let bad = |reason: String| Error::invalid_option("url", reason);
    let parsed = url::Url::parse(url).map_err(|e| bad(format!("not a URL: {e}")))?;
    if !schemes.contains(&parsed.scheme()) {
        return Err(bad(format!("expected {example}")));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad(format!("no host: expected {example}")));
    }
    for (part, text) in [
        ("user name", parsed.username()),
        ("password", parsed.password().unwrap_or_default()),
        ("database", parsed.path()),
    ] {
        if !percent_decodes(text) {
            // The part itself is not shown: it may be a password.
            return Err(bad(format!(
                "the {part} has a malformed %-escape or is not UTF-8"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_before_connecting() {
        let check = |url| check_url(url, ["db", "dbx"], "db://user:password@host/database");
        for bad in [
            "db://",
            "db:///db",
            "db://u:%zz@127.0.0.1/db",
            "db://u:%E9@127.0.0.1/db",
            "db://u:p@127.0.0.1/%",
            "other://u@127.0.0.1/db",
            "not a url",
        ] {
            let r = check(bad);
            assert!(
                matches!(r, Err(Error::InvalidOption { option: "url", .. })),
                "{bad}: {r:?}"
            );
        }
        assert!(check("db://u:p%40ss@127.0.0.1:3306/db").is_ok());
        assert!(check("dbx://u@localhost/db").is_ok());
    }

    #[test]
    fn a_password_is_never_shown() {
        let r = check_url("db://u:%zzsecret@h/d", ["db", "db"], "db://…");
        assert!(!format!("{r:?}").contains("secret"), "{r:?}");
        let settings = Settings::new("db://u:secret@h/d", false);
        struct Shown<'a>(&'a Settings);
        impl std::fmt::Debug for Shown<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.debug(f, "Builder", &[])
            }
        }
        assert!(!format!("{:?}", Shown(&settings)).contains("secret"));
    }
}
