//! Extend: a session lease needs no renewal, so extending only checks
//! that the lease still holds.

use dlock_core::{Lease, Result};
use zookeeper_client as zk;

use crate::backend::ZkBackend;
use crate::error::{not_held, zk_error};

impl ZkBackend {
    /// A session lease holds while its node exists and the session has not
    /// been given up.
    pub(crate) async fn check_held(&self, lease: &Lease) -> Result<()> {
        let path = self.node_of(lease).ok_or_else(|| not_held(lease))?;
        match self.bounded(self.client().check_stat(path)).await {
            Ok(Some(_)) if !lease.lost_token().is_cancelled() => Ok(()),
            Ok(_) | Err(zk::Error::NoNode | zk::Error::SessionExpired) => Err(not_held(lease)),
            Err(e) => Err(zk_error(e, "extend")),
        }
    }
}
