//! Several names at once across processes: two OS processes (this test
//! binary, started again as `multi_node`) lock `[a, b]` and `[b, a]` a
//! thousand times each through `acquire_all`, against one lock service.
//! Neither waits for the other in a cycle, and no name is ever held by
//! both: each name's holds, ordered by their fencing tokens, must not
//! overlap in time.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use dlock::{LockOptions, Locker};
use dlock_conformance::harness::{Service, shared};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::time::timeout;

/// Set (to the lock service's URL) when this binary runs as a node.
const NODE_URL: &str = "DLOCK_MULTI_NODE_URL";
const ROUNDS: usize = 1000;

/// One hold of the set: each name's token, and when the hold began and
/// ended (ns of the machine's monotonic clock, which the two processes
/// share).
#[derive(Debug, Clone)]
struct Hold {
    tokens: [(String, u64); 2],
    start: u128,
    end: u128,
}

fn now_ns() -> u128 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("the clock");
    Duration::from(now).as_nanos()
}

/// Locks `names` [`ROUNDS`] times and prints each hold as `DLOCK-HOLD
/// <name> <token> <name> <token> <start ns> <end ns>`.
async fn rounds(locker: Locker, names: [String; 2]) {
    for _ in 0..ROUNDS {
        let set = locker
            .acquire_all(&names, &LockOptions::new())
            .await
            .expect("acquire_all");
        let start = now_ns();
        // A hold that lasts: the other process asks meanwhile, and a
        // grant to it now would overlap.
        tokio::time::sleep(Duration::from_millis(1)).await;
        let line: Vec<String> = set
            .guards()
            .iter()
            .map(|g| format!("{} {}", g.name(), g.fencing_token()))
            .collect();
        let end = now_ns();
        println!("DLOCK-HOLD {} {start} {end}", line.join(" "));
        set.release().await.expect("release");
    }
}

/// One node. Run by the tests below as a separate process; run directly,
/// two of it share one in-memory lock space on two runtimes.
#[test]
fn multi_node() {
    let rt = crate::current_thread;
    if let Ok(url) = std::env::var(NODE_URL) {
        let names = std::env::var("DLOCK_MULTI_NAMES").expect("DLOCK_MULTI_NAMES");
        let (a, b) = names.split_once(',').expect("two names");
        rt().block_on(async {
            let locker = dlock::connect(&url).await.expect("connect");
            rounds(locker, [a.to_owned(), b.to_owned()]).await;
        });
        return;
    }
    let locker = Locker::new(dlock::MemoryBackend::new());
    let threads: Vec<_> = [["a", "b"], ["b", "a"]]
        .map(|[a, b]| {
            let locker = locker.clone();
            std::thread::spawn(move || rt().block_on(rounds(locker, [a.into(), b.into()])))
        })
        .into();
    for t in threads {
        t.join().expect("a node");
    }
}

async fn opposite_orders(service: Service, query: &str) {
    let url = format!("{}{query}", shared(service).await.url());
    let tag = format!("{:08x}", fastrand::u32(..));
    let (a, b) = (format!("multi-a-{tag}"), format!("multi-b-{tag}"));
    let exe = std::env::current_exe().expect("the test binary");
    let mut nodes = Vec::new();
    for names in [format!("{a},{b}"), format!("{b},{a}")] {
        let mut child = Command::new(&exe)
            .args([
                "multi::multi_node",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(NODE_URL, &url)
            .env("DLOCK_MULTI_NAMES", names)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a node");
        let stdout = child.stdout.take().expect("piped");
        nodes.push((child, tokio::spawn(read_holds(stdout))));
    }
    let mut holds = Vec::new();
    for (mut child, reader) in nodes {
        // Liveness only: a deadlock would hold both nodes forever.
        let status = timeout(Duration::from_secs(300), child.wait())
            .await
            .expect("the nodes deadlocked (or ran far too slowly)")
            .expect("wait");
        assert!(status.success(), "a node failed: {status}");
        holds.extend(reader.await.expect("reader"));
    }
    assert_eq!(holds.len(), 2 * ROUNDS, "every round holds once");
    for name in [&a, &b] {
        let mut by_token: BTreeMap<u64, &Hold> = BTreeMap::new();
        for hold in &holds {
            let (_, token) = hold
                .tokens
                .iter()
                .find(|(n, _)| n == name)
                .expect("each name");
            assert!(
                by_token.insert(*token, hold).is_none(),
                "token {token} granted twice"
            );
        }
        let ordered: Vec<&Hold> = by_token.into_values().collect();
        for pair in ordered.windows(2) {
            assert!(
                pair[0].end <= pair[1].start,
                "{name} held twice at once: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
    }
}

async fn read_holds(stdout: tokio::process::ChildStdout) -> Vec<Hold> {
    let mut lines = BufReader::new(stdout).lines();
    let mut holds = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        // libtest may print "test multi_node ... " before a line of ours.
        let Some(at) = line.find("DLOCK-HOLD ") else {
            continue;
        };
        let f: Vec<&str> = line[at + "DLOCK-HOLD ".len()..].split(' ').collect();
        let [n1, t1, n2, t2, start, end] = f[..] else {
            panic!("a malformed hold: {line}");
        };
        let parse = |s: &str| s.parse::<u128>().expect("a number");
        holds.push(Hold {
            tokens: [
                (n1.to_owned(), t1.parse().expect("a token")),
                (n2.to_owned(), t2.parse().expect("a token")),
            ],
            start: parse(start),
            end: parse(end),
        });
    }
    holds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_opposite_orders_never_deadlock_or_overlap() {
    opposite_orders(Service::Redis, "").await;
}

/// With wake-ups, so that a waiter hears each release rather than polling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_opposite_orders_never_deadlock_or_overlap() {
    opposite_orders(Service::Postgres, "?wake_ups=true").await;
}
