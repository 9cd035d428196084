//! Hostile namespace calls fail with the POSIX error and change nothing: paths through
//! regular files (ENOTDIR), a directory renamed into its own subtree (EINVAL), rmdir of a
//! non-empty directory (ENOTEMPTY), too many links (EMLINK), writes and sizes past the
//! largest file (EFBIG).

mod common;

use std::sync::Arc;

use pmfs::{MappingKind, OpenOptions, Options, RenameFlags, Volume, fsck};
use pmfs_core::pm::{HeapRegion, Media};

use common::{KINDS, crash_copy, fresh, snapshot};

fn errno<T: std::fmt::Debug>(r: pmfs::Result<T>) -> i32 {
    std::io::Error::from(r.unwrap_err()).raw_os_error().unwrap()
}

fn assert_clean(media: &Arc<dyn Media>) {
    let report = fsck::check(crash_copy(media)).unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
}

#[test]
fn paths_through_files_subtree_renames_and_non_empty_rmdir_fail() {
    for kind in KINDS {
        let (vol, media) = fresh(kind);
        vol.create_dir_all("/d/sub/deeper").unwrap();
        vol.write("/d/f", b"file").unwrap();
        vol.symlink("/d/f", "/d/lf").unwrap();
        let before = snapshot(&vol);

        // A regular file (or a link to one) used as a directory.
        for p in ["/d/f/x", "/d/f/x/y", "/d/lf/x"] {
            assert_eq!(errno(vol.create_dir(p)), libc::ENOTDIR, "{p}");
            assert_eq!(errno(vol.write(p, b"x")), libc::ENOTDIR, "{p}");
            assert_eq!(errno(vol.metadata(p)), libc::ENOTDIR, "{p}");
            assert_eq!(errno(vol.remove_file(p)), libc::ENOTDIR, "{p}");
            assert_eq!(errno(vol.rename("/d/sub", p)), libc::ENOTDIR, "{p}");
            assert_eq!(errno(vol.hard_link("/d/f", p)), libc::ENOTDIR, "{p}");
        }
        assert_eq!(errno(vol.read_dir("/d/f")), libc::ENOTDIR);
        assert_eq!(errno(vol.create_dir_all("/d/f/x")), libc::ENOTDIR);
        assert_eq!(errno(vol.remove_dir("/d/f")), libc::ENOTDIR);
        assert_eq!(errno(vol.metadata("/d/f/")), libc::ENOTDIR);
        let root = vol.root();
        let f = vol.lookup(root, b"d").unwrap().ino;
        let file = vol.lookup(f, b"f").unwrap().ino;
        assert_eq!(errno(vol.lookup(file, b"x")), libc::ENOTDIR);
        assert_eq!(
            errno(vol.mkdir(file, b"x", 0o755, Default::default())),
            libc::ENOTDIR
        );

        // A directory into its own subtree, directly or through '..'.
        for to in ["/d/sub/x", "/d/sub/deeper/x", "/d/sub/deeper/../x"] {
            assert_eq!(errno(vol.rename("/d", to)), libc::EINVAL, "{to}");
        }
        assert_eq!(errno(vol.rename("/d/sub", "/d/sub/deeper/x")), libc::EINVAL);
        let exchange = RenameFlags {
            exchange: true,
            ..RenameFlags::default()
        };
        assert_eq!(
            errno(vol.rename_with("/d", "/d/sub/deeper", exchange)),
            libc::EINVAL
        );
        assert_eq!(
            errno(vol.rename_with("/d/sub/deeper", "/d", exchange)),
            libc::EINVAL
        );
        // An ancestor as the target of a plain rename is a non-empty directory.
        assert_eq!(errno(vol.rename("/d/sub/deeper", "/d")), libc::ENOTEMPTY);

        // rmdir of non-empty directories, and of the root.
        assert_eq!(errno(vol.remove_dir("/d")), libc::ENOTEMPTY);
        assert_eq!(errno(vol.remove_dir("/d/sub")), libc::ENOTEMPTY);
        assert_eq!(errno(vol.rmdir_at(root, b"d")), libc::ENOTEMPTY);
        assert_eq!(errno(vol.remove_dir("/")), libc::EBUSY);
        // Replacing a non-empty directory.
        vol.create_dir("/e").unwrap();
        assert_eq!(errno(vol.rename("/e", "/d")), libc::ENOTEMPTY);
        vol.remove_dir("/e").unwrap();

        assert_eq!(snapshot(&vol), before);
        vol.close().unwrap();
        assert_clean(&media);
    }
}

