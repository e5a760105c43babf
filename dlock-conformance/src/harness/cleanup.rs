//! Removing what the harness started: containers and networks at exit
//! (statics are never dropped and testcontainers has no reaper), and what
//! killed runs left behind.

use std::process::Command;
use std::sync::{Mutex, PoisonError};

static CONTAINERS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static NETWORKS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Remembers a network to remove at exit, after the containers.
pub(crate) fn register_network_for_cleanup(name: &str) {
    install_exit_hook();
    NETWORKS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(name.to_owned());
}

/// Remembers a container so that it is removed when the process exits:
/// the shared servers live in statics, which Rust never drops, and
/// testcontainers has no reaper.
pub(crate) fn register_for_cleanup(id: &str) {
    install_exit_hook();
    CONTAINERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(id.to_owned());
}

/// Removes the containers whose `dlock.start` label is `start`: a start
/// that failed after Docker created its container, which testcontainers
/// leaves behind.
pub(crate) fn remove_failed_start(start: &str) {
    let Ok(out) = Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label=dlock.start={start}"))
        .output()
    else {
        return;
    };
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if !ids.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&ids)
            .output();
    }
}

fn install_exit_hook() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        // SAFETY: `remove_containers` is a plain `extern "C" fn` with no
        // arguments, as atexit requires; registering it has no other effect.
        #[allow(unsafe_code)]
        unsafe {
            libc::atexit(remove_containers);
        }
    });
}

/// Removes containers left by test processes that were killed before their
/// exit hook ran: each carries its process id in the `dlock.harness` label.
pub(super) fn remove_stale_containers() {
    if !cfg!(target_os = "linux") {
        return; // no /proc to tell a live process from a dead one
    }
    let Ok(out) = Command::new("docker")
        .args(["ps", "-a", "--filter", "label=dlock.harness"])
        .args(["--format", "{{.ID}} {{.Label \"dlock.harness\"}}"])
        .output()
    else {
        return;
    };
    let stale: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(_, pid)| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        .map(|(id, _)| id.to_owned())
        .collect();
    if !stale.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&stale)
            .output();
    }
    let Ok(out) = Command::new("docker")
        .args(["network", "ls", "--filter", "label=dlock.harness"])
        .args(["--format", "{{.ID}} {{.Label \"dlock.harness\"}}"])
        .output()
    else {
        return;
    };
    for (id, pid) in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
    {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("docker").args(["network", "rm", id]).output();
        }
    }
}

extern "C" fn remove_containers() {
    let ids = std::mem::take(&mut *CONTAINERS.lock().unwrap_or_else(PoisonError::into_inner));
    if !ids.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&ids)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
    let networks = std::mem::take(&mut *NETWORKS.lock().unwrap_or_else(PoisonError::into_inner));
    if !networks.is_empty() {
        let _ = Command::new("docker")
            .args(["network", "rm"])
            .args(&networks)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}
