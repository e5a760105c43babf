//! The `redis+sentinel://` URL.

use dlock_core::{Error, Result};

/// The default Sentinel port.
const SENTINEL_PORT: u16 = 26379;

/// A parsed `redis+sentinel://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    pub sentinels: Vec<(String, u16)>,
    pub service: String,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// Parses `redis+sentinel://[user:password@]host[:port][,host[:port]…]/service[/db]`.
/// The credentials are the data nodes' (Sentinels are asked without).
pub(crate) fn parse_url(url: &str) -> Result<Option<SentinelUrl>> {
    let Some(rest) = url.strip_prefix("redis+sentinel://") else {
        return Ok(None);
    };
    let bad = |why: &str| {
        Error::invalid_option(
            "url",
            format!(
                "{why}: expected redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db]"
            ),
        )
    };
    let (authority, path) = rest.split_once('/').ok_or_else(|| bad("no service name"))?;
    let (credentials, hosts) = match authority.rsplit_once('@') {
        Some((credentials, hosts)) => (Some(credentials), hosts),
        None => (None, authority),
    };
    let (username, password) = match credentials {
        None => (None, None),
        Some(c) => match c.split_once(':') {
            Some((user, password)) => (
                (!user.is_empty()).then(|| decode(user)).transpose()?,
                Some(decode(password)?),
            ),
            None => (Some(decode(c)?), None),
        },
    };
    let mut sentinels = Vec::new();
    for host in hosts.split(',') {
        // `[::1]` has no port, `[::1]:3` and `a:3` have one.
        let (name, port) = match host.rsplit_once(':') {
            Some((name, port)) if !name.starts_with('[') || name.ends_with(']') => (
                name,
                port.parse()
                    .map_err(|_| bad(&format!("bad port in {host:?}")))?,
            ),
            _ => (host, SENTINEL_PORT),
        };
        let name = name.trim_start_matches('[').trim_end_matches(']');
        if name.is_empty() {
            return Err(bad("empty host"));
        }
        sentinels.push((name.to_owned(), port));
    }
    let (service, db) = match path.split_once('/') {
        Some((service, db)) => (
            service,
            db.parse()
                .map_err(|_| bad(&format!("bad database {db:?}")))?,
        ),
        None => (path, 0),
    };
    if service.is_empty() {
        return Err(bad("no service name"));
    }
    Ok(Some(SentinelUrl {
        sentinels,
        service: decode(service)?,
        db,
        username,
        password,
    }))
}

fn decode(s: &str) -> Result<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| Error::invalid_option("url", "percent-encoding that is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = parse_url("redis+sentinel://a:1,b,[::1]:3/svc/2")
            .unwrap()
            .unwrap();
        assert_eq!(
            u.sentinels,
            vec![
                ("a".to_owned(), 1),
                ("b".to_owned(), SENTINEL_PORT),
                ("::1".to_owned(), 3)
            ]
        );
        assert_eq!((u.service.as_str(), u.db), ("svc", 2));
        let u = parse_url("redis+sentinel://[::1]/svc").unwrap().unwrap();
        assert_eq!(u.sentinels, vec![("::1".to_owned(), SENTINEL_PORT)]);
        let u = parse_url("redis+sentinel://me:p%40ss@h/svc")
            .unwrap()
            .unwrap();
        assert_eq!(u.username.as_deref(), Some("me"));
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        let u = parse_url("redis+sentinel://:pw@h/svc").unwrap().unwrap();
        assert_eq!((u.username, u.password.as_deref()), (None, Some("pw")));
        assert!(parse_url("redis://h").unwrap().is_none());
        for bad in [
            "redis+sentinel://h",
            "redis+sentinel://h/",
            "redis+sentinel://h:x/svc",
            "redis+sentinel://,h/svc",
            "redis+sentinel://h/svc/x",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
