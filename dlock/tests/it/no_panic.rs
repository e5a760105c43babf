//! Bad input never panics: random options, durations, names and URLs
//! thrown at every public constructor, builder and option. Any result is
//! fine, a typed error most of all; a panic fails the test.
//!
//! Connecting tests reach only 127.0.0.1 ports that nothing listens on (or
//! no host at all), so nothing leaves the machine, and each connect is cut
//! off after a few seconds: hanging is not what they test.

#![cfg(all(feature = "redis", feature = "mysql", feature = "zookeeper"))]
#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::time::Duration;

use dlock::{Lease, LockOptions, Locker, MemoryBackend, OwnerToken};
use dlock_conformance::harness::unused_port;
use dlock_core::driver::wait::{Backoff, Deadline, jitter};
use proptest::prelude::*;
use proptest::sample::select;
use tokio::time::Instant;

/// Durations from the edges (zero, one nanosecond, `Duration::MAX`) and
/// from anywhere in between.
fn duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        select(vec![
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_millis(1),
            Duration::from_millis(10),
            Duration::from_secs(1),
            Duration::from_secs(24 * 3600),
            Duration::from_secs(u64::MAX),
            Duration::MAX,
        ]),
        (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        (0u64..100_000).prop_map(Duration::from_millis),
    ]
}

/// Text of awkward characters that cannot end a URL's user-info part, so
/// that no random text ever becomes a host name (and a DNS query).
fn junk() -> impl Strategy<Value = String> {
    let chars = select(vec![
        'a', 'Z', '0', '9', '%', '%', '2', 'F', 'e', ' ', '{', '}', '\\', '"', '\'', '~', '!', '$',
        '&', '(', '*', '+', ',', ';', '=', '|', 'é', '🔒', '\u{0}', '\t', '\n',
    ]);
    proptest::collection::vec(chars, 0..12).prop_map(|c| c.into_iter().collect())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs a connect, giving up quietly after a few seconds.
async fn bounded<T>(connect: impl Future<Output = T>) {
    let _ = tokio::time::timeout(Duration::from_secs(2), connect).await;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn options_leases_and_wait_helpers_never_panic(
        ttl in duration(),
        wait in duration(),
        drift in duration(),
        other in duration(),
        renew in any::<bool>(),
        forever in any::<bool>(),
        name in junk(),
    ) {
        let mut opts = LockOptions::new().ttl(ttl).drift(drift).renew(renew);
        opts = if forever { opts.wait_forever() } else { opts.wait(wait) };
        let _ = opts.validate();
        let _ = opts.get_drift();
        let now = Instant::now();
        let _ = opts.valid_until(now);
        let mut lease = Lease::with_ttl(name.clone(), OwnerToken::from_u128(7), 1, &opts, now);
        lease.extended(now);
        let _ = lease.is_valid();
        let deadline = Deadline::after(Some(wait));
        let _ = (deadline.cap(other), deadline.cut_off(other), deadline.is_past());
        let mut backoff = Backoff::new(ttl, wait);
        for _ in 0..70 {
            prop_assert!(backoff.next_delay() > Duration::ZERO, "a zero backoff is a busy loop");
        }
        let _ = jitter(other);
        let _ = dlock::validate_name(&name);
        runtime().block_on(async {
            let locker = Locker::new(MemoryBackend::new());
            if let Ok(Some(guard)) = locker.try_acquire(&name, &opts).await {
                let _ = guard.is_valid();
                drop(guard);
            }
            let quick = opts.clone().wait(Duration::ZERO);
            let _ = locker.acquire(&name, &quick).await;
            let _ = locker.with_lock(&name, &quick, async |_| ()).await;
        });
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn driver_builders_never_panic(
        a in duration(),
        b in duration(),
        c in duration(),
        n in any::<u32>(),
        text in junk(),
    ) {
        let port = unused_port();
        runtime().block_on(async {
            let redis = format!("redis://127.0.0.1:{port}");
            bounded(
                dlock::redis::RedisBackend::builder(&redis)
                    .max_poll_interval(a)
                    .request_timeout(b)
                    .connect_timeout(c)
                    .prefix(text.clone())
                    .connect(),
            )
            .await;
            let mysql = format!("mysql://u:p@127.0.0.1:{port}/db");
            bounded(
                dlock::mysql::MySqlBackend::builder(&mysql)
                    .connect_timeout(a)
                    .request_timeout(b)
                    .max_connections(n)
                    .table(text.clone())
                    .connect(),
            )
            .await;
            bounded(
                dlock::zk::ZkBackend::builder(format!("zk://127.0.0.1:{port}"))
                    .session_timeout(a)
                    .connect_timeout(b)
                    .request_timeout(c)
                    .root(format!("/{text}"))
                    .digest_auth(text.clone(), text.clone())
                    .connect(),
            )
            .await;
        });
    }

    #[test]
    fn urls_never_panic(
        scheme in select(vec![
            "redis", "rediss", "redis+unix", "mysql", "mariadb", "zk", "zookeeper",
            "memory", "postgres", "", "REDIS",
        ]),
        user in junk(),
        password in junk(),
        host in select(vec!["127.0.0.1", ""]),
        port in prop_oneof![Just(None), Just(Some("0".to_owned())), Just(Some("99999999".to_owned())), Just(Some("x".to_owned())), Just(Some(String::new()))],
        path in junk(),
        query in junk(),
    ) {
        let port = port.unwrap_or_else(|| unused_port().to_string());
        let urls = [
            format!("{scheme}://{user}:{password}@{host}:{port}/{path}?{query}"),
            format!("{scheme}://{host}:{port}/{path}"),
            format!("{scheme}://{user}@{host}"),
            format!("{scheme}:{path}"),
            format!("{scheme}://{host}:{port}#{query}"),
        ];
        runtime().block_on(async {
            for url in &urls {
                bounded(dlock::connect(url)).await;
            }
        });
    }
}
