//! The gRPC connection: one channel to the cluster's members, every unary
//! call bounded by the request timeout, the auth token attached and renewed
//! when the server forgets it, and the streams (watch, keep-alive) the
//! driver opens per use.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dlock_core::{Error, Result};
use futures_util::StreamExt;
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::error::{grpc_error, timed_out};
use crate::proto::auth_client::AuthClient;
use crate::proto::kv_client::KvClient;
use crate::proto::lease_client::LeaseClient;
use crate::proto::maintenance_client::MaintenanceClient;
use crate::proto::watch_client::WatchClient;
use crate::proto::{
    AuthenticateRequest, Event, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest,
    LeaseTimeToLiveRequest, RangeRequest, RangeResponse, StatusRequest, TxnRequest, TxnResponse,
    WatchCreateRequest, WatchRequest, WatchResponse, watch_request,
};

/// A connection to one etcd cluster. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Client {
    channel: Channel,
    /// The auth token, when the cluster has authentication on.
    token: Arc<RwLock<Option<AsciiMetadataValue>>>,
    credentials: Option<Arc<(String, String)>>,
    /// One login at a time: of many calls refused for one expired token,
    /// the first logs in and the others use its new token.
    login: Arc<tokio::sync::Mutex<()>>,
    pub(crate) request_timeout: Duration,
}

/// What a lease keep-alive found out about one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeptAlive {
    /// Renewed: the server counts its TTL again from now.
    Renewed,
    /// The lease is gone (expired or revoked).
    Gone,
}

impl Client {
    pub(crate) fn new(
        channel: Channel,
        credentials: Option<(String, String)>,
        request_timeout: Duration,
    ) -> Self {
        Client {
            channel,
            token: Arc::new(RwLock::new(None)),
            credentials: credentials.map(Arc::new),
            login: Arc::new(tokio::sync::Mutex::new(())),
            request_timeout,
        }
    }

    /// A request carrying the auth token, and `hasleader`, so that a member
    /// cut off from its cluster's leader refuses rather than serving what
    /// may be stale.
    fn request<M>(&self, message: M) -> Request<M> {
        let mut request = Request::new(message);
        let metadata = request.metadata_mut();
        metadata.insert("hasleader", MetadataValue::from_static("true"));
        if let Some(token) = self.token() {
            metadata.insert("token", token);
        }
        request
    }

    /// The auth token requests carry now.
    fn token(&self) -> Option<AsciiMetadataValue> {
        self.token.read().ok().and_then(|t| t.clone())
    }

    /// Logs in again after a request carrying `stale` was refused for its
    /// token, unless another call has done so since.
    async fn login_again(&self, stale: Option<AsciiMetadataValue>) -> Result<()> {
        let _one = self.login.lock().await;
        if self.token() != stale {
            return Ok(());
        }
        self.authenticate().await
    }

    /// Whether a refusal's `reason` says the server no longer knows our
    /// token (it expired, or the server restarted and forgot it), so that
    /// logging in again helps.
    fn forgot_token(&self, reason: &str) -> bool {
        // etcd's own client logs in again on these two.
        self.credentials.is_some()
            && (reason.contains("invalid auth token") || reason.contains("auth store is old"))
    }

    /// Logs in with the credentials, if there are any, and keeps the token.
    pub(crate) async fn authenticate(&self) -> Result<()> {
        let Some(credentials) = self.credentials.clone() else {
            return Ok(());
        };
        let (name, password) = (credentials.0.clone(), credentials.1.clone());
        let mut auth = AuthClient::new(self.channel.clone());
        let reply = tokio::time::timeout(
            self.request_timeout,
            auth.authenticate(AuthenticateRequest { name, password }),
        )
        .await
        .map_err(|_| timed_out("authenticate"))?
        .map_err(|s| grpc_error(s, "authenticate"))?;
        let token = AsciiMetadataValue::try_from(reply.into_inner().token)
            .map_err(|e| Error::malformed(crate::backend::NAME, "authenticate", e))?;
        if let Ok(mut slot) = self.token.write() {
            *slot = Some(token);
        }
        Ok(())
    }

