//! fsck finds each kind of damage at its location, repairs what can be repaired, and damaged
//! media never makes the checker, the mount or the API panic.

mod common;

use std::sync::Arc;

use pmfs::fsck::{self, ProblemKind};
use pmfs::{Error, Volume, XattrSet};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::{HeapRegion, Media};
use proptest::prelude::*;

use common::{KINDS, SIZE, crash_copy, fresh, options, remount};

fn image(media: &Arc<dyn Media>) -> Vec<u8> {
    let mut img = vec![0u8; media.size() as usize];
    media.read(PmOff(0), &mut img).unwrap();
    img
}

fn find(img: &[u8], needle: &[u8]) -> usize {
    img.windows(needle.len())
        .position(|w| w == needle)
        .expect("needle on media")
}

/// A closed volume with a small tree; returns the media and the volume's layout. It keeps its
/// free space in the baseline allocator's persistent bitmap, so that fsck can find blocks
/// that no live object maps but the bitmap holds (a leak): the volatile allocators have no
/// record to leak from, their mount rebuilds what is free from the live objects.
fn populated(kind: pmfs::MappingKind) -> (Arc<dyn Media>, pmfs::VolumeInfo) {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIZE).unwrap());
    let opts = pmfs::Options {
        allocator: pmfs::AllocatorKind::Baseline,
        ..options(kind)
    };
    let vol = Volume::format(media.clone(), &opts).unwrap();
    vol.create_dir_all("/d/e").unwrap();
    vol.write("/d/victim-entry", b"v").unwrap();
    vol.write("/d/e/file", &[7u8; 9000]).unwrap();
    vol.hard_link("/d/e/file", "/d/link").unwrap();
    vol.symlink("/d/e", "/d/sym").unwrap();
    let info = vol.info();
    vol.close().unwrap();
    (media, info)
}

fn ino_of(media: &Arc<dyn Media>, path: &str) -> u64 {
    let vol = Volume::mount_read_only(media.clone()).unwrap();
    vol.symlink_metadata(path).unwrap().ino()
}

#[test]
fn a_clean_volume_checks_clean() {
    for kind in KINDS {
        let (media, _) = populated(kind);
        let r = fsck::check(media.clone()).unwrap();
        assert!(r.is_clean(), "{:#?}", r.problems);
        assert_eq!(r.directories, 3);
        assert_eq!(r.entries, 6);
        assert!(r.used_blocks >= 4);
    }
}

#[test]
fn blocks_staged_by_a_write_that_never_committed_are_not_damage() {
    use pmfs_core::layout::BlockNo;
    use pmfs_core::traits::{Extent, FileId, FileMapping};
    let (media, info) = populated(pmfs::MappingKind::HashFs);
    let ino = ino_of(&media, "/d/e/file");
    // What a data-only client killed in the middle of a write leaves in the table of a
    // volume its owner then closed cleanly: blocks staged for the file, never committed. The
    // table's header names its extents (words 2 to 5).
    let word = |k: u64| media.load_u64(PmOff(info.mapping_offset + 8 * k)).unwrap();
    let t = pmfs_mapping::hashfs::HashFs::open(
        media.clone(),
        Extent::new(BlockNo(word(2)), word(3)),
        Extent::new(BlockNo(word(4)), word(5)),
    )
    .unwrap();
    let f = t
        .open_file(FileId {
            ino,
            root: PmOff(0),
        })
        .unwrap();
    let mut runs = Vec::new();
    t.stage(&f, 0, 2, &mut runs).unwrap();
    drop(t);
    let r = fsck::check(media.clone()).unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);
    assert_eq!(r.staged_blocks, 2);
    // The repair (a mount) drops them.
    let fixed = fsck::repair(media.clone()).unwrap();
    assert!(
        fixed.actions.iter().any(|a| a.contains("2 blocks staged")),
        "{:?}",
        fixed.actions
    );
    assert!(fixed.after.is_clean(), "{:#?}", fixed.after.problems);
    assert_eq!(fixed.after.staged_blocks, 0);
}

#[test]
fn damaged_primary_superblock_is_reported_and_restored() {
    for kind in KINDS {
        let (media, _) = populated(kind);
        media.write(PmOff(100), &[0xaa; 8]).unwrap();
        let r = fsck::check(media.clone()).unwrap();
        assert!(r.has(ProblemKind::PrimarySuperblock));
        let fixed = fsck::repair(media.clone()).unwrap();
        assert!(fixed.after.is_clean(), "{:#?}", fixed.after.problems);
        // Both copies damaged: the volume cannot be opened, cleanly.
        media.write(PmOff(100), &[0xaa; 8]).unwrap();
        media.write(PmOff(4096 + 100), &[0xaa; 8]).unwrap();
        assert!(matches!(
            fsck::check(media.clone()),
            Err(Error::Corrupt { .. })
        ));
        assert!(matches!(
            Volume::mount(media.clone()),
            Err(Error::Corrupt { .. })
        ));
    }
}

