//! Standalone servers on a network of their own, for the benchmark.

use std::net::Ipv4Addr;

use super::{Network, Topology, create_network, start_node};
use crate::harness::{Service, last_words, on_harness, test_image, wait_ready};

/// One standalone server of each service asked (with its extra start
/// arguments; a service once), on a network of their own, and where a
/// client connects to each, in the order asked. Clients reach them at
/// their addresses on that network: a port published on 127.0.0.1 passes
/// every byte through Docker's port proxy, a process of its own that, on
/// two cores, takes as much of them as the server behind it, and that no
/// deployment has.
///
/// `None`, with nothing started and nothing sent, when this host has no
/// route to the network through its bridge (Docker Desktop, rootless
/// Docker, a client in a container of its own): its addresses would then
/// be looked for elsewhere.
///
/// # Errors
/// When Docker cannot be reached, or a server does not come up (with what
/// it said last).
pub async fn standalone(
    servers: Vec<(Service, Vec<String>)>,
) -> Result<Option<(Topology, Vec<String>)>, String> {
    on_harness(async move {
        test_image()?;
        let network = create_network()?;
        let mut topology = Topology {
            network,
            nodes: Vec::new(),
        };
        if !routed(&topology.network) {
            return Ok(None);
        }
        let mut urls = Vec::new();
        for (service, args) in servers {
            let name = format!("{}-{}", topology.network, service.command());
            let cmd = std::iter::once(service.command().to_owned())
                .chain(args)
                .collect();
            let port = service.port();
            let node = start_node(&topology.network, &name, cmd, Vec::new(), &[], port).await?;
            let url = service.url_at(&node.ip.to_string(), port);
            if let Err(e) = wait_ready(service, &url).await {
                let said = match &node.container {
                    Some(container) => last_words(container).await,
                    None => String::new(),
                };
                // Removed with the others when the topology goes.
                topology.nodes.push(node);
                return Err(format!("{e}\n{said}"));
            }
            topology.nodes.push(node);
            urls.push(url);
        }
        Ok(Some((topology, urls)))
    })
    .await
}

/// Whether this host routes the subnet of `network` through the network's
/// own bridge (`br-` and the first 12 digits of its id, Docker's name for
/// it), by the kernel's routing table (`/proc/net/route`).
fn routed(network: &Network) -> bool {
    let Some(id) = network.id.get(..12) else {
        return false;
    };
    let Ok(routes) = std::fs::read_to_string("/proc/net/route") else {
        return false;
    };
    routes_through(&routes, network.base, &format!("br-{id}"))
}

/// Whether a route of `table` (`/proc/net/route`'s text: destinations and
/// masks as hexadecimal in the host's byte order) sends `address` through
/// the interface `iface`.
fn routes_through(table: &str, address: Ipv4Addr, iface: &str) -> bool {
    let address = u32::from_ne_bytes(address.octets());
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let hex = |i: usize| fields.get(i).and_then(|f| u32::from_str_radix(f, 16).ok());
        match (fields.first(), hex(1), hex(7)) {
            (Some(name), Some(destination), Some(mask)) => {
                *name == iface && mask != 0 && address & mask == destination
            }
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_the_bridge_s_own_only() {
        // As the kernel writes them: in the host's byte order.
        let hex = |a: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(a));
        let table = format!(
            "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n\
             eth0\t00000000\t{gw}\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
             br-1\t{net}\t00000000\t0001\t0\t0\t0\t{mask}\t0\t0\t0\n",
            gw = hex([192, 168, 1, 1]),
            net = hex([172, 18, 0, 0]),
            mask = hex([255, 255, 0, 0]),
        );
        assert!(routes_through(&table, Ipv4Addr::new(172, 18, 0, 2), "br-1"));
        assert!(!routes_through(
            &table,
            Ipv4Addr::new(172, 19, 0, 2),
            "br-1"
        ));
        assert!(!routes_through(
            &table,
            Ipv4Addr::new(172, 18, 0, 2),
            "br-2"
        ));
        // The default route is no route to the bridge.
        assert!(!routes_through(&table, Ipv4Addr::new(10, 0, 0, 1), "eth0"));
    }
}
