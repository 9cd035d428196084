//! The crash harness: run one operation on a volume over the crash simulator and check every
//! post-crash image: fsck of the image reports the crash alone, recovery succeeds, fsck is
//! clean afterwards, and the namespace equals the state before or after the operation (after,
//! once the operation returned).

use std::cell::Cell;
use std::sync::Arc;

use pmfs::{MappingKind, Options, Volume, fsck};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SAMPLES_ENV, SimRegion};

use super::crash_image::check_crashed;
use super::{Snapshot, snapshot};

/// Size of the simulated volumes: one 2 MiB data group after the metadata.
pub const SIM_SIZE: u64 = 4 << 20;

/// Options of the simulated volumes.
pub fn sim_options(kind: MappingKind) -> Options {
    Options {
        inodes: Some(64),
        journal_slots: 2,
        ..Options::with_mapping(kind)
    }
}

/// An explorer for the tests whose workloads have many crash points or that check each image
/// more than once: crash points of up to 8 images enumerated, 8 sampled at the others unless
/// `PMFS_CRASH_SAMPLES` says otherwise.
pub fn light_explorer(seed: u64) -> Explorer {
    let e = Explorer::new(seed).exhaustive_limit(8);
    if std::env::var_os(SAMPLES_ENV).is_some() {
        e
    } else {
        e.samples(8)
    }
}

/// Mounts `image` (recovering it), snapshots it, closes it and runs fsck.
pub fn recover_and_check(image: &[u8]) -> Result<Snapshot, String> {
    recover_and_check_with(image, snapshot)
}

/// [`recover_and_check`] that returns what `look` sees of the recovered volume.
pub fn recover_and_check_with<T>(image: &[u8], look: impl Fn(&Volume) -> T) -> Result<T, String> {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::from_image(image).map_err(|e| e.to_string())?);
    let vol = Volume::mount(media.clone()).map_err(|e| format!("mount failed: {e}"))?;
    let snap = look(&vol);
    vol.close().map_err(|e| format!("close failed: {e}"))?;
    let report = fsck::check(media).map_err(|e| format!("fsck failed: {e}"))?;
    if !report.is_clean() {
        return Err(format!("fsck after recovery: {:#?}", report.problems));
    }
    Ok(snap)
}

/// Runs `op` after `setup` under the simulator and checks every crash image.
///
/// `setup` builds the tree (it may keep state, such as open files, for the operation).
pub fn check_op<S, T>(
    kind: MappingKind,
    seed: u64,
    setup: S,
    op: impl Fn(&Volume, &mut T) -> pmfs::Result<()>,
) where
    S: Fn(&Volume) -> T,
{
    // The expected "after": the same setup and operation on a plain heap region.
    let after = {
        let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
        let vol = Volume::format(media, &sim_options(kind)).unwrap();
        let mut state = setup(&vol);
        op(&vol, &mut state).unwrap();
        drop(state);
        snapshot(&vol)
    };
    let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
    let vol = Volume::format(region.clone(), &sim_options(kind)).unwrap();
    let mut state = setup(&vol);
    let before = snapshot(&vol);
    assert_ne!(before, after, "the operation must change the namespace");
    region.persist_all();
    let done = Cell::new(false);
    let stats = Explorer::new(seed)
        .exhaustive_limit(1024)
        .store_prefixes(true)
        .run(
            &region,
            |_| {
                op(&vol, &mut state).unwrap();
                done.set(true);
            },
            |cp| {
                check_crashed(cp.image)?;
                let got = recover_and_check(cp.image)?;
                if got == after || (got == before && !done.get()) {
                    Ok(())
                } else {
                    Err(format!(
                        "namespace after recovery is neither before nor after (returned: {}):\n\
                         got {got:#?}\nbefore {before:#?}\nafter {after:#?}",
                        done.get()
                    ))
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
    assert!(stats.fences > 0);
    drop(state);
    drop(vol);
}
