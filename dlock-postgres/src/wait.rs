//! Acquire's wait, on core's shared loop: jittered polls, cut short by a
//! release in this process and by the holder's expiry.

use std::time::Duration;

use dlock_core::wait::{Backoff, Deadline, wait_for_lock};
use dlock_core::{Lease, LockOptions, Mode, Result};

use crate::backend::PgBackend;

impl PgBackend {
    /// Acquire's wait for `name` until `deadline`.
    pub(crate) async fn wait(
        &self,
        name: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Lease> {
        if let Some(options) = &self.inner.listen {
            crate::notify::Listener::start(&self.inner, options);
        }
        let max_poll = self.inner.max_poll;
        let backoff = Backoff::new(Duration::from_millis(50).min(max_poll), max_poll);
        if opts.mode_value() != Mode::Exclusive {
            return self.wait_shared(name, opts, deadline, backoff).await;
        }
        wait_for_lock(name, deadline, Some(&self.inner.wakeups), backoff, || {
            self.attempt(name, opts)
        })
        .await
    }
}