#[test]
fn wrong_link_count_dead_entry_and_unreachable_inode_are_found_and_repaired() {
    for kind in KINDS {
        let (media, info) = populated(kind);
        let inode = |ino: u64| info.inode_table_offset + ino * info.inode_size;
        let file = ino_of(&media, "/d/e/file");
        let victim = ino_of(&media, "/d/victim-entry");
        media.store_u64(PmOff(inode(file) + 24), 5).unwrap();
        // The victim's inode dies under its entry.
        let state = media.load_u64(PmOff(inode(victim))).unwrap();
        media
            .store_u64(PmOff(inode(victim)), state & !(1 << 63))
            .unwrap();
        // A live, well-formed inode that no entry names.
        let stray = 1500u64;
        let mut rec = [0u8; 128];
        rec[0..8].copy_from_slice(&((1u64 << 63) | 1).to_le_bytes());
        rec[8..12].copy_from_slice(&0o100644u32.to_le_bytes());
        rec[20..22].copy_from_slice(&1u16.to_le_bytes());
        rec[24..32].copy_from_slice(&1u64.to_le_bytes());
        media.write(PmOff(inode(stray)), &rec).unwrap();

        let r = fsck::check(media.clone()).unwrap();
        let find_kind = |k| {
            r.problems
                .iter()
                .find(|p| p.kind == k)
                .unwrap_or_else(|| panic!("{k:?} not found in {:#?}", r.problems))
        };
        let link = find_kind(ProblemKind::LinkCount);
        assert_eq!((link.at, link.ino), (inode(file) + 24, Some(file)));
        let img = image(&media);
        let entry = find(&img, b"victim-entry") - 24;
        assert_eq!(find_kind(ProblemKind::DeadEntry).at, entry as u64);
        let un = find_kind(ProblemKind::Unreachable);
        assert_eq!((un.at, un.ino), (inode(stray), Some(stray)));
        // The victim's data block is still mapped to its dead inode: a leak.
        find_kind(ProblemKind::FreeSpace);
        assert_eq!(r.problems.len(), 4, "{:#?}", r.problems);

        let fixed = fsck::repair(media.clone()).unwrap();
        assert_eq!(fixed.before, r);
        assert!(fixed.after.is_clean(), "{:#?}", fixed.after.problems);
        let vol = remount(&media);
        assert_eq!(vol.metadata("/d/link").unwrap().nlink(), 2);
        assert!(!vol.exists("/d/victim-entry").unwrap());
        let md = vol.metadata("/lost+found/#1500").unwrap();
        assert!(md.is_file());
        assert_eq!(md.nlink(), 1);
    }
}

/// Creates files on `media` until one gets inode `ino` (its blocks gone with its death), and
/// checks that it maps nothing: its three blocks past a truncation read as zeros.
fn a_new_file_given(media: &Arc<dyn Media>, ino: u64) {
    let vol = remount(media);
    let path = (0..64)
        .map(|i| format!("/new-{i}"))
        .find(|path| {
            vol.write(path, b"").unwrap();
            vol.metadata(path).unwrap().ino() == ino
        })
        .unwrap_or_else(|| panic!("no new file got inode {ino}"));
    common::open_rw(&vol, &path).set_len(3 * 4096).unwrap();
    assert_eq!(vol.read(&path).unwrap(), vec![0u8; 3 * 4096]);
    vol.close().unwrap();
    let r = fsck::check(media.clone()).unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);
}

/// A closed volume of the default options with `/victim` (three blocks of 0xaa) and `/keep`;
/// returns the media, the layout and the victim's inode number.
fn with_victim(kind: pmfs::MappingKind) -> (Arc<dyn Media>, pmfs::VolumeInfo, u64) {
    let (vol, media) = fresh(kind);
    vol.write("/victim", &[0xaa; 3 * 4096]).unwrap();
    vol.write("/keep", b"k").unwrap();
    let info = vol.info();
    let victim = vol.metadata("/victim").unwrap().ino();
    vol.close().unwrap();
    (media, info, victim)
}

