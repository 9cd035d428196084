//! Mounting and checking a volume cost one pass over a hashed structure's table, not one per
//! file: the allocator rebuild of every mount of a cuckoo volume (its allocator is volatile)
//! and of a repair, and `fsck`'s check of each file's blocks, find every file's blocks in one
//! pass over the table, and so does the mount's release of the orphans a crash left (files
//! unlinked while open). The work is counted in words loaded from the media, not timed, on a
//! clean volume of 400 files and on a crash image of it taken with 300 unlinked files open.
//! The free blocks `fsck` reports are those the mount finds (on a volatile allocator `fsck`
//! reported the whole data region free).

mod common;

use std::sync::Arc;

use pmfs::{MappingKind, Owner, Volume, fsck};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::Media;

use common::counting;
use common::{KINDS, RW, options};

const BS: u64 = 4096;
const VOLUME: u64 = 128 << 20;
const FILES: u64 = 400;
/// Files unlinked while open when the crash image is taken.
const ORPHANS: u64 = 300;
/// Words a mount, a check or a repair may load: a few passes over the table of a hashed
/// structure (about 32 000 words each here) and up to a few thousand words per file (a repair
/// checks the volume twice and mounts it). They loaded 0.25 to 4.9 million; with a pass per
/// file a cuckoo mount loaded 52 million, a check 26 million (HashFS) and 104 million
/// (cuckoo), a repair 79 and 415 million; freeing each orphan whole with a pass of its own, a
/// HashFS mount after the crash loaded 10.4 million, a repair 12.6 million.
const LIMIT: u64 = 6_000_000;

#[test]
fn mount_check_and_repair_of_many_files_read_each_table_once() {
    for kind in KINDS {
        let clean = Arc::new(counting::new(VOLUME));
        let media: Arc<dyn Media> = clean.clone();
        let vol = Volume::format(media.clone(), &options(kind)).unwrap();
        let who = Owner { uid: 0, gid: 0 };
        // Files of one, two and three blocks, one with blocks past its end of file, and
        // unlinked ones still open when the crash image is taken.
        for i in 0..FILES {
            let name = format!("f{i}");
            let (_, f, _) = vol
                .create_open(vol.root(), name.as_bytes(), 0o644, who, true, RW)
                .unwrap();
            f.write_at(&vec![i as u8; (BS * (1 + i % 3)) as usize], 0)
                .unwrap();
        }
        let (_, f, _) = vol
            .create_open(vol.root(), b"kept", 0o644, who, true, RW)
            .unwrap();
        f.allocate(0, 8 * BS, true).unwrap();
        drop(f);
        let mut gone = Vec::new();
        for i in 0..ORPHANS {
            let name = format!("gone{i}");
            let (_, f, _) = vol
                .create_open(vol.root(), name.as_bytes(), 0o644, who, true, RW)
                .unwrap();
            f.write_at(&[1; 2 * BS as usize], 0).unwrap();
            vol.unlink_at(vol.root(), name.as_bytes()).unwrap();
            gone.push(f);
        }
        let mut image = vec![0; VOLUME as usize];
        media.read(PmOff(0), &mut image).unwrap();
        drop(gone);
        vol.close().unwrap();
        let what = |op: &str| format!("{kind:?}: {op}");

        let vol = clean
            .tap()
            .costs(LIMIT, &what("mount"), || Volume::mount(media.clone()))
            .unwrap();
        let free = vol.statfs().unwrap().free_blocks;
        let mut buf = vec![0u8; 3 * BS as usize];
        let f = vol
            .open_ino(vol.lookup(vol.root(), b"f398").unwrap().ino, RW)
            .unwrap();
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 3 * BS as usize);
        assert!(buf.iter().all(|&b| b == (398 % 256) as u8));
        drop(f);
        vol.close().unwrap();
        let report = clean
            .tap()
            .costs(LIMIT, &what("check"), || fsck::check(media.clone()))
            .unwrap();
        assert!(report.is_clean(), "{kind:?}: {:#?}", report.problems);
        let blocks: u64 = (0..FILES).map(|i| 1 + i % 3).sum::<u64>() + 8;
        assert!(report.used_blocks >= blocks, "{kind:?}: {report:?}");
        assert_eq!(report.free_blocks, free, "{kind:?}: {report:?}");

        let crashed = Arc::new(counting::from_image(&image));
        let vol = crashed
            .tap()
            .costs(LIMIT, &what("mount after a crash"), || {
                Volume::mount(crashed.clone())
            })
            .unwrap();
        assert!(!vol.mount_report().clean, "{kind:?}");
        assert_eq!(vol.mount_report().orphans_freed, ORPHANS as u32, "{kind:?}");
        assert_eq!(vol.statfs().unwrap().free_blocks, free, "{kind:?}");
        vol.close().unwrap();

        let crashed = Arc::new(counting::from_image(&image));
        let repair = crashed
            .tap()
            .costs(LIMIT, &what("repair after a crash"), || {
                fsck::repair(crashed.clone())
            })
            .unwrap();
        assert!(repair.after.is_clean(), "{kind:?}: {repair:?}");
        let rebuilt = repair
            .actions
            .iter()
            .any(|a| a.starts_with("rebuilt the allocator"));
        assert_eq!(rebuilt, kind != MappingKind::HashFs, "{kind:?}: {repair:?}");
        let vol = Volume::mount(crashed.clone()).unwrap();
        assert_eq!(vol.statfs().unwrap().free_blocks, free, "{kind:?}");
        vol.close().unwrap();
    }
}
