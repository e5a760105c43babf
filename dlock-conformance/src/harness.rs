//! Real servers for tests: Redis, MariaDB and ZooKeeper started with
//! testcontainers from the project's test image, or servers the user already
//! runs, named by environment variables.
//!
//! | variable | meaning |
//! |---|---|
//! | `DLOCK_REDIS_URL` | use this Redis (`redis://127.0.0.1:6379`) instead of a container |
//! | `DLOCK_MYSQL_URL` | use this MySQL/MariaDB (`mysql://user:pw@127.0.0.1:3306/db`) |
//! | `DLOCK_ZK_CONNECT` | use this ZooKeeper (`127.0.0.1:2181`) |
//! | `DLOCK_TEST_IMAGE` | start containers from this image instead of building `testbed/` |
//!
//! Containers publish their port on 127.0.0.1 only, carry the label
//! `dlock.harness`, and are removed when the test process exits.

use std::collections::HashMap;
use std::future::Future;
use std::net::TcpListener;
use std::process::Command;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use testcontainers::bollard::models::PortBinding;
use testcontainers::core::{ContainerPort, IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use tokio::sync::OnceCell;
use tokio::time::{Instant, sleep};

/// How long a server may take to answer its readiness probe.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one probe may wait for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The password of the `dlock` user in the test MariaDB.
pub const MYSQL_PASSWORD: &str = "dlock";

/// The servers the harness can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// redis-server, no persistence.
    Redis,
    /// mariadbd with database `dlock` and user `dlock`.
    MariaDb,
    /// A standalone ZooKeeper.
    ZooKeeper,
}

impl Service {
    fn port(self) -> u16 {
        match self {
            Service::Redis => 6379,
            Service::MariaDb => 3306,
            Service::ZooKeeper => 2181,
        }
    }

