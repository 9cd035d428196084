//! The checker's view of a crash image, shared by the crash harnesses.

use std::sync::Arc;

use pmfs::fsck::{self, ProblemKind};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::Media;

/// Runs the read-only check on `media`, which holds crash image `image`, before anything
/// recovers it. The checker examines a crashed volume as recovery leaves it, and recovery
/// leaves every crash image consistent: the report may name the crash
/// ([`ProblemKind::NotClean`]; an image of the end of a clean close is clean) and nothing
/// else, and the media must still hold the image.
pub fn check_crashed(media: &Arc<dyn Media>, image: &[u8]) -> Result<(), String> {
    let report =
        fsck::check(media.clone()).map_err(|e| format!("fsck of the crash image failed: {e}"))?;
    if report
        .problems
        .iter()
        .any(|p| p.kind != ProblemKind::NotClean)
    {
        return Err(format!("fsck of the crash image: {:#?}", report.problems));
    }
    let mut after = vec![0u8; image.len()];
    media
        .read(PmOff(0), &mut after)
        .map_err(|e| e.to_string())?;
    if let Some(at) = after.iter().zip(image).position(|(a, b)| a != b) {
        return Err(format!(
            "fsck of the crash image wrote to it (at byte {at:#x})"
        ));
    }
    Ok(())
}
