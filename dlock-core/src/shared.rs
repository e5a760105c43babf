//! Reader-writer locks and semaphores on a [`Locker`]: the handles, the
//! capability check, and the refusal of what would wait for itself (a read
//! → write upgrade, a task locking a name it holds).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::{Error, Guard, Lease, LeaseKind, LockOptions, Locker, Mode, Result};

/// Who took a hold, its name, and whether it excludes every other hold (a
/// mutex, a write lock) or is a read hold.
type HoldKey = (Taker, String, bool);

/// A tokio task, or, for code outside any task (a runtime's `block_on`,
/// `#[tokio::main]`'s body), the thread it runs on: two threads' `block_on`
/// sharing a locker are two takers, each waiting for the other as usual.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Taker {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Taker {
    fn current() -> Self {
        tokio::task::try_id()
            .map_or_else(|| Taker::Thread(std::thread::current().id()), Taker::Task)
    }
}

/// How many holds the tasks of a locker (and its clones) took per name,
/// so that a task asking for a name it holds in a way that would make it
/// wait for itself fails at once; other tasks' holds make it wait as usual.
#[derive(Debug, Clone, Default)]
pub(crate) struct Holds(Arc<Mutex<HashMap<HoldKey, usize>>>);

/// One hold counted in [`Holds`], uncounted when dropped.
#[derive(Debug)]
pub(crate) struct HoldMark {
    holds: Holds,
    key: HoldKey,
}

impl Holds {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<HoldKey, usize>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Counts `lease` for the current task; semaphore permits are not
    /// counted (another permit may well be free).
    pub(crate) fn mark(&self, lease: &Lease) -> Option<HoldMark> {
        let exclusive = match lease.mode() {
            Mode::Exclusive | Mode::Write => true,
            Mode::Read => false,
            Mode::Permit(_) => return None,
        };
        let key = (Taker::current(), lease.name().to_owned(), exclusive);
        self.with(|holds| *holds.entry(key.clone()).or_default() += 1);
        Some(HoldMark {
            holds: self.clone(),
            key,
        })
    }

    /// Whether the current task holds `name` exclusively, or for reading.
    fn holds(&self, name: &str, exclusive: bool) -> bool {
        let key = (Taker::current(), name.to_owned(), exclusive);
        self.with(|holds| holds.contains_key(&key))
    }
}

impl Drop for HoldMark {
    fn drop(&mut self) {
        self.holds.with(|holds| {
            if let Some(count) = holds.get_mut(&self.key) {
                *count -= 1;
                if *count == 0 {
                    holds.remove(&self.key);
                }
            }
        });
    }
}

