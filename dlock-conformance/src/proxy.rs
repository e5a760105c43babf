//! A TCP proxy between a client and its server that can cut or stall the
//! traffic while a test runs: the network faults of the fault cases.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the proxy does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Close every connection, and close new ones at once: a dead link.
    Cut,
    /// Keep connections open but forward nothing: a hung link or a paused
    /// peer. Traffic resumes on `Pass`.
    Stall,
    /// Forward everything, each chunk this much later: a slow link.
    Delay(std::time::Duration),
}

/// A proxy on 127.0.0.1 in front of one server. Dropping it closes it.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    _tasks: JoinSet<()>,
}

impl FaultProxy {
    /// Starts forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (fault, rx) = watch::channel(Fault::Pass);
        let mut tasks = JoinSet::new();
        tasks.spawn(accept(listener, upstream, rx));
        Ok(FaultProxy {
            addr,
            fault,
            _tasks: tasks,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the fault, for every connection at once.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, fault: watch::Receiver<Fault>) {
    // Owned here, so that the connections end with the accept loop.
    let mut connections = JoinSet::new();
    while let Ok((inbound, _)) = listener.accept().await {
        if *fault.borrow() == Fault::Cut {
            continue; // dropped: the client sees the connection close
        }
        let fault = fault.clone();
        connections.spawn(async move {
            let Ok(outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            tokio::join!(pipe(ri, wo, fault.clone()), pipe(ro, wi, fault));
        });
    }
}

/// Copies one direction, holding data while stalled and stopping on a cut.
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut fault: watch::Receiver<Fault>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = fault.changed() => {
                if changed.is_err() || *fault.borrow() == Fault::Cut {
                    return;
                }
                continue;
            }
        };
        loop {
            let now = *fault.borrow();
            match now {
                Fault::Pass => break,
                Fault::Delay(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Fault::Cut => return,
                Fault::Stall => {
                    if fault.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
