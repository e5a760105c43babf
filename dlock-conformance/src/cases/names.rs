//! Names and options: every legal name is a lock of its own, however easy
//! it is to map onto another's key by mistake; illegal names and
//! out-of-range options are refused before anything is locked.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, Error, LockOptions, validate_name};

use crate::support::{long, unique_name};

/// Names that are easy to map onto one key by mistake are distinct locks.
pub async fn tricky_names_are_distinct(backend: &Arc<dyn Backend>) {
    let id = format!("{:08x}", fastrand::u32(..));
    let mut names: Vec<String> = [
        "a/b",
        "a%2Fb",
        "a_b",
        "a{b}",
        "{a}b",
        "}x",
        "{",
        "}",
        "Job",
        "job",
        "JOB",
        "🔒 lock",
        "with space",
        "with  space",
        ".",
        "..",
        "/",
        "//",
        "a:b",
        "a\\b",
        "é",
        "e\u{301}",
        "tab\tx",
        "line\nx",
        "*",
        "?",
    ]
    .iter()
    .map(|n| format!("{n}{id}"))
    .collect();
    // SQL's PAD SPACE collations compare these equal to `pad<id>`.
    names.extend([
        format!("pad{id}"),
        format!("pad{id} "),
        format!("pad{id}  "),
    ]);
    names.push(format!("{}{id}", "x".repeat(255 - id.len())));
    names.push(format!("{}{id}", "é".repeat((255 - id.len()) / 2)));
    for n in &names {
        validate_name(n).expect("test names are legal");
    }
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "the test's names repeat");
    let mut leases = Vec::new();
    for n in &names {
        let lease = backend
            .try_acquire(n, &long())
            .await
            .unwrap_or_else(|e| panic!("try_acquire({n:?}) failed: {e}"))
            .unwrap_or_else(|| panic!("{n:?} was held already: it shares a key with another name"));
        leases.push(lease);
    }
    for (n, lease) in names.iter().zip(&leases) {
        let info = backend.inspect(n).await.expect("inspect").expect("held");
        assert_eq!(
            info.owner,
            lease.owner(),
            "{n:?} reports another name's holder"
        );
    }
    for lease in &leases {
        backend.release(lease).await.expect("release");
    }
}

/// Illegal names give `Error::InvalidName` from every operation.
pub async fn invalid_names_are_rejected(backend: &Arc<dyn Backend>) {
    for name in [
        String::new(),
        "x".repeat(256),
        "a\0b".to_owned(),
        "é".repeat(128),
    ] {
        let shown = format!("{:?}", name.chars().take(12).collect::<String>());
        let r = backend.try_acquire(&name, &long()).await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "try_acquire({shown}): {r:?}"
        );
        let r = backend.acquire(&name, &long().wait(Duration::ZERO)).await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "acquire({shown}): {r:?}"
        );
        let r = backend.inspect(&name).await;
        assert!(
            matches!(r, Err(Error::InvalidName { .. })),
            "inspect({shown}): {r:?}"
        );
    }
}

/// Out-of-range options give `Error::InvalidOption`.
pub async fn invalid_options_are_rejected(backend: &Arc<dyn Backend>) {
    let name = unique_name("invalid_options_are_rejected");
    for opts in [
        LockOptions::new().ttl(Duration::ZERO),
        LockOptions::new().ttl(Duration::from_secs(400 * 24 * 3600)),
        LockOptions::new()
            .ttl(Duration::from_secs(1))
            .drift(Duration::from_secs(1)),
    ] {
        let r = backend.try_acquire(&name, &opts).await;
        assert!(
            matches!(r, Err(Error::InvalidOption { .. })),
            "{opts:?}: {r:?}"
        );
        let r = backend.acquire(&name, &opts).await;
        assert!(
            matches!(r, Err(Error::InvalidOption { .. })),
            "{opts:?}: {r:?}"
        );
    }
    assert!(
        backend.inspect(&name).await.expect("inspect").is_none(),
        "a refused acquire took the lock"
    );
}