impl Locker {
    /// Refuses what the backend cannot do and, for an acquire that `waits`,
    /// what would wait for itself. (A single attempt at a name the task
    /// holds exclusively finds it held.)
    pub(crate) fn check_mode(&self, name: &str, opts: &LockOptions, waits: bool) -> Result<()> {
        self.check_supported(opts.get_mode(), opts)?;
        match opts.get_mode() {
            Mode::Exclusive | Mode::Read | Mode::Write if waits && self.holds.holds(name, true) => {
                Err(Error::Reentrant {
                    name: name.to_owned(),
                })
            }
            Mode::Write if self.holds.holds(name, false) => Err(Error::Upgrade {
                name: name.to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// Refuses a kind of lock the backend lacks, and a bound on renewal or
    /// a lock-delay where leases live with a session: nothing would end
    /// them, and the server frees a lost session's locks at once.
    fn check_supported(&self, mode: Mode, opts: &LockOptions) -> Result<()> {
        let caps = self.backend.capabilities();
        let unsupported = |operation| Error::Unsupported {
            backend: self.backend.driver(),
            operation,
        };
        if caps.lease == LeaseKind::Session {
            if opts.get_max_hold().is_some() {
                return Err(unsupported("max_hold"));
            }
            if opts.get_lock_delay().is_some_and(|d| !d.is_zero()) {
                return Err(unsupported("lock_delay"));
            }
        }
        match mode {
            Mode::Read | Mode::Write if !caps.rwlock => Err(unsupported("reader-writer lock")),
            Mode::Permit(_) if !caps.semaphore => Err(unsupported("semaphore")),
            _ => Ok(()),
        }
    }

    /// Waits for the read side of `name`'s reader-writer lock: shared with
    /// other readers, never with a writer, and behind any writer already
    /// waiting. `opts`' mode is ignored.
    ///
    /// # Errors
    /// As [`Locker::acquire`].
    pub async fn read(&self, name: &str, opts: &LockOptions) -> Result<Guard> {
        self.acquire(name, &opts.clone().read()).await
    }

    /// Waits for the write side of `name`'s reader-writer lock: held alone.
    /// `opts`' mode is ignored.
    ///
    /// # Errors
    /// As [`Locker::acquire`], including [`Error::Upgrade`] when the
    /// calling task holds `name` for reading through this locker (or a
    /// clone of it): the write would wait for the task's own read.
    pub async fn write(&self, name: &str, opts: &LockOptions) -> Result<Guard> {
        self.acquire(name, &opts.clone().write()).await
    }

    /// One attempt at the read side: `None` while a writer holds or waits.
    ///
    /// # Errors
    /// As [`Locker::acquire`].
    #[must_use = "a guard releases its lock when dropped"]
    pub async fn try_read(&self, name: &str, opts: &LockOptions) -> Result<Option<Guard>> {
        self.try_acquire(name, &opts.clone().read()).await
    }

    /// One attempt at the write side: `None` while anyone holds or waits.
    ///
    /// # Errors
    /// As [`Locker::write`].
    #[must_use = "a guard releases its lock when dropped"]
    pub async fn try_write(&self, name: &str, opts: &LockOptions) -> Result<Option<Guard>> {
        self.try_acquire(name, &opts.clone().write()).await
    }

    /// Takes a read hold while holding `write`, the name's write lock,
    /// without letting a waiting writer in between; then release `write`
    /// to let other readers in (see [`Backend::downgrade`](crate::Backend::downgrade)).
    /// `opts` gives the read hold's TTL and renewal.
    ///
    /// # Errors
    /// [`Error::NotHeld`] if `write` is not a live write hold;
    /// [`Error::Unsupported`] where the backend has no reader-writer locks.
    pub async fn downgrade(&self, write: &Guard, opts: &LockOptions) -> Result<Guard> {
        if write.mode() != Mode::Write {
            return Err(Error::not_held(write.name()));
        }
        // Its own write hold is what a downgrade starts from.
        self.check_supported(Mode::Read, opts)?;
        let lease = self.backend.downgrade(write.lease(), opts).await?;
        Ok(self.guard(lease, opts))
    }

    /// The semaphore of `permits` named `name`: at most `permits` holders
    /// at once, across every process that uses it with the same count.
    pub fn semaphore(&self, name: &str, permits: u32) -> Semaphore {
        Semaphore {
            locker: self.clone(),
            name: name.to_owned(),
            permits,
        }
    }
}

/// A counting semaphore over a [`Locker`]: at most `permits` holders of its
/// name at once, waiters served first come, first served, every permit a
/// lease with renewal, `lost()` and a fencing token.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock_core::Result<()> {
/// use dlock_core::{LockOptions, Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let api = locker.semaphore("partner-api", 2);
/// let a = api.acquire(&LockOptions::new()).await?;
/// let b = api.acquire(&LockOptions::new()).await?;
/// assert!(api.try_acquire(&LockOptions::new()).await?.is_none());
/// a.release().await?;
/// b.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Semaphore {
    locker: Locker,
    name: String,
    permits: u32,
}

impl Semaphore {
    fn opts(&self, opts: &LockOptions) -> LockOptions {
        opts.clone().permits(self.permits)
    }

    /// Waits for a permit up to the options' wait bound (the options' mode
    /// is ignored).
    ///
    /// # Errors
    /// As [`Locker::acquire`]; [`Error::ModeConflict`] when the name is in
    /// use with another number of permits or as another kind of lock.
    pub async fn acquire(&self, opts: &LockOptions) -> Result<Guard> {
        self.locker.acquire(&self.name, &self.opts(opts)).await
    }

    /// One attempt: a permit if one is free and nobody waits ahead.
    ///
    /// # Errors
    /// As [`Semaphore::acquire`].
    #[must_use = "a guard releases its lock when dropped"]
    pub async fn try_acquire(&self, opts: &LockOptions) -> Result<Option<Guard>> {
        self.locker.try_acquire(&self.name, &self.opts(opts)).await
    }

    /// Runs `f` while holding a permit, then releases it; see
    /// [`Locker::with_lock`].
    ///
    /// # Errors
    /// As [`Locker::with_lock`].
    pub async fn with_permit<T>(
        &self,
        opts: &LockOptions,
        f: impl AsyncFnOnce(&Guard) -> T,
    ) -> Result<crate::Finished<T>> {
        self.locker.with_lock(&self.name, &self.opts(opts), f).await
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::MemoryBackend;

    fn quick() -> LockOptions {
        LockOptions::new().wait(Duration::from_secs(30))
    }

    /// Code outside any tokio task (each thread's `block_on`) is told apart
    /// by its thread: a second thread waits for the first one's hold.
    #[test]
    fn block_on_in_two_threads_are_two_takers() {
        let locker = Locker::new(MemoryBackend::new());
        let rt = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let held = rt().block_on(locker.acquire("x", &quick())).unwrap();
        let other = locker.clone();
        let waiter = std::thread::spawn(move || {
            rt().block_on(async {
                let guard = other.acquire("x", &quick()).await?;
                guard.release().await
            })
        });
        // The waiter cannot get it while this thread holds it.
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "{:?}", waiter.join());
        rt().block_on(held.release()).unwrap();
        assert!(waiter.join().unwrap().is_ok());
        let again = rt().block_on(locker.acquire("x", &quick())).unwrap();
        let same_thread = rt().block_on(locker.acquire("x", &quick()));
        assert!(
            matches!(same_thread, Err(Error::Reentrant { .. })),
            "{same_thread:?}"
        );
        drop(again);
    }

    #[tokio::test]
    async fn a_reader_asking_to_write_fails_at_once_instead_of_waiting_for_itself() {
        let locker = Locker::new(MemoryBackend::new());
        let reader = locker.read("config", &quick()).await.unwrap();
        let clone = locker.clone();
        let upgrade = tokio::time::timeout(Duration::from_secs(5), clone.write("config", &quick()))
            .await
            .expect("the upgrade waited");
        assert!(matches!(upgrade, Err(Error::Upgrade { .. })), "{upgrade:?}");
        // Another task of the same service waits for the reader, as it
        // should: the read is not its own.
        let other = tokio::spawn({
            let locker = locker.clone();
            async move { locker.try_write("config", &LockOptions::new()).await }
        });
        assert!(matches!(other.await.unwrap(), Ok(None)));
        // Another name, and the same name once the read hold is gone, are
        // writable.
        locker
            .write("other", &quick())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        reader.release().await.unwrap();
        locker
            .write("config", &quick())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_downgrade_keeps_the_name_read_locked_after_the_write_lock_ends() {
        let memory = MemoryBackend::new();
        let (locker, elsewhere) = (Locker::new(memory.clone()), Locker::new(memory));
        let writer = locker.write("doc", &quick()).await.unwrap();
        let reader = locker.downgrade(&writer, &quick()).await.unwrap();
        writer.release().await.unwrap();
        assert_eq!(reader.mode(), Mode::Read);
        let write = elsewhere.try_write("doc", &LockOptions::new()).await;
        assert!(matches!(write, Ok(None)), "{write:?}");
        let other = elsewhere.try_read("doc", &LockOptions::new()).await;
        assert!(
            matches!(other, Ok(Some(_))),
            "a second reader was refused: {other:?}"
        );
        // Only a write guard downgrades.
        assert!(matches!(
            locker.downgrade(&reader, &quick()).await,
            Err(Error::NotHeld { .. })
        ));
    }

    #[tokio::test]
    async fn a_semaphore_handle_holds_its_permits() {
        let locker = Locker::new(MemoryBackend::new());
        let pool = locker.semaphore("pool", 2);
        let ran = pool
            .with_permit(&quick(), async |permit| {
                assert_eq!(permit.mode(), Mode::Permit(2));
                7
            })
            .await
            .unwrap();
        assert_eq!(ran.into_result().unwrap(), 7);
        let held = [
            pool.acquire(&quick()).await.unwrap(),
            pool.acquire(&quick()).await.unwrap(),
        ];
        assert!(pool.try_acquire(&quick()).await.unwrap().is_none());
        let bigger = locker.semaphore("pool", 3).try_acquire(&quick()).await;
        assert!(
            matches!(bigger, Err(Error::ModeConflict { .. })),
            "{bigger:?}"
        );
        let zero = locker.semaphore("zero", 0).try_acquire(&quick()).await;
        assert!(
            matches!(
                zero,
                Err(Error::InvalidOption {
                    option: "permits",
                    ..
                })
            ),
            "{zero:?}"
        );
        for permit in held {
            permit.release().await.unwrap();
        }
    }
}
