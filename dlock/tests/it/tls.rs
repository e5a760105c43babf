//! TLS with certificates the test makes (a private CA), against servers
//! that speak only TLS: Redis on a TLS-only port with an ACL user, MariaDB
//! with `require_secure_transport`, ZooKeeper with only a secure client
//! port, PostgreSQL accepting only `hostssl`, etcd serving only TLS and
//! asking for client certificates. Exercises the `tls` features of the
//! five drivers.

#![cfg(all(
    feature = "redis",
    feature = "mysql",
    feature = "postgres",
    feature = "zookeeper",
    feature = "etcd"
))]
#![allow(clippy::unwrap_used)] // tests panic on purpose

use std::future::Future;
use std::time::Duration;

use dlock::etcd::EtcdBackend;
use dlock::mysql::MySqlBackend;
use dlock::postgres::PgBackend;
use dlock::redis::RedisBackend;
use dlock::zk::ZkBackend;
use dlock::{Backend, Error, LockOptions, Locker};
use dlock_conformance::harness::{ServerOptions, Service, TestCertificates, start};
use dlock_conformance::support::unique_name;
use tokio::time::{Instant, sleep};

fn files(certs: &TestCertificates) -> Vec<(String, Vec<u8>)> {
    vec![
        ("/tmp/ca.crt".to_owned(), certs.ca.clone()),
        ("/tmp/server.crt".to_owned(), certs.server_cert.clone()),
        ("/tmp/server.key".to_owned(), certs.server_key.clone()),
    ]
}

/// A server of its own that speaks only TLS; its host port.
async fn tls_server(
    service: Service,
    args: &[&str],
    files: Vec<(String, Vec<u8>)>,
) -> (dlock_conformance::harness::Server, u16) {
    let server = start(
        service,
        ServerOptions {
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            files,
            skip_probe: true,
            ..ServerOptions::default()
        },
    )
    .await;
    let port = server.port().unwrap();
    (server, port)
}

/// Tries `connect` until the server is up (it has no plain-text probe).
async fn when_up<T, F: Future<Output = dlock::Result<T>>>(mut connect: impl FnMut() -> F) -> T {
    let started = Instant::now();
    loop {
        match connect().await {
            Ok(value) => return value,
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                let _ = e;
                sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the TLS server never answered: {e}"),
        }
    }
}

