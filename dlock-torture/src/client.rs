//! One client process of the workload: several tasks contending on the
//! run's names with every kind of hold, each critical section writing to
//! the fenced resource twice, and a history of everything.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dlock::{Backend, Guard, Lease, LockOptions, Locker};
use tokio::time::sleep;

use crate::history::{Kind, PERMITS, Recorder, What, instant_ns, now_ns};
use crate::mutant::{Broken, Mutant};
use crate::resource::Writer;

/// The client's settings, passed on its command line by the campaign.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// The driver: a backend's label, or a control's mutant.
    #[arg(long)]
    pub driver: String,
    /// Where its server is (through the client's own fault proxy).
    #[arg(long)]
    pub url: String,
    /// The fenced resource.
    #[arg(long)]
    pub resource: SocketAddr,
    /// This process's id, unique over the run.
    #[arg(long)]
    pub client: u32,
    /// Tasks contending in this process.
    #[arg(long)]
    pub tasks: u32,
    /// Names contended on.
    #[arg(long)]
    pub names: u32,
    /// Lease TTL, milliseconds.
    #[arg(long)]
    pub ttl_ms: u64,
    /// Lock-delay, milliseconds (0: none; not on session backends).
    #[arg(long, default_value_t = 0)]
    pub lock_delay_ms: u64,
    /// Stop starting holds at this `CLOCK_MONOTONIC` time (ns).
    #[arg(long)]
    pub until_ns: u64,
    /// Seed of this process's choices.
    #[arg(long)]
    pub seed: u64,
    /// Where to write the history.
    #[arg(long)]
    pub history: PathBuf,
    /// Hold every lock for up to a TTL (renewed), not 0–20 ms.
    #[arg(long)]
    pub long_holds: bool,
}

/// How long an acquire may wait for a held name.
pub const WAIT: Duration = Duration::from_secs(3);

/// The lock name of name index `i`.
pub fn lock_name(i: u32) -> String {
    format!("torture:{i}")
}

/// The kind of hold name `i` is used as: mutexes, reader-writer locks and
/// semaphores in turn (a name is never used as two kinds, which the drivers
/// refuse).
pub fn name_kinds(i: u32) -> &'static [Kind] {
    match i % 3 {
        0 => &[Kind::Mutex],
        1 => &[Kind::Read, Kind::Read, Kind::Write],
        _ => &[Kind::Permit],
    }
}

/// Runs the client until `until_ns`, then releases and exits.
pub async fn run(args: ClientArgs) -> Result<(), String> {
    // The campaign's death must not leave workers behind.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    let recorder = Arc::new(
        Recorder::create(&args.history, args.client).map_err(|e| format!("history: {e}"))?,
    );
    let backend = loop {
        match connect(&args.driver, &args.url, args.seed).await {
            Ok(backend) => break backend,
            // The nemesis may have the server down right now.
            Err(_) if now_ns() < args.until_ns => sleep(Duration::from_millis(200)).await,
            Err(e) => return Err(format!("connect: {e}")),
        }
    };
    let locker = Locker::from_arc(backend);
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..args.tasks {
        let seed = args.seed ^ (u64::from(args.client) << 32) ^ u64::from(task);
        let worker = Worker {
            args: args.clone(),
            locker: locker.clone(),
            recorder: recorder.clone(),
            task,
            rng: fastrand::Rng::with_seed(seed),
            holds: 0,
        };
        tasks.spawn(worker.run());
    }
    while tasks.join_next().await.is_some() {}
    // A guard dropped in a task's last hold releases in the background:
    // give that release its request timeout before the runtime ends.
    sleep(Duration::from_secs(2)).await;
    Ok(())
}

