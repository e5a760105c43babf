//! Every example runs, against the test image's servers where it needs
//! one, and says what it should; the crate README's quick start is the
//! `quick_start` example's code, run against Redis and PostgreSQL.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use dlock_conformance::harness::{Service, shared};

/// Runs the example `name` (built by `cargo test` beside this binary) with
/// `args`, within two minutes, and returns what it printed.
async fn run(name: &str, args: &[&str]) -> String {
    // target/<profile>/deps/it-… → target/<profile>/examples/<name>
    let exe = std::env::current_exe().unwrap();
    let bin: PathBuf = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples").join(name))
        .unwrap();
    assert!(
        bin.exists(),
        "{} is missing: `cargo test` builds the examples; a run of the `it` \
         target alone needs `cargo build -p dlock-rs --examples` first",
        bin.display()
    );
    let child = tokio::process::Command::new(&bin)
        .args(args)
        .kill_on_drop(true)
        .output();
    let Output {
        status,
        stdout,
        stderr,
    } = tokio::time::timeout(Duration::from_secs(120), child)
        .await
        .unwrap_or_else(|_| panic!("{name} ran for two minutes"))
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    );
    assert!(status.success(), "{name}: {status}\n{out}\n{err}");
    out
}

async fn url(service: Service) -> String {
    shared(service).await.url().to_owned()
}

#[tokio::test]
async fn the_quick_start_runs_against_redis_and_postgres() {
    let (redis, postgres) = (url(Service::Redis).await, url(Service::Postgres).await);
    for _ in 0..2 {
        // Again: each run's token is above the last, so its write is let in.
        let out = run("quick_start", &[&redis, &postgres]).await;
        assert!(out.contains("wrote with fencing token"), "{out}");
    }
}

/// The README's block is the example's code, line for line (but for the
/// URL it connects to), so that the test above runs what users copy.
#[test]
fn the_readmes_quick_start_is_the_examples_code() {
    let readme = include_str!("../../README.md");
    let example = include_str!("../../examples/quick_start.rs");
    let block = readme
        .split("```no_run\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap();
    let code = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("# ") && *l != "#")
            .map(|l| l.replace("\"redis://127.0.0.1:6379\"", "redis"))
            .collect()
    };
    let block = code(block);
    let example = code(example);
    let first = block.first().unwrap();
    let start = example.iter().position(|l| l == first).unwrap();
    assert_eq!(
        example[start..start + block.len()],
        block[..],
        "dlock/README.md's quick start and examples/quick_start.rs differ"
    );
}

#[tokio::test]
async fn the_election_hands_over_between_its_two_nodes() {
    let out = run("election", &[&url(Service::Redis).await]).await;
    for line in [
        "node-a leads",
        "node-b leads",
        "node-a resigns",
        "node-b resigns",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
    assert!(out.contains("leader now: None"), "{out}");
}

#[tokio::test]
async fn the_builder_and_the_url_give_the_same_settings() {
    let out = run("builder", &[&url(Service::Redis).await]).await;
    assert!(out.contains("request_timout"), "the typo named: {out}");
    assert!(out.contains("Some(\"billing-worker-1\")"), "{out}");
}

#[tokio::test]
async fn the_locked_method_ships_each_order() {
    let out = run("order_method", &[]).await;
    assert!(out.contains("shipped"), "{out}");
}

#[tokio::test]
async fn the_scheduled_job_runs_its_occurrences() {
    // Every second, for three seconds: each occurrence is run, or late on
    // a loaded machine, never failed.
    let out = run("scheduled_job", &["memory://", "* * * * * *", "3"]).await;
    let report = out
        .lines()
        .find(|l| l.starts_with("this node ran"))
        .unwrap_or_else(|| panic!("no report: {out}"));
    // ran, skipped (taken), late, failed
    let n: Vec<u64> = report
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|d| d.parse().ok())
        .collect();
    assert_eq!(n.len(), 4, "{report}");
    assert_eq!(n[3], 0, "a run failed: {report}");
    assert!(n[0] + n[2] >= 1, "no occurrence came due: {report}");
}

#[tokio::test]
async fn observability_prints_the_metrics() {
    let out = run("observability", &[]).await;
    assert!(out.contains("dlock_"), "{out}");
}