    fn command(self) -> &'static str {
        match self {
            Service::Redis => "dlock-redis",
            Service::MariaDb => "dlock-mariadb",
            Service::ZooKeeper => "dlock-zookeeper",
        }
    }

    fn env_override(self) -> &'static str {
        match self {
            Service::Redis => "DLOCK_REDIS_URL",
            Service::MariaDb => "DLOCK_MYSQL_URL",
            Service::ZooKeeper => "DLOCK_ZK_CONNECT",
        }
    }

    fn url(self, port: u16) -> String {
        match self {
            Service::Redis => format!("redis://127.0.0.1:{port}"),
            Service::MariaDb => format!("mysql://dlock:{MYSQL_PASSWORD}@127.0.0.1:{port}/dlock"),
            Service::ZooKeeper => format!("127.0.0.1:{port}"),
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

/// A CA and a server certificate for `127.0.0.1` and `localhost`, made
/// fresh with the `openssl` command, for TLS tests.
#[derive(Debug, Clone)]
pub struct TestCertificates {
    /// The CA certificate, PEM.
    pub ca: Vec<u8>,
    /// The server certificate, signed by the CA, PEM.
    pub server_cert: Vec<u8>,
    /// The server's private key, PEM.
    pub server_key: Vec<u8>,
}

impl TestCertificates {
    /// Makes a CA and a server certificate in a scratch folder.
    ///
    /// # Panics
    /// When the `openssl` command is missing or fails: TLS tests must fail
    /// loudly, never skip.
    pub fn generate() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "dlock-certs-{}-{:x}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("scratch folder: {e}"));
        let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let ext = path("ext.cnf");
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap_or_else(|e| panic!("write {ext}: {e}"));
        let steps: [Vec<String>; 3] = [
            [
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=dlock test CA",
                "-keyout",
                &path("ca.key"),
                "-out",
                &path("ca.crt"),
            ]
            .map(str::to_owned)
            .to_vec(),
            [
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=localhost",
                "-keyout",
                &path("server.key"),
                "-out",
                &path("server.csr"),
            ]
            .map(str::to_owned)
            .to_vec(),
            [
                "x509",
                "-req",
                "-in",
                &path("server.csr"),
                "-CA",
                &path("ca.crt"),
                "-CAkey",
                &path("ca.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &path("server.crt"),
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for args in steps {
            let out = Command::new("openssl")
                .args(&args)
                .output()
                .unwrap_or_else(|e| {
                    panic!("TLS tests need the `openssl` command (apt-get install openssl): {e}")
                });
            assert!(
                out.status.success(),
                "openssl {} failed: {}",
                args[0],
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let read = |f: &str| std::fs::read(path(f)).unwrap_or_else(|e| panic!("read {f}: {e}"));
        let certs = TestCertificates {
            ca: read("ca.crt"),
            server_cert: read("server.crt"),
            server_key: read("server.key"),
        };
        let _ = std::fs::remove_dir_all(&dir);
        certs
    }
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
        [Service::Redis, Service::MariaDb, Service::ZooKeeper]
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
    on_harness(start_container(service, options))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
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

const README_STEP: &str = "see \"Running the tests\" in the README";

async fn start_container(service: Service, options: ServerOptions) -> Result<Server, String> {
    let image = test_image()?;
    let (repo, tag) = image.split_once(':').unwrap_or((image.as_str(), "latest"));
    let port = service.port();
    let host_port = if options.fixed_port {
        Some(free_port()?)
    } else {
        None
    };
    let binding_key = format!("{port}/tcp");
    let mut cmd = vec![service.command().to_owned()];
    cmd.extend(options.args.iter().cloned());
    let mut request = GenericImage::new(repo, tag)
        .with_exposed_port(port.tcp())
        .with_wait_for(WaitFor::Nothing)
        .with_cmd(cmd)
        .with_label("dlock.harness", std::process::id().to_string())
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
    for (path, contents) in options.files {
        request = request.with_copy_to(path, contents);
    }
    let container = request.start().await.map_err(|e| {
        format!(
            "dlock harness: cannot start a {service:?} container from image {image}: {e}\n\
             The container tests need a running Docker engine and the test image; {README_STEP}."
        )
    })?;
    register_for_cleanup(container.id());
    let host_port = container
        .get_host_port_ipv4(ContainerPort::Tcp(port))
        .await
        .map_err(|e| format!("dlock harness: {service:?} container has no port: {e}"))?;
    let url = service.url(host_port);
    if !options.skip_probe {
        wait_ready(service, &url).await?;
    }
    Ok(Server {
        service,
        url,
        port: Some(host_port),
        container: Some(container),
    })
}

/// How long this process has spent building the test image: done builds,
/// plus the one in progress.
static IMAGE_BUILD: Mutex<(Duration, Option<std::time::Instant>)> =
    Mutex::new((Duration::ZERO, None));

/// Time spent building the test image so far, which case time limits do
/// not count: on a fresh machine the first case to need a server waits
/// for the image (a minute or two) before its own work starts.
pub fn image_build_time() -> Duration {
    let build = IMAGE_BUILD.lock().unwrap_or_else(PoisonError::into_inner);
    build.0 + build.1.map_or(Duration::ZERO, |started| started.elapsed())
}

/// The image to start: `DLOCK_TEST_IMAGE`, or the one `testbed/build-image.sh`
/// builds (it returns at once when the image exists).
pub(crate) fn test_image() -> Result<String, String> {
    // Whoever starts a container first clears what killed runs left.
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(remove_stale_containers);
    static IMAGE: LazyLock<Result<String, String>> = LazyLock::new(|| {
        if let Ok(image) = std::env::var("DLOCK_TEST_IMAGE") {
            return Ok(image);
        }
        IMAGE_BUILD.lock().unwrap_or_else(PoisonError::into_inner).1 =
            Some(std::time::Instant::now());
        let built = build_image();
        let mut build = IMAGE_BUILD.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(started) = build.1.take() {
            build.0 += started.elapsed();
        }
        built
    });
    IMAGE.clone()
}

/// Runs `testbed/build-image.sh`, which prints the image reference.
fn build_image() -> Result<String, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../testbed/build-image.sh");
    let out = Command::new("bash").arg(script).output().map_err(|e| {
        format!("dlock harness: cannot run {script}: {e}; set DLOCK_TEST_IMAGE or {README_STEP}")
    })?;
    if !out.status.success() {
        return Err(format!(
            "dlock harness: {script} failed; {README_STEP}.\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
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

/// Polls the server's own protocol until it answers.
pub async fn wait_ready(service: Service, url: &str) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let probe = async {
            match service {
                Service::Redis => probe_redis(url).await,
                Service::MariaDb => probe_mysql(url).await,
                Service::ZooKeeper => probe_zookeeper(url).await,
            }
        };
        // A server that accepts a connection but does not answer yet must
        // not hold the probe forever.
        let probe = tokio::time::timeout(PROBE_TIMEOUT, probe)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {PROBE_TIMEOUT:?}")));
        match probe {
            Ok(()) => return Ok(()),
            Err(e) if started.elapsed() > READY_TIMEOUT => {
                return Err(format!(
                    "dlock harness: {service:?} at {url} not ready after {READY_TIMEOUT:?}: {e}"
                ));
            }
            Err(_) => sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn probe_redis(url: &str) -> Result<(), String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let pong: String = redis::cmd("PING")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    (pong == "PONG").then_some(()).ok_or(pong)
}

async fn probe_mysql(url: &str) -> Result<(), String> {
    use sqlx::Connection;
    let mut conn = sqlx::MySqlConnection::connect(url)
        .await
        .map_err(|e| e.to_string())?;
    let one: i64 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    (one == 1).then_some(()).ok_or_else(|| one.to_string())
}

/// ZooKeeper's `srvr` four-letter word: it reports a `Mode:` line only once
/// the server is serving.
async fn probe_zookeeper(connect: &str) -> Result<(), String> {
    let addr = connect.split(',').next().unwrap_or(connect);
    let reply = four_letter_word(addr, "srvr").await?;
    reply.contains("Mode:").then_some(()).ok_or(reply)
}

/// Asks a ZooKeeper server at `addr` one of its four-letter words.
pub(crate) async fn four_letter_word(addr: &str, word: &str) -> Result<String, String> {
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        stream
            .write_all(word.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut reply = String::new();
        stream
            .read_to_string(&mut reply)
            .await
            .map_err(|e| e.to_string())?;
        Ok(reply)
    };
    tokio::time::timeout(PROBE_TIMEOUT, ask)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {PROBE_TIMEOUT:?}")))
}

static CONTAINERS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static NETWORKS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Remembers a network to remove at exit, after the containers.
pub(crate) fn register_network_for_cleanup(name: &str) {
    install_exit_hook();
    NETWORKS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(name.to_owned());
}

/// Remembers a container so that it is removed when the process exits:
/// the shared servers live in statics, which Rust never drops, and
/// testcontainers has no reaper.
pub(crate) fn register_for_cleanup(id: &str) {
    install_exit_hook();
    CONTAINERS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(id.to_owned());
}

fn install_exit_hook() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        // SAFETY: `remove_containers` is a plain `extern "C" fn` with no
        // arguments, as atexit requires; registering it has no other effect.
        #[allow(unsafe_code)]
        unsafe {
            libc::atexit(remove_containers);
        }
    });
}

/// Removes containers left by test processes that were killed before their
/// exit hook ran: each carries its process id in the `dlock.harness` label.
fn remove_stale_containers() {
    if !cfg!(target_os = "linux") {
        return; // no /proc to tell a live process from a dead one
    }
    let Ok(out) = Command::new("docker")
        .args(["ps", "-a", "--filter", "label=dlock.harness"])
        .args(["--format", "{{.ID}} {{.Label \"dlock.harness\"}}"])
        .output()
    else {
        return;
    };
    let stale: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(_, pid)| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        .map(|(id, _)| id.to_owned())
        .collect();
    if !stale.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&stale)
            .output();
    }
    let Ok(out) = Command::new("docker")
        .args(["network", "ls", "--filter", "label=dlock.harness"])
        .args(["--format", "{{.ID}} {{.Label \"dlock.harness\"}}"])
        .output()
    else {
        return;
    };
    for (id, pid) in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
    {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("docker").args(["network", "rm", id]).output();
        }
    }
}

extern "C" fn remove_containers() {
    let ids = std::mem::take(&mut *CONTAINERS.lock().unwrap_or_else(PoisonError::into_inner));
    if !ids.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&ids)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
    let networks = std::mem::take(&mut *NETWORKS.lock().unwrap_or_else(PoisonError::into_inner));
    if !networks.is_empty() {
        let _ = Command::new("docker")
            .args(["network", "rm"])
            .args(&networks)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}
