//! Standalone servers on a network of their own, for the benchmark.

use super::{Topology, create_network, start_node};
use crate::harness::{Service, on_harness, wait_ready};

/// One standalone server of each service asked (with its extra start
/// arguments), on a network of their own, and where a client connects to
/// each, in the order asked. Clients reach them at their addresses on that
/// network: a port published on 127.0.0.1 passes every byte through
/// Docker's port proxy, a process of its own that, on two cores, takes as
/// much of them as the server behind it, and that no deployment has.
///
/// # Errors
/// When Docker cannot be reached, or a server does not come up.
pub async fn standalone(
    servers: Vec<(Service, Vec<String>)>,
) -> Result<(Topology, Vec<String>), String> {
    on_harness(async move {
        let network = create_network()?;
        let mut topology = Topology {
            network,
            nodes: Vec::new(),
        };
        let mut urls = Vec::new();
        for (service, args) in servers {
            let name = format!("{}-{}", topology.network, service.command());
            let cmd = std::iter::once(service.command().to_owned())
                .chain(args)
                .collect();
            let port = service.port();
            let node = start_node(&topology.network, &name, cmd, Vec::new(), &[], port).await?;
            let url = service.url_at(&node.ip.to_string(), port);
            // Kept before the wait, so that a server that fails it is
            // removed with the others.
            topology.nodes.push(node);
            wait_ready(service, &url).await?;
            urls.push(url);
        }
        Ok((topology, urls))
    })
    .await
}
