//! Scheduled jobs across real processes: three OS processes (this test
//! binary, started again as `job_node`) run one schedule against each
//! backend's server, and every occurrence must run exactly once, also
//! when a node is SIGKILLed mid-run and when one node's timer is late.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dlock::{CancellationToken, JobOptions, Schedule, ScheduledJob};
use dlock_conformance::harness::{Service, shared};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::timeout;

/// Set (to the lock service's URL) when this binary runs as a node.
const NODE_URL: &str = "DLOCK_JOB_NODE_URL";

/// A node's settings, passed through the environment.
#[derive(Debug, Clone)]
struct Node {
    url: String,
    job: String,
    start_ms: u64,
    count: u32,
    period: Duration,
    at_least: Duration,
    delay: Duration,
    work: Duration,
}

impl Node {
    fn env(&self, cmd: &mut Command) {
        cmd.env(NODE_URL, &self.url)
            .env("DLOCK_JOB_NAME", &self.job)
            .env("DLOCK_JOB_COUNT", self.count.to_string())
            .env("DLOCK_JOB_PERIOD_MS", self.period.as_millis().to_string())
            .env(
                "DLOCK_JOB_AT_LEAST_MS",
                self.at_least.as_millis().to_string(),
            )
            .env("DLOCK_JOB_DELAY_MS", self.delay.as_millis().to_string())
            .env("DLOCK_JOB_WORK_MS", self.work.as_millis().to_string());
    }

    fn from_env(url: String) -> Node {
        let ms = |key: &str| -> u64 {
            std::env::var(key)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{key} is not set"))
        };
        Node {
            url,
            job: std::env::var("DLOCK_JOB_NAME").expect("DLOCK_JOB_NAME"),
            start_ms: 0,
            count: u32::try_from(ms("DLOCK_JOB_COUNT")).expect("count"),
            period: Duration::from_millis(ms("DLOCK_JOB_PERIOD_MS")),
            at_least: Duration::from_millis(ms("DLOCK_JOB_AT_LEAST_MS")),
            delay: Duration::from_millis(ms("DLOCK_JOB_DELAY_MS")),
            work: Duration::from_millis(ms("DLOCK_JOB_WORK_MS")),
        }
    }

    /// Runs the schedule; prints `DLOCK-START <due ms>` when a run starts
    /// and `DLOCK-DONE <due ms>` when it ends.
    async fn run(self) -> dlock::RunReport {
        let locker = dlock::connect(&self.url).await.expect("connect");
        // Connected: the parent sends the first occurrence once every node
        // is, so that none misses it by starting slowly.
        println!("DLOCK-READY");
        let mut line = String::new();
        BufReader::new(tokio::io::stdin())
            .read_line(&mut line)
            .await
            .expect("the start time on stdin");
        let start_ms: u64 = line.trim().parse().expect("a start time in ms");
        let start = UNIX_EPOCH + Duration::from_millis(start_ms);
        let job = ScheduledJob::new(
            locker,
            self.job.clone(),
            Schedule::every(self.period),
            JobOptions::new(Duration::from_secs(10)).at_least(self.at_least),
        )
        .delay(self.delay)
        .starting(start)
        .until(start + self.period * self.count);
        let work = self.work;
        let mut run = std::pin::pin!(job.run(CancellationToken::new(), move |run| async move {
            let due = millis(run.scheduled());
            // When it started too, shown with a failure: how late it was.
            println!("DLOCK-START {due} {}", millis(SystemTime::now()));
            tokio::time::sleep(work).await;
            println!("DLOCK-DONE {due}");
        }));
        // One poll takes the schedule to its first occurrence's timer: a
        // node paused once it says so is late for that occurrence.
        let first = std::future::poll_fn(|cx| Poll::Ready(run.as_mut().poll(cx))).await;
        println!("DLOCK-ARMED");
        match first {
            Poll::Ready(report) => report,
            Poll::Pending => run.await,
        }
        .expect("the schedule runs")
    }
}

