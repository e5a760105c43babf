//! Admin reads and writes: the list of held locks, a lock's holder, and a
//! forced release.

use dlock_core::{HeldLock, LockInfo, LockPage, MAX_HOLDERS, Mode, OwnerToken, Result};
use zookeeper_client as zk;

use crate::acquire::Queue;
use crate::acquire::fencing_token;
use crate::backend::ZkBackend;
use crate::error::{gave_up, zk_error};
use crate::hold::{Hold, hold_path};
use crate::path::{Node, owner_of, parse, unescape};
use crate::semaphore::LEASES;

impl ZkBackend {
    /// One page of the held locks whose names start with `prefix`, after
    /// `cursor`. ZooKeeper has no ranged listing: every name is read, and
    /// only the page's queues are looked at.
    pub(crate) async fn list_page(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<LockPage> {
        let limit = limit.max(1);
        let client = self.client();
        let children = match self.bounded(client.list_children(&self.inner.root)).await {
            Ok(children) => children,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(zk_error(e, "list the locks")),
        };
        let mut names: Vec<String> = children
            .iter()
            .filter_map(|c| unescape(c))
            .filter(|n| n.starts_with(prefix) && cursor.is_none_or(|c| n.as_str() > c))
            .collect();
        names.sort();
        // One look at each folder of the page; a folder whose queue is
        // empty is a lock nobody holds.
        let more = names.len() > limit;
        names.truncate(limit);
        let mut locks = Vec::new();
        for name in &names {
            if let Some(info) = self.holder(&client, &self.lock_dir(name)).await? {
                locks.push(HeldLock::new(name.clone(), info));
            }
        }
        Ok(LockPage::new(
            locks,
            more.then(|| names.last().cloned()).flatten(),
        ))
    }

    /// Every hold of `name`: a delayed release's hold, or the nodes of its
    /// queue that hold (see [`holding`]), or a semaphore's leases and
    /// permit holds.
    pub(crate) async fn holders_of(&self, name: &str) -> Result<Vec<LockInfo>> {
        self.each_hold(&self.client(), &self.lock_dir(name), false)
            .await
    }

    /// Deletes every hold of `name`, whoever made it (a delayed release's
    /// hold, or every node that holds: each reader, each permit); returns
    /// the first it deleted.
    pub(crate) async fn force_delete(&self, name: &str) -> Result<Option<LockInfo>> {
        let (client, dir) = (self.client(), self.lock_dir(name));
        let holds = self.each_hold(&client, &dir, true).await?;
        Ok(holds.into_iter().next())
    }

    /// The holds of the lock in `dir`, each deleted too if `delete`. The
    /// nodes are read (and deleted) a few hundred at once: the client
    /// pipelines the requests, so the call takes a few round trips for any
    /// likely number of holds.
    async fn each_hold(
        &self,
        client: &zk::Client,
        dir: &str,
        delete: bool,
    ) -> Result<Vec<LockInfo>> {
        let queue = self.queue(client, dir).await?;
        // During a hold, the nodes at the front only wait for it.
        if queue.hold
            && let Some(info) = self.end_hold(client, &hold_path(dir), delete).await?
        {
            return Ok(vec![info]);
        }
        let (folder, nodes, held) = if queue.nodes.is_empty() && queue.leases {
            let leases = format!("{dir}/{LEASES}");
            let permits = self.queue(client, &leases).await?;
            let nodes = leasing(&permits);
            (leases, nodes, permits.held)
        } else {
            (dir.to_owned(), holding(&queue.nodes), Vec::new())
        };
        // A forced release ends them all; a look shows the first ones.
        let most = if delete { usize::MAX } else { MAX_HOLDERS };
        let paths: Vec<(String, bool)> = nodes
            .iter()
            .chain(&held)
            .take(most)
            .map(|node| (format!("{folder}/{node}"), held.contains(node)))
            .collect();
        // A few hundred requests in flight at a time.
        let mut looks = paths.iter().map(|(path, permit_hold)| async move {
            if *permit_hold {
                return self.end_hold(client, path, delete).await;
            }
            let (data, stat) = match self.bounded(client.get_data(path)).await {
                Ok(read) => read,
                Err(zk::Error::NoNode) => return Ok(None), // released meanwhile
                Err(e) => return Err(zk_error(e, "holders")),
            };
            if delete {
                match self.bounded(client.delete(path, None)).await {
                    Ok(()) => {}
                    Err(zk::Error::NoNode) => return Ok(None),
                    Err(e) => return Err(zk_error(e, "force_release")),
                }
            }
            shown(path, &stat, &data)
        });
        let mut holds = Vec::with_capacity(paths.len());
        loop {
            let batch: Vec<_> = looks.by_ref().take(256).collect();
            if batch.is_empty() {
                return Ok(holds);
            }
            for look in futures_util::future::join_all(batch).await {
                holds.extend(look?);
            }
        }
    }

    /// The hold whose node is `path`, if it still keeps the lock; deleted
    /// if `delete`, whatever its state.
    async fn end_hold(
        &self,
        client: &zk::Client,
        path: &str,
        delete: bool,
    ) -> Result<Option<LockInfo>> {
        if delete {
            return self.delete_hold(client, path).await;
        }
        Ok(self
            .read_hold_at(client, path)
            .await?
            .and_then(|h| h.info()))
    }

    /// The holder of the lock in `dir`: the first node of its queue.
    pub(crate) async fn holder(&self, client: &zk::Client, dir: &str) -> Result<Option<LockInfo>> {
        for _ in 0..3 {
            let queue = self.queue(client, dir).await?;
            // During a hold, the node at the front only waits for it.
            if queue.hold
                && let Some(info) = self.read_hold(client, dir).await?.and_then(|h| h.info())
            {
                return Ok(Some(info));
            }
            match self.front(client, dir, &queue).await? {
                Front::Free => return Ok(None),
                Front::PermitHolds(paths) => {
                    for path in paths {
                        let hold = self.read_hold_at(client, &path).await?;
                        if let Some(info) = hold.and_then(|h| h.info()) {
                            return Ok(Some(info));
                        }
                    }
                    return Ok(None);
                }
                Front::Node(first, stat, data) => match shown(&first, &stat, &data)? {
                    Some(info) => return Ok(Some(info)),
                    // A reader's ended hold: the readers behind it may
                    // hold still.
                    None => {
                        return Ok(self.each_hold(client, dir, false).await?.into_iter().next());
                    }
                },
                // Released between the two reads: look again.
                Front::Gone => {}
            }
        }
        Err(gave_up(format!("the queue of {dir} keeps changing")))
    }

    /// The node that shows the holder of the lock in `dir`, as `queue`
    /// listed it: the front of the queue, or else a semaphore's first
    /// lease (see [`crate::semaphore`]).
    async fn front(&self, client: &zk::Client, dir: &str, queue: &Queue) -> Result<Front> {
        let leases = format!("{dir}/{LEASES}");
        let (dir, first) = match queue.nodes.first() {
            Some(first) => (dir, first.clone()),
            None if queue.leases => {
                let permits = self.queue(client, &leases).await?;
                match permits.nodes.first() {
                    Some(first) => (leases.as_str(), first.clone()),
                    None if permits.held.is_empty() => return Ok(Front::Free),
                    None => {
                        let paths = permits.held.iter().map(|h| format!("{leases}/{h}"));
                        return Ok(Front::PermitHolds(paths.collect()));
                    }
                }
            }
            None => return Ok(Front::Free),
        };
        let path = format!("{dir}/{first}");
        Ok(match self.bounded(client.get_data(&path)).await {
            Ok((data, stat)) => Front::Node(path, stat, data),
            Err(zk::Error::NoNode) => Front::Gone,
            Err(e) => return Err(zk_error(e, "inspect")),
        })
    }
}

/// The nodes of a lock's queue that hold it: the first, and, of a
/// reader-writer lock, the readers after it with no writer ahead but the
/// one at the front they were downgraded from (its sequence number).
fn holding(nodes: &[String]) -> Vec<String> {
    let front = nodes.first().and_then(|n| parse(n));
    let mut holds = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let reader = |n: &str| matches!(parse(n), Some((Node::Read | Node::KazooRead, _)));
        let downgraded =
            |n: &str| matches!((front, parse(n)), (Some((Node::Write, w)), Some((_, r))) if w == r);
        let ahead = &nodes[..i];
        let holds_too = reader(node)
            && ahead
                .iter()
                .enumerate()
                .all(|(j, a)| reader(a) || (j == 0 && downgraded(node)));
        if i > 0 && !holds_too {
            break;
        }
        holds.push(node.clone());
    }
    holds
}

