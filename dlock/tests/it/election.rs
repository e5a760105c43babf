//! Leader election across real processes: three OS processes (this test
//! binary, started again as `election_node`) campaign on each backend's
//! server, each leading a few short terms. Over their histories exactly
//! one leads at any time, terms' tokens increase, a resigned leader's
//! successor leads without waiting for a TTL, a SIGKILLed leader's
//! successor leads once its term's lease ends, and an observer in this
//! process sees the terms in order with their leaders' identities.

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock::{Election, LockOptions};
use dlock_conformance::harness::{Service, shared};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout};

/// Set (to the lock service's URL) when this binary runs as a node.
const NODE_URL: &str = "DLOCK_ELECTION_NODE_URL";
/// A term's lease.
const TTL: Duration = Duration::from_secs(3);
/// Terms each node leads.
const TERMS: u32 = 4;

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}

/// One node, run by the tests below as a separate process: leads `TERMS`
/// terms of 500 ms, printing `DLOCK-LEAD <token> <µs>` when a term begins
/// and `DLOCK-RESIGN <token> <µs>` before it resigns.
#[test]
fn election_node() {
    let Ok(url) = std::env::var(NODE_URL) else {
        return; // only as a node
    };
    let name = std::env::var("DLOCK_ELECTION_NAME").expect("DLOCK_ELECTION_NAME");
    let id = std::env::var("DLOCK_ELECTION_ID").expect("DLOCK_ELECTION_ID");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let locker = connect(&url).await;
        let election = Election::new(locker, name, id).options(LockOptions::new().ttl(TTL));
        println!("DLOCK-READY");
        for _ in 0..TERMS {
            election
                .lead(dlock::OnLost::Rejoin, |term| async move {
                    println!("DLOCK-LEAD {} {}", term.fencing_token(), now_us());
                    sleep(Duration::from_millis(500)).await;
                    println!("DLOCK-RESIGN {} {}", term.fencing_token(), now_us());
                })
                .await
                .expect("lead")
                .into_value();
        }
    });
}

/// A client whose leases last `TTL` (on ZooKeeper, its session).
async fn connect(url: &str) -> dlock::Locker {
    if url.starts_with("zk://") {
        let zk = dlock::zk::ZkBackend::builder(url).session_timeout(TTL);
        return dlock::Locker::new(zk.connect().await.expect("connect"));
    }
    dlock::connect(url).await.expect("connect")
}

/// What a node printed: (node, event, token, µs).
type Event = (usize, String, u64, u128);

fn spawn(url: &str, name: &str, node: usize, events: mpsc::UnboundedSender<Event>) -> Child {
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new(exe)
        .args([
            "election::election_node",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(NODE_URL, url)
        .env("DLOCK_ELECTION_NAME", name)
        .env("DLOCK_ELECTION_ID", format!("node-{node}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a node");
    let stdout = child.stdout.take().expect("piped");
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            // libtest may print "test election_node ... " before ours.
            let Some(at) = line.find("DLOCK-") else {
                continue;
            };
            let mut parts = line[at..].split(' ');
            let kind = parts.next().unwrap_or_default().to_owned();
            let token = parts.next().and_then(|t| t.parse().ok()).unwrap_or(0);
            let us = parts.next().and_then(|t| t.parse().ok()).unwrap_or(0);
            if events.send((node, kind, token, us)).is_err() {
                return;
            }
        }
    });
    child
}

