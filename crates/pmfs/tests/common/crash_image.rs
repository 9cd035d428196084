//! The checker's view of a crash image, shared by the crash harnesses.

use std::sync::Arc;

use pmfs::fsck::{self, ProblemKind};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::{HeapRegion, Media};

/// Runs the read-only check on crash image `image`, before anything recovers it. The checker
/// examines a crashed volume as recovery leaves it, and recovery leaves every crash image
/// consistent: the report must name the crash ([`ProblemKind::NotClean`]) and nothing else,
/// and the check must not change a byte.
///
/// The harnesses run it on the images of the operations they explore. The tests of crashes
/// during recovery (an exploration inside each image) leave it out for their inner images:
/// with it, one of them ran for more than a quarter of an hour in the unoptimised CI build.
pub fn check_crashed(image: &[u8]) -> Result<(), String> {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::from_image(image).map_err(|e| e.to_string())?);
    let report =
        fsck::check(media.clone()).map_err(|e| format!("fsck of the crash image failed: {e}"))?;
    if report
        .problems
        .iter()
        .map(|p| p.kind)
        .ne([ProblemKind::NotClean])
    {
        return Err(format!("fsck of the crash image: {:#?}", report.problems));
    }
    unchanged(&*media, image, "fsck of the crash image")
}

/// Fails, naming `who` and the first byte that differs, unless `media` still holds `image`.
pub fn unchanged(media: &dyn Media, image: &[u8], who: &str) -> Result<(), String> {
    let mut now = vec![0u8; image.len()];
    media.read(PmOff(0), &mut now).map_err(|e| e.to_string())?;
    match now.iter().zip(image).position(|(a, b)| a != b) {
        Some(at) => Err(format!("{who} wrote to the image (at byte {at:#x})")),
        None => Ok(()),
    }
}