/// With the volatile allocators the mount holds a dead inode's blocks free, as no live file
/// maps them. The repair must not free them twice, and must leave nothing mapped for the
/// next file given the inode number. A mount before the repair may hand out the blocks again
/// on the trees (here to a file written then), but not the inode number on the hashed tables:
/// the repair must leave that file alone.
#[test]
fn a_dead_entry_is_repaired_with_the_default_allocator() {
    for kind in KINDS {
        for written_before_repair in [false, true] {
            let (media, info, victim) = with_victim(kind);
            let at = PmOff(info.inode_table_offset + victim * info.inode_size);
            let state = media.load_u64(at).unwrap();
            media.store_u64(at, state & !(1 << 63)).unwrap();
            if written_before_repair {
                let vol = remount(&media);
                vol.write("/after", &[0x5a; 64 * 4096]).unwrap();
                vol.close().unwrap();
            }

            let r = fsck::check(media.clone()).unwrap();
            assert!(r.has(ProblemKind::DeadEntry), "{kind:?}: {:#?}", r.problems);
            let fixed = fsck::repair(media.clone()).unwrap();
            assert!(
                fixed.after.is_clean(),
                "{kind:?}: {:#?}",
                fixed.after.problems
            );
            let did = |action: &str| fixed.actions.iter().any(|a| a.contains(action));
            assert!(did("dropped entry \"victim\""), "{:?}", fixed.actions);
            let released = matches!(kind, pmfs::MappingKind::Cuckoo | pmfs::MappingKind::HashFs);
            assert_eq!(
                did(&format!("blocks of dead inode {victim}")),
                released,
                "{kind:?}: {:?}",
                fixed.actions
            );
            let vol = remount(&media);
            assert_eq!(vol.read("/keep").unwrap(), b"k");
            if written_before_repair {
                assert_eq!(vol.read("/after").unwrap(), vec![0x5a; 64 * 4096]);
                vol.close().unwrap();
            } else {
                vol.close().unwrap();
                a_new_file_given(&media, victim);
            }
        }
    }
}

/// A dead inode whose blocks the hashed structures' one table still maps, with no entry
/// naming it: made by putting back the table as it was before the file's removal.
#[test]
fn a_dead_inode_that_still_maps_blocks_is_found_and_released() {
    for kind in [pmfs::MappingKind::Cuckoo, pmfs::MappingKind::HashFs] {
        let (media, info, victim) = with_victim(kind);
        let table = (info.mapping_offset as usize)..(info.data_offset as usize);
        let before = image(&media)[table.clone()].to_vec();
        let vol = remount(&media);
        vol.remove_file("/victim").unwrap();
        vol.close().unwrap();
        media.write(PmOff(table.start as u64), &before).unwrap();
        // The mount's pass over the table (the allocator rebuild on the cuckoo table, the
        // tombstone purge on HashFS) keeps the number out of use.
        let vol = remount(&media);
        assert_eq!(vol.mount_report().dead_inodes_withheld, 1);
        for i in 0..4 {
            let path = format!("/before-repair-{i}");
            vol.write(&path, b"").unwrap();
            assert_ne!(vol.metadata(&path).unwrap().ino(), victim);
            vol.remove_file(&path).unwrap();
        }
        vol.close().unwrap();

        let at = info.inode_table_offset + victim * info.inode_size;
        let r = fsck::check(media.clone()).unwrap();
        let p = r
            .problems
            .iter()
            .find(|p| p.kind == ProblemKind::DeadInodeBlocks)
            .unwrap_or_else(|| panic!("{kind:?}: {:#?}", r.problems));
        assert_eq!((p.at, p.ino), (at, Some(victim)), "{p}");
        repairs(&media, &format!("blocks of dead inode {victim}"));
        a_new_file_given(&media, victim);
        assert_eq!(remount(&media).read("/keep").unwrap(), b"k");
    }
}

#[test]
fn orphans_and_unclean_state_are_found_and_repaired() {
    for kind in KINDS {
        let (vol, media) = fresh(kind);
        vol.write("/keep", b"k").unwrap();
        vol.write("/gone", &[1u8; 5000]).unwrap();
        let open = vol.open_file("/gone").unwrap();
        vol.remove_file("/gone").unwrap();
        let crashed = crash_copy(&media);
        drop(open);
        drop(vol);
        let r = fsck::check(crashed.clone()).unwrap();
        assert!(r.has(ProblemKind::NotClean));
        assert_eq!(r.orphans.len(), 1, "/gone, unlinked while open");
        let fixed = fsck::repair(crashed.clone()).unwrap();
        assert!(fixed.after.is_clean(), "{:#?}", fixed.after.problems);
        assert!(!fixed.actions.is_empty());
        let vol = remount(&crashed);
        assert_eq!(vol.read("/keep").unwrap(), b"k");
        assert_eq!(vol.read_dir("/").unwrap().count(), 1);
    }
}