async fn one_leader_at_a_time(service: Service) {
    let server = shared(service).await;
    let url = match service {
        Service::ZooKeeper => format!("zk://{}", server.url()),
        _ => server.url().to_owned(),
    };
    let name = format!("election-{:08x}", fastrand::u32(..));
    let (tx, mut events) = mpsc::unbounded_channel();
    let mut nodes: Vec<Child> = (0..3).map(|i| spawn(&url, &name, i, tx.clone())).collect();
    drop(tx);
    let watcher = Election::new(connect(&url).await, &name, "watcher")
        .poll_interval(Duration::from_millis(10));
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let observed = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut observer = watcher.observe();
            loop {
                match observer.changed().await {
                    Ok(Some(leader)) => {
                        let mut seen = seen.lock().expect("the observer's list");
                        seen.push((leader.fencing_token, leader.identity));
                    }
                    Ok(None) => {}
                    // A read that failed (no answer in time on a loaded
                    // machine): the next call reads again, as a user's
                    // observer would.
                    Err(e) if e.is_retryable() => {
                        eprintln!("the observer's read failed, reading again: {e}");
                    }
                    Err(e) => panic!("the observer: {e}"),
                }
            }
        })
    };

    // Every term, in the order they began: (node, token, began, ended).
    let mut terms: Vec<(usize, u64, u128, Option<u128>)> = Vec::new();
    let mut killed: Option<(usize, u128)> = None;
    let mut leads = 0;
    while let Ok(Some((node, kind, token, us))) =
        timeout(Duration::from_secs(60), events.recv()).await
    {
        match kind.as_str() {
            "DLOCK-LEAD" => {
                terms.push((node, token, us, None));
                leads += 1;
                if leads == 5 {
                    // The leader dies mid-term: its lease must end before
                    // anyone else leads.
                    let _ = nodes[node].start_kill();
                    killed = Some((node, now_us()));
                }
            }
            "DLOCK-RESIGN" => {
                if let Some(term) = terms.iter_mut().find(|t| t.0 == node && t.1 == token) {
                    term.3 = Some(us);
                }
            }
            _ => {}
        }
    }
    observed.abort();
    for node in &mut nodes {
        let _ = node.kill().await;
    }
    let (dead, killed_at) = killed.expect("a leader was killed");
    for node in (0..3).filter(|n| *n != dead) {
        let led = terms.iter().filter(|t| t.0 == node).count();
        assert_eq!(led, TERMS as usize, "node {node}'s terms: {terms:?}");
    }

    let mut failover = None;
    for pair in terms.windows(2) {
        let (a_node, a_token, _, a_end) = pair[0];
        let (_, b_token, b_start, _) = pair[1];
        assert!(b_token > a_token, "tokens go back: {terms:?}");
        let ended = match a_end {
            Some(end) => end,
            None => {
                assert_eq!(a_node, dead, "a term that never ended: {terms:?}");
                failover = Some(b_start.saturating_sub(killed_at));
                killed_at
            }
        };
        assert!(b_start > ended, "two leaders at once: {pair:?}");
        if a_end.is_some() {
            let gap = Duration::from_micros(u64::try_from(b_start - ended).unwrap_or(u64::MAX));
            assert!(
                gap < TTL,
                "a resignation's successor waited {gap:?}, as for a lease"
            );
        }
    }
    let failover = Duration::from_micros(u64::try_from(failover.expect("a failover")).unwrap_or(0));
    // For the record (the README's failover times), and bounded by the
    // term's lease and a generous margin for two loaded cores.
    eprintln!("election failover on {service:?}: {failover:?} (terms of {TTL:?})");
    assert!(
        failover < TTL + Duration::from_secs(5),
        "failover took {failover:?}"
    );

    let seen = seen.lock().expect("the observer's list").clone();
    assert!(
        seen.windows(2).all(|w| w[0].0 < w[1].0),
        "out of order: {seen:?}"
    );
    for (token, identity) in &seen {
        let term = terms
            .iter()
            .find(|t| t.1 == *token)
            .expect("an observed term led");
        assert_eq!(
            identity.as_deref(),
            Some(format!("node-{}", term.0).as_str())
        );
    }
    assert!(
        seen.len() >= terms.len() / 2,
        "the observer missed most terms: {seen:?}"
    );
}

macro_rules! backend_tests {
    ($module:ident, $service:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn three_processes_one_leader_at_a_time() {
                one_leader_at_a_time($service).await;
            }
        }
    };
}

backend_tests!(redis, Service::Redis);
backend_tests!(mysql, Service::MariaDb);
backend_tests!(postgres, Service::Postgres);
backend_tests!(zookeeper, Service::ZooKeeper);
backend_tests!(etcd, Service::Etcd);
