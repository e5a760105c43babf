//! What operators see: the holds of a name, and the held names under a
//! prefix, a page at a time.

use std::time::Duration;

use dlock_core::{HeldLock, LockInfo, LockPage, Result};
use futures_util::future::join_all;

use crate::backend::EtcdBackend;
use crate::key::{Entry, holds, prefix_end, queue};
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

    /// The held names under `prefix`, from `cursor` (the last name of the
    /// page before) on. A page reads a bounded number of keys; a name whose
    /// keys run past the page's end starts the next page.
    pub(crate) async fn list_locks(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        let base = &self.inner.prefix;
        let start = match cursor {
            // Past every key of the cursor's name (`name\0...`).
            Some(last) => format!("{base}{last}\x01").into_bytes(),
            None => format!("{base}{prefix}").into_bytes(),
        };
        let end = prefix_end(format!("{base}{prefix}").as_bytes());
        // Waiters' keys share the range with holds: read more than asked.
        let keys = i64::try_from(limit.clamp(1, 1000).saturating_mul(4)).unwrap_or(4000);
        self.bounded("list locks", async {
            let reply = self
                .client()
                .range(
                    "list locks",
                    RangeRequest {
                        key: start,
                        range_end: end,
                        limit: keys,
                        sort_order: range_request::SortOrder::Ascend as i32,
                        sort_target: range_request::SortTarget::Key as i32,
                        ..RangeRequest::default()
                    },
                )
                .await?;
            let entries = queue(base, &reply.kvs)?;
            let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            // The last name may have more keys past the page: it waits for
            // the next page, or, alone on this one, is read whole (keys are
            // paged in key order, not queue order, so a part of its queue
            // could show a waiter as the holder).
            let truncated = reply.more && names.len() == 1;
            if reply.more && names.len() > 1 {
                names.pop();
            }
            let mut held = Vec::new();
            for name in &names {
                let of_name: Vec<Entry> = if truncated {
                    self.read_queue(name).await?.0
                } else {
                    entries
                        .iter()
                        .filter(|e| e.name == *name)
                        .cloned()
                        .collect()
                };
                held.extend(holds(&of_name).next().cloned());
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
                .then(|| names.last().map(|n| (*n).to_owned()))
                .flatten();
            Ok(LockPage::new(locks, next))
        })
        .await
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
