//! The client processes of a run: each started from this binary's own
//! `client` command, behind a fault proxy of its own, and replaced by a
//! new one (a new id) when the nemesis kills it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dlock_conformance::proxy::{Fault, FaultProxy};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::history::now_ns;

/// What every client of the run shares.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The driver's label.
    pub driver: &'static str,
    /// The server's URL (the campaign rewrites it to each client's proxy).
    pub url: String,
    /// The server's address, which the proxies forward to (`None` for an
    /// in-process driver).
    pub upstream: Option<SocketAddr>,
    /// The fenced resource.
    pub resource: SocketAddr,
    /// Tasks per process.
    pub tasks: u32,
    /// Names contended on.
    pub names: u32,
    /// Lease TTL.
    pub ttl: Duration,
    /// Lock-delay (zero: none).
    pub lock_delay: Duration,
    /// When clients stop starting holds (ns).
    pub until_ns: u64,
    /// The run's seed.
    pub seed: u64,
    /// Where histories go.
    pub dir: PathBuf,
    /// Whether holds last up to a TTL.
    pub long_holds: bool,
}

struct Slot {
    id: u32,
    /// `None` while the nemesis replaces it.
    child: Option<Child>,
    proxy: Option<FaultProxy>,
}

/// The run's client processes.
pub struct Clients {
    workload: Workload,
    slots: Mutex<Vec<Slot>>,
    next_id: Mutex<u32>,
    /// Every process started: (id, history file).
    started: Mutex<Vec<(u32, PathBuf)>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Clients {
    /// Starts `processes` clients, each behind a proxy of its own when the
    /// driver has a server.
    pub async fn start(workload: Workload, processes: u32) -> Result<Self, String> {
        let clients = Clients {
            workload,
            slots: Mutex::new(Vec::new()),
            next_id: Mutex::new(0),
            started: Mutex::new(Vec::new()),
        };
        for _ in 0..processes {
            let proxy = match clients.workload.upstream {
                Some(upstream) => Some(
                    FaultProxy::start(upstream)
                        .await
                        .map_err(|e| format!("fault proxy: {e}"))?,
                ),
                None => None,
            };
            let (id, child) = clients.spawn(proxy.as_ref())?;
            lock(&clients.slots).push(Slot {
                id,
                child: Some(child),
                proxy,
            });
        }
        Ok(clients)
    }

    /// How many slots there are.
    pub fn len(&self) -> usize {
        lock(&self.slots).len()
    }

    fn spawn(&self, proxy: Option<&FaultProxy>) -> Result<(u32, Child), String> {
        let w = &self.workload;
        let id = {
            let mut next = lock(&self.next_id);
            *next += 1;
            *next
        };
        let url = match (proxy, w.upstream) {
            (Some(p), Some(up)) => w.url.replace(&up.to_string(), &p.addr().to_string()),
            _ => w.url.clone(),
        };
        let history = w.dir.join(format!("client-{id}.jsonl"));
        let exe = std::env::current_exe().map_err(|e| format!("this binary: {e}"))?;
        let child = Command::new(exe)
            .arg("client")
            .args(["--driver", w.driver, "--url", &url])
            .args(["--resource", &w.resource.to_string()])
            .args(["--client", &id.to_string(), "--tasks", &w.tasks.to_string()])
            .args(["--names", &w.names.to_string()])
            .args(["--ttl-ms", &w.ttl.as_millis().to_string()])
            .args(["--lock-delay-ms", &w.lock_delay.as_millis().to_string()])
            .args(["--until-ns", &w.until_ns.to_string()])
            .args(["--seed", &w.seed.to_string()])
            .arg("--history")
            .arg(&history)
            .args(w.long_holds.then_some("--long-holds"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting a client: {e}"))?;
        lock(&self.started).push((id, history));
        Ok((id, child))
    }

    /// The id of the client in slot `i`.
    pub fn id(&self, i: usize) -> Option<u32> {
        lock(&self.slots).get(i).map(|s| s.id)
    }

    /// Sets the fault of slot `i`'s link.
    pub fn set_link(&self, i: usize, fault: Fault) {
        if let Some(proxy) = lock(&self.slots).get(i).and_then(|s| s.proxy.as_ref()) {
            proxy.set(fault);
        }
    }

    /// Sends `signal` to slot `i`'s process; its id.
    pub fn signal(&self, i: usize, signal: Signal) -> Option<u32> {
        let slots = lock(&self.slots);
        let slot = slots.get(i)?;
        let pid = slot
            .child
            .as_ref()?
            .id()
            .and_then(|p| i32::try_from(p).ok())?;
        kill(Pid::from_raw(pid), signal).ok()?;
        Some(slot.id)
    }

    /// Kills slot `i`'s process (SIGKILL) and, after `pause`, starts a new
    /// client in its place behind the same proxy: the killed id and when.
    pub async fn kill_and_replace(&self, i: usize, pause: Duration) -> Option<(u32, u64)> {
        let (killed, mut child) = {
            let mut slots = lock(&self.slots);
            let slot = slots.get_mut(i)?;
            (slot.id, slot.child.take()?)
        };
        // Its belief ends no later than this.
        let at = now_ns();
        let _ = child.start_kill();
        let _ = child.wait().await;
        tokio::time::sleep(pause).await;
        let mut slots = lock(&self.slots);
        let slot = slots.get_mut(i)?;
        // A failed start leaves the slot empty: the run goes on with fewer
        // clients, and its report shows fewer grants.
        if let Ok((id, child)) = self.spawn(slot.proxy.as_ref()) {
            slot.id = id;
            slot.child = Some(child);
        }
        Some((killed, at))
    }

    /// Waits for every client to exit by itself, until `deadline_ns`; then
    /// kills the rest. The ids killed, and when; and the clients that
    /// exited with an error (their own, not a signal of ours).
    pub async fn finish(&self, deadline_ns: u64) -> (Vec<(u32, u64)>, Vec<String>) {
        let slots: Vec<Slot> = std::mem::take(&mut *lock(&self.slots));
        let mut killed = Vec::new();
        let mut failed = Vec::new();
        for slot in slots {
            let Some(mut child) = slot.child else {
                continue;
            };
            let left = Duration::from_nanos(deadline_ns.saturating_sub(now_ns()));
            match tokio::time::timeout(left, child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(Ok(status)) => failed.push(format!("client {} exited: {status}", slot.id)),
                Ok(Err(e)) => failed.push(format!("client {}: {e}", slot.id)),
                Err(_) => {
                    killed.push((slot.id, now_ns()));
                    let _ = child.start_kill();
                    let _ = child.wait().await;
                }
            }
        }
        (killed, failed)
    }

    /// Every process started, with its history file.
    pub fn histories(&self) -> Vec<(u32, PathBuf)> {
        lock(&self.started).clone()
    }
}