#[test]
fn a_named_file_with_a_zero_link_count_is_damage_and_keeps_its_data() {
    for kind in KINDS {
        let (media, info) = populated(kind);
        let file = ino_of(&media, "/d/e/file");
        let nlink = PmOff(info.inode_table_offset + file * info.inode_size + 24);
        let vol = remount(&media);
        let data = vol.read("/d/e/file").unwrap();
        vol.close().unwrap();
        media.store_u64(nlink, 0).unwrap();

        let r = fsck::check(media.clone()).unwrap();
        assert!(r.orphans.is_empty(), "{:?}", r.orphans);
        assert_eq!(r.problems.len(), 1, "{:#?}", r.problems);
        let p = &r.problems[0];
        assert_eq!(
            (p.kind, p.at, p.ino),
            (ProblemKind::LinkCount, nlink.0, Some(file))
        );
        let fixed = fsck::repair(media.clone()).unwrap();
        assert!(fixed.after.is_clean(), "{:#?}", fixed.after.problems);
        let vol = remount(&media);
        assert_eq!(
            vol.metadata("/d/e/file").unwrap().nlink(),
            2,
            "it and /d/link"
        );
        assert_eq!(vol.read("/d/link").unwrap(), data, "{kind:?}");
    }
}

#[test]
fn damaged_directory_page_is_reported_not_repaired() {
    for kind in KINDS {
        let (media, _) = populated(kind);
        let img = image(&media);
        let entry = find(&img, b"victim-entry") - 24;
        let page = entry & !4095;
        media.write(PmOff(page as u64 + 2), &[0x55]).unwrap();
        let r = fsck::check(media.clone()).unwrap();
        let p = r
            .problems
            .iter()
            .find(|p| p.kind == ProblemKind::DirectoryPage)
            .expect("page problem");
        assert_eq!(p.at, page as u64);
        let fixed = fsck::repair(media.clone()).unwrap();
        assert!(fixed.after.has(ProblemKind::DirectoryPage));
        let vol = remount(&media);
        assert!(matches!(vol.read_dir("/d"), Err(Error::Corrupt { .. })));
        let io: std::io::Error = vol.read_dir("/d").unwrap_err().into();
        assert_eq!(io.raw_os_error(), Some(libc::EUCLEAN));
    }
}

/// Checks that fsck finds one problem on `media`: `kind`, at `at`, in inode `ino`.
fn finds_only(media: &Arc<dyn Media>, kind: ProblemKind, at: PmOff, ino: u64) {
    let r = fsck::check(media.clone()).unwrap();
    assert_eq!(r.problems.len(), 1, "{:#?}", r.problems);
    let p = &r.problems[0];
    assert_eq!((p.kind, p.at, p.ino), (kind, at.0, Some(ino)));
}

/// A symbolic link's block holds its target and zeros: a NUL in the target or a stray byte
/// past it is found where it lies (fsck cannot know the target, so it leaves the link), and
/// reading a target with a NUL fails rather than return a shorter one.
#[test]
fn damaged_symbolic_link_targets_are_found() {
    for kind in KINDS {
        for (offset, byte) in [(1, 0), (4, b'x'), (4095, 1)] {
            let (media, _) = populated(kind);
            let sym = ino_of(&media, "/d/sym");
            let img = image(&media);
            let block = (0..img.len())
                .step_by(4096)
                .find(|&o| {
                    img[o..o + 4096].starts_with(b"/d/e") && img[o + 4..o + 4096] == [0; 4092]
                })
                .expect("the link's target block");
            media
                .write(PmOff((block + offset) as u64), &[byte])
                .unwrap();
            finds_only(&media, ProblemKind::SymlinkTarget, PmOff(block as u64), sym);
            let vol = Volume::mount_read_only(media.clone()).unwrap();
            let read = vol.read_link("/d/sym");
            if byte == 0 {
                assert!(
                    matches!(read, Err(Error::Corrupt { .. })),
                    "{kind:?}: {read:?}"
                );
            } else {
                assert_eq!(read.unwrap(), std::path::Path::new("/d/e"));
            }
        }
    }
}