/// A client of `driver` at `url`, as every process of the run makes it.
pub async fn connect(driver: &str, url: &str, seed: u64) -> Result<Arc<dyn Backend>, dlock::Error> {
    Ok(match driver {
        "redis" => Arc::new(
            dlock::redis::RedisBackend::builder(url)
                .request_timeout(Duration::from_secs(1))
                .connect()
                .await?,
        ),
        "mysql" => Arc::new(
            dlock::mysql::MySqlBackend::builder(url)
                .wake_ups(true)
                .connect()
                .await?,
        ),
        "postgres" => Arc::new(
            dlock::postgres::PgBackend::builder(url)
                .wake_ups(true)
                .connect()
                .await?,
        ),
        "zookeeper" => Arc::new(
            dlock::zk::ZkBackend::builder(url)
                .session_timeout(crate::target::ZK_SESSION)
                .connect()
                .await?,
        ),
        "etcd" => Arc::new(dlock::etcd::EtcdBackend::builder(url).connect().await?),
        "sim-split-brain" => Arc::new(Mutant::new(Broken::SplitBrain, seed)),
        "sim-stale-token" => Arc::new(Mutant::new(Broken::StaleToken, seed)),
        other => {
            return Err(dlock::Error::invalid_option(
                "driver",
                format!("unknown driver {other}"),
            ));
        }
    })
}

/// An error with its sources, for the report.
fn chain(e: &dlock::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// How a critical section ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Release,
    /// Drop the guard: it releases in the background.
    Drop,
    /// Leave the lease to expire (no renewal, no release).
    Abandon,
}

struct Worker {
    args: ClientArgs,
    locker: Locker,
    recorder: Arc<Recorder>,
    task: u32,
    rng: fastrand::Rng,
    /// Holds so far: with the task, each write names its hold.
    holds: u32,
}

impl Worker {
    async fn run(mut self) {
        let mut writer = None;
        while now_ns() < self.args.until_ns {
            if writer.is_none() {
                writer = Writer::connect(self.args.resource).await.ok();
            }
            let Some(w) = writer.as_mut() else {
                sleep(Duration::from_millis(100)).await;
                continue;
            };
            if !self.one_hold(w).await {
                writer = None;
            }
        }
    }

    fn record(&self, name: u32, what: What) {
        self.recorder.record(self.task, name, what);
    }

    /// Looks at the hold as its user would before acting, and records what
    /// it saw: whether it is valid, and until when as last renewed.
    fn look(&self, name: u32, held: &Held) -> bool {
        let valid = held.is_valid();
        let valid_until = held.valid_until();
        self.record(name, What::Checked { valid, valid_until });
        valid
    }

    /// One acquire and critical section; `false` when the resource
    /// connection broke.
    async fn one_hold(&mut self, writer: &mut Writer) -> bool {
        let name = self.rng.u32(0..self.args.names);
        let kinds = name_kinds(name);
        let kind = kinds[self.rng.usize(0..kinds.len())];
        let end = match self.rng.u32(0..100) {
            0..85 => End::Release,
            85..93 => End::Drop,
            _ => End::Abandon,
        };
        let ttl = Duration::from_millis(self.args.ttl_ms);
        let mut opts = LockOptions::new()
            .ttl(ttl)
            .wait(WAIT)
            .renew(end != End::Abandon);
        if self.args.lock_delay_ms > 0
            && self.locker.backend().capabilities().lease == dlock::LeaseKind::Ttl
        {
            opts = opts.lock_delay(Duration::from_millis(self.args.lock_delay_ms));
        }
        let opts = match kind {
            Kind::Mutex => opts,
            Kind::Read => opts.read(),
            Kind::Write => opts.write(),
            Kind::Permit => opts.permits(PERMITS),
        };
        self.holds = self.holds.wrapping_add(1);
        self.record(name, What::Invoke { kind });
        let lock = lock_name(name);
        let held = if end == End::Abandon {
            // A bare lease: nothing renews it, nothing releases it.
            self.locker
                .backend()
                .acquire(&lock, &opts)
                .await
                .map(Held::Lease)
        } else {
            self.locker.acquire(&lock, &opts).await.map(Held::Guard)
        };
        let held = match held {
            Ok(held) => held,
            Err(e) => {
                self.record(
                    name,
                    What::Failed {
                        error: chain(&e),
                        unexpected: !e.is_retryable(),
                    },
                );
                // A down server answers at once; do not spin on it.
                sleep(Duration::from_millis(50)).await;
                return true;
            }
        };
        self.record(
            name,
            What::Granted {
                kind,
                token: held.token(),
                valid_until: held.valid_until(),
            },
        );
        let ok = self.critical_section(name, kind, &held, writer).await;
        // The deadline as last renewed, for the checker: belief ends at
        // the first of it and what follows.
        self.look(name, &held);
        match (end, held) {
            (End::Release, Held::Guard(guard)) => {
                self.record(name, What::Release);
                let done = guard.release().await;
                self.record(name, What::Released { ok: done.is_ok() });
            }
            (_, Held::Guard(guard)) => {
                self.record(name, What::Dropped);
                drop(guard);
            }
            (_, Held::Lease(lease)) if lease.valid_until().is_some() => {
                self.record(name, What::Abandoned);
            }
            // A session lease would live as long as the process: released.
            (_, Held::Lease(lease)) => {
                self.record(name, What::Release);
                let done = self.locker.backend().release(&lease).await;
                self.record(name, What::Released { ok: done.is_ok() });
            }
        }
        ok
    }

