//! A crash during the format leaves no volume or the empty one, and the upgrade of a
//! version-2 volume survives crashes: a read-write mount raises each file's
//! `MAPPED_END` word to its size (files of volumes made before the copy-on-write data path map
//! blocks below their size past the word) before it writes the new version. Whatever fence
//! of that mount a crash lands on, the next mount ends at the current version with every
//! word raised: a truncation then frees the file's blocks, and fsck finds the volume clean.

mod common;

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use pmfs::{FORMAT_VERSION, Volume, fsck};
use pmfs_core::layout::{PmOff, crc32c};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion};

use common::KINDS;
use common::crash::{SIM_SIZE, recover_and_check, sim_options};
use common::snapshot;

/// Offset of the superblock's format version, and of its checksum, in each copy (block 0
/// and block 1).
const VERSION_AT: usize = 8;
const CRC_AT: usize = 248;

/// The image of a closed volume of `kind` holding `/d/g` (9000 bytes), made to look like a
/// version-2 volume made before `MAPPED_END` was kept: both superblock copies say version 2
/// and the file's word says 0.
fn version_2_image(kind: pmfs::MappingKind) -> Vec<u8> {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
    let vol = Volume::format(media.clone(), &sim_options(kind)).unwrap();
    vol.create_dir("/d").unwrap();
    vol.write("/d/g", &[5u8; 9000]).unwrap();
    let ino = vol.symlink_metadata("/d/g").unwrap().ino();
    let info = vol.info();
    vol.close().unwrap();
    let mapped_end = PmOff(info.inode_table_offset + ino * info.inode_size + 120);
    assert_eq!(media.load_u64(mapped_end).unwrap(), 3);
    media.store_u64(mapped_end, 0).unwrap();
    let mut img = vec![0u8; SIM_SIZE as usize];
    media.read(PmOff(0), &mut img).unwrap();
    for base in [0usize, 4096] {
        img[base + VERSION_AT..base + VERSION_AT + 4].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c(&img[base..base + CRC_AT]);
        img[base + CRC_AT..base + CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    }
    img
}

/// Mounts `image`, checks the version and the file, truncates the file and checks that fsck
/// finds the volume clean (blocks left mapped past the truncation would be found).
fn upgraded_and_truncated(image: &[u8]) -> Result<(), String> {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::from_image(image).map_err(|e| e.to_string())?);
    let vol = Volume::mount(media.clone()).map_err(|e| format!("mount: {e}"))?;
    let version = vol.info().format_version;
    if version != FORMAT_VERSION {
        return Err(format!("version {version} after a read-write mount"));
    }
    let data = vol.read("/d/g").map_err(|e| format!("read: {e}"))?;
    if data != [5u8; 9000] {
        return Err("the file's data changed".into());
    }
    vol.write("/d/g", b"short")
        .map_err(|e| format!("truncate: {e}"))?;
    vol.close().map_err(|e| format!("close: {e}"))?;
    let report = fsck::check(media).map_err(|e| format!("fsck: {e}"))?;
    if report.is_clean() {
        Ok(())
    } else {
        Err(format!("fsck: {:#?}", report.problems))
    }
}

#[test]
fn a_crash_during_the_upgrade_of_a_version_2_volume_loses_no_mapped_end() {
    for kind in KINDS {
        let image = version_2_image(kind);
        let region = Arc::new(SimRegion::from_image(&image).unwrap());
        let media: Arc<dyn Media> = region.clone();
        let stats = Explorer::new(0x2d)
            .exhaustive_limit(64)
            .run(
                &region,
                |_| Volume::mount(media.clone()).unwrap().close().unwrap(),
                |cp| upgraded_and_truncated(cp.image),
            )
            .unwrap_or_else(|f| panic!("{kind:?}: {f}"));
        assert!(stats.fences > 2, "{kind:?}: {stats:?}");
    }
}

/// The format writes the superblocks last: a crash before them leaves no volume (the mount
/// refuses the image), and every image with them mounts as the empty volume, which fsck
/// finds clean. The structures the format lays out before them must be durable by then.
#[test]
fn a_crash_during_the_format_leaves_no_volume_or_the_empty_one() {
    for (i, kind) in KINDS.into_iter().enumerate() {
        let empty = {
            let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
            snapshot(&Volume::format(media, &sim_options(kind)).unwrap())
        };
        let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
        let formatted = Cell::new(false);
        // The volume outlives the run: its clean close is no crash point.
        let vol = RefCell::new(None);
        // The superblocks' lines enumerated, the tables' (thousands) sampled.
        let stats = Explorer::new(0x40 + i as u64)
            .exhaustive_limit(64)
            .samples(8)
            .run(
                &region,
                |_| {
                    *vol.borrow_mut() =
                        Some(Volume::format(region.clone(), &sim_options(kind)).unwrap());
                    formatted.set(true);
                },
                |cp| match recover_and_check(cp.image) {
                    Ok(got) if got == empty => Ok(()),
                    Ok(got) => Err(format!("{kind:?}: the new volume holds {got:#?}")),
                    Err(e) if !formatted.get() && e.starts_with("mount failed") => Ok(()),
                    Err(e) => Err(format!("{kind:?}: {e}")),
                },
            )
            .unwrap_or_else(|f| panic!("{f}"));
        assert!(stats.fences > 2, "{kind:?}: {stats:?}");
        vol.take().unwrap().close().unwrap();
    }
}
