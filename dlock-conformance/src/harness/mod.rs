//! Real servers for tests: Redis, MariaDB, PostgreSQL (alone and behind
//! PgBouncer), ZooKeeper and etcd started with
//! testcontainers from the project's test image, or servers the user already
//! runs, named by environment variables.
//!
//! | variable | meaning |
//! |---|---|
//! | `DLOCK_REDIS_URL` | use this Redis (`redis://127.0.0.1:6379`) instead of a container |
//! | `DLOCK_MYSQL_URL` | use this MySQL/MariaDB (`mysql://user:pw@127.0.0.1:3306/db`) |
//! | `DLOCK_POSTGRES_URL` | use this PostgreSQL (`postgres://user:pw@127.0.0.1:5432/db`) |
//! | `DLOCK_PGBOUNCER_URL` | use this PgBouncer, in transaction pooling mode |
//! | `DLOCK_ZK_CONNECT` | use this ZooKeeper (`127.0.0.1:2181`) |
//! | `DLOCK_ETCD_URL` | use this etcd (`etcd://127.0.0.1:2379`) |
//! | `DLOCK_TEST_IMAGE` | start containers from this image instead of building `testbed/` |
//!
//! Containers publish their port on 127.0.0.1 only, carry the label
//! `dlock.harness`, and are removed when the test process exits.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the services, and starting their servers |
//! | `image.rs` | the test image the containers start from |
//! | `ready.rs` | waiting until a server answers its own protocol |
//! | `certs.rs` | certificates for TLS tests |
//! | `cleanup.rs` | removing containers and networks at exit |

use std::collections::HashMap;
use std::future::Future;
use std::net::TcpListener;
use std::sync::LazyLock;

use testcontainers::bollard::models::PortBinding;
use testcontainers::core::{ContainerPort, IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio::runtime::Runtime;
use tokio::sync::OnceCell;

mod certs;
mod cleanup;
mod image;
mod ready;

pub use certs::TestCertificates;
pub(crate) use cleanup::{register_for_cleanup, register_network_for_cleanup};
pub use image::image_build_time;
pub(crate) use image::test_image;
pub use ready::wait_ready;
pub(crate) use ready::{ask, four_letter_word};

/// The password of the `dlock` user in the test MariaDB.
pub const MYSQL_PASSWORD: &str = "dlock";

/// The password of the `dlock` role in the test PostgreSQL and PgBouncer.
pub const POSTGRES_PASSWORD: &str = "dlock";

/// The servers the harness can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// redis-server, no persistence.
    Redis,
    /// mariadbd with database `dlock` and user `dlock`.
    MariaDb,
    /// A standalone ZooKeeper.
    ZooKeeper,
    /// PostgreSQL 15 with database `dlock` and role `dlock`.
    Postgres,
    /// PgBouncer in transaction pooling mode, in front of a PostgreSQL as
    /// [`Service::Postgres`] in the same container.
    PgBouncer,
    /// A single-node etcd 3.4.
    Etcd,
}

impl Service {
    /// Every service.
    pub const ALL: [Service; 6] = [
        Service::Redis,
        Service::MariaDb,
        Service::ZooKeeper,
        Service::Postgres,
        Service::PgBouncer,
        Service::Etcd,
    ];

    pub(crate) fn port(self) -> u16 {
        match self {
            Service::Redis => 6379,
            Service::MariaDb => 3306,
            Service::ZooKeeper => 2181,
            Service::Postgres => 5432,
            Service::PgBouncer => 6432,
            Service::Etcd => 2379,
        }
    }

    pub(crate) fn command(self) -> &'static str {
        match self {
            Service::Redis => "dlock-redis",
            Service::MariaDb => "dlock-mariadb",
            Service::ZooKeeper => "dlock-zookeeper",
            Service::Postgres => "dlock-postgres",
            Service::PgBouncer => "dlock-pgbouncer",
            Service::Etcd => "dlock-etcd",
        }
    }

    /// The variable naming a running server to use instead of a container
    /// (read by [`try_shared`]).
    pub fn env_override(self) -> &'static str {
        match self {
            Service::Redis => "DLOCK_REDIS_URL",
            Service::MariaDb => "DLOCK_MYSQL_URL",
            Service::ZooKeeper => "DLOCK_ZK_CONNECT",
            Service::Postgres => "DLOCK_POSTGRES_URL",
            Service::PgBouncer => "DLOCK_PGBOUNCER_URL",
            Service::Etcd => "DLOCK_ETCD_URL",
        }
    }

    fn url(self, port: u16) -> String {
        self.url_at("127.0.0.1", port)
    }

    /// Where a client connects to this service's server at `host:port`.
    pub(crate) fn url_at(self, host: &str, port: u16) -> String {
        match self {
            Service::Redis => format!("redis://{host}:{port}"),
            Service::MariaDb => format!("mysql://dlock:{MYSQL_PASSWORD}@{host}:{port}/dlock"),
            Service::ZooKeeper => format!("{host}:{port}"),
            Service::Postgres | Service::PgBouncer => {
                format!("postgres://dlock:{POSTGRES_PASSWORD}@{host}:{port}/dlock")
            }
            Service::Etcd => format!("etcd://{host}:{port}"),
        }
    }
}