async fn lock_and_unlock(backend: impl Backend + 'static) {
    let locker = Locker::new(backend);
    let name = unique_name("tls");
    let guard = locker
        .try_acquire(&name, &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    assert!(
        locker
            .try_acquire(&name, &LockOptions::new())
            .await
            .unwrap()
            .is_none()
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_a_private_ca_and_an_acl_user() {
    let certs = TestCertificates::generate();
    let args = [
        "--port",
        "0",
        "--tls-port",
        "6379",
        "--tls-cert-file",
        "/tmp/server.crt",
        "--tls-key-file",
        "/tmp/server.key",
        "--tls-ca-cert-file",
        "/tmp/ca.crt",
        "--tls-auth-clients",
        "no",
    ];
    let (_server, port) = tls_server(Service::Redis, &args, files(&certs)).await;
    let url = format!("rediss://127.0.0.1:{port}");
    let trusted = |url: String| {
        RedisBackend::builder(url)
            .tls_ca_certificates(certs.ca.clone())
            .connect()
    };
    let admin = when_up(|| trusted(url.clone())).await;

    // An ACL user with a password, over TLS.
    let user = unique_name("tls_user");
    let () = dlock::redis::redis::cmd("ACL")
        .arg(&["SETUSER", &user, "on", ">right-pw", "~*", "&*", "+@all"][..])
        .query_async(&mut admin.connection())
        .await
        .unwrap();
    let as_user = trusted(format!("rediss://{user}:right-pw@127.0.0.1:{port}"))
        .await
        .expect("the ACL user connects over TLS");
    lock_and_unlock(as_user).await;
    match trusted(format!("rediss://{user}:wrong-pw@127.0.0.1:{port}")).await {
        Err(e @ Error::Backend { .. }) => {
            assert!(e.to_string().contains("authentication"), "{e}");
            assert!(!e.is_retryable());
        }
        other => panic!("a wrong password: expected an authentication error, got {other:?}"),
    }
    lock_and_unlock(admin).await;

    // The web's roots do not vouch for the private CA; plain text gets
    // nowhere. Both are errors, never grants.
    let untrusted = RedisBackend::connect(&url).await;
    assert!(
        untrusted.is_err(),
        "a server the client cannot verify was accepted"
    );
    let plain = RedisBackend::builder(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(2))
        .connect()
        .await;
    assert!(plain.is_err(), "plain text reached a TLS-only port");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_requiring_secure_transport() {
    let certs = TestCertificates::generate();
    let args = [
        "--ssl-ca=/tmp/ca.crt",
        "--ssl-cert=/tmp/server.crt",
        "--ssl-key=/tmp/server.key",
        "--require-secure-transport=ON",
    ];
    let (_server, port) = tls_server(Service::MariaDb, &args, files(&certs)).await;
    let ca = std::env::temp_dir().join(format!("dlock-ca-{}.crt", unique_name("ca")));
    std::fs::write(&ca, &certs.ca).unwrap();
    let url = format!(
        "mysql://dlock:dlock@127.0.0.1:{port}/dlock?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
        ca.display()
    );
    let backend = when_up(|| MySqlBackend::connect(&url)).await;
    lock_and_unlock(backend).await;

    // The session really is encrypted.
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    let (_, cipher): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(!cipher.is_empty(), "the connection is not encrypted");

    let plain = format!("mysql://dlock:dlock@127.0.0.1:{port}/dlock?ssl-mode=DISABLED");
    match MySqlBackend::connect(&plain).await {
        Err(Error::Backend { .. }) => {}
        other => panic!("plain text to a server requiring TLS: {other:?}"),
    }
    let _ = std::fs::remove_file(ca);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_verify_full_with_a_private_ca() {
    let certs = TestCertificates::generate();
    let (_server, port) = tls_server(Service::Postgres, &[], files(&certs)).await;
    let ca = std::env::temp_dir().join(format!("dlock-ca-{}.crt", unique_name("ca")));
    std::fs::write(&ca, &certs.ca).unwrap();
    let base = format!("postgres://dlock:dlock@127.0.0.1:{port}/dlock");
    let url = format!("{base}?sslmode=verify-full&sslrootcert={}", ca.display());
    let backend = when_up(|| PgBackend::connect(&url)).await;
    lock_and_unlock(backend).await;

    // The session really is encrypted.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (ssl,): (bool,) =
        sqlx::query_as("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(ssl, "the connection is not encrypted");
    pool.close().await;

    // Plain text is refused by the server; a certificate the client cannot
    // verify (no private CA given, so only the web's roots) by the client.
    // Both are errors, never grants.
    match PgBackend::connect(&format!("{base}?sslmode=disable")).await {
        Err(Error::Backend { .. }) => {}
        other => panic!("plain text to a server requiring TLS: {other:?}"),
    }
    let unverified = PgBackend::connect(&format!("{base}?sslmode=verify-full")).await;
    assert!(
        unverified.is_err(),
        "a server the client cannot verify was accepted"
    );
    let _ = std::fs::remove_file(ca);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_with_only_a_secure_client_port() {
    let certs = TestCertificates::generate();
    let mut pem = certs.server_key.clone();
    pem.extend_from_slice(&certs.server_cert);
    let config = "clientPort=2182
secureClientPort=2181
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
ssl.keyStore.location=/tmp/server.pem
ssl.keyStore.type=PEM
ssl.trustStore.location=/tmp/ca.crt
ssl.trustStore.type=PEM
ssl.clientAuth=none
";
    let files = vec![
        ("/tmp/server.pem".to_owned(), pem),
        ("/tmp/ca.crt".to_owned(), certs.ca.clone()),
        ("/tmp/zoo-extra.cfg".to_owned(), config.as_bytes().to_vec()),
    ];
    let (_server, port) = tls_server(Service::ZooKeeper, &[], files).await;
    let ca = String::from_utf8(certs.ca.clone()).unwrap();
    let backend = when_up(|| {
        ZkBackend::builder(format!("127.0.0.1:{port}"))
            .tls_ca_certificates(ca.clone())
            .connect_timeout(Duration::from_secs(2))
            .connect()
    })
    .await;
    lock_and_unlock(backend).await;

    let plain = ZkBackend::builder(format!("127.0.0.1:{port}"))
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await;
    assert!(plain.is_err(), "plain text reached a TLS-only port");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_with_client_certificates_and_a_private_ca() {
    let certs = TestCertificates::generate();
    let args = [
        "--listen-client-urls=https://0.0.0.0:2379",
        "--cert-file=/tmp/server.crt",
        "--key-file=/tmp/server.key",
        "--client-cert-auth",
        "--trusted-ca-file=/tmp/ca.crt",
    ];
    let (_server, port) = tls_server(Service::Etcd, &args, files(&certs)).await;
    let url = format!("etcds://127.0.0.1:{port}");
    let pem = |bytes: &[u8]| String::from_utf8(bytes.to_vec()).unwrap();
    // The server's certificate has no key usage limits: it serves as the
    // client's too, signed by the CA the server trusts.
    let backend = when_up(|| {
        EtcdBackend::builder(url.clone())
            .tls_ca_certificates(pem(&certs.ca))
            .tls_client_identity(pem(&certs.server_cert), pem(&certs.server_key))
            .connect_timeout(Duration::from_secs(2))
            .connect()
    })
    .await;
    lock_and_unlock(backend).await;

    // Without a client certificate, with the web's roots (which do not
    // vouch for the private CA), or in plain text: errors, never grants.
    let attempts = [
        EtcdBackend::builder(url.clone()).tls_ca_certificates(pem(&certs.ca)),
        EtcdBackend::builder(url.clone())
            .tls_client_identity(pem(&certs.server_cert), pem(&certs.server_key)),
        EtcdBackend::builder(format!("etcd://127.0.0.1:{port}")),
    ];
    for (i, builder) in attempts.into_iter().enumerate() {
        let refused = builder
            .connect_timeout(Duration::from_secs(2))
            .request_timeout(Duration::from_secs(2))
            .connect()
            .await;
        assert!(refused.is_err(), "attempt {i} connected: {refused:?}");
    }
}
