//! The test image the harness starts its containers from, and how long
//! building it took (case time limits do not count that).

use std::process::Command;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use super::README_STEP;
use super::cleanup::remove_stale_containers;

/// How long this process has spent building the test image: done builds,
/// plus the one in progress.
static IMAGE_BUILD: Mutex<(Duration, Option<std::time::Instant>)> =
    Mutex::new((Duration::ZERO, None));

/// Time spent building the test image so far, which case time limits do
/// not count: on a fresh machine the first case to need a server waits
/// for the image (a minute or two) before its own work starts.
pub fn image_build_time() -> Duration {
    let build = IMAGE_BUILD.lock().unwrap_or_else(PoisonError::into_inner);
    build.0 + build.1.map_or(Duration::ZERO, |started| started.elapsed())
}

/// The image to start: `DLOCK_TEST_IMAGE`, or the one `testbed/build-image.sh`
/// builds (it returns at once when the image exists).
pub(crate) fn test_image() -> Result<String, String> {
    // Whoever starts a container first clears what killed runs left.
    static SWEEP: std::sync::Once = std::sync::Once::new();
    SWEEP.call_once(remove_stale_containers);
    static IMAGE: LazyLock<Result<String, String>> = LazyLock::new(|| {
        if let Ok(image) = std::env::var("DLOCK_TEST_IMAGE") {
            return Ok(image);
        }
        IMAGE_BUILD.lock().unwrap_or_else(PoisonError::into_inner).1 =
            Some(std::time::Instant::now());
        let built = build_image();
        let mut build = IMAGE_BUILD.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(started) = build.1.take() {
            build.0 += started.elapsed();
        }
        built
    });
    IMAGE.clone()
}

/// Runs `testbed/build-image.sh`, which prints the image reference.
fn build_image() -> Result<String, String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../testbed/build-image.sh");
    let out = Command::new("bash").arg(script).output().map_err(|e| {
        format!("dlock harness: cannot run {script}: {e}; set DLOCK_TEST_IMAGE or {README_STEP}")
    })?;
    if !out.status.success() {
        return Err(format!(
            "dlock harness: {script} failed; {README_STEP}.\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