/// The lease nodes of a semaphore's folder that hold a permit: all but
/// the newest when the folder has more children than permits (the newest
/// is the acquirer at the gate, waiting; a Curator lease does not say its
/// semaphore's size, so a folder of those alone is taken as all held).
fn leasing(leases: &Queue) -> Vec<String> {
    let permits = leases.nodes.iter().find_map(|n| match parse(n) {
        Some((Node::Permit(p), _)) => Some(p),
        _ => None,
    });
    let mut nodes = leases.nodes.clone();
    if permits.is_some_and(|p| u32::try_from(leases.children).is_ok_and(|n| n > p)) {
        nodes.pop();
    }
    nodes
}

/// What a look for the node that shows a lock's holder found.
enum Front {
    /// Nobody holds it.
    Free,
    /// The node listed went before its stat was read.
    Gone,
    /// The node's path, its stat, and its data (the holder description).
    Node(String, zk::Stat, Vec<u8>),
    /// Permits' holds, and no permit held (see [`crate::hold`]): their
    /// nodes' paths.
    PermitHolds(Vec<String>),
}

/// What a node that holds shows: a reader's delayed release (a persistent
/// read node; see `crate::hold`) its hold, until it ends; any other node
/// its holder, as [`front_info`].
fn shown(path: &str, stat: &zk::Stat, data: &[u8]) -> Result<Option<LockInfo>> {
    if stat.ephemeral_owner == 0
        && let Some(hold) = Hold::parse(data, *stat)
    {
        return Ok(hold.info().map(|info| info.with_mode(Mode::Read)));
    }
    front_info(path, stat, data).map(Some)
}

