//! The wait: a place in the queue, and a watch on the node just ahead.

use std::time::Duration;

use dlock_core::wait::{Backoff, Deadline};
use dlock_core::{Error, Lease, Result};
use tokio::time::sleep;
use zookeeper_client as zk;

use crate::backend::{NAME, ZkBackend};
use crate::error::zk_error;
use crate::hold::hold_path;

impl ZkBackend {
    /// Contends for `name` until `deadline`, again after a dropped
    /// connection: it costs that attempt its node (the server went, or the
    /// session moved to another server of the ensemble), not the caller its
    /// wait.
    pub(crate) async fn wait(&self, name: &str, deadline: Deadline) -> Result<Lease> {
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            match self.contend(name, Some(deadline)).await {
                Ok(Some(lease)) => return Ok(lease),
                Ok(None) => return Err(deadline.timeout_error(name)),
                Err(e) if e.is_retryable() && !deadline.is_past() => {
                    tracing::debug!(name, error = %e, "contending again");
                    sleep(deadline.cap(backoff.next_delay())).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Takes a place in the queue and waits for the front, up to `deadline`
    /// (`None`: one look only). The node is deleted if this ends without a
    /// lease, and also if this future is dropped.
    ///
    /// Not core's `wait_for_lock`, which repeats whole attempts: a waiter
    /// here keeps its place (and so its turn) and sleeps on a watch.
    pub(crate) async fn contend(
        &self,
        name: &str,
        deadline: Option<Deadline>,
    ) -> Result<Option<Lease>> {
        let client = self.client();
        let mut place = self.join(&client, name).await?;
        loop {
            let (queue, hold) = match place.listed.take() {
                // The listing sent with the create: the server answers a
                // session's requests in order, so it holds our node. Read
                // again if it does not, rather than trust it.
                Some(first) if first.0.contains(&place.node) => first,
                _ => self.queue(&client, &place.dir).await?,
            };
            let Some(at) = queue.iter().position(|c| *c == place.node) else {
                // Our node vanished: the session expired under us.
                return Err(Error::connection(
                    NAME,
                    "our lock node disappeared (session expired)",
                    zk::Error::SessionExpired,
                ));
            };
            if at == 0
                && hold
                && let Some(left) = self.hold_left(&client, &place.dir, &place.path).await?
            {
                let Some(deadline) = deadline else {
                    self.leave(place).await;
                    return Ok(None);
                };
                if deadline.is_past() {
                    self.leave(place).await;
                    return Err(deadline.timeout_error(name));
                }
                // Until the hold ends, or its node goes (an operator's
                // forced release).
                let watcher = match self
                    .bounded(client.check_and_watch_stat(&hold_path(&place.dir)))
                    .await
                {
                    Ok((_, watcher)) => watcher,
                    Err(e) => return Err(zk_error(e, "watch the lock's hold")),
                };
                tokio::select! {
                    _ = watcher.changed() => {}
                    () = sleep(deadline.cap(left)) => {}
                }
                continue;
            }
            if at == 0 {
                let lease = self.grant(&client, name, &place)?;
                place.undo.disarm();
                return Ok(Some(lease));
            }
            let Some(deadline) = deadline else {
                // Leave the queue before saying "held", so the next attempt
                // (ours or anyone's) does not queue behind a ghost.
                self.leave(place).await;
                return Ok(None);
            };
            // Watch only the node just ahead of ours: a release wakes one
            // waiter, not the herd.
            let predecessor = format!("{}/{}", place.dir, queue[at - 1]);
            let watcher = match self
                .bounded(client.check_and_watch_stat(&predecessor))
                .await
            {
                Ok((Some(_), watcher)) => watcher,
                Ok((None, _)) => continue,
                Err(e) => return Err(zk_error(e, "watch the lock's predecessor")),
            };
            if !deadline.is_past() {
                tokio::select! {
                    _ = watcher.changed() => continue,
                    () = sleep(deadline.cap(Duration::MAX)) => {}
                }
            }
            self.leave(place).await;
            return Err(deadline.timeout_error(name));
        }
    }
}