/// A symbolic link whose target block the table lost (made by putting back the table of the
/// hashed structures as it was before the link's create) is found, and reading it fails.
#[test]
fn a_symbolic_link_without_its_target_block_is_found() {
    for kind in [pmfs::MappingKind::Cuckoo, pmfs::MappingKind::HashFs] {
        let (vol, media) = fresh(kind);
        vol.write("/keep", b"k").unwrap();
        let info = vol.info();
        let table = (info.mapping_offset as usize)..(info.data_offset as usize);
        let before = image(&media)[table.clone()].to_vec();
        vol.symlink("/keep", "/sym").unwrap();
        let sym = vol.symlink_metadata("/sym").unwrap().ino();
        vol.close().unwrap();
        media.write(PmOff(table.start as u64), &before).unwrap();
        let at = PmOff(info.inode_table_offset + sym * info.inode_size);
        finds_only(&media, ProblemKind::SymlinkTarget, at, sym);
        let read = remount(&media).read_link("/sym");
        assert!(
            matches!(read, Err(Error::Corrupt { .. })),
            "{kind:?}: {read:?}"
        );
    }
}

/// A tree that maps a block outside the data region made the mount fail wherever it rebuilds
/// the allocator from the files (the default allocator), and the repair, which mounts, with
/// it. The repair now gives such an inode an empty mapping first: a file reads as zeros, and
/// what a directory held goes to `/lost+found`.
#[test]
fn a_tree_that_maps_blocks_outside_the_data_region_is_dropped() {
    for kind in [pmfs::MappingKind::Extent, pmfs::MappingKind::Radix] {
        for allocator in [pmfs::AllocatorKind::Cffs, pmfs::AllocatorKind::Baseline] {
            for victim in ["/d/f", "/d"] {
                let what = format!("{kind:?}, {allocator:?}, {victim}");
                let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIZE).unwrap());
                let opts = pmfs::Options {
                    allocator,
                    ..options(kind)
                };
                let vol = Volume::format(media.clone(), &opts).unwrap();
                vol.create_dir("/d").unwrap();
                vol.write("/d/f", &[7; 8192]).unwrap();
                vol.write("/keep", b"k").unwrap();
                let info = vol.info();
                let ino = vol.metadata(victim).unwrap().ino();
                let file = vol.metadata("/d/f").unwrap().ino();
                vol.close().unwrap();
                common::point_tree_outside(&media, &info, kind, ino);

                let r = fsck::check(media.clone()).unwrap();
                assert!(
                    r.has(ProblemKind::BlockOutsideData),
                    "{what}: {:#?}",
                    r.problems
                );
                repairs(
                    &media,
                    &format!("dropped the damaged mapping of inode {ino}"),
                );
                let vol = remount(&media);
                assert_eq!(vol.read("/keep").unwrap(), b"k", "{what}");
                if victim == "/d/f" {
                    assert_eq!(vol.read("/d/f").unwrap(), vec![0; 8192], "{what}");
                } else {
                    assert_eq!(vol.read_dir("/d").unwrap().count(), 0, "{what}");
                    let found = format!("/lost+found/#{file}");
                    assert_eq!(vol.read(&found).unwrap(), vec![7; 8192], "{what}");
                }
                vol.close().unwrap();
            }
        }
    }
}

/// A damaged file log made every mount fail (the mount opens each log to repair what a crash
/// left), and the repair with it. On a cleanly closed volume every entry of a log is applied
/// already, so the repair drops a damaged one before it mounts: the file keeps its data, and
/// a new log takes its next writes (on HashFS, once the old log's blocks are unmapped from
/// the file's own space).
#[test]
fn a_damaged_log_is_dropped_and_the_file_keeps_its_data() {
    const LOW: u64 = (1 << 48) - 1;
    for kind in KINDS {
        for damage in ["head pointer", "block magic", "entry"] {
            let what = format!("{kind:?}, {damage}");
            let (vol, media) = fresh(kind);
            vol.write("/f", &[7u8; 8192]).unwrap();
            vol.write("/keep", b"k").unwrap();
            let info = vol.info();
            let ino = vol.metadata("/f").unwrap().ino();
            vol.close().unwrap();
            let log = PmOff(info.inode_table_offset + ino * info.inode_size + 104);
            let head = media.load_u64(log).unwrap();
            let block = (head & LOW) * 4096;
            let (at, flip) = match damage {
                "head pointer" => (log.0, 1 << 20),
                "block magic" => (block, 0xff),
                _ => (block + 64, 0xff00),
            };
            let word = media.load_u64(PmOff(at)).unwrap();
            media.store_u64(PmOff(at), word ^ flip).unwrap();
            assert!(Volume::mount(media.clone()).is_err(), "{what}");

            let r = fsck::check(media.clone()).unwrap();
            assert!(r.has(ProblemKind::FileLog), "{what}: {:#?}", r.problems);
            repairs(&media, &format!("dropped the damaged log of inode {ino}"));
            let vol = remount(&media);
            assert_eq!(vol.read("/f").unwrap(), vec![7u8; 8192], "{what}");
            common::open_rw(&vol, "/f")
                .write_all_at(&[8u8; 5000], 100)
                .unwrap();
            vol.close().unwrap();
            let vol = remount(&media);
            let mut want = vec![7u8; 8192];
            want[100..5100].fill(8);
            assert_eq!(vol.read("/f").unwrap(), want, "{what}");
            vol.close().unwrap();
            let r = fsck::check(media.clone()).unwrap();
            assert!(r.is_clean(), "{what}: {:#?}", r.problems);
        }
    }
}

