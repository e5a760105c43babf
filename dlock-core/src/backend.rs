use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::{Lease, LockInfo, LockOptions, LockPage, NameWatch, Result};

/// How a backend's leases end when their holder goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseKind {
    /// The server frees the lock when the TTL passes without an extension
    /// (Redis, MySQL, memory).
    Ttl,
    /// The lock lives as long as the client's session (ZooKeeper); extend
    /// is a no-op and the TTL option is ignored.
    Session,
}

/// What a backend can do, declared by the driver and checked by the
/// conformance suite before each case that needs it.
///
/// Drivers start from [`Capabilities::new`] and switch on what they have,
/// so that a capability added in a later release is off for a driver that
/// does not know it:
///
/// ```
/// use dlock_core::{Capabilities, LeaseKind};
/// let mut caps = Capabilities::new(LeaseKind::Ttl);
/// caps.fencing = true;
/// caps.distributed = true;
/// assert!(!caps.notify);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// How leases end.
    pub lease: LeaseKind,
    /// Leases carry fencing tokens that strictly increase per name.
    pub fencing: bool,
    /// Fencing tokens keep increasing across a server restart.
    pub fencing_survives_restart: bool,
    /// Waiters are woken by a notification on release rather than by polling.
    pub notify: bool,
    /// Waiters are granted the lock in arrival order.
    pub fifo: bool,
    /// Several processes can share the lock (false for the in-memory driver).
    pub distributed: bool,
    /// An acquire whose outcome is unknown (its reply timed out, or its
    /// future was dropped while the request was in flight) is undone by
    /// owner token at once, so the name is free again within a round trip
    /// or two rather than at the end of the TTL.
    pub cleanup: bool,
    /// [`Backend::release_after`] keeps a released name locked on the
    /// server, by the server's clock, for the time asked, also when the
    /// releasing client goes away.
    pub delayed_release: bool,
    /// [`Backend::extend_many`] extends a whole batch of leases in one
    /// request (or a few), so that the renewal of many held leases costs a
    /// few requests per renewal period rather than one per lease.
    pub batch_extend: bool,
    /// Reader-writer locks ([`Mode::Read`](crate::Mode::Read) and
    /// [`Mode::Write`](crate::Mode::Write)), with
    /// [`Backend::downgrade`]. Without it, acquires in those modes are
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    pub rwlock: bool,
    /// Semaphores ([`Mode::Permit`](crate::Mode::Permit)). Without it,
    /// acquires of permits are [`Error::Unsupported`](crate::Error::Unsupported).
    pub semaphore: bool,
    /// The step the server counts TTLs in (1 ms for most backends; etcd
    /// counts whole seconds, and looks for expired leases twice a second):
    /// the lock of a holder that went silent is freed within its TTL
    /// rounded up to a whole step, plus one step. The lease's validity is
    /// the TTL asked for all the same, so the lock outlives it, never the
    /// reverse.
    pub ttl_resolution: Duration,
    /// The server starts every lease's TTL again when its leader changes
    /// (etcd: the new leader cannot know how long ago the last keep-alive
    /// reached the old one, and extends every lease to its TTL plus an
    /// election timeout). The lock of a holder that went silent is then
    /// freed up to that much later than
    /// [`ttl_resolution`](Self::ttl_resolution) says, after each election:
    /// later, never sooner.
    pub ttl_restarts_on_leader_change: bool,
    /// The server frees a session lease the moment its connection closes
    /// (a link reset on the way, an operator ending the session), which
    /// the holder learns only at its next probe: until then another client
    /// may be granted the lock while the holder still trusts its lease,
    /// and only the fencing token keeps their writes apart (PostgreSQL's
    /// session mode). A link that goes silent instead is covered as for
    /// any session lease: the holder gives up before the server does.
    pub freed_on_disconnect: bool,
}

impl Capabilities {
    /// Leases of kind `lease`, and no other capability.
    pub const fn new(lease: LeaseKind) -> Self {
        Capabilities {
            lease,
            fencing: false,
            fencing_survives_restart: false,
            notify: false,
            fifo: false,
            distributed: false,
            cleanup: false,
            delayed_release: false,
            batch_extend: false,
            rwlock: false,
            semaphore: false,
            ttl_resolution: Duration::from_millis(1),
            ttl_restarts_on_leader_change: false,
            freed_on_disconnect: false,
        }
    }
}

