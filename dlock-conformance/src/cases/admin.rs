//! Administration: `list` shows exactly the held locks, page by page,
//! `force_release` frees a name whoever holds it, and both, with `inspect`,
//! say who holds it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, Error, Lease, LeaseKind, LockOptions};

use super::{assert_not_held, needs};
use crate::support::{long, must_acquire, unique_name};

/// `list` pages through the held locks under a prefix: every held name
/// shows with its holder, released names and names outside the prefix do
/// not. Drivers that cannot list say so (`Unsupported`) and the case passes.
pub async fn list_pages_through_held_locks(backend: &Arc<dyn Backend>) {
    let prefix = format!("{}/", unique_name("list"));
    let mut held = BTreeMap::new();
    for suffix in ["a", "b", "c", "d}", "e%7D", "é f", "g/h"] {
        let name = format!("{prefix}{suffix}");
        let lease = must_acquire(backend.as_ref(), &name, &long()).await;
        held.insert(name, lease);
    }
    let released = must_acquire(backend.as_ref(), &format!("{prefix}released"), &long()).await;
    backend.release(&released).await.expect("release");
    let outside_name = format!("{}x", &prefix[..prefix.len() - 1]);
    let outside = must_acquire(backend.as_ref(), &outside_name, &long()).await;

    let mut seen = BTreeMap::new();
    let mut cursor: Option<String> = None;
    for page in 0.. {
        assert!(page < 100, "list never reached its last page");
        let listed = match backend.list(&prefix, cursor.as_deref(), 2).await {
            Ok(listed) => listed,
            Err(Error::Unsupported { .. }) => {
                eprintln!("list_pages_through_held_locks: not applicable: the backend cannot list");
                return;
            }
            Err(e) => panic!("list failed: {e}"),
        };
        for lock in listed.locks {
            seen.insert(lock.name, lock.info);
        }
        match listed.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    let names: Vec<&String> = seen.keys().collect();
    let expected: Vec<&String> = held.keys().collect();
    assert_eq!(
        names, expected,
        "list shows exactly the held names under the prefix"
    );
    for (name, info) in &seen {
        let lease = &held[name];
        assert_eq!(info.owner, lease.owner(), "{name:?} lists another holder");
        if backend.capabilities().fencing {
            assert_eq!(info.fencing_token, lease.fencing_token(), "{name:?}");
        }
    }
    for lease in held.values() {
        backend.release(lease).await.expect("release");
    }
    backend.release(&outside).await.expect("release");
}

/// `force_release` frees a held name whoever holds it, and reports the
/// holder; the next grant's fencing token is greater, and the old holder's
/// lease is "not held". A free name gives `None`; a delayed release's hold
/// ends too.
pub async fn force_release_frees_the_name_for_the_next_holder(backend: &Arc<dyn Backend>) {
    let case = "force_release_frees_the_name_for_the_next_holder";
    let name = unique_name(case);
    let held = must_acquire(backend.as_ref(), &name, &long()).await;
    let removed = backend
        .force_release(&name)
        .await
        .expect("force_release")
        .unwrap_or_else(|| panic!("force_release of a held name reported it free"));
    assert_eq!(
        removed.owner,
        held.owner(),
        "force_release reported another holder"
    );
    let next = must_acquire(backend.as_ref(), &name, &long()).await;
    if backend.capabilities().fencing {
        assert!(next.fencing_token() > held.fencing_token());
    }
    assert_not_held(
        backend.release(&held).await,
        "release by the removed holder",
    );
    backend
        .release(&next)
        .await
        .expect("the new holder's release");
    assert!(
        backend
            .force_release(&name)
            .await
            .expect("force_release")
            .is_none(),
        "force_release of a free name reported a holder"
    );
    if backend.capabilities().delayed_release {
        let last = must_acquire(backend.as_ref(), &name, &long()).await;
        backend
            .release_after(&last, Duration::from_secs(60))
            .await
            .expect("release_after");
        assert!(
            backend
                .force_release(&name)
                .await
                .expect("force_release")
                .is_some(),
            "force_release did not see the hold of a delayed release"
        );
        let after = must_acquire(backend.as_ref(), &name, &long()).await;
        backend.release(&after).await.expect("release");
    }
}

/// Every grant stores its holder description ([`LockOptions::holder`]):
/// `inspect`, `list` and `force_release` report it, for a mutex and for a
/// reader's and a permit's hold; the default is this process's `host:pid`,
/// an empty one is none; a description too long or with a control
/// character is refused before anything is written.
pub async fn holders_show_in_inspect_and_list(backend: &Arc<dyn Backend>) {
    let case = "holders_show_in_inspect_and_list";
    let prefix = format!("{}/", unique_name("holder"));
    let holder = "worker 7 · Zürich:4211 🔒";
    let named = format!("{prefix}named");
    let lease = must_acquire(backend.as_ref(), &named, &long().holder(holder)).await;
    assert_eq!(lease.holder(), holder);
    assert_eq!(holder_of(backend, &named).await.as_deref(), Some(holder));

    let default = format!("{prefix}default");
    let by_default = must_acquire(backend.as_ref(), &default, &long()).await;
    let expected = dlock_core::driver::host_and_pid();
    assert_eq!(
        holder_of(backend, &default).await,
        Some(expected.clone()),
        "a grant without a holder description stores host:pid"
    );
    let anonymous = format!("{prefix}none");
    let unnamed = must_acquire(backend.as_ref(), &anonymous, &long().holder("")).await;
    assert_eq!(holder_of(backend, &anonymous).await, None);

    match backend.list(&prefix, None, 10).await {
        Ok(page) => {
            let listed: BTreeMap<String, Option<String>> = page
                .locks
                .into_iter()
                .map(|l| (l.name, l.info.holder))
                .collect();
            let wanted = BTreeMap::from([
                (default.clone(), Some(expected)),
                (named.clone(), Some(holder.to_owned())),
                (anonymous.clone(), None),
            ]);
            assert_eq!(listed, wanted, "list shows each lock's holder");
        }
        Err(Error::Unsupported { .. }) => {}
        Err(e) => panic!("list failed: {e}"),
    }

    let refused = format!("{prefix}refused");
    for bad in [
        "two\nlines",
        "\u{1b}[2J",
        &"x".repeat(dlock_core::MAX_HOLDER_LEN + 1),
    ] {
        let tried = backend.try_acquire(&refused, &long().holder(bad)).await;
        assert!(
            matches!(
                tried,
                Err(Error::InvalidOption {
                    option: "holder",
                    ..
                })
            ),
            "the holder {bad:?} was not refused: {tried:?}"
        );
    }
    assert!(
        backend.inspect(&refused).await.expect("inspect").is_none(),
        "a refused acquire left a holder"
    );

    let removed = backend.force_release(&named).await.expect("force_release");
    assert_eq!(
        removed.and_then(|info| info.holder).as_deref(),
        Some(holder),
        "force_release reports the holder it removed"
    );
    for lease in [by_default, unnamed] {
        backend.release(&lease).await.expect("release");
    }

    let caps = backend.capabilities();
    if caps.delayed_release {
        // A grant that waited out a delayed release's hold keeps its own
        // description (a driver that writes its queue node to read the
        // server's clock must write the description back).
        let name = format!("{prefix}after-hold");
        let first = must_acquire(backend.as_ref(), &name, &long()).await;
        backend
            .release_after(&first, Duration::from_millis(300))
            .await
            .expect("release_after");
        let opts = long()
            .holder("after the hold")
            .wait(Duration::from_secs(30));
        let next = backend
            .acquire(&name, &opts)
            .await
            .expect("acquire after the hold");
        assert_eq!(
            holder_of(backend, &name).await.as_deref(),
            Some("after the hold"),
            "a grant made after a hold"
        );
        backend.release(&next).await.expect("release");
    }
    let shared = [
        (caps.rwlock, LockOptions::new().read(), "reader 1"),
        (caps.semaphore, LockOptions::new().permits(3), "permit 1"),
    ];
    for (has, opts, holder) in shared {
        if !needs(case, has, "the backend has no such kind of lock") {
            continue;
        }
        let name = unique_name(case);
        let opts = opts.ttl(long().get_ttl()).holder(holder);
        let lease = must_acquire(backend.as_ref(), &name, &opts).await;
        assert_eq!(
            holder_of(backend, &name).await.as_deref(),
            Some(holder),
            "a {:?} hold's holder",
            opts.get_mode()
        );
        let info = backend.inspect(&name).await.expect("inspect");
        let mode = info.and_then(|info| info.mode);
        assert!(
            mode.is_none_or(|m| m == opts.get_mode()),
            "inspect reports a {:?} hold as {mode:?}",
            opts.get_mode()
        );
        backend.release(&lease).await.expect("release");
    }
}

async fn holder_of(backend: &Arc<dyn Backend>, name: &str) -> Option<String> {
    let info = backend.inspect(name).await.expect("inspect");
    info.unwrap_or_else(|| panic!("inspect of the held {name:?} found it free"))
        .holder
}

/// `holders` lists every live hold of a name, each with its own owner,
/// fencing token and description: the mutex's holder, a delayed release's
/// hold, each reader, each permit (the longest-lasting first where leases
/// have TTLs); nothing for a free name, or once `force_release` has ended
/// every hold.
pub async fn holders_list_every_hold(backend: &Arc<dyn Backend>) {
    let case = "holders_list_every_hold";
    let caps = backend.capabilities();
    let name = unique_name(case);
    let free = backend.holders(&name).await.expect("holders");
    assert!(free.is_empty(), "a free name has holds: {free:?}");
    assert!(
        matches!(backend.holders("").await, Err(Error::InvalidName { .. })),
        "holders of an invalid name"
    );
    let lease = must_acquire(backend.as_ref(), &name, &long().holder("the one")).await;
    assert_holds(backend, &name, &[&lease]).await;
    if caps.delayed_release {
        let hold = Duration::from_secs(60);
        backend
            .release_after(&lease, hold)
            .await
            .expect("release_after");
        let holds = backend.holders(&name).await.expect("holders");
        assert_eq!(holds.len(), 1, "a delayed release's hold: {holds:?}");
        backend.force_release(&name).await.expect("force_release");
    } else {
        backend.release(&lease).await.expect("release");
    }
    let left = backend.holders(&name).await.expect("holders");
    assert!(left.is_empty(), "a freed name has holds: {left:?}");

    let shared = [
        (caps.rwlock, LockOptions::new().read(), "readers"),
        (caps.semaphore, LockOptions::new().permits(3), "permits"),
    ];
    for (has, opts, kind) in shared {
        if !needs(case, has, "the backend has no such kind of lock") {
            continue;
        }
        let name = unique_name(case);
        let longest = opts.clone().ttl(Duration::from_secs(120)).holder(kind);
        let first = must_acquire(backend.as_ref(), &name, &longest).await;
        let others = long().mode(opts.get_mode());
        let second = must_acquire(backend.as_ref(), &name, &others).await;
        let third = must_acquire(backend.as_ref(), &name, &others.holder("")).await;
        let holds = assert_holds(backend, &name, &[&first, &second, &third]).await;
        if caps.lease == LeaseKind::Ttl {
            assert_eq!(holds[0].owner, first.owner(), "the longest hold first");
        }
        backend.release(&second).await.expect("release");
        assert_holds(backend, &name, &[&first, &third]).await;
        // An operator's force release ends them all.
        let removed = backend.force_release(&name).await.expect("force_release");
        assert!(removed.is_some(), "force_release found no {kind}");
        let left = backend.holders(&name).await.expect("holders");
        assert!(left.is_empty(), "{kind} outlived force_release: {left:?}");
        for lease in [first, third] {
            assert_not_held(backend.release(&lease).await, "a forcibly released hold");
        }
    }
}

/// `holders` of `name` shows exactly `leases`, each as granted; returns
/// the holds in the order listed.
async fn assert_holds(
    backend: &Arc<dyn Backend>,
    name: &str,
    leases: &[&Lease],
) -> Vec<dlock_core::LockInfo> {
    let holds = backend.holders(name).await.expect("holders");
    let mut shown: Vec<_> = holds.iter().map(|h| h.owner.to_string()).collect();
    let mut granted: Vec<_> = leases.iter().map(|l| l.owner().to_string()).collect();
    shown.sort();
    granted.sort();
    assert_eq!(shown, granted, "holders of {name:?}: {holds:?}");
    for lease in leases {
        let Some(hold) = holds.iter().find(|h| h.owner == lease.owner()) else {
            continue;
        };
        if backend.capabilities().fencing {
            assert_eq!(hold.fencing_token, lease.fencing_token(), "{hold:?}");
        }
        let described = (!lease.holder().is_empty()).then(|| lease.holder().to_owned());
        assert_eq!(hold.holder, described, "{hold:?}");
        assert!(hold.mode.is_none_or(|m| m == lease.mode()), "{hold:?}");
    }
    holds
}
