//! Leader election ([`Election`]) over clients of one backend: one leader
//! at a time, a resigned leader's successor at once, and followers that
//! read who leads.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Backend, Election, Leadership, LockOptions, Locker};
use tokio::task::JoinHandle;
use tokio::time::sleep;

use crate::support::unique_name;

/// Three clients campaign for one election: one leads, the others wait;
/// each resignation lets exactly one of the waiters lead, with a greater
/// fencing token; an observer on a fourth client sees every term in
/// order, each with the identity its leader campaigned as.
pub async fn an_election_has_one_leader_at_a_time<F, Fut>(factory: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Arc<dyn Backend>>,
{
    let name = unique_name("election");
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let mut elections = Vec::new();
    for i in 0..3 {
        let locker = Locker::from_arc(factory().await);
        elections.push(Election::new(locker, &name, format!("node {i} 🔒")).options(opts.clone()));
    }
    let watcher = Election::new(Locker::from_arc(factory().await), &name, "watcher")
        .poll_interval(Duration::from_millis(20));
    let mut observer = watcher.observe();

    let first = elections[0].campaign().await.expect("the first campaign");
    let mut waiting: Vec<JoinHandle<(usize, Leadership)>> = elections
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, election)| {
            let election = election.clone();
            tokio::spawn(async move {
                let term = election.campaign().await.expect("a campaign");
                (i, term)
            })
        })
        .collect();
    let mut term = (0, first);
    let mut terms = Vec::new();
    loop {
        let (leader, leadership) = &term;
        for other in &waiting {
            assert!(!other.is_finished(), "two campaigners lead at once");
        }
        let seen = loop {
            // Until the observer has caught up with this term (a gap with
            // no leader may show first).
            if let Some(seen) = observer.changed().await.expect("observe") {
                break seen;
            }
        };
        assert_eq!(
            seen.identity.as_deref(),
            Some(elections[*leader].identity()),
            "the observer reads another leader"
        );
        assert_eq!(seen.fencing_token, leadership.fencing_token());
        terms.push(seen.fencing_token);
        let read = watcher.leader().await.expect("leader").expect("a leader");
        assert_eq!(read.identity, seen.identity);
        if waiting.is_empty() {
            break;
        }
        let (_, leadership) = term;
        leadership.resign().await.expect("resign");
        let (next, others) = first_done(waiting).await;
        term = next;
        waiting = others;
        for other in &waiting {
            assert!(!other.is_finished(), "two campaigners lead at once");
        }
    }
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms' tokens do not increase: {terms:?}"
    );
    term.1.resign().await.expect("resign");
}

/// The first of `waiting` to finish, and the others.
async fn first_done(
    mut waiting: Vec<JoinHandle<(usize, Leadership)>>,
) -> ((usize, Leadership), Vec<JoinHandle<(usize, Leadership)>>) {
    // Bounded by the case's timeout; each poll waits a little, so that a
    // hand-off is found within a round of polls.
    loop {
        for i in 0..waiting.len() {
            if waiting[i].is_finished() {
                let done = waiting.remove(i);
                let term = done.await.expect("a campaign task");
                return (term, waiting);
            }
        }
        sleep(Duration::from_millis(10)).await;
    }
}