/// How to start a server of one's own.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Keep the same host port across stop/start (for restart tests);
    /// otherwise Docker picks one and a restart may change it.
    pub fixed_port: bool,
    /// Extra arguments to the server's start script.
    pub args: Vec<String>,
    /// Files to place in the container before it starts: (path, contents).
    pub files: Vec<(String, Vec<u8>)>,
    /// Do not wait for the server's plain-protocol readiness probe (for a
    /// server that speaks only TLS, say): the caller waits in its own way.
    pub skip_probe: bool,
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    service: Service,
    url: String,
    port: Option<u16>,
    container: Option<ContainerAsync<GenericImage>>,
}

impl Server {
    /// Where to connect: a Redis or MySQL URL, or a ZooKeeper connect string
    /// (`host:port`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server kind.
    pub fn service(&self) -> Service {
        self.service
    }

    /// The host port on 127.0.0.1, when the harness started the server.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The container, when the harness started the server.
    pub fn container(&self) -> Option<&ContainerAsync<GenericImage>> {
        self.container.as_ref()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(container) = self.container.take() {
            // Removal blocks on the Docker API; do it on the harness runtime,
            // which outlives the test's own.
            RUNTIME.spawn(async move { drop(container) });
        }
    }
}

/// The shared server of one kind, started once per test process.
///
/// # Panics
/// When Docker cannot be reached or the server does not come up: a container
/// test must fail loudly, never pass by skipping.
pub async fn shared(service: Service) -> &'static Server {
    try_shared(service).await.unwrap_or_else(|e| panic!("{e}"))
}

/// [`shared`], with a failure to start the server as a one-paragraph
/// message instead of a panic: for programs such as the benchmark.
///
/// # Errors
/// What went wrong and what to do about it.
pub async fn try_shared(service: Service) -> Result<&'static Server, String> {
    static SHARED: LazyLock<HashMap<Service, OnceCell<Server>>> = LazyLock::new(|| {
        Service::ALL
            .into_iter()
            .map(|s| (s, OnceCell::new()))
            .collect()
    });
    let Some(cell) = SHARED.get(&service) else {
        unreachable!("every service has a cell")
    };
    cell.get_or_try_init(|| async move {
        if let Ok(url) = std::env::var(service.env_override()) {
            return Ok(Server {
                service,
                url,
                port: None,
                container: None,
            });
        }
        on_harness(start_container(service, ServerOptions::default())).await
    })
    .await
}

/// Starts a server of one's own (for tests that stop, pause or restart it).
///
/// # Panics
/// As [`shared`].
pub async fn start(service: Service, options: ServerOptions) -> Server {
    try_start(service, options)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// [`start`], saying why instead of panicking when the server cannot be
/// started (no Docker, no image).
pub async fn try_start(service: Service, options: ServerOptions) -> Result<Server, String> {
    on_harness(start_container(service, options)).await
}

/// The runtime all Docker calls run on. Tests each have their own runtime,
/// which ends with the test; the Docker client's connections must outlive
/// any one of them.
pub(crate) static RUNTIME: LazyLock<Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("dlock-harness")
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("dlock harness: cannot start its runtime: {e}"))
});