/// HashFS keeps a file's log blocks in the file's own space. A file without a log that still
/// maps some (here: its log words cleared behind its back) leaks them; a crash while a
/// file's first log is made leaves the same, which the mount frees. fsck reports them and the
/// repair's mount frees them.
#[test]
fn hashfs_log_blocks_without_a_log_are_found_and_freed() {
    let (vol, media) = fresh(pmfs::MappingKind::HashFs);
    vol.write("/f", &[7u8; 8192]).unwrap();
    let info = vol.info();
    let ino = vol.metadata("/f").unwrap().ino();
    vol.close().unwrap();
    let inode = info.inode_table_offset + ino * info.inode_size;
    media.store_u64(PmOff(inode + 112), 0).unwrap();
    media.store_u64(PmOff(inode + 104), 0).unwrap();

    finds_only(&media, ProblemKind::FileLog, PmOff(inode + 104), ino);
    repairs(&media, "log blocks freed");
    let vol = remount(&media);
    assert_eq!(vol.read("/f").unwrap(), vec![7u8; 8192]);
    common::open_rw(&vol, "/f").write_all_at(b"new", 0).unwrap();
    vol.close().unwrap();
    assert_eq!(remount(&media).read("/f").unwrap()[..4], *b"new\x07");
}

/// Repairs `media`, checks that the repair leaves it clean and that one of its actions
/// mentions `action`.
fn repairs(media: &Arc<dyn Media>, action: &str) {
    let fixed = fsck::repair(media.clone()).unwrap();
    assert!(fixed.after.is_clean(), "{:#?}", fixed.after.problems);
    assert!(
        fixed.actions.iter().any(|a| a.contains(action)),
        "{:?}",
        fixed.actions
    );
}

#[test]
fn digest_cursor_beyond_the_log_tail_is_found_and_moved_back() {
    for kind in KINDS {
        let (media, info) = populated(kind);
        let file = ino_of(&media, "/d/e/file");
        // The inode's digest cursor word: LSN in the low bits, no holder after a clean close.
        let cursor = PmOff(info.inode_table_offset + file * info.inode_size + 112);
        let applied = media.load_u64(cursor).unwrap();
        media.store_u64(cursor, applied + 40).unwrap();

        finds_only(&media, ProblemKind::FileLog, cursor, file);
        assert!(matches!(
            Volume::mount(media.clone()),
            Err(Error::Corrupt { .. })
        ));
        repairs(&media, "digest cursor");
        let vol = remount(&media);
        assert_eq!(vol.read("/d/e/file").unwrap(), vec![7u8; 9000]);
        // Commits land at the tail again and are digested: they survive a remount.
        vol.write("/d/e/file", b"after repair").unwrap();
        vol.close().unwrap();
        let vol = remount(&media);
        assert_eq!(vol.read("/d/e/file").unwrap(), b"after repair");
        vol.close().unwrap();
        assert!(fsck::check(media).unwrap().is_clean());
    }
}

/// Damage that makes a crashed volume's recovery fail: the check cannot examine the volume
/// as recovered, so it examines it as the crash left it, says so, and still writes nothing.
#[test]
fn a_crashed_volume_whose_recovery_fails_is_checked_as_left() {
    for kind in KINDS {
        let (media, info) = populated(kind);
        let file = ino_of(&media, "/d/e/file");
        let vol = remount(&media);
        let crashed = crash_copy(&media);
        drop(vol);
        let cursor = PmOff(info.inode_table_offset + file * info.inode_size + 112);
        let applied = crashed.load_u64(cursor).unwrap();
        crashed.store_u64(cursor, applied + 40).unwrap();
        let before = image(&crashed);

        let r = fsck::check(crashed.clone()).unwrap();
        let kinds: Vec<ProblemKind> = r.problems.iter().map(|p| p.kind).collect();
        assert_eq!(
            kinds,
            [ProblemKind::NotClean, ProblemKind::FileLog],
            "{kind:?}: {:#?}",
            r.problems
        );
        assert!(
            r.problems[0].detail.contains("but recovery fails"),
            "{:?}",
            r.problems[0]
        );
        assert!(image(&crashed) == before, "{kind:?}: the check wrote");
        repairs(&crashed, "digest cursor");
        assert_eq!(remount(&crashed).read("/d/e/file").unwrap(), [7u8; 9000]);
    }
}

