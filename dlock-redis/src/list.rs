//! Reading who holds what: a page of held locks (`SCAN`), or one lock.

use std::time::Duration;

use dlock_core::{Error, HeldLock, LockInfo, LockPage, Mode, Result};

use crate::backend::{NAME, RedisBackend};
use crate::keys::{holder_parts, lock_pattern, name_of};
use crate::scripts::HOLDERS;

impl RedisBackend {
    /// One page of the held locks whose names start with `name_prefix`
    /// (not to be mixed up with the key prefix).
    pub(crate) async fn list_locks(
        &self,
        name_prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        if self.inner.cluster {
            // SCAN walks one node; a cluster-wide walk needs a cursor per
            // primary.
            return Err(Error::Unsupported {
                backend: NAME,
                operation: "list on Redis Cluster",
            });
        }
        let mut scan: u64 = match cursor {
            None => 0,
            Some(c) => c
                .parse()
                .map_err(|_| Error::invalid_option("cursor", "not a cursor this driver gave"))?,
        };
        let pattern = lock_pattern(&self.inner.prefix, name_prefix);
        let mut conn = self.connection();
        let mut names = Vec::new();
        // One bound for the whole page, however many requests it takes.
        let (replies, described): (Vec<redis::Value>, Vec<Option<String>>) = self
            .bounded("list", async {
                // A few SCAN steps per page: each is bounded work for the
                // server, and a sparse prefix still fills a page.
                let mut found = Vec::new();
                for _ in 0..10 {
                    let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                        .arg(scan)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000)
                        .query_async(&mut conn)
                        .await?;
                    found.extend(keys);
                    scan = next;
                    if scan == 0 || found.len() >= limit {
                        break;
                    }
                }
                names.extend(
                    found
                        .iter()
                        .filter_map(|key| name_of(&self.inner.prefix, key)),
                );
                if names.is_empty() {
                    return Ok((Vec::new(), Vec::new()));
                }
                // Every holder in one round trip, each read consistently.
                let mut pipe = redis::pipe();
                pipe.atomic();
                for name in &names {
                    let keys = self.keys(name);
                    pipe.get(keys.lock())
                        .pttl(keys.lock())
                        .get(keys.fence())
                        .zrange(keys.holds(), -1, -1);
                }
                let replies: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
                // The shared kinds' holder descriptions, beside their holds
                // (see `scripts/shared.rs`): a second round trip, only for
                // pages with such locks.
                let mut pipe = redis::pipe();
                let mut asked = Vec::new();
                for (i, (name, reply)) in names.iter().zip(replies.chunks(4)).enumerate() {
                    if let [value, _, _, last_hold] = reply
                        && let Ok(Some(value)) =
                            redis::from_redis_value_ref::<Option<String>>(value)
                        && value.starts_with('~')
                        && let Ok(last) = redis::from_redis_value_ref::<Vec<String>>(last_hold)
                        && let Some(member) = last.first()
                    {
                        pipe.hget(format!("{}w", self.keys(name).holds()), member);
                        asked.push(i);
                    }
                }
                let mut described = vec![None; names.len()];
                if !asked.is_empty() {
                    let answers: Vec<Option<String>> = pipe.query_async(&mut conn).await?;
                    for (i, answer) in asked.into_iter().zip(answers) {
                        described[i] = answer;
                    }
                }
                Ok((replies, described))
            })
            .await?;
        let mut locks = Vec::new();
        let rows = replies.chunks(4).zip(described);
        for (name, (reply, described)) in names.into_iter().zip(rows) {
            let [owner, pttl, fence, last_hold] = reply else {
                return Err(Error::malformed(NAME, "list", reply));
            };
            let (Ok(Some(value)), Ok(pttl)) = (
                redis::from_redis_value_ref::<Option<String>>(owner),
                redis::from_redis_value_ref::<i64>(pttl),
            ) else {
                continue; // released between SCAN and the read
            };
            let last;
            let (stored, shared) = if value.starts_with('~') {
                // A reader-writer lock or semaphore: the hold that lasts
                // longest speaks for it.
                last = redis::from_redis_value_ref::<Vec<String>>(last_hold).unwrap_or_default();
                match last.first() {
                    Some(member) => (member, true),
                    None => continue,
                }
            } else {
                (&value, false)
            };
            let (owner, holder) = holder_parts(stored, shared)
                .ok_or_else(|| Error::malformed(NAME, "list (owner)", stored))?;
            let mut fence = redis::from_redis_value_ref::<Option<String>>(fence)
                .ok()
                .flatten()
                .and_then(|f| f.parse().ok())
                .unwrap_or(0);
            let expires_in = u64::try_from(pttl).ok().map(Duration::from_millis);
            let holder = match &described {
                Some(entry) if shared => {
                    let (token, holder) = token_and_holder(entry);
                    fence = token.unwrap_or(fence);
                    holder
                }
                _ if shared => "",
                _ => holder,
            };
            let mut info = LockInfo::new(owner, fence, expires_in).with_holder(holder);
            info.mode = mode_of(stored, if shared { &value } else { "" });
            locks.push(HeldLock::new(name, info));
        }
        Ok(LockPage::new(locks, (scan != 0).then(|| scan.to_string())))
    }

    /// The holder of `name`, if any, and its marker when it is held as a
    /// reader-writer lock or a semaphore (`""` for a mutex).
    pub(crate) async fn inspect_with_kind(&self, name: &str) -> Result<Option<(LockInfo, String)>> {
        Ok(self.holds(name, 1).await?.into_iter().next())
    }

    /// Up to `most` holds of `name`, the longest first.
    pub(crate) async fn holders_of(&self, name: &str, most: usize) -> Result<Vec<LockInfo>> {
        let holds = self.holds(name, most).await?;
        Ok(holds.into_iter().map(|(info, _)| info).collect())
    }

    /// Up to `most` holds of `name`, each with the name's marker.
    async fn holds(&self, name: &str, most: usize) -> Result<Vec<(LockInfo, String)>> {
        let keys = self.keys(name);
        let mut invocation = HOLDERS.prepare_invoke();
        invocation
            .key(keys.lock())
            .key(keys.fence())
            .key(keys.holds())
            .arg(most);
        let (reply, _) = self
            .run::<Vec<String>>(&invocation, false, "inspect")
            .await?;
        let quads = reply.chunks_exact(4);
        if !quads.remainder().is_empty() {
            return Err(Error::malformed(NAME, "inspect", reply));
        }
        let mut holds = Vec::with_capacity(reply.len() / 4);
        for quad in quads {
            let [stored, left, fence, kind] = quad else {
                continue;
            };
            let (owner, holder) = holder_parts(stored, !kind.is_empty())
                .ok_or_else(|| Error::malformed(NAME, "inspect (owner)", stored))?;
            let fence = fence
                .parse()
                .map_err(|_| Error::malformed(NAME, "inspect (fence)", fence))?;
            let expires_in = left.parse::<u64>().ok().map(Duration::from_millis);
            let mut info = LockInfo::new(owner, fence, expires_in).with_holder(holder);
            info.mode = mode_of(stored, kind);
            holds.push((info, kind.clone()));
        }
        Ok(holds)
    }
}

/// A shared hold's entry in `P:{E}:hw`: its fencing token (`None` in an
/// entry without one) and holder description.
fn token_and_holder(entry: &str) -> (Option<u64>, &str) {
    match entry.split_once('\u{1f}') {
        Some((token, holder)) if let Ok(token) = token.parse() => (Some(token), holder),
        _ => (None, entry),
    }
}

/// The kind of hold of a lock key's value (`marker` empty) or of a holds
/// member under the name's `marker`.
fn mode_of(stored: &str, marker: &str) -> Option<Mode> {
    if marker.is_empty() {
        return Some(Mode::Exclusive);
    }
    Mode::of_code(stored.get(32..33)?, marker)
}
