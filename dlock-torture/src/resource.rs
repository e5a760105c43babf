//! The fenced resource: a small line server on loopback that every critical
//! section writes to with its fencing token. Per name it keeps the highest
//! token accepted and refuses a lower one, as a store that honours fencing
//! would; it logs every write, accepted or refused.
//!
//! A request is `name token exclusive client hold believed late\n`
//! (numbers, `0`/`1` for the flags); the answer is `ok\n` or `refused\n`.
//! An exclusive write needs a token above the highest accepted (or equal to
//! it from the same hold: a hold writes twice); a shared one (a reader, a
//! permit) at least the highest exclusive one, since shared holders write
//! beside each other in any order. So a semaphore's permits, all shared,
//! are never refused: one counter cannot fence N holders at once.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::timeout;

use crate::history::now_ns;

/// One write the resource saw.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Write {
    /// When it arrived (ns, `CLOCK_MONOTONIC`).
    pub t: u64,
    /// The name's index.
    pub name: u32,
    /// The writer's fencing token.
    pub token: u64,
    /// Whether the writer held exclusively.
    pub exclusive: bool,
    /// The client process that sent it.
    pub client: u32,
    /// The hold within it.
    pub hold: u64,
    /// Whether the writer believed it held the lock (`is_valid()` when it
    /// decided to write).
    pub believed: bool,
    /// Whether the workload made it late on purpose: sent after the
    /// lease ended, as by a holder paused between its check and its write.
    pub late: bool,
    /// Whether the resource took it.
    pub accepted: bool,
}

#[derive(Debug, Default)]
struct State {
    /// Per name: the highest token accepted, and the highest exclusive one.
    highest: HashMap<u32, (u64, u64)>,
    /// Per name: the hold that wrote the highest exclusive token (client,
    /// hold).
    writer: HashMap<u32, (u32, u64)>,
    log: Vec<Write>,
}

/// The resource, serving until dropped.
#[derive(Debug)]
pub struct Resource {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    _tasks: JoinSet<()>,
}

impl Resource {
    /// Listens on an unused loopback port.
    pub async fn start() -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let mut tasks = JoinSet::new();
        let serving = state.clone();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                connections.spawn(serve(stream, serving.clone()));
            }
        });
        Ok(Resource {
            addr,
            state,
            _tasks: tasks,
        })
    }

    /// Where clients write.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every write so far, in arrival order.
    pub fn log(&self) -> Vec<Write> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .log
            .clone()
    }
}

async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Some(w) = parse(&line) else { return };
        let accepted = apply(&state, w);
        let answer: &[u8] = if accepted { b"ok\n" } else { b"refused\n" };
        if write.write_all(answer).await.is_err() {
            return;
        }
    }
}

fn parse(line: &str) -> Option<Write> {
    let mut f = line.split_ascii_whitespace();
    let mut next = || f.next()?.parse::<u64>().ok();
    let (name, token, exclusive) = (next()?, next()?, next()?);
    let (client, hold, believed, late) = (next()?, next()?, next()?, next()?);
    Some(Write {
        t: now_ns(),
        name: u32::try_from(name).ok()?,
        token,
        exclusive: exclusive == 1,
        client: u32::try_from(client).ok()?,
        hold,
        believed: believed == 1,
        late: late == 1,
        accepted: false,
    })
}

fn apply(state: &Mutex<State>, mut w: Write) -> bool {
    let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
    let same_writer = s.writer.get(&w.name) == Some(&(w.client, w.hold));
    let (any, exclusive) = s.highest.entry(w.name).or_default();
    w.accepted = if w.exclusive {
        w.token > *any || (w.token == *any && same_writer)
    } else {
        w.token >= *exclusive
    };
    if w.accepted {
        *any = (*any).max(w.token);
        if w.exclusive {
            *exclusive = (*exclusive).max(w.token);
            s.writer.insert(w.name, (w.client, w.hold));
        }
    }
    s.log.push(w);
    w.accepted
}

/// A task's connection to the resource.
#[derive(Debug)]
pub struct Writer {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
}

/// How long a write may take: the resource is on loopback.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

impl Writer {
    /// Connects to the resource at `addr`.
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let (read, write) = TcpStream::connect(addr).await?.into_split();
        Ok(Writer {
            lines: BufReader::new(read).lines(),
            write,
        })
    }

    /// Writes under `token`; whether the resource accepted it.
    pub async fn write(
        &mut self,
        name: u32,
        token: u64,
        exclusive: bool,
        (client, hold): (u32, u64),
        (believed, late): (bool, bool),
    ) -> io::Result<bool> {
        let line = format!(
            "{name} {token} {} {client} {hold} {} {}\n",
            u8::from(exclusive),
            u8::from(believed),
            u8::from(late)
        );
        let exchange = async {
            self.write.write_all(line.as_bytes()).await?;
            self.lines.next_line().await
        };
        match timeout(WRITE_TIMEOUT, exchange).await {
            Ok(Ok(Some(answer))) => Ok(answer == "ok"),
            Ok(Ok(None)) => Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        }
    }
}