/// The holder as the node at the front of a queue shows it, with the token
/// its grant drew: a shared kind's node was written at its grant (see
/// `grant`), a mutex's was not. Other recipes' nodes (kazoo's) carry no
/// owner token: the zero token stands for them. The node's data is its
/// holder description, when it is text (a Curator node's is its client's
/// address).
fn front_info(path: &str, stat: &zk::Stat, data: &[u8]) -> Result<LockInfo> {
    let node = path.rsplit('/').next().unwrap_or_default();
    let owner = owner_of(node).unwrap_or(OwnerToken::from_u128(0));
    let kind = parse(node).map(|(kind, _)| kind);
    let drawn = match kind {
        Some(Node::Read | Node::Write | Node::Permit(_)) => stat.mzxid,
        _ => stat.czxid,
    };
    let info = LockInfo::new(owner, fencing_token(drawn)?, None);
    let info = match kind {
        Some(Node::Mutex | Node::KazooLock) => info.with_mode(Mode::Exclusive),
        Some(Node::Read | Node::KazooRead) => info.with_mode(Mode::Read),
        Some(Node::Write) => info.with_mode(Mode::Write),
        Some(Node::Permit(n)) => info.with_mode(Mode::Permit(n)),
        Some(Node::CuratorLease) | None => info,
    };
    Ok(match std::str::from_utf8(data) {
        Ok(holder) if dlock_core::driver::check_holder(holder).is_ok() => info.with_holder(holder),
        _ => info,
    })
}