/// The most leases [`Backend::extend_many`] is given at once: small enough
/// for one request and for one script run to stay short on the server, large
/// enough that 10,000 held leases cost ten requests per renewal period.
pub const MAX_BATCH: usize = 1000;

/// The most holds [`Backend::holders`] needs to report for one name.
pub const MAX_HOLDERS: usize = 10_000;

/// A lock service, as it is called. Users normally go through
/// [`Locker`](crate::Locker), which adds guards, renewal and `with_lock`.
///
/// A driver does not implement `Backend`: it implements
/// [`Driver`](crate::driver::Driver), the protocol alone, and core makes it
/// a `Backend` that checks names and options and bounds every call the
/// same way for every driver. Implement `Backend` directly only to wrap
/// another backend (as [`Observed`](crate::Observed) does).
///
/// # Contract
///
/// Every implementation honours these rules, and the `dlock-conformance`
/// suite checks them:
///
/// - **Names**: any string accepted by [`validate_name`](crate::validate_name)
///   is a distinct lock; the driver's mapping to keys, paths or rows is
///   injective. Anything else gives [`Error::InvalidName`](crate::Error::InvalidName)
///   before the server is contacted. Options are checked with
///   [`LockOptions::validate`]. (Core does both for every driver.)
/// - **Mutual exclusion**: at no instant are two unexpired leases of one name
///   granted. TTL backends assume client and server clocks run at the same
///   rate within the drift allowance ([`LockOptions::drift`]).
/// - **Validity**: a lease's deadline is measured from *before* the request
///   was sent, minus the drift allowance.
/// - **Fencing**: if [`Capabilities::fencing`] is set, every later grant of a
///   name carries a strictly greater fencing token, across releases, expiry
///   takeovers and client crashes (and server restarts where
///   [`Capabilities::fencing_survives_restart`] is set).
/// - **Ownership**: [`release`](Backend::release) and
///   [`extend`](Backend::extend) act only on the caller's own grant; on a
///   lease that expired, was released or was taken over they return
///   [`Error::NotHeld`](crate::Error::NotHeld) and leave the current holder
///   untouched.
/// - **A grant is valid when it reaches the caller**: a reply that arrives
///   after the lease's validity deadline is not a grant. It is released
///   (owner-checked, see [`wait::on_arrival`](crate::driver::wait::on_arrival);
///   core does this for every driver) and the attempt counts as "held".
/// - **Waiting**: [`try_acquire`](Backend::try_acquire) makes one attempt.
///   [`acquire`](Backend::acquire) returns within the wait bound, or within
///   the driver's request timeout when that is longer (one attempt always
///   gets its round trip); see [`Deadline::bound`](crate::driver::wait::Deadline::bound).
///   Waiters wake on release by notification where the backend has one,
///   and otherwise poll with jitter; never a busy loop.
/// - **Every call is bounded**, by one bound counted from the call's start,
///   whatever it waits for inside (a free connection, a reconnect, several
///   requests): [`acquire`](Backend::acquire) as above, every other call
///   within the driver's request timeout, except
///   [`release_detached`](Backend::release_detached), whose wait for a
///   turn may last until its `until` first, and
///   [`force_release`](Backend::force_release), whose default makes up to
///   five rounds of [`inspect`](Backend::inspect) and
///   [`release`](Backend::release) (ten request timeouts), and
///   [`extend_many`](Backend::extend_many), one request timeout per
///   [`MAX_BATCH`] leases. (Core cuts a [`Driver`](crate::driver::Driver)'s
///   calls off [`GRACE`](crate::driver::GRACE) later, so that the driver's
///   own bound answers first.) A request that
///   timed out has an unknown outcome, and a driver that declares
///   [`Capabilities::cleanup`] undoes such an acquire by owner token.
/// - **Cancellation**: dropping any future of this trait at any await point
///   leaves no lock held beyond its TTL or session, and no lock held that
///   the caller was not told about beyond that.
/// - **Failures**: a backend that cannot be reached gives an error, never a
///   false grant.
/// - **Kinds of lock** (where [`Capabilities::rwlock`] or
///   [`Capabilities::semaphore`] is set): the options' [`Mode`](crate::Mode)
///   asks for a mutex, a reader's or a writer's hold, or one of N permits,
///   and [`Mode::admits`](crate::Mode::admits) decides each grant against
///   the live holders and the waiters queued ahead: a writer holds alone,
///   readers together and never beside a writer, no new reader while a
///   writer waits, never more than N permits, waiters first come first
///   served. A name is one kind of lock at a time; another kind (or a
///   semaphore of another size) gets
///   [`Error::ModeConflict`](crate::Error::ModeConflict). Every rule above
///   holds for every hold of every kind: leases, ownership, expiry (an
///   expired permit frees its place and cannot be renewed back), fencing
///   across kinds, bounds, cancellation. Drivers without a kind refuse it
///   with [`Error::Unsupported`](crate::Error::Unsupported), never grant it
///   as a mutex.
#[async_trait]
pub trait Backend: Send + Sync + Debug {
    /// What this backend can do.
    fn capabilities(&self) -> Capabilities;

