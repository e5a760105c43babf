//! dlock and Apache Curator (Java) on the same locks, both ways, with
//! mixed queues: Curator 5.4 from the test image's Debian packages, run
//! by `dlock-curator` inside the ZooKeeper container (see
//! `testbed/bin/dlock-curator.java`). One Curator participant per process.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::process::Stdio;
use std::time::Duration;

use dlock_conformance::harness::{Service, shared};
use dlock_conformance::support::{must_acquire, unique_name};
use dlock_core::{Backend, Lease, LockOptions};
use dlock_zk::ZkBackend;
use dlock_zk::zookeeper_client as zk;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::{Instant, sleep, timeout};

/// How long a Curator answer may take: a JVM on a loaded machine.
const ANSWER: Duration = Duration::from_secs(30);

/// One Curator participant: `recipe` is `mutex`, `read`, `write` or
/// `semaphore <permits>`.
struct Curator {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl Curator {
    async fn start(path: &str, recipe: &str) -> Self {
        let server = shared(Service::ZooKeeper).await;
        let container = server
            .container()
            .expect("the Curator tests run Curator inside the harness's ZooKeeper container");
        let mut child = Command::new("docker")
            .args([
                "exec",
                "-i",
                container.id(),
                "dlock-curator",
                "127.0.0.1:2181",
                path,
            ])
            .args(recipe.split(' '))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run docker exec for Curator: {e}"));
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut curator = Curator {
            child,
            stdin,
            stdout,
        };
        assert_eq!(curator.read().await, "ready");
        curator
    }

    async fn read(&mut self) -> String {
        let line = timeout(ANSWER, self.stdout.next_line())
            .await
            .expect("Curator did not answer")
            .unwrap();
        line.unwrap_or_else(|| panic!("Curator exited: {:?}", self.child.try_wait()))
    }

