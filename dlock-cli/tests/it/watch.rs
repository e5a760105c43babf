//! `dlock watch` as a real binary: one view of held locks, as a table and
//! as JSON, and a live view on a pseudo-terminal that follows a lock being
//! taken and released.

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::io::Read;
use std::time::Duration;

use dlock::{Backend, LockOptions};
use dlock_conformance::harness::{Service, shared};
use dlock_conformance::support::unique_name;
use tokio::sync::mpsc;
use tokio::time::timeout;

use crate::support::*;

async fn backend(url: &str) -> std::sync::Arc<dyn Backend> {
    dlock::connect(url)
        .await
        .expect("connect")
        .backend()
        .clone()
}

/// `--once` lists the held locks under a prefix, with holders and tokens,
/// soonest to end first; `--json` says the same.
async fn once_shows_holders_and_tokens(service: Service) {
    let url = url_of(shared(service).await);
    let prefix = format!("{}/", unique_name("watch"));
    let b = backend(&url).await;
    let long = LockOptions::new()
        .ttl(Duration::from_secs(60))
        .holder("web-1");
    let short = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .holder("web-2");
    let late = b
        .try_acquire(&format!("{prefix}late"), &long)
        .await
        .unwrap()
        .unwrap();
    let soon = b
        .try_acquire(&format!("{prefix}soon"), &short)
        .await
        .unwrap()
        .unwrap();
    let shown = output(dlock(&["watch", "--once", &url, &prefix])).await;
    assert!(shown.status.success(), "{shown:?}");
    let table = String::from_utf8_lossy(&shown.stdout);
    assert!(table.starts_with("2 held locks under"), "{table}");
    let rows: Vec<&str> = table.lines().skip(2).collect();
    assert_eq!(rows.len(), 2, "{table}");
    // Session leases do not end by time: they come by name.
    let order = if service == Service::ZooKeeper {
        [(rows[1], &soon, "web-2"), (rows[0], &late, "web-1")]
    } else {
        [(rows[0], &soon, "web-2"), (rows[1], &late, "web-1")]
    };
    for (row, lease, holder) in order {
        assert!(row.contains(&format!(
            "{prefix}{}",
            if holder == "web-2" { "soon" } else { "late" }
        )));
        assert!(row.contains(holder), "{row}");
        assert!(row.contains(&lease.fencing_token().to_string()), "{row}");
        assert!(row.contains("mutex"), "{row}");
    }
    assert!(!table.contains('\x1b'), "colours off a terminal: {table:?}");
    let json = output(dlock(&["watch", "--once", "--json", &url, &prefix])).await;
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let rows = json.as_array().expect("an array");
    let soon_row = rows.iter().find(|r| r["holder"] == "web-2").expect("soon");
    assert_eq!(soon_row["fencing_token"], soon.fencing_token());
    assert_eq!(soon_row["kind"], "mutex");
    // The shared kinds say theirs.
    let shared = format!("{prefix}shared/");
    let read = LockOptions::new().read().holder("reader");
    let permit = LockOptions::new().permits(3).holder("permit");
    let r = b
        .try_acquire(&format!("{shared}r"), &read)
        .await
        .unwrap()
        .unwrap();
    let p = b
        .try_acquire(&format!("{shared}p"), &permit)
        .await
        .unwrap()
        .unwrap();
    let json = output(dlock(&["watch", "--once", "--json", &url, &shared])).await;
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let kinds: Vec<(&str, &str)> = json
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| (r["holder"].as_str().unwrap(), r["kind"].as_str().unwrap()))
        .collect();
    assert!(kinds.contains(&("reader", "read")), "{kinds:?}");
    assert!(kinds.contains(&("permit", "permit/3")), "{kinds:?}");
    for lease in [late, soon, r, p] {
        b.release(&lease).await.unwrap();
    }
}

/// On a pseudo-terminal the view is redrawn each interval: a lock taken
/// shows up with its holder, and goes once released.
async fn a_terminal_view_follows_the_locks(service: Service) {
    let url = url_of(shared(service).await);
    let prefix = format!("{}/", unique_name("watch-tty"));
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let mut child = dlock(&["watch", "--interval", "200ms", &url, &prefix])
        .stdout(std::process::Stdio::from(pty.slave))
        .spawn()
        .expect("spawn dlock watch");
    let mut screens = screens(std::fs::File::from(pty.master));
    let wait_for = async |screens: &mut mpsc::UnboundedReceiver<String>, wanted: &str| {
        timeout(Duration::from_secs(30), async {
            while let Some(screen) = screens.recv().await {
                if screen.contains(wanted) {
                    return screen;
                }
            }
            panic!("dlock watch ended");
        })
        .await
        .unwrap_or_else(|_| panic!("no screen showed {wanted:?}"))
    };
    wait_for(&mut screens, "0 held locks").await;
    let b = backend(&url).await;
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .holder("tty-holder");
    let lease = b
        .try_acquire(&format!("{prefix}job"), &opts)
        .await
        .unwrap()
        .unwrap();
    let held = wait_for(&mut screens, "tty-holder").await;
    assert!(held.contains("1 held lock"), "{held:?}");
    assert!(
        held.contains("\x1b[1mNAME"),
        "a bold header on a terminal: {held:?}"
    );
    b.release(&lease).await.unwrap();
    wait_for(&mut screens, "0 held locks").await;
    let _ = child.start_kill();
}

/// The screens written to the terminal's `master` side: what follows each
/// "home and clear".
fn screens(mut master: std::fs::File) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut seen = String::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            // Every complete screen: the text between two clears.
            while let Some(start) = seen.find("\x1b[2J") {
                let rest = &seen[start + 4..];
                let Some(end) = rest.find("\x1b[H") else {
                    break;
                };
                if tx.send(rest[..end].to_owned()).is_err() {
                    return;
                }
                seen = rest[end..].to_owned();
            }
        }
    });
    rx
}

macro_rules! backend_tests {
    ($module:ident, $service:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn once_shows_the_holders_and_tokens() {
                once_shows_holders_and_tokens($service).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_terminal_view_refreshes_as_locks_come_and_go() {
                a_terminal_view_follows_the_locks($service).await;
            }
        }
    };
}

backend_tests!(redis, Service::Redis);
backend_tests!(mysql, Service::MariaDb);
backend_tests!(postgres, Service::Postgres);
backend_tests!(zookeeper, Service::ZooKeeper);
backend_tests!(etcd, Service::Etcd);
