//! What drivers share for operators' calls.

use std::future::Future;

use crate::{Error, Lease, LockInfo, LockOptions, Result};

/// [`Backend::force_release`](crate::Backend::force_release) in rounds,
/// for the trait's default and for drivers with shared kinds of lock:
/// read the holder (`inspect`); end the name's shared holds all at once
/// (`clear`, which says whether the name had any); or else release the
/// mutex holder by its token (`release`). A holder that changed between
/// the look and the release (it released, or its lease ended and the name
/// was taken again) is looked up again, five rounds at most.
///
/// # Errors
/// The closures' errors, and a backend error naming `driver` when the
/// holder kept changing.
pub async fn force_release_with<I, IF, C, CF, R, RF>(
    driver: &'static str,
    name: &str,
    mut inspect: I,
    mut clear: C,
    mut release: R,
) -> Result<Option<LockInfo>>
where
    I: FnMut() -> IF,
    IF: Future<Output = Result<Option<LockInfo>>>,
    C: FnMut() -> CF,
    CF: Future<Output = Result<bool>>,
    R: FnMut(Lease) -> RF,
    RF: Future<Output = Result<()>>,
{
    for _ in 0..5 {
        let Some(info) = inspect().await? else {
            return Ok(None);
        };
        if clear().await? {
            return Ok(Some(info));
        }
        // Drivers that store the holder with the token compare both.
        let opts = LockOptions::new().holder(info.holder.clone().unwrap_or_default());
        let lease = Lease::with_ttl(
            name,
            info.owner,
            info.fencing_token,
            &opts,
            tokio::time::Instant::now(),
        );
        match release(lease).await {
            Ok(()) => return Ok(Some(info)),
            Err(Error::NotHeld { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Err(Error::Backend {
        backend: driver,
        message: format!("the holder of {name:?} kept changing"),
        source: None,
    })
}