#[test]
fn a_mapped_end_below_mapped_blocks_is_found_and_raised() {
    for kind in KINDS {
        let (media, info) = populated(kind);
        let file = ino_of(&media, "/d/e/file");
        // The file maps 3 blocks; its mapped end word, which truncations and SEEK_DATA take
        // as the end of its blocks, says 1.
        let word = PmOff(info.inode_table_offset + file * info.inode_size + 120);
        assert_eq!(media.load_u64(word).unwrap(), 3);
        media.store_u64(word, 1).unwrap();

        finds_only(&media, ProblemKind::MappedEnd, word, file);
        repairs(&media, "mapped end");
        assert_eq!(media.load_u64(word).unwrap(), 3);
        let vol = remount(&media);
        assert_eq!(vol.read("/d/e/file").unwrap(), vec![7u8; 9000]);
        vol.write("/d/e/file", b"x").unwrap();
        vol.close().unwrap();
        assert!(fsck::check(media).unwrap().is_clean());
    }
}

/// The flag that says a file may have holes is set before a hole commits and never cleared:
/// a file without it is counted as mapping every block below its size (`st_blocks`).
#[test]
fn a_file_with_holes_not_marked_as_having_any_is_found_and_marked() {
    for kind in KINDS {
        let (media, info) = populated(kind);
        let vol = remount(&media);
        let f = common::open_rw(&vol, "/d/sparse");
        f.set_len(4 * 4096).unwrap();
        f.write_all_at(b"data", 4096).unwrap();
        drop(f);
        let ino = vol.metadata("/d/sparse").unwrap().ino();
        let units = |vol: &Volume| {
            let d = vol.lookup(vol.root(), b"d").unwrap().ino;
            vol.lookup(d, b"sparse").unwrap().blocks
        };
        assert_eq!(units(&vol), 8);
        vol.close().unwrap();
        // Bit 0 of the flags half-word, the top 16 bits of the record's word at 16.
        let word = PmOff(info.inode_table_offset + ino * info.inode_size + 16);
        let w = media.load_u64(word).unwrap();
        assert_ne!(w & (1 << 48), 0);
        media.store_u64(word, w & !(1 << 48)).unwrap();
        assert_eq!(units(&remount(&media)), 4 * 8, "counted as dense");

        finds_only(&media, ProblemKind::HolesFlag, word, ino);
        repairs(&media, &format!("marked inode {ino} as having holes"));
        let vol = remount(&media);
        assert_eq!(units(&vol), 8);
        let mut want = vec![0u8; 4 * 4096];
        want[4096..4100].copy_from_slice(b"data");
        assert_eq!(vol.read("/d/sparse").unwrap(), want);
    }
}

/// Extended attributes whose word or block is damaged cannot be read back (`EUCLEAN`): fsck
/// reports them, and repair drops them, as they cannot be had back.
#[test]
fn unreadable_extended_attributes_are_found_and_dropped() {
    for kind in KINDS {
        for damage_block in [false, true] {
            let (media, info) = populated(kind);
            let file = ino_of(&media, "/d/e/file");
            let vol = remount(&media);
            let md = vol.metadata("/d/e/file").unwrap();
            let ino = pmfs::Ino::from_raw(u64::from(md.generation()) << 32 | md.ino());
            vol.set_xattr(ino, b"user.k", b"value", XattrSet::Any)
                .unwrap();
            vol.close().unwrap();
            let word = PmOff(info.inode_table_offset + file * info.inode_size + 96);
            if damage_block {
                let img = image(&media);
                let at = find(&img, b"user.kvalue");
                media.write(PmOff(at as u64), b"U").unwrap();
            } else {
                let w = media.load_u64(word).unwrap();
                media.store_u64(word, w ^ 1 << 40).unwrap();
            }
            let vol = remount(&media);
            let err = vol.get_xattr(ino, b"user.k").unwrap_err();
            assert_eq!(
                std::io::Error::from(err).raw_os_error(),
                Some(libc::EUCLEAN)
            );
            vol.close().unwrap();

            finds_only(&media, ProblemKind::Xattrs, word, file);
            repairs(&media, &format!("extended attributes of inode {file}"));
            let vol = remount(&media);
            assert_eq!(vol.list_xattr(ino).unwrap(), Vec::<Vec<u8>>::new());
            assert_eq!(vol.read("/d/e/file").unwrap(), vec![7u8; 9000]);
            vol.set_xattr(ino, b"user.k", b"again", XattrSet::Any)
                .unwrap();
            assert_eq!(vol.get_xattr(ino, b"user.k").unwrap().unwrap(), b"again");
            vol.close().unwrap();
            assert!(fsck::check(media).unwrap().is_clean());
        }
    }
}