fn millis(t: SystemTime) -> u64 {
    u64::try_from(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(0)
}

/// One node. Run by the tests below as a separate process; run directly,
/// three of it share one in-memory lock space on three runtimes, which
/// must also give every occurrence once.
#[test]
fn job_node() {
    let rt = crate::current_thread;
    if let Ok(url) = std::env::var(NODE_URL) {
        // The node's warnings (occurrences that failed) show in the test's
        // output.
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::WARN)
            .init();
        let report = rt().block_on(Node::from_env(url).run());
        println!(
            "DLOCK-REPORT {} {} {} {}",
            report.ran, report.skipped, report.failed, report.late
        );
        return;
    }
    let locker = dlock::Locker::new(dlock::MemoryBackend::new());
    let period = Duration::from_millis(200);
    let start = SystemTime::now() + period;
    let count = 5;
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let locker = locker.clone();
            std::thread::spawn(move || {
                let job = ScheduledJob::new(
                    locker,
                    "memory-node",
                    Schedule::every(period),
                    JobOptions::new(Duration::from_secs(10)).at_least(period / 2),
                )
                .starting(start)
                .until(start + period * count);
                rt().block_on(job.run(CancellationToken::new(), |_| async {}))
                    .expect("runs")
            })
        })
        .collect();
    let reports: Vec<dlock::RunReport> = threads
        .into_iter()
        .map(|t| t.join().expect("node"))
        .collect();
    let ran: u64 = reports.iter().map(|r| r.ran).sum();
    let late = reports.iter().map(|r| r.late).min().unwrap_or(0);
    // Each occurrence once at most; one not run was one every node got to
    // late (a stalled machine).
    assert!(ran > 0 && ran <= u64::from(count), "{reports:?}");
    assert!(u64::from(count) - ran <= late, "{reports:?}");
}

