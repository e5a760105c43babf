//! The pieces of etcd transactions the driver builds, and what it reads
//! from their replies.

use dlock_core::{Error, Result};

use crate::backend::NAME;
use crate::proto::{
    Compare, DeleteRangeRequest, KeyValue, PutRequest, RangeRequest, RequestOp, ResponseHeader,
    TxnResponse, compare, request_op, response_op,
};

pub(crate) fn range_op(key: Vec<u8>, range_end: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestRange(RangeRequest {
            key,
            range_end,
            ..RangeRequest::default()
        })),
    }
}

pub(crate) fn delete_op(key: Vec<u8>) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key,
                ..DeleteRangeRequest::default()
            },
        )),
    }
}

pub(crate) fn put_op(key: Vec<u8>, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp {
        request: Some(request_op::Request::RequestPut(PutRequest {
            key,
            value,
            lease,
            ..PutRequest::default()
        })),
    }
}

/// The comparison that `key` was created at `revision` (0: does not exist).
pub(crate) fn created_at(key: Vec<u8>, revision: i64) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Create as i32,
        key,
        target_union: Some(compare::TargetUnion::CreateRevision(revision)),
        range_end: Vec::new(),
    }
}

/// The comparison that `key` was created before `revision`.
pub(crate) fn created_before(key: Vec<u8>, revision: i64) -> Compare {
    Compare {
        result: compare::CompareResult::Less as i32,
        target: compare::CompareTarget::Create as i32,
        key,
        target_union: Some(compare::TargetUnion::CreateRevision(revision)),
        range_end: Vec::new(),
    }
}

/// The comparison that `key` is attached to `lease` (a key handed to a
/// delayed release's lease no longer belongs to its old lease).
pub(crate) fn under_lease(key: Vec<u8>, lease: i64) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Lease as i32,
        key,
        target_union: Some(compare::TargetUnion::Lease(lease)),
        range_end: Vec::new(),
    }
}

/// A transaction's revision, as a fencing token.
pub(crate) fn revision(reply: &TxnResponse) -> Result<i64> {
    header_revision(reply.header.as_ref(), "a transaction (its header)", reply)
}

/// The revision a reply's header gives, which is positive on a healthy
/// server; `what` and `reply` name a malformed one.
pub(crate) fn header_revision(
    header: Option<&ResponseHeader>,
    what: &str,
    reply: impl std::fmt::Debug,
) -> Result<i64> {
    header
        .map(|h| h.revision)
        .filter(|&r| r > 0)
        .ok_or_else(|| Error::malformed(NAME, what, reply))
}

/// The keys read by a transaction's ranges, all of them.
pub(crate) fn ranged(reply: &TxnResponse) -> Result<Vec<&KeyValue>> {
    let mut ranges = reply
        .responses
        .iter()
        .filter_map(|r| match &r.response {
            Some(response_op::Response::ResponseRange(range)) => Some(&range.kvs),
            _ => None,
        })
        .peekable();
    if ranges.peek().is_none() {
        return Err(Error::malformed(NAME, "a transaction (no range)", reply));
    }
    Ok(ranges.flatten().collect())
}

/// A token from a revision, which is positive on a healthy server.
pub(crate) fn token(revision: i64) -> Result<u64> {
    u64::try_from(revision)
        .ok()
        .filter(|&t| t > 0)
        .ok_or_else(|| Error::malformed(NAME, "a revision", revision))
}
