//! Extending leases: one at a time, or a renewal batch in one statement per
//! TTL.

use std::collections::HashSet;
use std::time::Duration;

use dlock_core::driver::micros_up;
use dlock_core::{Lease, Result};
use sqlx::mysql::MySqlRow;
use tokio::time::{Instant, timeout_at};

use crate::backend::MySqlBackend;
use crate::sql::Batch;

/// Which leases of a batch an extension extended.
pub(crate) enum Extended {
    /// Every one.
    All,
    /// Those whose key ([`owned_key`]) is here.
    Owned(HashSet<Vec<u8>>),
}

/// A lease's key in the answers of the batch statements: its owner token,
/// then its name.
fn owned_key(lease: &Lease) -> Vec<u8> {
    let mut key = lease.owner().to_string().into_bytes();
    key.extend_from_slice(lease.name().as_bytes());
    key
}

/// The keys ([`owned_key`]) in the first column of `rows`.
pub(crate) fn owned_keys(rows: &[MySqlRow]) -> HashSet<Vec<u8>> {
    rows.iter()
        .filter_map(|row| sqlx::Row::try_get::<Vec<u8>, _>(row, 0).ok())
        .collect()
}

impl MySqlBackend {
    /// [`Driver::extend`](dlock_core::driver::Driver::extend) of a mutex.
    pub(crate) async fn extend_mutex(&self, lease: &mut Lease) -> Result<()> {
        let sent = Instant::now();
        let ttl = micros_up(lease.ttl().unwrap_or_default());
        let query = sqlx::query(self.inner.sql.extend.clone())
            .bind(ttl)
            .bind(lease.name().as_bytes())
            .bind(lease.owner().to_string());
        self.inner.pool.own_row(query, lease, "extend").await?;
        lease.extended(sent);
        Ok(())
    }

    /// Extends mutex leases, one statement per TTL.
    pub(crate) async fn extend_mutexes(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let by = self.deadline();
        self.extend_per_ttl(leases, |batch, ttl| async move {
            let update = sqlx::raw_sql(self.inner.sql.extend_many(&batch, micros_up(ttl)));
            let matched = self.execute(update, "extend", by).await?.rows_affected();
            if usize::try_from(matched).is_ok_and(|m| m == batch.len()) {
                return Ok(Extended::All);
            }
            // Some were lost: ask which rows are still ours, which are
            // exactly those the update extended.
            let select = sqlx::raw_sql(self.inner.sql.owned_of(&batch));
            let mut lent = self.inner.pool.lend("extend", by).await?;
            let done = timeout_at(by, select.fetch_all(lent.conn())).await;
            Ok(Extended::Owned(owned_keys(
                &self.inner.pool.settle(lent, done, "extend")?,
            )))
        })
        .await
    }

    /// Extends `leases` one batch per TTL (a batch's leases nearly always
    /// share one): `send` extends a batch, and says which of it it extended.
    pub(crate) async fn extend_per_ttl<F, Fut>(
        &self,
        leases: &mut [Lease],
        mut send: F,
    ) -> Result<Vec<bool>>
    where
        F: FnMut(Batch, Duration) -> Fut,
        Fut: Future<Output = Result<Extended>>,
    {
        let mut held = vec![false; leases.len()];
        let mut ttls: Vec<Duration> = leases.iter().filter_map(Lease::ttl).collect();
        ttls.sort_unstable();
        ttls.dedup();
        for ttl in ttls {
            let members: Vec<usize> = (0..leases.len())
                .filter(|&i| leases[i].ttl() == Some(ttl))
                .collect();
            let mut batch = Batch::default();
            for &i in &members {
                batch.push(leases[i].name().as_bytes(), &leases[i].owner().to_string());
            }
            let sent = Instant::now();
            let extended = send(batch, ttl).await?;
            for i in members {
                let ours = match &extended {
                    Extended::All => true,
                    Extended::Owned(owned) => owned.contains(&owned_key(&leases[i])),
                };
                if ours {
                    leases[i].extended(sent);
                    held[i] = true;
                }
            }
        }
        Ok(held)
    }
}
