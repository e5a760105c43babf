//! The servers a run measures: given by URL, or started by the bench.

use std::collections::HashMap;

use dlock_conformance::harness::{Server, ServerOptions, Service, try_start};
use dlock_conformance::topology::{Topology, standalone};

use crate::target::Result;

/// The servers of a run: where each is, and those the bench started,
/// kept until the run ends (dropping them removes them).
pub struct Servers {
    urls: HashMap<Service, String>,
    _network: Option<Topology>,
    _published: Vec<Server>,
    /// Where they are, for the report's machine line.
    pub place: &'static str,
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
        let mut servers = Servers {
            place: if urls.is_empty() {
                "no servers"
            } else {
                "servers given by URL"
            },
            urls,
            _network: None,
            _published: Vec::new(),
        };
        if start.is_empty() {
            return Ok(servers);
        }
        let given = !servers.urls.is_empty();
        let services: Vec<Service> = start.iter().map(|(s, _)| *s).collect();
        if let Some((network, started)) = standalone(start.clone()).await? {
            servers.urls.extend(services.into_iter().zip(started));
            servers._network = Some(network);
            servers.place = if given {
                "servers in Docker on a network of the bench's own, and servers given by URL"
            } else {
                "servers in Docker, reached at their addresses on a network of the bench's own"
            };
            return Ok(servers);
        }
        for (service, args) in start {
            let options = ServerOptions {
                args,
                ..ServerOptions::default()
            };
            let server = try_start(service, options).await?;
            servers.urls.insert(service, server.url().to_owned());
            servers._published.push(server);
        }
        servers.place = "servers in Docker through 127.0.0.1 port mappings (this host has no route \
                         to a network of the bench's own)";
        Ok(servers)
    }

    /// Where `service`'s server is.
    pub fn url(&self, service: Service) -> Result<String> {
        let url = self.urls.get(&service).cloned();
        url.ok_or_else(|| format!("no server for {service:?}").into())
    }
}
