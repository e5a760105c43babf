//! dlock and kazoo (Python) on the same lock: each side sees the other's
//! holder, in both directions, with the real kazoo client from PyPI against
//! the container ZooKeeper. kazoo is installed into the test's scratch
//! folder on first use; the test fails, never skips, when it cannot be.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use dlock_conformance::harness::{Service, shared};
use dlock_conformance::support::{must_acquire, unique_name};
use dlock_core::{Backend, Error, LockOptions};
use dlock_zk::ZkBackend;

const KAZOO: &str = "kazoo==2.11.0";

/// A kazoo `Lock`, `ReadLock` or `WriteLock` driven line by line: `try`
/// answers `acquired` or `held`, `release` answers `released`.
const DRIVER: &str = r#"
import sys
from kazoo.client import KazooClient
from kazoo.recipe import lock as recipes
hosts, path, recipe, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
zk = KazooClient(hosts=hosts)
zk.start(timeout=15)
lock = getattr(recipes, recipe)(zk, path, extra_lock_patterns=extra)
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "try":
        print("acquired" if lock.acquire(blocking=False) else "held", flush=True)
    elif cmd == "release":
        lock.release()
        print("released", flush=True)
zk.stop()
"#;

/// Where kazoo is installed for the tests, installing it if need be: once
/// per test process (the tests run at once, and two pip runs into one
/// folder fail), into a folder of its own that is then moved into place,
/// so that an install cut short leaves nothing half there.
fn kazoo_path() -> PathBuf {
    static INSTALLED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(install_kazoo).clone()
}

fn install_kazoo() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kazoo-2.11.0");
    let present = Command::new("python3")
        .args(["-c", "import kazoo"])
        .env("PYTHONPATH", &dir)
        // Missing before its first install: no traceback in the log.
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        return dir;
    }
    let fresh = dir.with_extension(format!("installing-{}", std::process::id()));
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg("--target")
        .arg(&fresh)
        .arg(KAZOO)
        .output()
        .unwrap_or_else(|e| panic!("this test needs python3 with pip to install {KAZOO}: {e}"));
    assert!(
        out.status.success(),
        "installing {KAZOO} with pip failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&fresh, &dir).expect("move kazoo into place");
    dir
}

