//! dlock beside etcd's own clients on the same names: `etcdctl lock` (Go's
//! `concurrency.Mutex`) and `etcdctl elect` (`concurrency.Election`), run
//! in the server's container. Each case decides on order: what the Go side
//! saw while it held, and who ran before whom.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::process::Stdio;
use std::time::Duration;

use dlock_conformance::harness::{Service, shared};
use dlock_conformance::support::{must_acquire, unique_name};
use dlock_core::{Backend, Election, LockOptions, Locker};
use dlock_etcd::EtcdBackend;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{Instant, sleep, timeout};

/// The shared server's container and a backend on it.
async fn setup() -> (String, EtcdBackend) {
    let server = shared(Service::Etcd).await;
    let id = server.container().unwrap().id().to_owned();
    (id, EtcdBackend::connect(server.url()).await.unwrap())
}

/// A hold that nobody renews, as long as the test needs.
fn long() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

/// `etcdctl args…` in container `id`, through a shell that prints its
/// process id first (the shell execs etcdctl, which keeps that id), so
/// that the test can interrupt it as a user's Ctrl-C would.
fn etcdctl(id: &str, args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let script = r#"echo $$; exec etcdctl --endpoints=127.0.0.1:2379 "$@""#;
    let mut child = Command::new("docker")
        .args(["exec", id, "sh", "-c", script, "etcdctl"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// `etcdctl lock dlock/<name>`, which runs `etcdctl <command…>` while it
/// holds the lock.
fn lock_then(id: &str, name: &str, command: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let lock = format!("dlock/{name}");
    let mut args = vec!["lock", &lock, "--", "etcdctl", "--endpoints=127.0.0.1:2379"];
    args.extend_from_slice(command);
    etcdctl(id, &args)
}

/// The next line `etcdctl` prints.
async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("etcdctl printed nothing for 30 s")
        .unwrap()
        .expect("etcdctl ended")
}

/// Interrupts the `etcdctl` whose process id is `pid`.
async fn interrupt(id: &str, pid: &str) {
    let out = Command::new("docker")
        .args(["exec", id, "kill", "-INT", pid])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// Waits until `name` has `count` keys (holds and waiters, dlock's and
/// Go's).
async fn until_keys(backend: &EtcdBackend, name: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while backend.keys_for_tests(name).await.unwrap() != count {
        assert!(Instant::now() < deadline, "{name} never had {count} keys");
        sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn etcdctl_lock_waits_for_a_dlock_holder() {
    let (id, backend) = setup().await;
    let name = unique_name("interop-go-waits");
    let held = must_acquire(&backend, &name, &long()).await;
    // Its command lists the lock's keys while etcdctl holds the lock: had
    // it run beside dlock's hold, dlock's key would be among them.
    let prefix = format!("dlock/{name}/");
    let (mut go, mut lines) = lock_then(&id, &name, &["get", "--prefix", "--keys-only", &prefix]);
    next_line(&mut lines).await;
    until_keys(&backend, &name, 2).await;
    assert!(go.try_wait().unwrap().is_none(), "etcdctl did not wait");
    backend.release(&held).await.unwrap();
    let mut seen = Vec::new();
    while let Some(line) = timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap()
        .unwrap()
    {
        if !line.is_empty() {
            seen.push(line);
        }
    }
    assert!(go.wait().await.unwrap().success());
    assert_eq!(seen.len(), 1, "etcdctl held beside dlock: {seen:?}");
    assert!(seen[0].starts_with(&prefix), "{seen:?}");
}

#[tokio::test]
async fn dlock_waits_for_an_etcdctl_holder_then_the_next_in_line_in_order() {
    let (id, backend) = setup().await;
    let name = unique_name("interop-dlock-waits");
    let (mut go, mut lines) = etcdctl(&id, &["lock", &format!("dlock/{name}")]);
    let pid = next_line(&mut lines).await;
    // etcdctl prints its key once it holds the lock.
    let key = next_line(&mut lines).await;
    assert!(key.starts_with(&format!("dlock/{name}/")), "{key}");
    assert!(backend.try_acquire(&name, &long()).await.unwrap().is_none());
    let first = tokio::spawn({
        let (backend, name) = (backend.clone(), name.clone());
        async move {
            let lease = backend
                .acquire(&name, &long().wait(Duration::from_secs(60)))
                .await;
            (lease, Instant::now())
        }
    });
    until_keys(&backend, &name, 2).await;
    // A second etcdctl queues behind dlock's waiter: served after it.
    let marker = format!("dlock-interop/{name}");
    let (mut second, _its_output) = lock_then(&id, &name, &["put", &marker, "second"]);
    until_keys(&backend, &name, 3).await;
    interrupt(&id, &pid).await;
    assert!(go.wait().await.unwrap().success());
    let (lease, _) = timeout(Duration::from_secs(60), first)
        .await
        .unwrap()
        .unwrap();
    let lease = lease.unwrap();
    // The second etcdctl waits behind dlock's hold: its command has not run.
    let read = Command::new("docker")
        .args(["exec", &id, "etcdctl", "--endpoints=127.0.0.1:2379"])
        .args(["get", "--print-value-only", &marker])
        .output()
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&read.stdout).trim(), "");
    let early = second.try_wait().unwrap();
    assert!(early.is_none(), "the second etcdctl ended: {early:?}");
    backend.release(&lease).await.unwrap();
    assert!(
        timeout(Duration::from_secs(30), second.wait())
            .await
            .unwrap()
            .unwrap()
            .success()
    );
}

#[tokio::test]
async fn etcdctl_elect_and_dlock_elections_see_each_others_leader() {
    let (id, backend) = setup().await;
    let name = unique_name("interop-elect");
    let locker = Locker::new(backend.clone());
    let election = Election::new(locker, name.clone(), "dlock-node:8080");
    let term = election.campaign().await.unwrap();
    // `elect --listen` prints the leader's key, then its value.
    let (_listen, mut lines) = etcdctl(&id, &["elect", "--listen", &format!("dlock/{name}")]);
    next_line(&mut lines).await;
    let key = next_line(&mut lines).await;
    assert!(key.starts_with(&format!("dlock/{name}/")), "{key}");
    assert_eq!(next_line(&mut lines).await, "dlock-node:8080");
    // A Go candidate waits behind dlock's term, and leads once it ends.
    let (mut go, mut campaign) = etcdctl(&id, &["elect", &format!("dlock/{name}"), "go-node:9090"]);
    let pid = next_line(&mut campaign).await;
    until_keys(&backend, &name, 2).await;
    term.resign().await.unwrap();
    next_line(&mut campaign).await;
    assert_eq!(next_line(&mut campaign).await, "go-node:9090");
    let leader = election.leader().await.unwrap().expect("a leader");
    assert_eq!(leader.identity.as_deref(), Some("go-node:9090"));
    interrupt(&id, &pid).await;
    assert!(go.wait().await.unwrap().success());
}
