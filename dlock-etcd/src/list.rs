//! What operators see: the holds of a name, and the held names under a
//! prefix, a page at a time.

use std::time::Duration;

use dlock_core::{HeldLock, LockInfo, LockPage, Result};
use futures_util::future::join_all;

use crate::backend::EtcdBackend;
use crate::key::{Entry, holds, name_of, name_ranges, prefix_end};
use crate::proto::{RangeRequest, range_request};

impl EtcdBackend {
    /// Up to `most` holds of `name`, the one that lasts longest first.
    pub(crate) async fn holders_of(&self, name: &str, most: usize) -> Result<Vec<LockInfo>> {
        self.bounded("read the lock's holders", async {
            let (queue, _) = self.read_queue(name).await?;
            let infos = join_all(holds(&queue).take(most).map(|e| self.info(e))).await;
            // A hold whose lease ended since the read is no hold.
            let mut infos: Vec<LockInfo> = infos
                .into_iter()
                .collect::<Result<Vec<_>>>()?
                .into_iter()
                .flatten()
                .collect();
            infos.sort_by_key(|info| std::cmp::Reverse(info.expires_in));
            Ok(infos)
        })
        .await
    }

    /// A hold as operators see it, with its lease's remaining TTL; `None`
    /// when the lease is gone.
    async fn info(&self, entry: &Entry) -> Result<Option<LockInfo>> {
        let Some(ttl) = self.client().time_to_live(entry.lease).await? else {
            return Ok(None);
        };
        let expires_in = Duration::from_secs(u64::try_from(ttl).unwrap_or(0));
        Ok(Some(describe(entry, Some(expires_in))))
    }

    /// The held names under `prefix`, a page of keys at a time from
    /// `cursor` (the last key of the page before) on.
    ///
    /// A name's keys sort as its shared kinds' (`name\0…`), then keys of
    /// other names (`name-1…`), then its mutex's (`name/…`): a name is
    /// listed on the page of its first key, and read whole there.
    pub(crate) async fn list_locks(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        let base = &self.inner.prefix;
        let start = match cursor {
            // Right after the cursor's key.
            Some(last) => format!("{base}{last}\0").into_bytes(),
            None => format!("{base}{prefix}").into_bytes(),
        };
        let end = prefix_end(format!("{base}{prefix}").as_bytes());
        let keys = i64::try_from(limit.clamp(1, 1000)).unwrap_or(1000);
        self.bounded("list locks", async {
            let reply = self
                .client()
                .range(
                    "list locks",
                    RangeRequest {
                        key: start.clone(),
                        range_end: end,
                        limit: keys,
                        sort_order: range_request::SortOrder::Ascend as i32,
                        sort_target: range_request::SortTarget::Key as i32,
                        keys_only: true,
                        ..RangeRequest::default()
                    },
                )
                .await?;
            // A page that stops inside a name's keys stops before them (the
            // next page starts there), unless they are all it has.
            let mut page = reply.kvs.as_slice();
            if reply.more
                && let Some(last) = page.last().map(|kv| name_of(base, &kv.key))
                && let Some(i) = page.iter().rposition(|kv| name_of(base, &kv.key) != last)
            {
                page = &page[..=i];
            }
            let mut names: Vec<&str> = Vec::new();
            let mut firsts = Vec::new();
            for kv in page {
                if let Some(name) = name_of(base, &kv.key)
                    && !names.contains(&name)
                {
                    names.push(name);
                    firsts.push(self.listed_here(base, name, &start));
                }
            }
            let firsts = join_all(firsts).await;
            let mut held = Vec::new();
            for (name, first) in names.iter().zip(firsts) {
                if first? {
                    let (queue, _) = self.read_queue(name).await?;
                    held.extend(holds(&queue).next().cloned());
                }
            }
            // Each with its lease's remaining TTL, asked for all at once; a
            // hold whose lease ended since the read is left out.
            let infos = join_all(held.iter().map(|e| self.info(e))).await;
            let mut locks = Vec::new();
            for (entry, info) in held.iter().zip(infos) {
                if let Some(info) = info? {
                    locks.push(HeldLock::new(entry.name.clone(), info));
                }
            }
            let next = reply
                .more
                .then(|| page.last())
                .flatten()
                .and_then(|kv| kv.key.strip_prefix(base.as_bytes()))
                .map(|last| String::from_utf8_lossy(last).into_owned());
            Ok(LockPage::new(locks, next))
        })
        .await
    }

    /// Whether `name`, which has a key on the page that starts at `start`,
    /// is listed on it: whether none of its keys is before `start`.
    async fn listed_here(&self, base: &str, name: &str, start: &[u8]) -> Result<bool> {
        let [(shared, shared_end), (mutex, _)] = name_ranges(base, name);
        if start <= shared.as_slice() {
            return Ok(true);
        }
        let before = |key, range_end, count_only| RangeRequest {
            key,
            range_end,
            count_only,
            keys_only: true,
            ..RangeRequest::default()
        };
        let client = self.client();
        let shared = client.range("list locks", before(shared, shared_end, true));
        if shared.await?.count > 0 {
            return Ok(false);
        }
        if start <= mutex.as_slice() {
            return Ok(true);
        }
        // Between its mutex keys' start and the page's: other names' keys
        // (`name/sub/…`), or its own.
        // Bounded: past that many, the name is listed here (and maybe on a
        // page before).
        let mut between = before(mutex, start.to_vec(), false);
        between.limit = 10_000;
        let reply = client.range("list locks", between).await?;
        Ok(!reply
            .kvs
            .iter()
            .any(|kv| name_of(base, &kv.key) == Some(name)))
    }
}

/// A hold's description with its fencing token: a mutex's key's creation
/// (a delayed release rewrites the key, not the token), a shared kind's
/// key's last write (its creation, or the grant's draw).
pub(crate) fn describe(entry: &Entry, expires_in: Option<Duration>) -> LockInfo {
    let token = if entry.mode == dlock_core::Mode::Exclusive {
        entry.create_revision
    } else {
        entry.mod_revision
    };
    LockInfo::new(entry.owner, u64::try_from(token).unwrap_or(0), expires_in)
        .with_holder(entry.holder.clone())
        .with_mode(entry.mode)
}