    /// The driver's name (`redis`, `mysql`, ...), as traces, metrics and
    /// errors show it.
    fn driver(&self) -> &'static str {
        "custom"
    }

    /// One attempt: the lease if the lock was free (or its holder's lease had
    /// expired), `None` if it is held.
    async fn try_acquire(&self, name: &str, opts: &LockOptions) -> Result<Option<Lease>>;

    /// Waits for the lock up to the options' wait bound, and returns within
    /// that bound plus one request timeout: the wait looks once more when
    /// the bound comes, and that look gets its answer (see
    /// [`Deadline::cut_off`](crate::driver::wait::Deadline::cut_off)).
    ///
    /// # Errors
    /// [`Error::Timeout`](crate::Error::Timeout) when the bound passes first.
    async fn acquire(&self, name: &str, opts: &LockOptions) -> Result<Lease>;

    /// Gives the lock up, waking waiters.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the lease is no longer the
    /// holder.
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// Gives the lock up as [`release`](Backend::release) does, for a
    /// release no caller waits for: a dropped guard's, or a grant's that
    /// arrived after its deadline. It does not spawn: core calls it from a
    /// task of its own, and again while the server is out of reach, until
    /// `until`. A backend whose connections its callers share first waits
    /// for a turn that keeps such releases to part of them (after a stall,
    /// every guard dropped during it releases at once), until `until` at
    /// the latest ([`Driver::background_turn`](crate::driver::Driver::background_turn));
    /// the release itself then has one request timeout. The default is
    /// [`release`](Backend::release). A backend that wraps another must
    /// forward this call, or the wrapped one's turns are lost.
    ///
    /// # Errors
    /// As [`release`](Backend::release); [`Error::Timeout`](crate::Error::Timeout)
    /// when no turn came by `until`.
    async fn release_detached(&self, lease: &Lease, until: Instant) -> Result<()> {
        let _ = until;
        self.release(lease).await
    }

    /// Restarts the lease's TTL from now and moves its validity deadline.
    /// A no-op for session leases whose session is alive.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the lease is no longer the
    /// holder.
    async fn extend(&self, lease: &mut Lease) -> Result<()>;

    /// Extends each lease as [`Backend::extend`] does, in as few requests as
    /// the backend can; the guards' renewal scheduler calls it with up to
    /// [`MAX_BATCH`] leases at a time. Returns, in order, whether each lease
    /// was still held and is now extended (its deadline moved); `false` is
    /// what `extend` reports as `NotHeld`.
    ///
    /// The default extends one lease after another; drivers that can do
    /// better override it and declare [`Capabilities::batch_extend`].
    ///
    /// # Errors
    /// A failure of the request, or of part of it (one shard of a cluster
    /// down, say): the leases whose deadline the driver moved (with
    /// [`Lease::extended`], only on a confirmed extension) were extended,
    /// the others must not be counted as extended.
    async fn extend_many(&self, leases: &mut [Lease]) -> Result<Vec<bool>> {
        let mut held = Vec::with_capacity(leases.len());
        for lease in leases {
            match self.extend(lease).await {
                Ok(()) => held.push(true),
                Err(crate::Error::NotHeld { .. }) => held.push(false),
                Err(e) => return Err(e),
            }
        }
        Ok(held)
    }

    /// Ends the lease but keeps the name locked for `hold` more, judged by
    /// the server's clock: until then nobody is granted it, and after that
    /// it is free without any further call. The lease's holder must stop
    /// acting on it now (its guard does not renew it). This is what
    /// scheduled jobs need for "lock at least": a run that ended early
    /// keeps other nodes, whose timers fire a little later, from running the
    /// same occurrence again. A `hold` of zero is a plain release.
    ///
    /// The hold outlives the client: a process that exits right after this
    /// call still keeps the name locked until the hold ends.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) if the lease is no longer
    /// the holder (nothing changes then);
    /// [`Error::Unsupported`](crate::Error::Unsupported) from drivers that
    /// do not declare [`Capabilities::delayed_release`] (the default).
    async fn release_after(&self, lease: &Lease, hold: Duration) -> Result<()> {
        let _ = (lease, hold);
        Err(crate::Error::Unsupported {
            backend: self.driver(),
            operation: "release_after",
        })
    }

    /// Takes a read hold of the name of `write`, a live write lease, without
    /// waiting: granted even when writers are queued (they came after the
    /// writer, and the reader continues its work), so a writer can hand its
    /// lock down to a reader without letting anyone write in between. The
    /// write lease stays held until released. `opts` gives the read hold's
    /// TTL.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) if `write` is not a live
    /// write lease; [`Error::Unsupported`](crate::Error::Unsupported) from
    /// drivers that do not declare [`Capabilities::rwlock`] (the default).
    async fn downgrade(&self, write: &Lease, opts: &LockOptions) -> Result<Lease> {
        let _ = (write, opts);
        Err(crate::Error::Unsupported {
            backend: self.driver(),
            operation: "downgrade",
        })
    }

    /// Frees `name` whoever holds it, for operators (a holder known to be
    /// gone or stuck): returns the holder it removed, `None` if the name
    /// was free. A delayed release's hold ends too. The holder is not told
    /// until its next renewal fails (a session lease, which is not renewed,
    /// is not told at all), so two holders may act at once until then;
    /// fencing tokens keep increasing, so fenced resources stay safe.
    ///
    /// The default reads the holder with [`inspect`](Backend::inspect) and
    /// releases with its owner token, which suits drivers whose release
    /// needs nothing else.
    ///
    /// # Errors
    /// The driver's errors.
    async fn force_release(&self, name: &str) -> Result<Option<LockInfo>> {
        crate::validate_name(name)?;
        crate::driver::admin::force_release_with(
            self.driver(),
            name,
            || self.inspect(name),
            || async { Ok(false) },
            |lease| async move { self.release(&lease).await },
        )
        .await
    }

    /// Who holds `name` now, if anyone. For a reader-writer lock or a
    /// semaphore, one of its holds; [`holders`](Backend::holders) gives
    /// them all.
    async fn inspect(&self, name: &str) -> Result<Option<LockInfo>>;

    /// Every live hold of `name`, for operators: the mutex's holder, or
    /// each writer, reader and permit of a reader-writer lock or
    /// semaphore, and a delayed release's hold; empty when the name is
    /// free. Where the driver knows when holds end, the one that lasts
    /// longest comes first. A driver may stop at [`MAX_HOLDERS`], so that
    /// the call stays bounded work for the server.
    ///
    /// The default is what [`inspect`](Backend::inspect) shows, which is
    /// every hold for a driver with only mutexes; drivers with
    /// reader-writer locks or semaphores override it.
    ///
    /// # Errors
    /// The driver's errors.
    async fn holders(&self, name: &str) -> Result<Vec<LockInfo>> {
        Ok(self.inspect(name).await?.into_iter().collect())
    }

    /// The held locks whose names start with `prefix`, a page at a time,
    /// for operators: start with `cursor` `None`, and pass each page's
    /// [`LockPage::next`] to get the next one. A page holds about `limit`
    /// locks (more or fewer where the server pages by its own measure; a
    /// lock may show on two pages when it changes meanwhile), and each page
    /// costs the server a bounded amount of work, so listing is safe on a
    /// large keyspace.
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) from drivers that
    /// cannot list (the default).
    async fn list(&self, prefix: &str, cursor: Option<&str>, limit: usize) -> Result<LockPage> {
        let _ = (prefix, cursor, limit);
        Err(crate::Error::Unsupported {
            backend: self.driver(),
            operation: "list",
        })
    }

    /// A watch on `name`'s holds where the lock service can tell of their
    /// changes (etcd, ZooKeeper): [`Observer`](crate::Observer) reads
    /// again when it fires, instead of only on its timer. `None` (the
    /// default) where it cannot: callers read on a timer.
    ///
    /// # Errors
    /// The driver's errors; callers read on a timer meanwhile.
    async fn watch(&self, name: &str) -> Result<Option<Box<dyn NameWatch>>> {
        let _ = name;
        Ok(None)
    }
}
