//! Unlinked files give every block back (data, log and extended-attribute blocks) and their
//! inode numbers, on every mapping. HashFS frees written files in batches, one scan of its
//! global table for many files: asking for the free space, running out of space or inodes,
//! and unmounting complete a batch, and a crash leaves the files to the next mount (orphans
//! until then, which the mount frees).

mod common;

use pmfs::fsck::ProblemKind;
use pmfs::{MappingKind, Volume, XattrSet};

use common::{KINDS, crash_copy, fresh, remount};

/// Writes `n` files of a few blocks each in directory `/d` (some with an extended
/// attribute), overwriting them once so their logs grow, and unlinks them all.
fn churn(vol: &Volume, n: usize) {
    for i in 0..n {
        let path = format!("/d/f{i}");
        let data = vec![i as u8; 4096 * (1 + i % 4) + 100];
        vol.write(&path, &data).unwrap();
        vol.write(&path, &data[..data.len() / 2]).unwrap();
        if i % 3 == 0 {
            let dir = vol.lookup(vol.root(), b"d").unwrap().ino;
            let ino = vol.lookup(dir, format!("f{i}").as_bytes()).unwrap().ino;
            vol.set_xattr(ino, b"user.k", &[7u8; 300], XattrSet::Any)
                .unwrap();
        }
    }
    for i in 0..n {
        vol.remove_file(&format!("/d/f{i}")).unwrap();
    }
}

/// A volume of `kind` with directory `/d` grown by a first [`churn`] of `n` files (a
/// directory keeps the blocks its entries took), and its free space then.
fn warmed(
    kind: MappingKind,
    n: usize,
) -> (
    Volume,
    std::sync::Arc<dyn pmfs_core::pm::Media>,
    pmfs::StatFs,
) {
    let (vol, media) = fresh(kind);
    vol.create_dir("/d").unwrap();
    churn(&vol, n);
    let before = vol.statfs().unwrap();
    (vol, media, before)
}

#[test]
fn space_and_inodes_come_back_after_unlinks() {
    for kind in KINDS {
        // More files than one HashFS batch, and a rest.
        let (vol, media, before) = warmed(kind, 150);
        churn(&vol, 150);
        let after = vol.statfs().unwrap();
        assert_eq!(
            after.free_blocks, before.free_blocks,
            "{kind:?}: blocks not freed"
        );
        assert_eq!(
            after.free_inodes, before.free_inodes,
            "{kind:?}: inodes not freed"
        );
        vol.close().unwrap();
        let vol = remount(&media);
        assert_eq!(
            vol.statfs().unwrap().free_blocks,
            before.free_blocks,
            "{kind:?}"
        );
        vol.close().unwrap();
        data_free_fsck(media, kind);
    }
}

#[test]
fn a_crash_before_a_batch_is_freed_leaves_orphans_the_mount_frees() {
    let (vol, media, before) = warmed(MappingKind::HashFs, 10);
    churn(&vol, 10);
    // The ten files wait for their batch: a crash now.
    let image = crash_copy(&media);
    drop(vol);
    let report = pmfs::fsck::check(image.clone()).unwrap();
    assert!(
        report.orphans.len() == 10
            && report
                .problems
                .iter()
                .all(|p| p.kind == ProblemKind::NotClean),
        "the ten files as orphans, nothing else: {:?} {:#?}",
        report.orphans,
        report.problems
    );
    let vol = remount(&image);
    let after = vol.statfs().unwrap();
    assert_eq!(after.free_blocks, before.free_blocks);
    assert_eq!(after.free_inodes, before.free_inodes);
    for i in 0..10 {
        assert!(vol.metadata(&format!("/d/f{i}")).is_err());
    }
    vol.close().unwrap();
    data_free_fsck(image, MappingKind::HashFs);
}

#[test]
fn orphans_a_crash_left_are_freed_whole_by_the_mount() {
    // Files unlinked while open, with data, blocks allocated past their end and extended
    // attributes: what a crash leaves of them the mount frees, every block (on the cuckoo
    // table from one pass over it for them all).
    for kind in KINDS {
        let (vol, media, before) = warmed(kind, 10);
        let mut held = Vec::new();
        for i in 0..12 {
            let path = format!("/d/o{i}");
            vol.write(&path, &vec![i as u8; 4096 * (1 + i % 3) + 10])
                .unwrap();
            let dir = vol.lookup(vol.root(), b"d").unwrap().ino;
            let ino = vol.lookup(dir, format!("o{i}").as_bytes()).unwrap().ino;
            let node = vol.open_ino(ino, common::RW).unwrap();
            node.allocate(0, 4096 * (6 + i as u64), true).unwrap();
            vol.set_xattr(ino, b"user.k", &[3u8; 200], XattrSet::Any)
                .unwrap();
            vol.remove_file(&path).unwrap();
            held.push(node);
        }
        let image = crash_copy(&media);
        drop(held);
        drop(vol);
        let vol = remount(&image);
        assert_eq!(vol.mount_report().orphans_freed, 12, "{kind:?}");
        let after = vol.statfs().unwrap();
        assert_eq!(after.free_blocks, before.free_blocks, "{kind:?}");
        assert_eq!(after.free_inodes, before.free_inodes, "{kind:?}");
        vol.close().unwrap();
        data_free_fsck(image, kind);
    }
}

#[test]
fn running_out_of_inodes_frees_the_waiting_files() {
    let (vol, _media) = fresh(MappingKind::HashFs);
    let free = vol.statfs().unwrap().free_inodes;
    // Every inode used once and unlinked, then used again: the numbers waiting for a batch
    // must come back when creation finds none left.
    for round in 0..2 {
        let n = (free - 1) as usize;
        for i in 0..n {
            vol.write(&format!("/r{round}-{i}"), b"x").unwrap();
        }
        for i in 0..n {
            vol.remove_file(&format!("/r{round}-{i}")).unwrap();
        }
    }
    vol.close().unwrap();
}

fn data_free_fsck(media: std::sync::Arc<dyn pmfs_core::pm::Media>, kind: MappingKind) {
    let report = pmfs::fsck::check(media).unwrap();
    assert!(report.is_clean(), "{kind:?}: {:#?}", report.problems);
}