/// A node process and the runs it reported.
struct Process {
    child: Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

fn spawn(node: &Node) -> Process {
    let exe = std::env::current_exe().expect("the test binary");
    let mut cmd = Command::new(exe);
    cmd.args([
        "jobs::job_node",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .kill_on_drop(true);
    node.env(&mut cmd);
    let mut child = cmd.spawn().expect("spawn a node");
    let stdout = child.stdout.take().expect("piped");
    let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut reader = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = reader.next_line().await {
            // libtest may print "test job_node ... " before a line of ours.
            let Some(at) = line.find("DLOCK-") else {
                continue;
            };
            if tx.send(line[at..].to_owned()).is_err() {
                return;
            }
        }
    });
    Process { child, lines }
}

/// Waits until every node is connected, then tells them the first
/// occurrence: the next whole second at least a second from now. Returns
/// it.
async fn start(processes: &mut [Process]) -> u64 {
    for p in processes.iter_mut() {
        let ready = timeout(Duration::from_secs(60), p.lines.recv())
            .await
            .expect("a node did not connect in time");
        assert_eq!(ready.as_deref(), Some("DLOCK-READY"));
    }
    let start_ms = (millis(SystemTime::now()) / 1000 + 2) * 1000;
    for p in processes.iter_mut() {
        let mut stdin = p.child.stdin.take().expect("piped");
        stdin
            .write_all(format!("{start_ms}\n").as_bytes())
            .await
            .expect("send the start");
    }
    start_ms
}

/// Who started each occurrence: due ms → node indices.
type Starts = BTreeMap<u64, Vec<usize>>;

/// Waits for every process and gathers the occurrences each started, and
/// the fewest occurrences any node that finished got to late
/// (`RunReport::late`).
async fn collect(processes: Vec<Process>, within: Duration) -> (Starts, u64) {
    let mut starts = Starts::new();
    let mut late = None::<u64>;
    for (i, mut p) in processes.into_iter().enumerate() {
        let status = timeout(within, p.child.wait())
            .await
            .expect("a node did not finish in time")
            .expect("wait");
        while let Ok(line) = p.lines.try_recv() {
            // Shown with a failure.
            eprintln!("node {i}: {line}");
            if let Some(start) = line.strip_prefix("DLOCK-START ") {
                let due = start.split(' ').next().unwrap_or_default();
                starts.entry(due.parse().expect("ms")).or_default().push(i);
            } else if let Some(report) = line.strip_prefix("DLOCK-REPORT ")
                && let Some(n) = report.split(' ').nth(3).and_then(|n| n.parse().ok())
            {
                late = Some(late.map_or(n, |l: u64| l.min(n)));
            }
        }
        // A SIGKILLed node has no status code.
        if let Some(code) = status.code() {
            assert_eq!(code, 0, "node {i} failed");
        }
    }
    (starts, late.unwrap_or(0))
}

/// Whether no occurrence ran twice, and every one not run is one that
/// every node got to after `at_least` (and so skipped): `late` is the
/// fewest any node skipped so.
fn at_most_once_and_none_lost(counts: &[usize], late: u64) -> bool {
    let missed = counts.iter().filter(|&&n| n == 0).count();
    // Some ran: a node that thought itself always late would pass the rest.
    missed < counts.len()
        && counts.iter().all(|&n| n <= 1)
        && u64::try_from(missed).unwrap_or(u64::MAX) <= late
}

async fn url(service: Service) -> String {
    let server = shared(service).await;
    match service {
        Service::ZooKeeper => format!("zk://{}", server.url()),
        _ => server.url().to_owned(),
    }
}

fn nodes(url: String, job: &str, count: u32, at_least: Duration, work: Duration) -> Node {
    Node {
        url,
        job: format!("{job}-{:08x}", fastrand::u32(..)),
        start_ms: 0,
        count,
        period: Duration::from_secs(1),
        at_least,
        delay: Duration::ZERO,
        work,
    }
}

fn expected(node: &Node) -> Vec<u64> {
    let period = u64::try_from(node.period.as_millis()).expect("ms");
    (0..u64::from(node.count))
        .map(|i| node.start_ms + i * period)
        .collect()
}

async fn exactly_once(service: Service) {
    let mut node = nodes(
        url(service).await,
        "exactly-once",
        5,
        Duration::from_millis(500),
        Duration::from_millis(100),
    );
    let mut processes: Vec<Process> = (0..3).map(|_| spawn(&node)).collect();
    node.start_ms = start(&mut processes).await;
    let (starts, late) = collect(processes, Duration::from_secs(30)).await;
    let counts: Vec<usize> = expected(&node)
        .iter()
        .map(|due| starts.get(due).map_or(0, Vec::len))
        .collect();
    eprintln!("{service:?}: runs per occurrence across 3 processes: {counts:?}");
    assert!(
        at_most_once_and_none_lost(&counts, late),
        "occurrences → runs: {starts:?}; every node late for {late}"
    );
}

async fn sigkilled_mid_run(service: Service) {
    let mut node = nodes(
        url(service).await,
        "sigkill",
        4,
        Duration::from_millis(500),
        Duration::from_millis(800),
    );
    let mut processes: Vec<Process> = (0..3).map(|_| spawn(&node)).collect();
    node.start_ms = start(&mut processes).await;
    // The first node to start a run is killed in the middle of it.
    let first = expected(&node)[0];
    let victim = timeout(Duration::from_secs(15), async {
        loop {
            for (i, p) in processes.iter_mut().enumerate() {
                if let Ok(line) = p.lines.try_recv()
                    && line.starts_with(&format!("DLOCK-START {first} "))
                {
                    return i;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("no node started the first occurrence");
    processes[victim].child.start_kill().expect("SIGKILL");
    let (mut starts, late) = collect(processes, Duration::from_secs(30)).await;
    starts.entry(first).or_default().push(victim);
    let counts: Vec<usize> = expected(&node)
        .iter()
        .map(|due| starts.get(due).map_or(0, Vec::len))
        .collect();
    eprintln!("{service:?}: node {victim} killed mid-run; runs per occurrence: {counts:?}");
    assert!(
        at_most_once_and_none_lost(&counts, late),
        "occurrences → runs: {starts:?}; every node late for {late}"
    );
    for due in &expected(&node)[1..] {
        assert!(
            !starts.get(due).is_some_and(|s| s.contains(&victim)),
            "the killed node ran {due} after it died"
        );
    }
}

/// One node of each job is paused (SIGSTOP) while it waits for the first
/// occurrence, as a stalled process is, and resumed once the nodes on time
/// have finished and released or kept its lock: its timer fires late. With
/// `at_least` it finds the occurrence taken (or, past the lock's keep,
/// skips it as late); without (the control, run alongside) the lock is
/// free and it runs the occurrence again. Decided on that order alone.
async fn late_timer(service: Service) {
    let url = url(service).await;
    for attempt in 1..=3 {
        let held = nodes(
            url.clone(),
            "late-held",
            1,
            Duration::from_millis(600),
            Duration::from_millis(50),
        );
        let bare = Node {
            job: format!("late-bare-{:08x}", fastrand::u32(..)),
            at_least: Duration::ZERO,
            ..held.clone()
        };
        // On time: held, held, bare, bare; late: held, bare.
        let mut on_time: Vec<Process> =
            [&held, &held, &bare, &bare, &held, &bare].map(spawn).into();
        let start_ms = start(&mut on_time).await;
        let mut late = on_time.split_off(4);
        for p in &mut late {
            stop(p).await;
        }
        if millis(SystemTime::now()) >= start_ms {
            // Paused too late to be late: the machine stalled for a second.
            eprintln!("attempt {attempt}: the late nodes were paused after the occurrence was due");
            continue;
        }
        let bare_on_time = on_time.split_off(2);
        let (held_starts, held_late) = collect(on_time, Duration::from_secs(30)).await;
        let (bare_starts, _) = collect(bare_on_time, Duration::from_secs(30)).await;
        for p in &late {
            resume(p);
        }
        let (late_starts, _) = collect(late, Duration::from_secs(30)).await;
        let ran_late = |index| late_starts.values().any(|nodes| nodes.contains(&index));
        let held_runs = held_starts.get(&start_ms).map_or(0, Vec::len) + usize::from(ran_late(0));
        eprintln!(
            "{service:?}: the late node ran the occurrence again: {} with at_least 600 ms, {} without",
            ran_late(0),
            ran_late(1)
        );
        if held_runs == 0 && held_late > 0 {
            // Every node on time came to it after its keep: nothing shown.
            eprintln!("attempt {attempt}: every node with at_least was late");
            continue;
        }
        assert!(
            at_most_once_and_none_lost(&[held_runs], held_late),
            "with at_least: {held_starts:?}, the late node ran too: {}; every node late for {held_late}",
            ran_late(0)
        );
        assert!(
            ran_late(1),
            "the control without at_least: the late node found its lock free and must run it: \
             on time {bare_starts:?}, late {late_starts:?}"
        );
        return;
    }
    panic!("three attempts stalled past the occurrence before the late nodes were paused");
}

/// Pauses a node once its schedule waits for the first occurrence, and
/// waits until it is stopped: from then on it runs nothing.
async fn stop(p: &mut Process) {
    let armed = timeout(Duration::from_secs(60), p.lines.recv())
        .await
        .expect("a node did not start its schedule in time");
    assert_eq!(armed.as_deref(), Some("DLOCK-ARMED"));
    let pid = p.child.id().expect("a running node");
    signal(pid, Signal::SIGSTOP);
    // The signal is taken on the node's next return to user space; /proc
    // says when it has been (`T`; `t` under a tracer).
    let stopped = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .expect("the node's state")
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with(['T', 't']))
    };
    // Liveness only.
    timeout(Duration::from_secs(30), async {
        while !stopped() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the node did not stop");
}

fn resume(p: &Process) {
    signal(p.child.id().expect("a paused node"), Signal::SIGCONT);
}

fn signal(pid: u32, signal: Signal) {
    let pid = Pid::from_raw(i32::try_from(pid).expect("a pid"));
    nix::sys::signal::kill(pid, signal).expect("signal a node");
}

macro_rules! backend_tests {
    ($module:ident, $service:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn three_processes_run_each_occurrence_exactly_once() {
                exactly_once($service).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_node_sigkilled_mid_run_does_not_stop_the_schedule() {
                sigkilled_mid_run($service).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_late_timer_does_not_run_an_occurrence_twice() {
                late_timer($service).await;
            }
        }
    };
}

backend_tests!(redis, Service::Redis);
backend_tests!(mysql, Service::MariaDb);
backend_tests!(postgres, Service::Postgres);
backend_tests!(zookeeper, Service::ZooKeeper);
backend_tests!(etcd, Service::Etcd);
