//! Extending leases: one, or a whole renewal batch in one statement.

use std::collections::HashSet;

use dlock_core::driver::micros_up;
use dlock_core::{Error, Lease, Result};
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::time::Instant;

use crate::backend::{NAME, PgBackend};
use crate::sql::{Renewal, unhex};

impl PgBackend {
    /// [`Driver::extend`](dlock_core::driver::Driver::extend) of a mutex.
    pub(crate) async fn extend_mutex(&self, lease: &mut Lease) -> Result<()> {
        let sent = Instant::now();
        let ttl = micros_up(lease.ttl().unwrap_or_default());
        let owner = lease.owner().to_string();
        let sql = self.inner.sql.extend(lease.name().as_bytes(), &owner, ttl);
        self.own_row(sql, lease, "extend").await?;
        lease.extended(sent);
        Ok(())
    }

    /// Extends mutex leases in one statement, whose reply names the rows
    /// it extended.
    pub(crate) async fn extend_mutexes(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        if leases.is_empty() {
            // An empty `VALUES` is no statement.
            return Ok(Vec::new());
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
