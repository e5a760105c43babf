//! Settings in a URL's query (`?request_timeout=2s&wake_ups=true`), so
//! that `connect(url)`, a command line's `--url` or an environment
//! variable can say everything a builder can. A driver's builder takes its
//! own parameters as it is made (its setters then override them), the
//! client library keeps those it knows (sqlx's `sslmode`, the redis
//! crate's `protocol`), and any other is refused by name at connect.

use std::str::FromStr;
use std::time::Duration;

use crate::{Error, Result};

/// The query parameters of a URL, taken one by one by the builder that
/// knows them.
///
/// A malformed value is kept as the first error, which [`UrlParams::finish`]
/// reports (a setter called later does not clear it: the URL is wrong): a
/// builder is made from a URL without failing, and its `connect` says what
/// was wrong, before any request.
#[derive(Clone)]
pub struct UrlParams {
    base: String,
    fragment: Option<String>,
    pairs: Vec<(String, String)>,
    error: Option<(&'static str, String)>,
}

// By hand: the URL may hold a password, and so may the query (`password=`).
impl std::fmt::Debug for UrlParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlParams")
            .field("base", &crate::driver::redact_url(&self.base))
            .field("keys", &self.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl UrlParams {
    /// Splits `url` into the URL without its query and the query's
    /// `key=value` pairs (`&`-separated, %-escaped as in a form). The
    /// query starts after the authority: a raw `?` or `#` in a password
    /// stays in the password.
    pub fn parse(url: &str) -> Self {
        // As `redact_url` reads the user info: it ends at the last `@`
        // before the first `/`, `?` or `#` after the first `@`.
        let start = url.find("://").map_or(0, |i| i + 3);
        let rest = &url[start..];
        let host = match rest.find('@') {
            None => start,
            Some(first_at) => {
                let end = rest[first_at..]
                    .find(['/', '?', '#'])
                    .map_or(rest.len(), |i| first_at + i);
                start + rest[..end].rfind('@').map_or(0, |at| at + 1)
            }
        };
        let (head, tail) = url.split_at(host);
        let (tail, fragment) = match tail.split_once('#') {
            Some((tail, fragment)) => (tail, Some(fragment.to_owned())),
            None => (tail, None),
        };
        let (rest, query) = tail.split_once('?').unwrap_or((tail, ""));
        let pairs = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        UrlParams {
            base: format!("{head}{rest}"),
            fragment,
            pairs,
            error: None,
        }
    }

    /// The URL without its query.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The keys still in the query.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.pairs.iter().map(|(k, _)| k.as_str())
    }

    /// Takes `key`'s value out of the query; given twice, it is an error.
    pub fn text(&mut self, key: &'static str) -> Option<String> {
        let mut found = None;
        let mut twice = false;
        self.pairs.retain(|(k, v)| {
            if k != key {
                return true;
            }
            twice |= found.replace(v.clone()).is_some();
            false
        });
        if twice {
            self.fail(key, "given twice in the URL".to_owned());
        }
        found
    }

    /// Takes `key`, read by `parse`; a value it cannot read is an error
    /// that says what was `expected`.
    pub fn parsed<T>(
        &mut self,
        key: &'static str,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Option<T> {
        let value = self.text(key)?;
        let parsed = parse(&value);
        if parsed.is_none() {
            self.fail(
                key,
                format!("`{key}={value}` in the URL: expected {expected}"),
            );
        }
        parsed
    }

    /// Takes `key` as a duration (`2s`, `500ms`, `1m30s`).
    pub fn duration(&mut self, key: &'static str) -> Option<Duration> {
        self.parsed(key, "a duration such as 2s or 500ms", |v| {
            humantime::parse_duration(v).ok()
        })
    }

    /// Takes `key` as a duration, `default` when the URL has none.
    pub fn duration_or(&mut self, key: &'static str, default: Duration) -> Duration {
        self.duration(key).unwrap_or(default)
    }

    /// Takes `key` as `true` or `false`.
    pub fn flag(&mut self, key: &'static str) -> Option<bool> {
        self.parsed(key, "true or false", |v| match v {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        })
    }

    /// Takes `key` as a number.
    pub fn number<T: FromStr>(&mut self, key: &'static str) -> Option<T> {
        self.parsed(key, "a number in range", |v| v.parse().ok())
    }

    fn fail(&mut self, key: &'static str, reason: String) {
        self.error.get_or_insert((key, reason));
    }

    /// The URL for the client library: the base, with the parameters it
    /// knows (`library`; an entry ending in `[`, such as sqlx's `options[`,
    /// stands for every key it starts) and the fragment.
    ///
    /// # Errors
    /// [`Error::InvalidOption`]: the first malformed value taken, or
    /// `url` naming a parameter neither the driver nor the library knows
    /// (its value is never shown: it may be a secret).
    pub fn finish(&self, library: &[&str]) -> Result<String> {
        if let Some((key, reason)) = &self.error {
            return Err(Error::invalid_option(key, reason.clone()));
        }
        let known = |key: &str| {
            library
                .iter()
                .any(|&l| l == key || (l.ends_with('[') && key.starts_with(l)))
        };
        if let Some((unknown, _)) = self.pairs.iter().find(|(k, _)| !known(k)) {
            return Err(Error::invalid_option(
                "url",
                format!("unknown parameter `{unknown}` (the driver's README lists them)"),
            ));
        }
        let mut url = self.base.clone();
        if !self.pairs.is_empty() {
            let mut query = form_urlencoded::Serializer::new(String::new());
            query.extend_pairs(&self.pairs);
            url.push('?');
            url.push_str(&query.finish());
        }
        if let Some(fragment) = &self.fragment {
            url.push('#');
            url.push_str(fragment);
        }
        Ok(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_taken_and_the_library_keeps_its_own() {
        let mut p =
            UrlParams::parse("db://u:p@h/d?request_timeout=250ms&sslmode=require&wake_ups=true#x");
        assert_eq!(
            p.duration("request_timeout"),
            Some(Duration::from_millis(250))
        );
        assert_eq!(p.flag("wake_ups"), Some(true));
        assert_eq!(p.flag("create_table"), None);
        assert_eq!(
            p.finish(&["sslmode"]).unwrap(),
            "db://u:p@h/d?sslmode=require#x"
        );
        assert_eq!(
            UrlParams::parse("db://h/d").finish(&[]).unwrap(),
            "db://h/d"
        );
    }

    #[test]
    fn a_bad_or_unknown_parameter_is_named() {
        let mut p = UrlParams::parse("db://h/d?request_timeout=soon&max_connections=9");
        assert_eq!(p.duration("request_timeout"), None);
        assert_eq!(p.number::<u32>("max_connections"), Some(9));
        let e = p.finish(&[]).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidOption { option: "request_timeout", reason } if reason.contains("soon")),
            "{e:?}"
        );
        let p = UrlParams::parse("db://h/d?pasword=secret");
        let e = p.finish(&["password"]).unwrap_err();
        let shown = format!("{e:?}");
        assert!(
            shown.contains("`pasword`") && !shown.contains("secret"),
            "{shown}"
        );
        let p = UrlParams::parse("db://u:pa?ss#w@h:1?options[x]=y");
        assert_eq!(
            p.finish(&["options["]).unwrap(),
            "db://u:pa?ss#w@h:1?options%5Bx%5D=y"
        );
        assert!(!format!("{p:?}").contains("pa?ss"), "{p:?}");
        let mut p = UrlParams::parse("db://h/d?wake_ups=true&wake_ups=false");
        let _ = p.flag("wake_ups");
        assert!(matches!(
            p.finish(&[]),
            Err(Error::InvalidOption {
                option: "wake_ups",
                ..
            })
        ));
    }
}