fn exercise(media: Arc<dyn Media>) {
    let _ = fsck::check(media.clone());
    if let Ok(vol) = Volume::mount(media.clone()) {
        let mut stack = vec!["/".to_owned()];
        let mut seen = 0;
        while let Some(d) = stack.pop() {
            seen += 1;
            if seen > 50 {
                break;
            }
            let Ok(rd) = vol.read_dir(&d) else { continue };
            for e in rd.flatten() {
                let p = e.path().to_str().unwrap().to_owned();
                match vol.symlink_metadata(&p) {
                    Ok(md) if md.is_dir() => stack.push(p),
                    Ok(md) if md.is_file() && md.len() < 1 << 20 => {
                        let _ = vol.read(&p);
                    }
                    _ => {}
                }
            }
        }
        let _ = vol.write("/new", b"n");
        let _ = vol.rename("/d", "/d2");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(16)
    ))]

    /// Random damage to the metadata regions: check, mount and use return errors, never
    /// panic.
    #[test]
    fn random_metadata_damage_never_panics(
        kind in 0usize..4,
        hits in proptest::collection::vec((0u64..1 << 20, any::<u8>()), 1..40),
    ) {
        let kind = KINDS[kind];
        let (media, info) = populated(kind);
        let img = image(&media);
        let entry = find(&img, b"victim-entry") as u64;
        let page = entry & !4095;
        let damaged = HeapRegion::from_image(&img).unwrap();
        for (pos, byte) in hits {
            // Spread the hits over superblocks, journal, inode table and the directory page.
            let off = match pos % 4 {
                0 => pos % 8192,
                1 => info.journal_offset + pos % (u64::from(info.journal_slots) * 4096),
                2 => info.inode_table_offset + pos % (16 * info.inode_size),
                _ => page + pos % 4096,
            };
            damaged.write(PmOff(off), &[byte]).unwrap();
        }
        exercise(Arc::new(damaged));
    }
}

/// A crash leaves the baseline allocator's bitmap behind the files (it is synced at the clean
/// close, and the mount rebuilds it after any other end): fsck reports the volume as not
/// closed cleanly, and no leak, until a mount has recovered it. What a clean close leaves
/// durable checks clean.
#[test]
fn a_crashed_volume_with_the_baseline_bitmap_is_not_clean_but_leaks_nothing() {
    use pmfs::{AllocatorKind, MappingKind, Options};
    use pmfs_core::sim::SimRegion;

    let region = Arc::new(SimRegion::new(16 << 20).unwrap());
    let opts = Options {
        allocator: AllocatorKind::Baseline,
        ..Options::with_mapping(MappingKind::Extent)
    };
    let vol = Volume::format(region.clone(), &opts).unwrap();
    vol.create_dir("/d").unwrap();
    for i in 0..20 {
        vol.write(&format!("/d/f{i}"), &vec![i as u8; 5000 * (i + 1)])
            .unwrap();
    }
    vol.remove_file("/d/f3").unwrap();
    let crashed: Arc<dyn Media> =
        Arc::new(HeapRegion::from_image(&region.durable_image()).unwrap());
    let r = fsck::check(crashed.clone()).unwrap();
    let kinds: Vec<ProblemKind> = r.problems.iter().map(|p| p.kind).collect();
    assert_eq!(kinds, [ProblemKind::NotClean], "{:#?}", r.problems);
    let recovered = remount(&crashed);
    assert_eq!(recovered.read("/d/f19").unwrap(), vec![19u8; 100_000]);
    recovered.close().unwrap();
    let r = fsck::check(crashed).unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);

    vol.close().unwrap();
    let closed: Arc<dyn Media> = Arc::new(HeapRegion::from_image(&region.durable_image()).unwrap());
    let r = fsck::check(closed).unwrap();
    assert!(r.is_clean(), "{:#?}", r.problems);
}