#[test]
fn too_many_links_is_emlink_and_the_volume_stays_clean() {
    // 65 000 names need about 650 directory pages: a larger volume than the other tests.
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(64 << 20).unwrap());
    let opts = Options {
        inodes: Some(256),
        journal_slots: 2,
        ..Options::with_mapping(MappingKind::Extent)
    };
    let vol = Volume::format(media.clone(), &opts).unwrap();
    vol.write("/f", b"linked").unwrap();
    let root = vol.root();
    let f = vol.lookup(root, b"f").unwrap().ino;
    vol.create_dir("/l").unwrap();
    let dir = vol.lookup(root, b"l").unwrap().ino;
    let mut nlink = 1;
    let err = loop {
        match vol.link_at(f, dir, nlink.to_string().as_bytes()) {
            Ok(a) => {
                nlink += 1;
                assert_eq!(a.nlink, nlink);
            }
            Err(e) => break e,
        }
        assert!(nlink <= 1 << 20, "links never run out");
    };
    assert_eq!(std::io::Error::from(err).raw_os_error(), Some(libc::EMLINK));
    assert_eq!(nlink, 65_000);
    // Through the path API too, and nothing was added by the failed calls.
    assert_eq!(errno(vol.hard_link("/f", "/one-more")), libc::EMLINK);
    assert!(!vol.exists("/one-more").unwrap());
    assert_eq!(vol.metadata("/f").unwrap().nlink(), 65_000);
    // Dropping one name makes room for one more.
    vol.remove_file("/l/1").unwrap();
    vol.hard_link("/f", "/one-more").unwrap();
    assert_eq!(errno(vol.hard_link("/f", "/two-more")), libc::EMLINK);
    vol.close().unwrap();
    assert_clean(&media);
}

#[test]
fn writes_and_sizes_past_the_largest_file_are_efbig() {
    for kind in KINDS {
        let (vol, media) = fresh(kind);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .open(&vol, "/big")
            .unwrap();
        f.write_all_at(b"head", 0).unwrap();
        // The largest file is below 2^32 blocks of 4 KiB (16 TiB).
        let beyond = 1u64 << 44;
        for off in [beyond, beyond - 1, u64::MAX - 1, u64::MAX / 2] {
            assert_eq!(errno(f.write_at(b"xy", off)), libc::EFBIG, "write at {off}");
        }
        for size in [beyond + 1, u64::MAX] {
            assert_eq!(errno(f.set_len(size)), libc::EFBIG, "set_len {size}");
        }
        // A sparse write far out but below the limit works and costs one data block plus
        // mapping nodes, not the blocks of the hole.
        let free = vol.statfs().unwrap().free_blocks;
        let far = 1u64 << 40;
        f.write_all_at(b"far", far).unwrap();
        assert_eq!(f.metadata().unwrap().len(), far + 3);
        let used = free - vol.statfs().unwrap().free_blocks;
        assert!(used <= 16, "{kind:?}: a far write used {used} blocks");
        let mut buf = [0u8; 3];
        f.read_exact_at(&mut buf, far).unwrap();
        assert_eq!(&buf, b"far");
        // Reads past the end return nothing, also at absurd offsets.
        assert_eq!(f.read_at(&mut buf, u64::MAX - 1).unwrap(), 0);
        f.set_len(4).unwrap();
        assert_eq!(vol.read("/big").unwrap(), b"head");
        drop(f);
        vol.close().unwrap();
        assert_clean(&media);
    }
}
