//! A TCP proxy between a client and its server that can cut, stall or
//! delay the traffic while a test runs: the network faults of the fault
//! cases.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until};

/// What a link does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Close every connection, and close new ones at once: a dead link.
    Cut,
    /// Keep connections open but forward nothing: a hung link or a paused
    /// peer. Traffic held back is delivered, in order, on `Pass`.
    Stall,
    /// Forward everything this much later, in each direction: a slow link.
    /// It is a latency, not a rate: data read at `t` is written at `t + d`.
    Delay(Duration),
    /// Forward requests, and close the connection when a reply comes
    /// instead of delivering it: the server did the work, and the client
    /// only learns that its connection dropped.
    CutOnReply,
}

/// A client's link to its server, which a fault case can fault. The
/// [`FaultProxy`] is the real one; a driver simulated in memory can have
/// its own.
pub trait Link: Send + Sync + std::fmt::Debug {
    /// Switches the fault, for every connection of the link at once.
    fn set(&self, fault: Fault);
}

/// A proxy on 127.0.0.1 in front of one server. Dropping it closes it.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    /// One fault per generation of connections, the newest last: new
    /// connections join the newest.
    generations: Arc<Mutex<Vec<watch::Sender<Fault>>>>,
    _tasks: JoinSet<()>,
}

impl FaultProxy {
    /// Starts forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let generations = Arc::new(Mutex::new(vec![watch::channel(Fault::Pass).0]));
        let mut tasks = JoinSet::new();
        tasks.spawn(accept(listener, upstream, generations.clone()));
        Ok(FaultProxy {
            addr,
            generations,
            _tasks: tasks,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the fault, for every connection at once.
    pub fn set(&self, fault: Fault) {
        for generation in lock(&self.generations).iter() {
            generation.send_replace(fault);
        }
    }

    /// Faults the connections open now, while connections opened from now
    /// on pass: one connection hangs (a lost route, a peer that stopped
    /// reading) or drops while the client's next one works.
    /// [`FaultProxy::set`] applies to all of them again.
    pub fn set_open_connections(&self, fault: Fault) {
        let mut generations = lock(&self.generations);
        for generation in generations.iter() {
            generation.send_replace(fault);
        }
        generations.push(watch::channel(Fault::Pass).0);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The fault of the newest generation, which a new connection joins.
fn newest(generations: &Mutex<Vec<watch::Sender<Fault>>>) -> Option<watch::Receiver<Fault>> {
    lock(generations).last().map(watch::Sender::subscribe)
}

impl Link for FaultProxy {
    fn set(&self, fault: Fault) {
        FaultProxy::set(self, fault);
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    generations: Arc<Mutex<Vec<watch::Sender<Fault>>>>,
) {
    // Owned here, so that the connections end with the accept loop.
    let mut connections = JoinSet::new();
    while let Ok((inbound, _)) = listener.accept().await {
        let Some(fault) = newest(&generations) else {
            return;
        };
        if *fault.borrow() == Fault::Cut {
            continue; // dropped: the client sees the connection close
        }
        connections.spawn(async move {
            let Ok(outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            let (ri, wi) = inbound.into_split();
            let (ro, wo) = outbound.into_split();
            tokio::join!(
                pipe(ri, wo, fault.clone(), false),
                pipe(ro, wi, fault, true)
            );
        });
    }
}

/// Copies one direction, the server's replies when `replies`. The reader
/// stamps each chunk with the time it arrived; the writer applies the
/// fault in force when the chunk is due.
async fn pipe(
    mut from: impl AsyncRead + Unpin + Send + 'static,
    mut to: impl AsyncWrite + Unpin,
    mut fault: watch::Receiver<Fault>,
    replies: bool,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut cut = fault.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            tokio::select! {
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                },
                changed = cut.changed() => {
                    if changed.is_err() || *cut.borrow() == Fault::Cut {
                        return;
                    }
                }
            }
        }
    };
    let writer = async move {
        while let Some((arrived, chunk)) = rx.recv().await {
            loop {
                let now = *fault.borrow_and_update();
                match now {
                    Fault::Pass => break,
                    Fault::Cut => return,
                    // Closes the client's side: it reads the end of the
                    // stream where its reply should be.
                    Fault::CutOnReply if replies => return,
                    Fault::CutOnReply => break,
                    Fault::Delay(d) => {
                        tokio::select! {
                            () = sleep_until(arrived + d) => break,
                            // The fault changed while waiting: judge again.
                            changed = fault.changed() => if changed.is_err() { return },
                        }
                    }
                    Fault::Stall => {
                        if fault.changed().await.is_err() {
                            return;
                        }
                    }
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    // The reader ends at EOF with the writer still owing what it queued:
    // finish the writes, unless the link is cut.
    let reader = tokio::spawn(reader);
    writer.await;
    reader.abort();
}
