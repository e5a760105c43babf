//! The real `dlock` binary as a subprocess against each backend's server.

use dlock_conformance::harness::{ServerOptions, Service, shared, start};
use dlock_conformance::support::unique_name;

use crate::support::*;

/// Two `dlock run` at once: one runs its command, the other exits "held"
/// without running it; once the first is done the name is free.
async fn one_of_two_runs(service: Service) {
    let url = url_of(shared(service).await);
    let name = unique_name("cli-two");
    let (mut first, mut lines) =
        run_until_started(&url, &name, "10s", "echo started; sleep 2; echo finished").await;
    let second = output(dlock(&[
        "run",
        "--url",
        &url,
        "--name",
        &name,
        "--",
        "sh",
        "-c",
        "echo second-ran",
    ]))
    .await;
    assert_eq!(second.status.code(), Some(HELD), "{second:?}");
    assert!(
        !String::from_utf8_lossy(&second.stdout).contains("second-ran"),
        "the second command ran while the lock was held"
    );
    assert!(String::from_utf8_lossy(&second.stderr).contains("held by another"));
    assert_eq!(exit_of(&mut first).await, 0);
    assert_eq!(rest(&mut lines).await, ["finished"]);
    let third = output(dlock(&[
        "run", "--url", &url, "--name", &name, "--", "sh", "-c", "exit 3",
    ]))
    .await;
    assert_eq!(
        third.status.code(),
        Some(3),
        "the command's status, once the lock is free: {third:?}"
    );
}

/// The server freezes while a command runs under the lock: the lease is
/// lost, the command gets SIGTERM, and dlock exits "lost".
async fn lost_lease_stops_the_command(service: Service) {
    let server = start(service, ServerOptions::default()).await;
    let url = url_of(&server);
    let name = unique_name("cli-lost");
    let (mut child, mut lines) = run_until_started(&url, &name, "2s", UNTIL_TERM).await;
    let id = server
        .container()
        .expect("started by the harness")
        .id()
        .to_owned();
    docker(&["pause", &id]).await;
    let code = exit_of(&mut child).await;
    docker(&["unpause", &id]).await;
    assert_eq!(code, LOST);
    assert_eq!(rest(&mut lines).await, ["got-term"]);
}

/// `inspect --json` shows the holder of a running command; `release
/// --force` frees the name for the next run, and (on TTL backends, whose
/// guards renew) the holder's command is stopped.
async fn inspect_and_force_release(service: Service) {
    let url = url_of(shared(service).await);
    let name = unique_name("cli-force");
    let (mut child, mut lines) = run_until_started(&url, &name, "3s", UNTIL_TERM).await;
    let inspected = output(dlock(&["inspect", "--json", &url, &name])).await;
    assert!(inspected.status.success(), "{inspected:?}");
    let json = String::from_utf8_lossy(&inspected.stdout);
    assert!(json.contains("\"held\":true"), "{json}");
    // The child's host is ours, its process id its own.
    let me = dlock_core::driver::host_and_pid();
    let host = me.rsplit_once(':').map_or("", |(host, _)| host);
    let holder = format!("\"holder\":\"{host}:{}\"", child.id().unwrap_or_default());
    assert!(json.contains(&holder), "{json} shows no {holder}");
    assert!(json.contains("\"fencing_token\":"), "{json}");
    let released = output(dlock(&["release", "--force", &url, &name])).await;
    assert!(released.status.success(), "{released:?}");
    assert!(String::from_utf8_lossy(&released.stderr).contains("released"));
    let free = output(dlock(&["inspect", "--json", &url, &name])).await;
    assert!(
        String::from_utf8_lossy(&free.stdout).contains("\"held\":false"),
        "{free:?}"
    );
    let next = output(dlock(&[
        "run", "--url", &url, "--name", &name, "--", "true",
    ]))
    .await;
    assert_eq!(next.status.code(), Some(0), "{next:?}");
    if service == Service::ZooKeeper {
        // A session lease is not renewed, so its holder is not told; the
        // command ends with dlock.
        let _ = child.start_kill();
        assert_eq!(rest(&mut lines).await, ["got-term"]);
        return;
    }
    assert_eq!(exit_of(&mut child).await, LOST);
    assert_eq!(rest(&mut lines).await, ["got-term"]);
}

