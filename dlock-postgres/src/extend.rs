//! Extending leases: one, or a whole renewal batch in one statement.

use std::collections::HashSet;

use dlock_core::driver::batch::extend_by_kind;
use dlock_core::driver::micros_up;
use dlock_core::{Error, Lease, Mode, Result};
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::time::Instant;

use crate::backend::{NAME, PgBackend};
use crate::sql::{Renewal, unhex};

impl PgBackend {
    /// [`Backend::extend`](dlock_core::Backend::extend).
    pub(crate) async fn extend_lease(&self, lease: &mut Lease) -> Result<()> {
        if lease.mode() != Mode::Exclusive {
            return match self.extend_shared(&mut [lease]).await?.as_slice() {
                [true] => Ok(()),
                _ => Err(Error::not_held(lease.name())),
            };
        }
        let sent = Instant::now();
        let ttl = micros_up(lease.ttl().unwrap_or_default());
        let owner = lease.owner().to_string();
        let sql = self.inner.sql.extend(lease.name().as_bytes(), &owner, ttl);
        self.inner
            .pool
            .own_row(sqlx::raw_sql(sql), lease, "extend")
            .await?;
        lease.extended(sent);
        Ok(())
    }

    /// [`Backend::extend_many`](dlock_core::Backend::extend_many): one
    /// statement, whose reply names the rows it extended.
    pub(crate) async fn extend_leases(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        if leases.iter().any(|l| l.mode() != Mode::Exclusive) {
            return extend_by_kind(
                leases,
                |mut mutexes| async move {
                    let held = Box::pin(self.extend_leases(&mut mutexes)).await;
                    (mutexes, held)
                },
                |mut shared| async move {
                    let held = {
                        let mut refs: Vec<&mut Lease> = shared.iter_mut().collect();
                        self.extend_shared(&mut refs).await
                    };
                    (shared, held)
                },
            )
            .await;
        }
        let owners: Vec<String> = leases.iter().map(|l| l.owner().to_string()).collect();
        let batch: Vec<Renewal<'_>> = leases
            .iter()
            .zip(&owners)
            .map(|(lease, owner)| Renewal {
                name: lease.name().as_bytes(),
                owner,
                ttl_us: micros_up(lease.ttl().unwrap_or_default()),
            })
            .collect();
        let sql = self.inner.sql.extend_many(&batch);
        let sent = Instant::now();
        let rows = self.fetch(sql, "extend", self.deadline()).await?;
        let extended = extended_rows(rows.iter())?;
        let mut held = Vec::with_capacity(leases.len());
        for (lease, owner) in leases.iter_mut().zip(owners) {
            let ours = extended.contains(&(lease.name().as_bytes().to_vec(), owner));
            if ours {
                lease.extended(sent);
            }
            held.push(ours);
        }
        Ok(held)
    }
}

/// The (name, owner) pairs of an extension's rows: `encode(name, 'hex')`
/// and the owner.
pub(crate) fn extended_rows<'a>(
    rows: impl Iterator<Item = &'a PgRow>,
) -> Result<HashSet<(Vec<u8>, String)>> {
    let mut extended = HashSet::new();
    for row in rows {
        let name: String = row
            .try_get(0)
            .map_err(|e| Error::backend(NAME, "extend", e))?;
        let owner: String = row
            .try_get(1)
            .map_err(|e| Error::backend(NAME, "extend", e))?;
        let name = unhex(&name).ok_or_else(|| Error::malformed(NAME, "extend", &name))?;
        extended.insert((name, owner));
    }
    Ok(extended)
}
