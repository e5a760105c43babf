//! CI's short campaign: a minute of faults per backend, and the controls,
//! through the `dlock-torture` binary as a user runs it. A violation the
//! README's Safety model does not predict, a missed bound, a lock left
//! held, or a control that shows nothing fails the test; its output (the
//! table and each failure) is printed then.
//!
//! The runs go at once, as `cargo test` starts them (16 threads, in
//! `.cargo/config.toml`): a run mostly waits (its faults, leases and heals),
//! and takes a tenth of a core with its servers (36 s of CPU in 431 s, one
//! at a time; three at a time left the machine 50-90 % idle); its bounds
//! allow 5 s of load on top of each wait (`SLACK` in `src/target.rs`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Seconds per backend: about a minute, as the issue that built this asks.
const SECONDS: &str = "60";

fn campaign(args: &[&str]) {
    let out = std::env::temp_dir().join(format!(
        "dlock-torture-{}-{}",
        std::process::id(),
        args.join("-").replace("--", "")
    ));
    std::fs::create_dir_all(&out).expect("the output folder");
    // Files, not pipes: nobody reads a pipe while the run goes on.
    let (stdout_path, stderr_path) = (out.join("stdout.txt"), out.join("stderr.txt"));
    let file = |p: &std::path::Path| Stdio::from(std::fs::File::create(p).expect("an output file"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlock-torture"))
        .args(args)
        .arg("--out")
        .arg(&out)
        .stdout(file(&stdout_path))
        .stderr(file(&stderr_path))
        .spawn()
        .expect("the dlock-torture binary runs");
    // A run takes about two minutes; a hung Docker must not hang CI.
    let deadline = Instant::now() + Duration::from_secs(15 * 60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for dlock-torture") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("dlock-torture {args:?} ran past 15 minutes");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = std::fs::read_to_string(&stdout_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(
        status.success(),
        "dlock-torture {args:?} failed ({status})\n{stdout}\n{stderr}"
    );
    // A run that judged nothing must not pass: every row saw grants.
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| "))
        .skip(1)
        .collect();
    assert!(!rows.is_empty(), "no table in the output:\n{stdout}");
    for row in rows {
        let grants: u64 = row
            .split('|')
            .nth(3)
            .and_then(|g| g.trim().parse().ok())
            .unwrap_or(0);
        assert!(grants > 0, "a run without grants judges nothing: {row}");
    }
    println!("{stdout}");
}

fn backend(name: &str) {
    campaign(&["--backends", name, "--no-controls", "--seconds", SECONDS]);
}

#[test]
fn redis() {
    backend("redis");
}

#[test]
fn mariadb() {
    backend("mariadb");
}

#[test]
fn postgres() {
    backend("postgres");
}

#[test]
fn zookeeper() {
    backend("zookeeper");
}

#[test]
fn etcd() {
    backend("etcd");
}

/// A control must show its violations, or the checker is blind. Each runs
/// as a test of its own, so that they go at once with the backends'.
fn control(name: &str) {
    campaign(&[
        "--controls-only",
        "--controls",
        name,
        "--control-seconds",
        "30",
    ]);
}

#[test]
fn control_redis_without_persistence_killed() {
    control("control-redis-without-persistence-killed");
}

#[test]
fn control_simulated_split_brain() {
    control("control-simulated-split-brain");
}

#[test]
fn control_simulated_stale_tokens() {
    control("control-simulated-stale-tokens");
}