/// `inspect --all` shows every permit of a semaphore, one line each (and
/// a `holds` array in JSON); `inspect` alone shows one.
async fn inspect_all_shows_every_permit(service: Service) {
    let url = url_of(shared(service).await);
    let name = unique_name("cli-all");
    let locker = dlock::connect(&url).await.expect("connect");
    let mut held = Vec::new();
    for holder in ["worker a", "worker b"] {
        let opts = dlock::LockOptions::new().permits(3).holder(holder);
        held.push(
            locker
                .try_acquire(&name, &opts)
                .await
                .expect("try_acquire")
                .expect("a permit"),
        );
    }
    let text = output(dlock(&["inspect", "--all", &url, &name])).await;
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        text.contains("worker a") && text.contains("worker b"),
        "{text}"
    );
    let one = output(dlock(&["inspect", &url, &name])).await;
    assert_eq!(
        String::from_utf8_lossy(&one.stdout).lines().count(),
        1,
        "{one:?}"
    );
    let json = output(dlock(&["inspect", "--all", "--json", &url, &name])).await;
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(json["held"], true, "{json}");
    let holds = json["holds"].as_array().expect("holds");
    let tokens: Vec<u64> = held.iter().map(dlock::Guard::fencing_token).collect();
    for hold in holds {
        let token = hold["fencing_token"].as_u64().expect("a token");
        assert!(tokens.contains(&token), "{hold} is not a grant: {tokens:?}");
    }
    assert_eq!(holds.len(), 2, "{json}");
    for guard in held {
        guard.release().await.expect("release");
    }
}

