//! Link cases against a real server: each faulty client reaches it through
//! a [`FaultProxy`] of its own, healthy clients directly.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use dlock_core::Backend;

use super::{FaultyClient, FaultyFactory};
use crate::Factory;
use crate::proxy::FaultProxy;

/// Factories for the link cases against a real server at `server_url`:
/// faulty clients reach it through a [`FaultProxy`] each, healthy ones
/// directly. `connect` makes a client from a URL of the server's form.
pub fn proxied<C, Fut>(connect: C, server_url: String) -> (FaultyFactory, Factory)
where
    C: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Arc<dyn Backend>> + Send + 'static,
{
    let connect = Arc::new(connect);
    let url = server_url.clone();
    let via = connect.clone();
    let faulty: FaultyFactory = Arc::new(move || {
        let connect = via.clone();
        let url = url.clone();
        Box::pin(async move {
            let (_, upstream) = redirect(&url, 0);
            let proxy = FaultProxy::start(upstream).await.expect("start the proxy");
            let (proxied, _) = redirect(&url, proxy.addr().port());
            FaultyClient {
                backend: connect(proxied).await,
                link: Arc::new(proxy),
            }
        })
    });
    let client: Factory = Arc::new(move || {
        let connect = connect.clone();
        let url = server_url.clone();
        Box::pin(async move { connect(url).await })
    });
    (faulty, client)
}

/// `url` with its `127.0.0.1:<port>` pointed at `port` instead, and the
/// address it pointed at.
fn redirect(url: &str, port: u16) -> (String, SocketAddr) {
    let at = url
        .find("127.0.0.1:")
        .unwrap_or_else(|| panic!("fault cases need a server on 127.0.0.1, got {url}"));
    let digits_at = at + "127.0.0.1:".len();
    let digits: String = url[digits_at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let upstream = format!("127.0.0.1:{digits}")
        .parse()
        .unwrap_or_else(|e| panic!("no port in {url}: {e}"));
    let redirected = format!(
        "{}127.0.0.1:{port}{}",
        &url[..at],
        &url[digits_at + digits.len()..]
    );
    (redirected, upstream)
}