    async fn send(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    async fn ask(&mut self, command: &str) -> String {
        self.send(command).await;
        self.read().await
    }

    /// Whether Curator says anything within `wait` (it should not).
    async fn silent_for(&mut self, wait: Duration) -> bool {
        timeout(wait, self.stdout.next_line()).await.is_err()
    }
}

async fn dlock() -> ZkBackend {
    ZkBackend::connect(shared(Service::ZooKeeper).await.url())
        .await
        .unwrap()
}

/// Waits until the lock folder `dir` has `n` children: a request sent to
/// Curator has queued.
async fn queued(b: &ZkBackend, dir: &str, n: usize) {
    let started = Instant::now();
    loop {
        let children = match b.client().list_children(dir).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => panic!("{e}"),
        };
        if children.len() >= n {
            return;
        }
        assert!(started.elapsed() < ANSWER, "never queued: {children:?}");
        sleep(Duration::from_millis(20)).await;
    }
}

fn spawn_acquire(
    b: &ZkBackend,
    name: &str,
    opts: LockOptions,
) -> tokio::task::JoinHandle<dlock_core::Result<Lease>> {
    let (b, name) = (b.clone(), name.to_owned());
    tokio::spawn(async move { b.acquire(&name, &opts.wait(ANSWER)).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_and_curator_mutexes_exclude_each_other_in_one_fifo_queue() {
    // Runs a JVM beside the server: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let b = dlock().await;
    let name = unique_name("curator-mutex");
    let path = format!("/dlock/{name}");
    let opts = LockOptions::new();
    let mut curator = Curator::start(&path, "mutex").await;

    // Curator holds: dlock sees its node ahead.
    assert_eq!(curator.ask("try").await, "acquired");
    assert!(
        b.try_acquire(&name, &opts).await.unwrap().is_none(),
        "dlock took a lock that Curator holds"
    );
    assert_eq!(curator.ask("release").await, "released");

    // dlock holds; Curator queues, then a dlock waiter behind it: Curator
    // is next, the dlock waiter after it.
    let held = must_acquire(&b, &name, &opts).await;
    assert_eq!(
        curator.ask("try").await,
        "held",
        "Curator took dlock's lock"
    );
    curator.send("acquire").await;
    queued(&b, &path, 2).await;
    let waiter = spawn_acquire(&b, &name, opts.clone());
    queued(&b, &path, 3).await;
    b.release(&held).await.unwrap();
    assert_eq!(curator.read().await, "acquired");
    assert!(!waiter.is_finished(), "dlock's waiter passed Curator's");
    assert_eq!(curator.ask("release").await, "released");
    let next = timeout(ANSWER, waiter).await.unwrap().unwrap().unwrap();
    assert!(next.fencing_token() > held.fencing_token());
    assert_eq!(curator.ask("try").await, "held");
    b.release(&next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_and_curator_share_one_reader_writer_lock() {
    // Runs a JVM beside the server: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let b = dlock().await;
    let name = unique_name("curator-rw");
    let path = format!("/dlock/{name}");
    let (read, write) = (LockOptions::new().read(), LockOptions::new().write());
    let mut curator_reader = Curator::start(&path, "read").await;
    let mut curator_writer = Curator::start(&path, "write").await;

    // Curator reads: dlock reads beside it and cannot write.
    assert_eq!(curator_reader.ask("try").await, "acquired");
    let reader = must_acquire(&b, &name, &read).await;
    assert!(
        b.try_acquire(&name, &write).await.unwrap().is_none(),
        "dlock wrote while Curator read"
    );
    assert_eq!(curator_writer.ask("try").await, "held");
    b.release(&reader).await.unwrap();

    // A dlock writer waits behind Curator's reader, and blocks new readers
    // of both: writers are preferred on either side.
    let writer = spawn_acquire(&b, &name, write.clone());
    queued(&b, &path, 2).await;
    assert!(
        b.try_acquire(&name, &read).await.unwrap().is_none(),
        "a dlock reader passed the waiting writer"
    );
    let mut second_reader = Curator::start(&path, "read").await;
    assert_eq!(
        second_reader.ask("try").await,
        "held",
        "a Curator reader passed dlock's waiting writer"
    );
    assert_eq!(curator_reader.ask("release").await, "released");
    let writer = timeout(ANSWER, writer).await.unwrap().unwrap().unwrap();

    // dlock writes: Curator's writer, then its reader, queue; the writer is
    // let in first, alone.
    curator_writer.send("acquire").await;
    queued(&b, &path, 2).await;
    second_reader.send("acquire").await;
    queued(&b, &path, 3).await;
    b.release(&writer).await.unwrap();
    assert_eq!(curator_writer.read().await, "acquired");
    assert!(
        second_reader.silent_for(Duration::from_millis(500)).await,
        "Curator read beside Curator's writer"
    );
    assert!(b.try_acquire(&name, &read).await.unwrap().is_none());
    assert_eq!(curator_writer.ask("release").await, "released");
    assert_eq!(second_reader.read().await, "acquired");
    let reader = must_acquire(&b, &name, &read).await;
    assert_eq!(second_reader.ask("release").await, "released");
    b.release(&reader).await.unwrap();
}

/// CURATOR-621 across the two: a Curator writer queued behind a dlock
/// writer does not get in when that writer downgrades and lets its write
/// lock go, but when the downgrade's read hold ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_writer_waits_for_a_dlock_downgrade() {
    // Runs a JVM beside the server: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let b = dlock().await;
    let name = unique_name("curator-downgrade");
    let path = format!("/dlock/{name}");
    let write = LockOptions::new().write();
    let held = must_acquire(&b, &name, &write).await;
    let mut curator = Curator::start(&path, "write").await;
    curator.send("acquire").await;
    queued(&b, &path, 2).await;
    let reader = b.downgrade(&held, &LockOptions::new()).await.unwrap();
    b.release(&held).await.unwrap();
    // Curator would answer within milliseconds of the write node's delete
    // if it took the lock then.
    assert!(
        curator.silent_for(Duration::from_secs(2)).await,
        "Curator's writer got in beside dlock's downgraded reader"
    );
    b.release(&reader).await.unwrap();
    assert_eq!(curator.read().await, "acquired");
    assert!(b.try_acquire(&name, &write).await.unwrap().is_none());
    assert_eq!(curator.ask("release").await, "released");
}

/// Curator's `InterProcessSemaphoreV2` and dlock's semaphore on one path
/// share their permits: never more than N between them, and N reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_and_curator_share_one_semaphore() {
    // Runs a JVM beside the server: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let b = dlock().await;
    let name = unique_name("curator-semaphore");
    let path = format!("/dlock/{name}");
    let two = LockOptions::new().permits(2);
    let mut first = Curator::start(&path, "semaphore 2").await;
    let mut second = Curator::start(&path, "semaphore 2").await;

    assert_eq!(first.ask("try").await, "acquired");
    let permit = must_acquire(&b, &name, &two).await;
    let leases = b.client().list_children(&format!("{path}/leases")).await;
    assert_eq!(leases.unwrap().len(), 2, "one lease node per permit");
    assert!(
        b.try_acquire(&name, &two).await.unwrap().is_none(),
        "dlock took a third permit of two"
    );
    assert_eq!(
        second.ask("try").await,
        "held",
        "Curator took a third permit"
    );
    b.release(&permit).await.unwrap();
    assert_eq!(second.ask("try").await, "acquired");

    // Both permits are Curator's: `inspect` shows a holder, and dlock
    // waits at the gate until one is returned.
    assert!(b.inspect(&name).await.unwrap().is_some());
    let waiter = spawn_acquire(&b, &name, two.clone());
    queued(&b, &format!("{path}/locks"), 1).await;
    assert_eq!(first.ask("release").await, "released");
    let permit = timeout(ANSWER, waiter).await.unwrap().unwrap().unwrap();
    assert_eq!(first.ask("try").await, "held");
    b.release(&permit).await.unwrap();
    assert_eq!(first.ask("try").await, "acquired");
    assert_eq!(first.ask("release").await, "released");
    assert_eq!(second.ask("release").await, "released");
}

/// Waiters of both take turns in arrival order at Curator's gate (the
/// mutex under `locks/`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_and_curator_semaphore_waiters_queue_in_arrival_order() {
    // Runs a JVM beside the server: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let b = dlock().await;
    let name = unique_name("curator-semaphore-fifo");
    let path = format!("/dlock/{name}");
    let one = LockOptions::new().permits(1);
    let mut holder = Curator::start(&path, "semaphore 1").await;
    let mut later = Curator::start(&path, "semaphore 1").await;
    assert_eq!(holder.ask("try").await, "acquired");
    let gate = format!("{path}/locks");
    let waiter = spawn_acquire(&b, &name, one.clone());
    queued(&b, &gate, 1).await;
    later.send("acquire").await;
    queued(&b, &gate, 2).await;
    assert_eq!(holder.ask("release").await, "released");
    let permit = timeout(ANSWER, waiter).await.unwrap().unwrap().unwrap();
    assert!(
        later.silent_for(Duration::from_millis(500)).await,
        "Curator took a second permit of one"
    );
    b.release(&permit).await.unwrap();
    assert_eq!(later.read().await, "acquired");
    assert!(b.try_acquire(&name, &one).await.unwrap().is_none());
    assert_eq!(later.ask("release").await, "released");
}

/// A permit released with `release_after` stays counted until the hold
/// ends, by Curator too: its hold is a lease node of its own. Its writer
/// is gone by then (so is its timer that deletes the hold): a waiter
/// deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permits_hold_keeps_curator_out_until_it_ends() {
    // Runs a JVM beside the server: the machine is its own.
    let _turn = dlock_conformance::support::alone();
    let b = dlock().await;
    let name = unique_name("curator-semaphore-hold");
    let path = format!("/dlock/{name}");
    let one = LockOptions::new().permits(1);
    let mut curator = Curator::start(&path, "semaphore 1").await;
    let writer = dlock().await;
    let permit = must_acquire(&writer, &name, &one).await;
    writer
        .release_after(&permit, Duration::from_secs(3))
        .await
        .unwrap();
    drop(writer);
    assert_eq!(curator.ask("try").await, "held", "Curator passed the hold");
    assert!(b.try_acquire(&name, &one).await.unwrap().is_none());
    let next = b.acquire(&name, &one.clone().wait(ANSWER)).await.unwrap();
    b.release(&next).await.unwrap();
    assert_eq!(curator.ask("try").await, "acquired");
    assert_eq!(curator.ask("release").await, "released");
}
