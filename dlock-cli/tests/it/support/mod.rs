//! What the tests of the real `dlock` binary share.

#![allow(dead_code)] // each test file uses its own part

use std::process::{Output, Stdio};
use std::time::Duration;

use dlock_conformance::harness::{Server, Service};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::timeout;

pub const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

/// The exit statuses the README documents.
pub const HELD: i32 = 75;
pub const UNAVAILABLE: i32 = 69;
pub const LOST: i32 = 76;
pub const USAGE: i32 = 64;

/// A command that says it started, then runs until SIGTERM, which it
/// reports.
pub const UNTIL_TERM: &str =
    "trap 'echo got-term; exit 0' TERM; echo started; while :; do sleep 0.1; done";

pub fn url_of(server: &Server) -> String {
    match server.service() {
        Service::ZooKeeper => format!("zk://{}", server.url()),
        _ => server.url().to_owned(),
    }
}

pub fn dlock(args: &[&str]) -> Command {
    let mut cmd = Command::new(DLOCK);
    cmd.args(args)
        .env_remove("DLOCK_URL")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

pub async fn output(mut cmd: Command) -> Output {
    timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("dlock did not finish within 30 s")
        .expect("run dlock")
}

/// Starts `dlock run … -- sh -c script` and waits for the script's
/// "started"; returns the child and the rest of its output lines.
pub async fn run_until_started(url: &str, name: &str, ttl: &str, script: &str) -> (Child, Lines) {
    let mut child = dlock(&[
        "run", "--url", url, "--name", name, "--ttl", ttl, "--grace", "5s", "--", "sh", "-c",
        script,
    ])
    .stdout(Stdio::piped())
    .spawn()
    .expect("spawn dlock run");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let first = timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the command did not start within 30 s")
        .expect("read");
    assert_eq!(first.as_deref(), Some("started"));
    (child, lines)
}

pub type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

pub async fn exit_of(child: &mut Child) -> i32 {
    timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("dlock run did not exit within 30 s")
        .expect("wait")
        .code()
        .expect("an exit code")
}

pub async fn rest(lines: &mut Lines) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(Ok(Some(line))) = timeout(Duration::from_secs(5), lines.next_line()).await {
        out.push(line);
    }
    out
}

pub async fn docker(args: &[&str]) {
    let status = Command::new("docker")
        .args(args)
        .status()
        .await
        .expect("run docker");
    assert!(status.success(), "docker {args:?}");
}
