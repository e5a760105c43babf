//! Renewal batches that mix kinds of lock, for drivers whose mutex leases
//! and shared leases (reader-writer locks, semaphores) renew by different
//! requests.

use std::future::Future;

use crate::{Lease, Mode, Result};

/// What one half of a batch gives back: its leases (their deadlines moved
/// where extended) and its answer.
pub type Half = (Vec<Lease>, Result<Vec<bool>>);

/// [`Backend::extend_many`](crate::Backend::extend_many) of a batch that
/// mixes kinds: `mutexes` renews a copy of the batch's mutex leases and
/// `shared` one of the others, both at once (a half with no lease is not
/// run); each gives its copies back with its answer, and they go back in
/// the batch's order. A failure of either half fails the batch once both
/// halves are back, so the leases the other half extended keep their moved
/// deadlines, as the trait asks.
///
/// # Errors
/// The first half's error, if any.
pub async fn extend_by_kind<M, MF, S, SF>(
    leases: &mut [Lease],
    mutexes: M,
    shared: S,
) -> Result<Vec<bool>>
where
    M: FnOnce(Vec<Lease>) -> MF,
    MF: Future<Output = Half>,
    S: FnOnce(Vec<Lease>) -> SF,
    SF: Future<Output = Half>,
{
    let (shared_at, mutex_at): (Vec<usize>, Vec<usize>) =
        (0..leases.len()).partition(|&i| leases[i].mode() != Mode::Exclusive);
    let copies = |at: &[usize]| at.iter().map(|&i| leases[i].clone()).collect::<Vec<_>>();
    let (mutex_copies, shared_copies) = (copies(&mutex_at), copies(&shared_at));
    let (mutex_half, shared_half) = tokio::join!(
        async {
            if mutex_copies.is_empty() {
                (mutex_copies, Ok(Vec::new()))
            } else {
                mutexes(mutex_copies).await
            }
        },
        async {
            if shared_copies.is_empty() {
                (shared_copies, Ok(Vec::new()))
            } else {
                shared(shared_copies).await
            }
        },
    );
    let mut held = vec![false; leases.len()];
    let mut failure = None;
    for (at, (back, answer)) in [(&mutex_at, mutex_half), (&shared_at, shared_half)] {
        for (&i, lease) in at.iter().zip(back) {
            leases[i] = lease;
        }
        match answer {
            Ok(answer) => {
                for (&i, h) in at.iter().zip(answer) {
                    held[i] = h;
                }
            }
            Err(e) => failure = failure.or(Some(e)),
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(held),
    }
}