struct Kazoo {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Kazoo {
    fn start(hosts: &str, path: &str, recipe: &str, extra_patterns: &[&str]) -> Self {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(DRIVER)
            .arg(hosts)
            .arg(path)
            .arg(recipe)
            .args(extra_patterns)
            .env("PYTHONPATH", kazoo_path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut kazoo = Kazoo {
            child,
            stdin,
            stdout,
        };
        assert_eq!(kazoo.read(), "ready");
        kazoo
    }

    fn read(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.read()
    }
}

impl Drop for Kazoo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a blocking kazoo exchange off the async runtime.
async fn with_kazoo<T: Send + 'static>(
    kazoo: Kazoo,
    f: impl FnOnce(&mut Kazoo) -> T + Send + 'static,
) -> (Kazoo, T) {
    tokio::task::spawn_blocking(move || {
        let mut kazoo = kazoo;
        let out = f(&mut kazoo);
        (kazoo, out)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_and_kazoo_respect_each_others_holders() {
    // Runs a Python client beside the server: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let hosts = shared(Service::ZooKeeper).await.url().to_owned();
    let dlock = ZkBackend::connect(&hosts).await.unwrap();
    let name = unique_name("kazoo");
    // The name needs no escaping, so kazoo's path is dlock's lock folder.
    let path = format!("/dlock/{name}");
    let opts = LockOptions::new();
    let start = |extra: &'static [&'static str]| {
        let (hosts, path) = (hosts.clone(), path.clone());
        tokio::task::spawn_blocking(move || Kazoo::start(&hosts, &path, "Lock", extra))
    };

    // kazoo holds: dlock sees its `__lock__` node ahead in the queue.
    let kazoo = start(&["-lock-"]).await.unwrap();
    let (kazoo, said) = with_kazoo(kazoo, |k| k.ask("try")).await;
    assert_eq!(said, "acquired");
    assert!(
        dlock.try_acquire(&name, &opts).await.unwrap().is_none(),
        "dlock took a lock that kazoo holds"
    );
    let (kazoo, said) = with_kazoo(kazoo, |k| k.ask("release")).await;
    assert_eq!(said, "released");
    // Free once kazoo released it.
    let lease = must_acquire(&dlock, &name, &opts).await;

    // dlock holds: kazoo with `extra_lock_patterns=["-lock-"]` sees it.
    let (kazoo, said) = with_kazoo(kazoo, |k| k.ask("try")).await;
    assert_eq!(said, "held", "kazoo took a lock that dlock holds");
    // Without that setting kazoo ignores dlock's nodes: the README's warning.
    let blind = start(&[]).await.unwrap();
    let (blind, said) = with_kazoo(blind, |k| k.ask("try")).await;
    assert_eq!(
        said, "acquired",
        "kazoo's default is expected to ignore dlock"
    );
    let (blind, _) = with_kazoo(blind, |k| k.ask("release")).await;
    drop(blind);

    dlock.release(&lease).await.unwrap();
    let (kazoo, said) = with_kazoo(kazoo, |k| k.ask("try")).await;
    assert_eq!(said, "acquired", "free once dlock released it");
    let (kazoo, said) = with_kazoo(kazoo, |k| k.ask("release")).await;
    assert_eq!(said, "released");
    drop(kazoo);
}

/// Reader-writer locks: kazoo's `ReadLock` and `WriteLock` (told of
/// Curator's node names, which dlock writes: a reader of the write nodes,
/// a writer of both) and dlock's share and exclude as one reader-writer
/// lock, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_and_kazoo_share_one_reader_writer_lock() {
    // Runs a Python client beside the server: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let hosts = shared(Service::ZooKeeper).await.url().to_owned();
    let dlock = ZkBackend::connect(&hosts).await.unwrap();
    let name = unique_name("kazoo-rw");
    let path = format!("/dlock/{name}");
    let start = |recipe: &'static str, patterns: &'static [&'static str]| {
        let (hosts, path) = (hosts.clone(), path.clone());
        tokio::task::spawn_blocking(move || Kazoo::start(&hosts, &path, recipe, patterns))
    };
    let (read, write) = (LockOptions::new().read(), LockOptions::new().write());
    let (kazoo_reader, kazoo_writer) = (
        start("ReadLock", &["__WRIT__"]).await.unwrap(),
        start("WriteLock", &["__WRIT__", "__READ__"]).await.unwrap(),
    );

    // dlock reads first: kazoo reads beside it.
    let reader = must_acquire(&dlock, &name, &read).await;
    let (kazoo_reader, said) = with_kazoo(kazoo_reader, |k| k.ask("try")).await;
    assert_eq!(said, "acquired", "kazoo could not read beside dlock");
    let (kazoo_reader, said) = with_kazoo(kazoo_reader, |k| k.ask("release")).await;
    assert_eq!(said, "released");
    dlock.release(&reader).await.unwrap();

    // kazoo reads: dlock reads beside it, and cannot write.
    let (kazoo_reader, said) = with_kazoo(kazoo_reader, |k| k.ask("try")).await;
    assert_eq!(said, "acquired");
    let reader = must_acquire(&dlock, &name, &read).await;
    assert!(
        dlock.try_acquire(&name, &write).await.unwrap().is_none(),
        "dlock wrote while kazoo read"
    );
    // Both read: a kazoo writer waits for them.
    let (kazoo_writer, said) = with_kazoo(kazoo_writer, |k| k.ask("try")).await;
    assert_eq!(said, "held", "kazoo wrote while dlock and kazoo read");
    let (kazoo_reader, said) = with_kazoo(kazoo_reader, |k| k.ask("release")).await;
    assert_eq!(said, "released");
    let (kazoo_writer, said) = with_kazoo(kazoo_writer, |k| k.ask("try")).await;
    assert_eq!(said, "held", "kazoo wrote while dlock read");
    dlock.release(&reader).await.unwrap();

    // dlock writes: kazoo can neither read nor write.
    let writer = must_acquire(&dlock, &name, &write).await;
    let (kazoo_reader, said) = with_kazoo(kazoo_reader, |k| k.ask("try")).await;
    assert_eq!(said, "held", "kazoo read while dlock wrote");
    let (kazoo_writer, said) = with_kazoo(kazoo_writer, |k| k.ask("try")).await;
    assert_eq!(said, "held", "kazoo wrote while dlock wrote");
    dlock.release(&writer).await.unwrap();

    // kazoo writes: dlock can neither read nor write.
    let (kazoo_writer, said) = with_kazoo(kazoo_writer, |k| k.ask("try")).await;
    assert_eq!(said, "acquired", "free once dlock released it");
    assert!(
        dlock.try_acquire(&name, &read).await.unwrap().is_none(),
        "dlock read while kazoo wrote"
    );
    assert!(
        dlock.try_acquire(&name, &write).await.unwrap().is_none(),
        "dlock wrote while kazoo wrote"
    );
    let (kazoo_writer, said) = with_kazoo(kazoo_writer, |k| k.ask("release")).await;
    assert_eq!(said, "released");
    let lease = must_acquire(&dlock, &name, &read).await;
    dlock.release(&lease).await.unwrap();

    drop((kazoo_reader, kazoo_writer));
}

/// kazoo's nodes are of whichever kind asks: behind a kazoo reader, a
/// dlock mutex waits (kazoo's node is a mutex to it) and a dlock reader
/// would read (a reader to it). The reader that comes after the waiting
/// mutex meets a conflict instead of sharing with kazoo, so the mutex,
/// once kazoo is gone, never holds beside a reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_node_at_the_front_lets_one_kind_in() {
    // Runs a Python client beside the server: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let hosts = shared(Service::ZooKeeper).await.url().to_owned();
    let dlock = ZkBackend::connect(&hosts).await.unwrap();
    let name = unique_name("kazoo-mixed");
    let path = format!("/dlock/{name}");
    let kazoo = {
        let (hosts, path) = (hosts.clone(), path.clone());
        tokio::task::spawn_blocking(move || Kazoo::start(&hosts, &path, "ReadLock", &[]))
            .await
            .unwrap()
    };
    let (kazoo, said) = with_kazoo(kazoo, |k| k.ask("try")).await;
    assert_eq!(said, "acquired");
    let mutex = {
        let (dlock, name) = (dlock.clone(), name.clone());
        let opts = LockOptions::new().wait(Duration::from_secs(20));
        tokio::spawn(async move { dlock.acquire(&name, &opts).await })
    };
    // The mutex's node is in the queue, behind kazoo's.
    let started = std::time::Instant::now();
    while dlock.client().list_children(&path).await.unwrap().len() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the mutex never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let read = dlock.try_acquire(&name, &LockOptions::new().read()).await;
    assert!(
        matches!(read, Err(Error::ModeConflict { .. })),
        "a reader behind kazoo's and a waiting mutex: {read:?}"
    );
    let (kazoo, said) = with_kazoo(kazoo, |k| k.ask("release")).await;
    assert_eq!(said, "released");
    let mutex = mutex.await.unwrap().unwrap();
    dlock.release(&mutex).await.unwrap();
    drop(kazoo);
}