    /// One unary call within the request timeout; a token the server no
    /// longer knows is renewed and the call sent once more, in the same
    /// bound. A reply after the bound is no reply: the call's effect is
    /// unknown.
    async fn unary<M, R, F, Fut>(&self, what: &'static str, message: M, send: F) -> Result<R>
    where
        M: Clone,
        F: Fn(Channel, Request<M>) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<R>, Status>>,
    {
        let call = async {
            let used = self.token();
            match send(self.channel.clone(), self.request(message.clone())).await {
                Err(status) if self.forgot_token(status.message()) => {
                    self.login_again(used).await?;
                    send(self.channel.clone(), self.request(message)).await
                }
                other => other,
            }
            .map(tonic::Response::into_inner)
            .map_err(|s| grpc_error(s, what))
        };
        tokio::time::timeout(self.request_timeout, call)
            .await
            .map_err(|_| timed_out(what))?
    }

    pub(crate) async fn range(
        &self,
        what: &'static str,
        request: RangeRequest,
    ) -> Result<RangeResponse> {
        self.unary(what, request, |ch, r| async move {
            KvClient::new(ch).range(r).await
        })
        .await
    }

    pub(crate) async fn txn(&self, what: &'static str, request: TxnRequest) -> Result<TxnResponse> {
        self.unary(what, request, |ch, r| async move {
            KvClient::new(ch).txn(r).await
        })
        .await
    }

    /// Grants lease `id` with `ttl` (whole seconds, at least one); returns
    /// the TTL the server granted, which may be longer. Granting an id that
    /// exists already (a retried grant whose first reply was lost) fails.
    pub(crate) async fn grant(&self, id: i64, ttl: i64) -> Result<i64> {
        let request = LeaseGrantRequest { ttl, id };
        let reply = self
            .unary("grant a lease", request, |ch, r| async move {
                LeaseClient::new(ch).lease_grant(r).await
            })
            .await?;
        if !reply.error.is_empty() {
            return Err(Error::backend(
                crate::backend::NAME,
                "grant a lease",
                reply.error,
            ));
        }
        Ok(reply.ttl)
    }

    /// Revokes lease `id`, deleting its keys; `false` if it was gone
    /// already.
    pub(crate) async fn revoke(&self, id: i64) -> Result<bool> {
        let request = LeaseRevokeRequest { id };
        let sent = self
            .unary("revoke a lease", request, |ch, r| async move {
                LeaseClient::new(ch).lease_revoke(r).await
            })
            .await;
        match sent {
            Ok(_) => Ok(true),
            Err(e) if crate::error::is_lease_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The lease's remaining TTL in whole seconds; `None` if it is gone.
    pub(crate) async fn time_to_live(&self, id: i64) -> Result<Option<i64>> {
        let request = LeaseTimeToLiveRequest { id, keys: false };
        let reply = self
            .unary("read a lease's TTL", request, |ch, r| async move {
                LeaseClient::new(ch).lease_time_to_live(r).await
            })
            .await?;
        // etcd rounds the time left down: a live lease with under a second
        // left reads 0; a lease that is gone reads -1.
        Ok((reply.ttl >= 0).then_some(reply.ttl))
    }

    /// The keys attached to lease `id`, and the revision the server was at;
    /// `None` if the lease is gone. A session's keys may be many (100,000
    /// are some 5 MB): the reply's bound is raised above tonic's 4 MB.
    pub(crate) async fn lease_keys(&self, id: i64) -> Result<Option<(i64, Vec<Vec<u8>>)>> {
        const MOST: usize = 256 * 1024 * 1024;
        let request = LeaseTimeToLiveRequest { id, keys: true };
        let reply = self
            .unary("read a lease's keys", request, |ch, r| async move {
                LeaseClient::new(ch)
                    .max_decoding_message_size(MOST)
                    .lease_time_to_live(r)
                    .await
            })
            .await?;
        let revision = reply.header.as_ref().map_or(0, |h| h.revision);
        Ok((reply.ttl >= 0).then_some((revision, reply.keys)))
    }

    /// Whether some member answers, for `connect`.
    pub(crate) async fn status(&self) -> Result<()> {
        self.unary(
            "read the server status",
            StatusRequest {},
            |ch, r| async move { MaintenanceClient::new(ch).status(r).await },
        )
        .await
        .map(drop)
    }

    /// Keeps each lease of `ids` alive on one stream: every id goes out
    /// at once and the replies come back in any order, within one request
    /// timeout; an id without a reply by then is an error for the whole
    /// batch (its renewal is unknown).
    pub(crate) async fn keep_alive(&self, ids: &[i64]) -> Result<Vec<KeptAlive>> {
        const WHAT: &str = "keep leases alive";
        let mut kept = vec![None; ids.len()];
        let call = async {
            let (outgoing, _open) = open_stream(ids.iter().map(|&id| LeaseKeepAliveRequest { id }));
            let mut lease = LeaseClient::new(self.channel.clone());
            let mut replies = lease
                .lease_keep_alive(self.request(outgoing))
                .await
                .map_err(|s| grpc_error(s, WHAT))?
                .into_inner();
            let mut missing = ids.len();
            while missing > 0 {
                let Some(reply) = replies.next().await else {
                    return Err(stream_ended(WHAT));
                };
                let reply = reply.map_err(|s| grpc_error(s, WHAT))?;
                // The first id without its reply yet: an id sent twice gets
                // two replies.
                let slot = kept
                    .iter_mut()
                    .zip(ids)
                    .find(|(s, id)| s.is_none() && **id == reply.id);
                if let Some((slot, _)) = slot {
                    *slot = Some(if reply.ttl > 0 {
                        KeptAlive::Renewed
                    } else {
                        KeptAlive::Gone
                    });
                    missing -= 1;
                }
            }
            Ok(())
        };
        tokio::time::timeout(self.request_timeout, call)
            .await
            .map_err(|_| timed_out(WHAT))??;
        Ok(kept
            .into_iter()
            .map(|k| k.unwrap_or(KeptAlive::Gone))
            .collect())
    }

    /// Watches the range `key`..`range_end` from now on: returns once the
    /// server confirmed the watch, so that every change after the
    /// revision of the reply is reported. A watch from the present, not
    /// from a past revision: etcd catches up watches of the past in a loop
    /// that runs every 100 ms, which would delay every hand-off.
    pub(crate) async fn watch(&self, (key, range_end): (Vec<u8>, Vec<u8>)) -> Result<Watch> {
        const WHAT: &str = "watch the lock";
        let create = WatchCreateRequest {
            key,
            range_end,
            ..WatchCreateRequest::default()
        };
        let request = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
        };
        let open_watch = async || {
            let used = self.token();
            let (outgoing, open) = open_stream([request.clone()]);
            let mut watch = WatchClient::new(self.channel.clone());
            let mut replies = watch
                .watch(self.request(outgoing))
                .await
                .map_err(|s| grpc_error(s, WHAT))?
                .into_inner();
            match replies.next().await {
                Some(Ok(reply)) if reply.created && !reply.canceled => Ok(Ok((replies, open))),
                // A token the server forgot cancels the watch (it is
                // checked when the watch is made, not with the stream).
                // etcd 3.4 gives the reason as "invalid auth token" only
                // from 3.4.22 on; before, as "permission denied", which
                // logging in again also clears when it was the token.
                Some(Ok(reply))
                    if reply.canceled
                        && (self.forgot_token(&reply.cancel_reason)
                            || self.credentials.is_some()
                                && reply.cancel_reason.contains("permission denied")) =>
                {
                    Ok(Err((reply, used)))
                }
                Some(Ok(reply)) if reply.canceled => Err(Error::backend(
                    crate::backend::NAME,
                    WHAT,
                    reply.cancel_reason,
                )),
                Some(Ok(reply)) => Err(Error::malformed(crate::backend::NAME, WHAT, reply)),
                Some(Err(status)) => Err(grpc_error(status, WHAT)),
                None => Err(stream_ended(WHAT)),
            }
        };
        let opened = async {
            match open_watch().await? {
                Ok(opened) => Ok(opened),
                Err((_, used)) => {
                    self.login_again(used).await?;
                    open_watch().await?.map_err(|(reply, _)| {
                        Error::backend(crate::backend::NAME, WHAT, reply.cancel_reason)
                    })
                }
            }
        };
        let (replies, open) = tokio::time::timeout(self.request_timeout, opened)
            .await
            .map_err(|_| timed_out(WHAT))??;
        Ok(Watch {
            replies,
            _open: open,
        })
    }
}

/// A watch of a lock's keys, open until dropped.
pub(crate) struct Watch {
    replies: tonic::Streaming<WatchResponse>,
    _open: tokio::sync::mpsc::UnboundedSender<WatchRequest>,
}

impl Watch {
    /// The next changes, in revision order. An error (the stream broke, the
    /// server cancelled the watch) leaves the caller to watch and read
    /// again.
    pub(crate) async fn changes(&mut self) -> Result<Vec<Event>> {
        const WHAT: &str = "watch the lock";
        loop {
            let reply = match self.replies.next().await {
                Some(reply) => reply.map_err(|s| grpc_error(s, WHAT))?,
                None => return Err(stream_ended(WHAT)),
            };
            if reply.canceled {
                return Err(Error::unavailable(
                    crate::backend::NAME,
                    format!("{WHAT}: cancelled by the server: {}", reply.cancel_reason),
                    Status::cancelled(reply.cancel_reason.clone()),
                ));
            }
            if !reply.events.is_empty() {
                return Ok(reply.events);
            }
        }
    }
}

fn stream_ended(what: &str) -> Error {
    Error::connection(
        crate::backend::NAME,
        what.to_owned(),
        Status::unavailable("the stream ended"),
    )
}

/// A request stream of `requests` that stays open while the returned
/// sender lives: a closed request stream may end the server's side before
/// its replies came. Once the sender and the reply stream are dropped, the
/// client resets the HTTP/2 stream, and the server forgets the watch or
/// keep-alive. A request stream that never ended would keep it open, and
/// the server's further messages would pile up unread on the connection
/// (h2 closes a connection with too many of them).
fn open_stream<T: Send + 'static>(
    requests: impl IntoIterator<Item = T>,
) -> (
    tokio_stream::wrappers::UnboundedReceiverStream<T>,
    tokio::sync::mpsc::UnboundedSender<T>,
) {
    let (open, outgoing) = tokio::sync::mpsc::unbounded_channel();
    for request in requests {
        // The receiver lives: sending cannot fail.
        let _ = open.send(request);
    }
    (
        tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing),
        open,
    )
}