    /// Writes, waits 0–20 ms (now and then past the TTL, so that renewal
    /// matters), writes again; stops writing once the lease is lost. A bare
    /// lease's holder is now and then late: it looks, then writes after its
    /// lease ended, as a holder paused between its check and its write
    /// would, and fencing must refuse the write once another holder wrote.
    async fn critical_section(
        &mut self,
        name: u32,
        kind: Kind,
        held: &Held,
        writer: &mut Writer,
    ) -> bool {
        for round in 0..2 {
            if round == 1 {
                let pause = if self.args.long_holds || self.rng.u32(0..50) == 0 {
                    self.rng.u64(0..self.args.ttl_ms * 3 / 2)
                } else {
                    self.rng.u64(0..=20)
                };
                tokio::select! {
                    () = held.lost() => {
                        self.look(name, held);
                        self.record(name, What::Lost);
                        return true;
                    }
                    () = sleep(Duration::from_millis(pause)) => {}
                }
            }
            let valid = self.look(name, held);
            if !valid {
                self.record(name, What::Lost);
                return true;
            }
            // Late only where the lease ends by itself: a session lease
            // lives on while the process does.
            let late = round == 1
                && matches!(held, Held::Lease(l) if l.valid_until().is_some())
                && self.rng.bool();
            if late {
                let after = self.args.ttl_ms + self.rng.u64(0..1000);
                sleep(Duration::from_millis(after)).await;
            }
            let hold = (u64::from(self.task) << 32) | u64::from(self.holds);
            let sent = writer
                .write(
                    name,
                    held.token(),
                    kind.exclusive(),
                    (self.args.client, hold),
                    (valid, late),
                )
                .await;
            if sent.is_err() {
                return false;
            }
        }
        true
    }
}

/// A grant, as a guard (renewed, released) or a bare lease (left to expire).
enum Held {
    Guard(Guard),
    Lease(Lease),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::Guard(g) => g.fencing_token(),
            Held::Lease(l) => l.fencing_token(),
        }
    }

    fn valid_until(&self) -> Option<u64> {
        let until = match self {
            Held::Guard(g) => g.valid_until(),
            Held::Lease(l) => l.valid_until(),
        };
        until.map(|t| instant_ns(t.into_std()))
    }

    fn is_valid(&self) -> bool {
        match self {
            Held::Guard(g) => g.is_valid(),
            Held::Lease(l) => l.is_valid(),
        }
    }

    async fn lost(&self) {
        match self {
            Held::Guard(g) => g.lost().await,
            Held::Lease(l) => match l.valid_until() {
                Some(until) => {
                    tokio::select! {
                        () = l.lost_token().cancelled() => {}
                        () = tokio::time::sleep_until(until) => {}
                    }
                }
                None => l.lost_token().cancelled().await,
            },
        }
    }
}
