//! Extending leases: one, or a whole renewal batch in one statement.

use std::collections::HashSet;

use dlock_core::{Error, Lease, Mode, Result, micros_up};
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
                _ => Err(Error::NotHeld {
                    name: lease.name().to_owned(),
                }),
            };
        }
        let sent = Instant::now();
        let ttl = micros_up(lease.ttl().unwrap_or_default());
        let owner = lease.owner().to_string();
        let sql = self.inner.sql.extend(lease.name().as_bytes(), &owner, ttl);
        self.own_row(sql, lease, "extend").await?;
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
            return self.extend_mixed(leases).await;
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

    /// A batch with shared holds in it: the mutexes' leases by their
    /// statement, the shared ones by theirs, both at once.
    async fn extend_mixed(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let (shared_at, mutex_at): (Vec<usize>, Vec<usize>) =
            (0..leases.len()).partition(|&i| leases[i].mode() != Mode::Exclusive);
        let mut mutexes: Vec<Lease> = mutex_at.iter().map(|&i| leases[i].clone()).collect();
        let mut shared: Vec<Lease> = shared_at.iter().map(|&i| leases[i].clone()).collect();
        let (mutex_held, shared_held) = tokio::join!(
            async {
                if mutexes.is_empty() {
                    Ok(Vec::new())
                } else {
                    Box::pin(self.extend_leases(&mut mutexes)).await
                }
            },
            async {
                let mut refs: Vec<&mut Lease> = shared.iter_mut().collect();
                self.extend_shared(&mut refs).await
            },
        );
        // The copies carry the moved deadlines of what was extended.
        for (&i, lease) in mutex_at.iter().zip(mutexes) {
            leases[i] = lease;
        }
        for (&i, lease) in shared_at.iter().zip(shared) {
            leases[i] = lease;
        }
        let mut held = vec![false; leases.len()];
        for (&i, h) in mutex_at.iter().zip(mutex_held?) {
            held[i] = h;
        }
        for (&i, h) in shared_at.iter().zip(shared_held?) {
            held[i] = h;
        }
        Ok(held)
    }

    /// Runs a statement that changes the caller's own live row (an
    /// extension, a hold); "not held" unless it matched one.
    pub(crate) async fn own_row(
        &self,
        sql: sqlx::SqlStr,
        lease: &Lease,
        doing: &str,
    ) -> Result<()> {
        if self
            .execute(sql, doing, self.deadline())
            .await?
            .rows_affected()
            == 1
        {
            Ok(())
        } else {
            Err(Error::NotHeld {
                name: lease.name().to_owned(),
            })
        }
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
