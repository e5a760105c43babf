//! etcd's own cases: what the shared suite cannot see from the outside
//! (a waiter's leftovers, the gap between joining and looking, logins).

#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock_conformance::harness::{Server, ServerOptions, Service, shared, start};
use dlock_conformance::proxy::Fault;
use dlock_conformance::support::{
    must_acquire, refused_by_name, unique_name, url_setting_takes_effect,
};
use dlock_core::{Backend, Error, ErrorKind, LockOptions, Locker};
use dlock_etcd::EtcdBackend;
use tokio::time::{Instant, sleep, timeout};

async fn backend() -> EtcdBackend {
    EtcdBackend::connect(shared(Service::Etcd).await.url())
        .await
        .unwrap()
}

/// A hold that nobody renews, as long as the test needs.
fn long() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

#[tokio::test]
async fn a_stale_release_leaves_the_next_holders_key() {
    let backend = backend().await;
    let name = unique_name("stale-release");
    // A lease of the server's shortest TTL, left to expire unrenewed.
    let short = LockOptions::new().ttl(Duration::from_secs(1));
    let stale = must_acquire(&backend, &name, &short).await;
    let next = timeout(
        Duration::from_secs(10),
        backend.acquire(&name, &long().wait(Duration::from_secs(10))),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(next.fencing_token() > stale.fencing_token());
    assert!(matches!(
        backend.release(&stale).await,
        Err(Error::NotHeld { .. })
    ));
    let holder = backend.inspect(&name).await.unwrap().expect("still held");
    assert_eq!(holder.fencing_token, next.fencing_token());
    assert!(backend.try_acquire(&name, &long()).await.unwrap().is_none());
    backend.release(&next).await.unwrap();
}

#[tokio::test]
async fn an_acquire_that_timed_out_leaves_no_key_behind() {
    let backend = backend().await;
    let name = unique_name("timed-out");
    let held = must_acquire(&backend, &name, &long()).await;
    // Dropped while waiting, once its key stands.
    let dropped = tokio::spawn({
        let (backend, name) = (backend.clone(), name.clone());
        async move {
            backend
                .acquire(&name, &long().wait(Duration::from_secs(30)))
                .await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.keys_for_tests(&name).await.unwrap() < 2 {
        assert!(Instant::now() < deadline, "the waiter never joined");
        sleep(Duration::from_millis(5)).await;
    }
    dropped.abort();
    let waiting = long().wait(Duration::from_millis(300));
    for _ in 0..3 {
        assert!(matches!(
            backend.acquire(&name, &waiting).await,
            Err(Error::Timeout { .. })
        ));
    }
    // The waiters' keys went with their leases (30 s TTLs: only a revoke
    // explains their going), right away or on a spawned task.
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.keys_for_tests(&name).await.unwrap() > 1 {
        assert!(Instant::now() < deadline, "a waiter's key was left behind");
        sleep(Duration::from_millis(20)).await;
    }
    backend.release(&held).await.unwrap();
    assert_eq!(backend.keys_for_tests(&name).await.unwrap(), 0);
}

/// A release that lands after a waiter joined the queue and before it
/// looked at it still wakes the waiter: the watch was open before the
/// join, so the delete is waiting in it.
#[tokio::test]
async fn a_release_between_joining_and_looking_wakes_the_waiter() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let url = shared(Service::Etcd).await.url();
    let holder = backend().await;
    let waiter = EtcdBackend::builder(url)
        .pause_after_join_for_tests(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let name = unique_name("gap");
    let held = must_acquire(&holder, &name, &long()).await;
    let opts = long().wait(Duration::from_secs(20));
    let wait = tokio::spawn({
        let (waiter, name) = (waiter.clone(), name.clone());
        async move { waiter.acquire(&name, &opts).await }
    });
    // The waiter's key shows once it joined; it looks 500 ms later.
    let deadline = Instant::now() + Duration::from_secs(5);
    while holder.keys_for_tests(&name).await.unwrap() < 2 {
        assert!(Instant::now() < deadline, "the waiter never joined");
        sleep(Duration::from_millis(5)).await;
    }
    holder.release(&held).await.unwrap();
    // Nothing else frees the name or wakes the waiter (a waiter's timer
    // only renews its lease): a missed release is a timeout.
    let lease = timeout(Duration::from_secs(10), wait)
        .await
        .expect("the waiter heard the release")
        .unwrap()
        .unwrap();
    assert!(lease.fencing_token() > held.fencing_token());
    waiter.release(&lease).await.unwrap();
}

/// A server of its own with authentication on: `root` (the admin etcd
/// requires) and `alice`, who may use the keys under `dlock/` only.
async fn with_authentication(token_ttl_secs: u32) -> Server {
    let server = start(
        Service::Etcd,
        ServerOptions {
            args: vec![format!("--auth-token-ttl={token_ttl_secs}")],
            ..ServerOptions::default()
        },
    )
    .await;
    let id = server.container().unwrap().id().to_owned();
    for command in [
        "user add root:rootpw",
        "user grant-role root root",
        "user add alice:s3cr:et@/x",
        "role add locks",
        "role grant-permission locks --prefix=true readwrite dlock/",
        "user grant-role alice locks",
        "auth enable",
    ] {
        let out = std::process::Command::new("docker")
            .args(["exec", &id, "etcdctl", "--endpoints=127.0.0.1:2379"])
            .args(command.split(' '))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "etcdctl {command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    server
}

fn with_user(server: &Server, credentials: &str) -> String {
    server
        .url()
        .replacen("etcd://", &format!("etcd://{credentials}@"), 1)
}

#[tokio::test]
async fn a_user_with_rights_to_the_prefix_locks_and_waits() {
    // Tokens that expire after a second: every call below comes after the
    // first login's token expired, streams (watch, keep-alive) included.
    let server = with_authentication(1).await;
    let url = with_user(&server, "alice:s3cr%3Aet%40%2Fx");
    let (a, b) = (
        EtcdBackend::connect(&url).await.unwrap(),
        EtcdBackend::connect(&url).await.unwrap(),
    );
    sleep(Duration::from_millis(2500)).await;
    let name = unique_name("auth");
    let mut held = must_acquire(&a, &name, &LockOptions::new()).await;
    sleep(Duration::from_millis(2500)).await;
    a.extend(&mut held).await.unwrap();
    let wait = tokio::spawn({
        let (b, name) = (b.clone(), name.clone());
        async move {
            b.acquire(&name, &LockOptions::new().wait(Duration::from_secs(20)))
                .await
        }
    });
    sleep(Duration::from_millis(2500)).await;
    a.release(&held).await.unwrap();
    let next = timeout(Duration::from_secs(10), wait)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(b.list("", None, 10).await.unwrap().locks.len(), 1);
    b.release(&next).await.unwrap();
}

#[tokio::test]
async fn refused_credentials_are_typed_errors_that_hide_the_password() {
    let server = with_authentication(300).await;
    for credentials in ["alice:wrong-password", "nobody:wrong-password"] {
        let err = EtcdBackend::connect(&with_user(&server, credentials))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Backend { .. }), "{err:?}");
        for shown in [err.to_string(), format!("{err:?}")] {
            assert!(!shown.contains("wrong-password"), "{shown}");
        }
    }
    // Without credentials, a request is refused, never granted.
    let anonymous = EtcdBackend::connect(server.url()).await;
    if let Ok(anonymous) = anonymous {
        let name = unique_name("anonymous");
        assert!(
            anonymous
                .try_acquire(&name, &LockOptions::new())
                .await
                .is_err()
        );
    }
    let builder = EtcdBackend::builder(with_user(&server, "alice:wrong-password"));
    assert!(!format!("{builder:?}").contains("wrong-password"));
}

/// The server restarts while a lock is held, its data on disk: the lease
/// comes back with its TTL restarted and the holder's renewals go on, or
/// the holder is told it lost the lock. Either way, the name is never
/// granted to another client while the holder's lease is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_mid_hold_never_grants_twice() {
    // Judges time against a budget: in its turn (two such at once at most).
    let _turn = dlock_conformance::support::in_turn();
    let server = start(
        Service::Etcd,
        ServerOptions {
            fixed_port: true,
            ..ServerOptions::default()
        },
    )
    .await;
    let connect = || {
        EtcdBackend::builder(server.url())
            .request_timeout(Duration::from_secs(1))
            .connect()
    };
    let holder = Locker::new(connect().await.unwrap());
    let other = connect().await.unwrap();
    let name = unique_name("restart-mid-hold");
    let opts = LockOptions::new().ttl(Duration::from_secs(6));
    let guard = holder.try_acquire(&name, &opts).await.unwrap().unwrap();

    let restarted = Instant::now();
    let id = server.container().unwrap().id().to_owned();
    let out = std::process::Command::new("docker")
        .args(["restart", "-t", "1", &id])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker restart: {out:?}");
    // For two TTLs, the other client tries the name.
    let mut answered = 0;
    while restarted.elapsed() < Duration::from_secs(12) {
        if let Ok(Ok(found)) =
            timeout(Duration::from_secs(2), other.try_acquire(&name, &opts)).await
        {
            answered += 1;
            if let Some(lease) = found {
                let granted = Instant::now();
                let valid_until = guard.valid_until().expect("a TTL lease");
                assert!(
                    valid_until < granted,
                    "granted to another client {:?} before the holder's validity ended",
                    valid_until - granted
                );
                eprintln!("restart mid-hold: the holder lost the lock; granted again after it");
                other.release(&lease).await.unwrap();
                return;
            }
        }
        sleep(Duration::from_millis(100)).await;
    }
    assert!(answered > 0, "the server never answered after its restart");
    assert!(
        guard.is_valid(),
        "the holder renewed its lease after the restart"
    );
    eprintln!("restart mid-hold: the lease came back and the holder kept the lock");
    guard.release().await.unwrap();
}

/// Every builder setting can come in the URL: the prefix named there is
/// the one a backend built with the setter uses, and an unknown parameter
/// is refused by its name.
#[tokio::test]
async fn settings_in_the_url_take_effect_and_unknown_ones_are_refused() {
    let url = shared(Service::Etcd).await.url();
    let with = |query: &str| format!("{url}?{query}");
    let by_url = EtcdBackend::connect(&with("prefix=by-url/&request_timeout=1500ms"))
        .await
        .unwrap();
    let by_setter = EtcdBackend::builder(url)
        .prefix("by-url/")
        .connect()
        .await
        .unwrap();
    url_setting_takes_effect(&by_url, &by_setter, &backend().await, &long()).await;
    refused_by_name(
        EtcdBackend::connect(&with("prefx=s3cret")).await,
        "prefx",
        "s3cret",
    );
}

/// A channel the application made carries every request: the URL's own
/// host (where nothing listens) is never dialled, and a lock taken over
/// the channel is the one the URL's backend sees.
#[tokio::test]
async fn a_channel_the_application_made_carries_the_requests() {
    let url = shared(Service::Etcd).await.url();
    let host = url.trim_start_matches("etcd://");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{host}"))
        .unwrap()
        .connect_lazy();
    // Port 1 of this machine: nobody answers there.
    let over_channel = EtcdBackend::builder("etcd://127.0.0.1:1")
        .channel(channel.clone())
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let name = dlock_conformance::support::unique_name("channel");
    let lease = over_channel.try_acquire(&name, &long()).await.unwrap();
    let lease = lease.expect("a fresh name is free");
    let seen = backend().await.inspect(&name).await.unwrap();
    assert_eq!(seen.map(|i| i.owner), Some(lease.owner()));
    over_channel.release(&lease).await.unwrap();
    // TLS is the channel's: the builder's TLS settings are refused beside
    // it, by name.
    #[cfg(feature = "tls")]
    {
        let both = EtcdBackend::builder("etcds://127.0.0.1:1")
            .channel(channel)
            .tls_ca_certificates("-----BEGIN CERTIFICATE-----")
            .connect()
            .await;
        assert!(
            matches!(
                both,
                Err(Error::InvalidOption {
                    option: "channel",
                    ..
                })
            ),
            "{both:?}"
        );
    }
}

/// Over a link slower than the lease (every byte 1.5 s late each way, TTL
/// 1 s), a wait of 5 s ends as every backend's does: no grant could be made
/// in time (a timeout or a lost connection), never a server error. It was
/// `Error::Backend` "requested lease not found": the lease had ended before
/// the write of its key arrived.
#[tokio::test]
async fn a_link_slower_than_the_lease_ends_in_a_timeout() {
    let url = shared(Service::Etcd).await.url().to_owned();
    let connect = |url: String| async move {
        let backend = EtcdBackend::builder(url)
            .request_timeout(Duration::from_secs(4))
            .connect()
            .await
            .unwrap();
        std::sync::Arc::new(backend) as std::sync::Arc<dyn Backend>
    };
    let (faulty, _) = dlock_conformance::faults::proxied(connect, url);
    let f = faulty().await;
    f.link.set(Fault::Delay(Duration::from_millis(1500)));
    let locker = Locker::from_arc(f.backend.clone());
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Duration::from_secs(5));
    let ran = locker
        .with_lock(&unique_name("slow-link"), &opts, async |_| ())
        .await;
    let kind = ran.as_ref().map_err(Error::kind).err();
    assert!(
        matches!(
            kind,
            Some(ErrorKind::Timeout | ErrorKind::Connection | ErrorKind::Unavailable)
        ),
        "{ran:?}"
    );
}
