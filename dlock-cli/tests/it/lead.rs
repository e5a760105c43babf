//! `dlock lead` as a real binary against each backend's server.

use std::time::Duration;

use dlock_conformance::harness::{ServerOptions, Service, shared, start};
use dlock_conformance::support::unique_name;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::time::timeout;

use crate::support::*;

/// Starts `dlock lead --holder HOLDER … -- sh -c UNTIL_TERM`.
fn lead(url: &str, name: &str, holder: &str) -> (Child, Lines) {
    let mut child = dlock(&[
        "lead", "--url", url, "--name", name, "--holder", holder, "--ttl", "4s", "--grace", "5s",
        "--", "sh", "-c", UNTIL_TERM,
    ])
    .stdout(std::process::Stdio::piped())
    .spawn()
    .expect("spawn dlock lead");
    let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    (child, lines)
}

/// The next line of a leader's command, within `within`.
async fn next_line(lines: &mut Lines, within: Duration) -> Option<String> {
    timeout(within, lines.next_line()).await.ok()?.ok()?
}

async fn leader_of(url: &str, name: &str) -> String {
    let inspected = output(dlock(&["inspect", "--json", url, name])).await;
    String::from_utf8_lossy(&inspected.stdout).into_owned()
}

/// Two `dlock lead` at once on one name: one runs its command, the other
/// waits; SIGKILL the leading dlock and the other runs its command; SIGTERM
/// that one and its command ends, it resigns, and it exits with the
/// command's status.
async fn one_leader_and_a_killed_one_hands_over(service: Service) {
    let url = url_of(shared(service).await);
    let name = unique_name("cli-lead");
    let (mut a, mut a_lines) = lead(&url, &name, "node-a");
    let first = next_line(&mut a_lines, Duration::from_secs(30)).await;
    assert_eq!(
        first.as_deref(),
        Some("started"),
        "the first leader's command"
    );
    let (mut b, mut b_lines) = lead(&url, &name, "node-b");
    assert_eq!(
        next_line(&mut b_lines, Duration::from_secs(3)).await,
        None,
        "the second command ran while the first led"
    );
    assert!(
        leader_of(&url, &name)
            .await
            .contains("\"holder\":\"node-a\"")
    );
    let killed = std::time::Instant::now();
    let _ = a.start_kill();
    let second = next_line(&mut b_lines, Duration::from_secs(30)).await;
    assert_eq!(
        second.as_deref(),
        Some("started"),
        "the successor's command"
    );
    // For the record (the README's failover times), not judged: terms
    // last 4 s.
    eprintln!("failover on {service:?}: {:?}", killed.elapsed());
    assert!(
        leader_of(&url, &name)
            .await
            .contains("\"holder\":\"node-b\"")
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(b.id().expect("running")).expect("a pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    assert_eq!(exit_of(&mut b).await, 0, "the command's status");
    assert_eq!(rest(&mut b_lines).await, ["got-term"]);
    assert!(
        leader_of(&url, &name).await.contains("\"held\":false"),
        "no resignation"
    );
}

/// The server freezes while the leader's command runs: the term is lost,
/// the command stopped, and once the server is back dlock leads again and
/// runs the command anew.
async fn a_lost_term_stops_the_command_and_leads_again(service: Service) {
    let server = start(service, ServerOptions::default()).await;
    let url = url_of(&server);
    let name = unique_name("cli-lead-lost");
    let (mut child, mut lines) = lead(&url, &name, "node-a");
    let first = next_line(&mut lines, Duration::from_secs(30)).await;
    assert_eq!(first.as_deref(), Some("started"));
    let id = server.container().expect("ours").id().to_owned();
    docker(&["pause", &id]).await;
    let stopped = next_line(&mut lines, Duration::from_secs(30)).await;
    docker(&["unpause", &id]).await;
    assert_eq!(
        stopped.as_deref(),
        Some("got-term"),
        "the lost term's command"
    );
    let again = next_line(&mut lines, Duration::from_secs(60)).await;
    assert_eq!(again.as_deref(), Some("started"), "leading again");
    let _ = child.start_kill();
}

macro_rules! backend_tests {
    ($module:ident, $service:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn one_leader_runs_the_command_and_a_killed_one_hands_over() {
                one_leader_and_a_killed_one_hands_over($service).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_lost_term_stops_the_command_and_it_leads_again() {
                a_lost_term_stops_the_command_and_leads_again($service).await;
            }
        }
    };
}

backend_tests!(redis, Service::Redis);
backend_tests!(mysql, Service::MariaDb);
backend_tests!(postgres, Service::Postgres);
backend_tests!(zookeeper, Service::ZooKeeper);
backend_tests!(etcd, Service::Etcd);
