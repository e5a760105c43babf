//! The servers a run measures: given by URL, or started by the bench.

use std::collections::HashMap;

use dlock_conformance::harness::{Server, ServerOptions, Service, try_start};
use dlock_conformance::topology::{Topology, standalone};

use crate::target::Result;

/// The servers of a run: where each is, and those the bench started,
/// kept until the run ends (dropping them removes them).
pub struct Servers {
    urls: HashMap<Service, String>,
    /// Whether some were given by URL.
    given: bool,
    started: Started,
}

/// The servers the bench started, held for the run.
enum Started {
    Nothing,
    OnNetwork { _topology: Topology },
    Published { _servers: Vec<Server> },
}

impl Servers {
    /// Where each server of `wanted` is: the URL given (its flag, or the
    /// harness's variable), else a server of the bench's own, started on
    /// a network of its own and reached at its address there (see
    /// [`standalone`]), or, on a host that has no route to such a
    /// network, at a port published on 127.0.0.1.
    ///
    /// MariaDB runs its thread pool: one thread per connection, the
    /// server's default, time-slices 64 clients' connections on 2 cores;
    /// dlock-mysql's README advises the pool for many nodes on few cores.
    /// The tests run the default.
    pub async fn start(wanted: &[(Service, Option<String>)]) -> Result<Servers> {
        let mut urls = HashMap::new();
        let mut start = Vec::new();
        for (service, flag) in wanted {
            let service = *service;
            let given = flag
                .clone()
                .or_else(|| std::env::var(service.env_override()).ok());
            match given {
                Some(url) => {
                    urls.insert(service, url);
                }
                None if start.iter().any(|(s, _)| *s == service) => {}
                None => {
                    let args = match service {
                        Service::MariaDb => vec!["--thread-handling=pool-of-threads".to_owned()],
                        _ => Vec::new(),
                    };
                    start.push((service, args));
                }
            }
        }
        let given = !urls.is_empty();
        if start.is_empty() {
            let started = Started::Nothing;
            return Ok(Servers {
                urls,
                given,
                started,
            });
        }
        let services: Vec<Service> = start.iter().map(|(s, _)| *s).collect();
        if let Some((topology, started)) = standalone(start.clone()).await? {
            urls.extend(services.into_iter().zip(started));
            let started = Started::OnNetwork {
                _topology: topology,
            };
            return Ok(Servers {
                urls,
                given,
                started,
            });
        }
        let mut servers = Vec::new();
        for (service, args) in start {
            let options = ServerOptions {
                args,
                ..ServerOptions::default()
            };
            let server = try_start(service, options).await?;
            urls.insert(service, server.url().to_owned());
            servers.push(server);
        }
        let started = Started::Published { _servers: servers };
        Ok(Servers {
            urls,
            given,
            started,
        })
    }

    /// Where `service`'s server is.
    pub fn url(&self, service: Service) -> Result<String> {
        let url = self.urls.get(&service).cloned();
        url.ok_or_else(|| format!("no server for {service:?}").into())
    }

    /// Where the servers are, for the report's machine line.
    pub fn place(&self) -> &'static str {
        match (&self.started, self.given) {
            (Started::Nothing, false) => "no servers",
            (Started::Nothing, true) => "servers given by URL",
            (Started::OnNetwork { .. }, false) => {
                "servers in Docker, reached at their addresses on a network of the bench's own"
            }
            (Started::OnNetwork { .. }, true) => {
                "servers in Docker on a network of the bench's own, and servers given by URL"
            }
            // The fallback is what a reader of the figures must know,
            // whether or not some servers were given too.
            (Started::Published { .. }, _) => {
                "servers in Docker through 127.0.0.1 port mappings (this host has no route \
                 to a network of the bench's own)"
            }
        }
    }
}