/// Runs `fut` on the harness runtime and waits for it from any runtime.
pub async fn on_harness<T: Send + 'static>(fut: impl Future<Output = T> + Send + 'static) -> T {
    match RUNTIME.spawn(fut).await {
        Ok(value) => value,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Where the README says how to get Docker and the test image ready.
const README_STEP: &str = "see \"Running the tests\" in the README";

async fn start_container(service: Service, options: ServerOptions) -> Result<Server, String> {
    let image = test_image()?;
    // A host port is chosen apart from its binding (by us for a fixed
    // port, by Docker's allocator otherwise), and another process starting
    // a container at the same moment may take it in between: Docker then
    // answers "port is already allocated". That start is made again, on
    // another port.
    let mut attempts = 0;
    let container = loop {
        attempts += 1;
        let host_port = if options.fixed_port {
            Some(free_port()?)
        } else {
            None
        };
        match start_once(service, &options, &image, host_port).await {
            Err(e) if attempts < 5 && port_taken(&e) => {
                eprintln!("dlock harness: a {service:?} container's port was taken ({e}); starting it again");
            }
            done => break done,
        }
    }
    .map_err(|e| {
        format!(
            "dlock harness: cannot start a {service:?} container from image {image}: {e}\n\
             The container tests need a running Docker engine and the test image; {README_STEP}."
        )
    })?;
    let port = service.port();
    register_for_cleanup(container.id());
    let host_port = container
        .get_host_port_ipv4(ContainerPort::Tcp(port))
        .await
        .map_err(|e| format!("dlock harness: {service:?} container has no port: {e}"))?;
    let url = service.url(host_port);
    if !options.skip_probe
        && let Err(e) = wait_ready(service, &url).await
    {
        return Err(format!("{e}\n{}", last_words(&container).await));
    }
    Ok(Server {
        service,
        url,
        port: Some(host_port),
        container: Some(container),
    })
}

/// Whether Docker refused a container for a host port already bound.
fn port_taken(e: &testcontainers::TestcontainersError) -> bool {
    let text = e.to_string();
    text.contains("port is already allocated") || text.contains("address already in use")
}

/// One start of a container for `service`, as `options` ask, its port
/// published on `host_port` (`None`: one Docker picks).
async fn start_once(
    service: Service,
    options: &ServerOptions,
    image: &str,
    host_port: Option<u16>,
) -> Result<ContainerAsync<GenericImage>, testcontainers::TestcontainersError> {
    let (repo, tag) = image.split_once(':').unwrap_or((image, "latest"));
    let port = service.port();
    let start = format!("{:016x}", fastrand::u64(..));
    let binding_key = format!("{port}/tcp");
    let mut cmd = vec![service.command().to_owned()];
    // The test etcd keeps its data in memory, for speed; one that a test
    // stops and starts again keeps it on disk, as a real server does.
    if service == Service::Etcd && options.fixed_port {
        cmd.extend(["--data-dir".to_owned(), "/var/lib/dlock-etcd".to_owned()]);
    }
    cmd.extend(options.args.iter().cloned());
    let mut request = GenericImage::new(repo, tag)
        .with_exposed_port(port.tcp())
        .with_wait_for(WaitFor::Nothing)
        .with_cmd(cmd)
        .with_label("dlock.harness", std::process::id().to_string())
        .with_label("dlock.start", start.clone())
        .with_host_config_modifier(move |host| {
            // Published ports listen on every interface unless bound here.
            host.publish_all_ports = Some(false);
            host.port_bindings = Some(HashMap::from([(
                binding_key.clone(),
                Some(vec![PortBinding {
                    host_ip: Some("127.0.0.1".to_owned()),
                    host_port: host_port.map(|p| p.to_string()),
                }]),
            )]));
        });
    if service == Service::Etcd {
        // The test etcd keeps its data in /dev/shm, whose 64 MiB default
        // one preallocated 64 MiB log segment fills.
        request = request.with_shm_size(1 << 30);
    }
    for (path, contents) in &options.files {
        request = request.with_copy_to(path.clone(), contents.clone());
    }
    let started = request.start().await;
    if started.is_err() {
        cleanup::remove_failed_start(&start);
    }
    started
}

/// What a container that did not come up said last, and whether it still
/// runs: the reason, in the failure's own message.
pub(crate) async fn last_words(container: &ContainerAsync<GenericImage>) -> String {
    let tail = |bytes: Vec<u8>| {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    };
    let stdout = container
        .stdout_to_vec()
        .await
        .map(tail)
        .unwrap_or_default();
    let stderr = container
        .stderr_to_vec()
        .await
        .map(tail)
        .unwrap_or_default();
    let running = container.is_running().await.ok();
    let exit = container.exit_code().await.ok().flatten();
    format!(
        "the container is running: {running:?}, exit code {exit:?}\n\
         --- its stdout (last lines) ---\n{stdout}\n--- its stderr (last lines) ---\n{stderr}"
    )
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("dlock harness: no free port: {e}"))
}

/// A port on 127.0.0.1 that nothing listens on, for "server is down" tests.
///
/// # Panics
/// When the OS has no free port to give.
pub fn unused_port() -> u16 {
    free_port().unwrap_or_else(|e| panic!("{e}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests panic on purpose

    use super::*;

    /// Docker's answer to a container whose host port is taken is told
    /// apart from other failures, so that a start that lost the port to
    /// another process is made again.
    #[test]
    fn a_taken_port_is_told_apart() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let image = test_image().unwrap();
        let options = ServerOptions::default();
        let refused = RUNTIME.block_on(start_once(Service::Redis, &options, &image, Some(port)));
        let error = refused.expect_err("a port bound already");
        assert!(port_taken(&error), "not told apart: {error}");
        drop(held);
        // The container Docker created for the failed start is gone.
        let left = std::process::Command::new("docker")
            .args(["ps", "-aq", "--filter", "label=dlock.harness"])
            .arg(format!("label=dlock.harness={}", std::process::id()))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&left.stdout).trim(),
            "",
            "a failed start left its container"
        );
    }
}