/// `--at-least` keeps the lock after a command that ended at once; a
/// crashed (SIGKILLed) dlock's lock frees itself with the TTL.
async fn at_least_and_crash(service: Service) {
    let url = url_of(shared(service).await);
    let name = unique_name("cli-at-least");
    let quick = output(dlock(&[
        "run",
        "--url",
        &url,
        "--name",
        &name,
        "--at-least",
        "2s",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(quick.status.code(), Some(0), "{quick:?}");
    let again = output(dlock(&[
        "run", "--url", &url, "--name", &name, "--", "true",
    ]))
    .await;
    assert_eq!(
        again.status.code(),
        Some(HELD),
        "within --at-least: {again:?}"
    );
    let waited = output(dlock(&[
        "run", "--url", &url, "--name", &name, "--wait", "10s", "--", "true",
    ]))
    .await;
    assert_eq!(
        waited.status.code(),
        Some(0),
        "after --at-least: {waited:?}"
    );

    let crash = unique_name("cli-crash");
    let (mut child, mut lines) = run_until_started(&url, &crash, "4s", UNTIL_TERM).await;
    child.start_kill().expect("SIGKILL dlock");
    let _ = child.wait().await;
    // The command must not go on without anyone renewing its lock.
    assert_eq!(
        rest(&mut lines).await,
        ["got-term"],
        "the command outlived dlock"
    );
    let next = output(dlock(&[
        "run", "--url", &url, "--name", &crash, "--wait", "20s", "--", "true",
    ]))
    .await;
    assert_eq!(
        next.status.code(),
        Some(0),
        "after the crashed holder's TTL: {next:?}"
    );
}

/// Four `dlock run --permits 2` at once, each command counting the
/// commands running beside it: all four run, never more than two at once,
/// and two do run together.
async fn at_most_n_commands_at_once(service: Service) {
    let url = url_of(shared(service).await);
    let name = unique_name("cli-permits");
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let script = format!(
        "touch {d}/$$; ls {d} | grep -v log | wc -l >> {d}/log; sleep 1; rm {d}/$$",
        d = dir.display()
    );
    let runs: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(output(dlock(&[
                "run",
                "--url",
                &url,
                "--name",
                &name,
                "--permits",
                "2",
                "--wait",
                "25s",
                "--",
                "sh",
                "-c",
                &script,
            ])))
        })
        .collect();
    for run in runs {
        let run = run.await.expect("the run's task");
        assert_eq!(run.status.code(), Some(0), "{run:?}");
    }
    let log = std::fs::read_to_string(dir.join("log")).expect("the commands' log");
    let counts: Vec<u32> = log
        .lines()
        .map(|l| l.trim().parse().expect("a count"))
        .collect();
    assert_eq!(counts.len(), 4, "every command ran once: {counts:?}");
    assert!(
        counts.iter().all(|&c| c <= 2),
        "more than 2 commands ran at once: {counts:?}"
    );
    assert!(
        counts.contains(&2),
        "two permits never ran together: {counts:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_run_at_most_n_commands_at_once_on_redis() {
    at_most_n_commands_at_once(Service::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_run_at_most_n_commands_at_once_on_postgres() {
    at_most_n_commands_at_once(Service::Postgres).await;
}

macro_rules! backend_tests {
    ($module:ident, $service:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn two_runs_at_once_one_runs_one_is_held() {
                one_of_two_runs($service).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_lost_lease_sends_the_command_sigterm() {
                lost_lease_stops_the_command($service).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn inspect_shows_the_holder_and_force_release_frees_it() {
                inspect_and_force_release($service).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn inspect_all_shows_every_permit_of_a_semaphore() {
                inspect_all_shows_every_permit($service).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn at_least_holds_and_a_crashed_holder_frees_with_its_ttl() {
                at_least_and_crash($service).await;
            }
        }
    };
}

backend_tests!(redis, Service::Redis);
backend_tests!(mysql, Service::MariaDb);
backend_tests!(postgres, Service::Postgres);
backend_tests!(zookeeper, Service::ZooKeeper);
backend_tests!(etcd, Service::Etcd);

#[tokio::test]
async fn an_unreachable_service_and_bad_arguments_have_their_own_statuses() {
    let down = output(dlock(&[
        "run",
        "--url",
        "redis://127.0.0.1:1",
        "--name",
        "x",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(down.status.code(), Some(UNAVAILABLE), "{down:?}");
    let bad_ttl = output(dlock(&[
        "run",
        "--url",
        "redis://127.0.0.1:1",
        "--name",
        "x",
        "--ttl",
        "1ms",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(bad_ttl.status.code(), Some(USAGE), "{bad_ttl:?}");
    let no_url = output(dlock(&["inspect", "x"])).await;
    assert_eq!(no_url.status.code(), Some(USAGE), "{no_url:?}");
    let missing = output(dlock(&[
        "run",
        "--url",
        "memory://",
        "--name",
        "x",
        "--",
        "/nonexistent/command",
    ]))
    .await;
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
}

#[tokio::test]
async fn migrate_creates_the_mysql_table() {
    let url = shared(Service::MariaDb).await.url().to_owned();
    let table = format!("cli_{:08x}", fastrand::u32(..));
    let migrated = output(dlock(&["migrate", &url, "--table", &table])).await;
    assert!(migrated.status.success(), "{migrated:?}");
    let again = output(dlock(&["migrate", &url, "--table", &table])).await;
    assert!(again.status.success(), "migrate is idempotent: {again:?}");
    let not_mysql = output(dlock(&["migrate", "redis://127.0.0.1:1"])).await;
    assert_eq!(not_mysql.status.code(), Some(USAGE), "{not_mysql:?}");
}

#[tokio::test]
async fn migrate_creates_the_postgres_table() {
    let url = shared(Service::Postgres).await.url().to_owned();
    let table = format!("cli_{:08x}", fastrand::u32(..));
    let migrated = output(dlock(&["migrate", &url, "--table", &table])).await;
    assert!(migrated.status.success(), "{migrated:?}");
    let again = output(dlock(&["migrate", &url, "--table", &table])).await;
    assert!(again.status.success(), "migrate is idempotent: {again:?}");
    let locker = dlock::postgres::PgBackend::builder(url.as_str())
        .table(table.as_str())
        .create_table(false)
        .connect()
        .await
        .expect("the migrated table serves");
    let lease = dlock::Backend::try_acquire(&locker, "x", &dlock::LockOptions::new())
        .await
        .unwrap();
    assert!(lease.is_some());
}

/// A URL that asks for TLS gets it: `dlock inspect` on a PostgreSQL that
/// speaks only TLS, its certificate verified against a private CA the URL
/// names (the binary is built with the drivers' TLS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_that_asks_for_tls_gets_it() {
    use dlock_conformance::harness::TestCertificates;

    let certs = TestCertificates::generate();
    let server = start(
        Service::Postgres,
        ServerOptions {
            files: vec![
                ("/tmp/ca.crt".to_owned(), certs.ca.clone()),
                ("/tmp/server.crt".to_owned(), certs.server_cert.clone()),
                ("/tmp/server.key".to_owned(), certs.server_key.clone()),
            ],
            // It has no plain-text probe: waited for below.
            skip_probe: true,
            ..ServerOptions::default()
        },
    )
    .await;
    let port = server.port().expect("a port on 127.0.0.1");
    let ca = std::env::temp_dir().join(format!("dlock-ca-{}.crt", unique_name("ca")));
    std::fs::write(&ca, &certs.ca).expect("write the CA");
    let url = format!(
        "postgres://dlock:dlock@127.0.0.1:{port}/dlock?sslmode=verify-full&sslrootcert={}",
        ca.display()
    );
    // Up once this process's own TLS client connects (which also makes
    // the lock table).
    let started = std::time::Instant::now();
    while let Err(e) = dlock::connect(&url).await {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the TLS server never answered: {e}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let name = unique_name("cli-tls");
    let inspected = output(dlock(&["inspect", "--json", &url, &name])).await;
    assert!(inspected.status.success(), "{inspected:?}");
    let json = String::from_utf8_lossy(&inspected.stdout);
    assert!(json.contains("\"held\":false"), "{json}");
    let _ = std::fs::remove_file(ca);
}
