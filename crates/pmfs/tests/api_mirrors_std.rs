//! The embedding API behaves like `std::fs` on the operations it mirrors, on every mapping
//! kind, and survives a clean close and reopen.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};

use pmfs::{Error, FileTimes, MappingKind, OpenOptions, Permissions, RenameFlags, Volume};

use common::{KINDS, fresh, remount};

fn errno<T: std::fmt::Debug>(r: pmfs::Result<T>) -> i32 {
    std::io::Error::from(r.unwrap_err()).raw_os_error().unwrap()
}

#[test]
fn namespace_operations_and_errors() {
    for kind in KINDS {
        let (vol, _m) = fresh(kind);
        vol.create_dir("/a").unwrap();
        vol.create_dir_all("/a/b/c").unwrap();
        vol.write("/a/b/f", b"hello").unwrap();
        assert_eq!(vol.read("/a/b/f").unwrap(), b"hello");
        assert_eq!(errno(vol.create_dir("/a")), libc::EEXIST);
        assert_eq!(errno(vol.create_dir("/nope/x")), libc::ENOENT);
        assert_eq!(errno(vol.create_dir("/a/b/f/x")), libc::ENOTDIR);
        assert_eq!(errno(vol.remove_dir("/a")), libc::ENOTEMPTY);
        assert_eq!(errno(vol.remove_file("/a")), libc::EISDIR);
        assert_eq!(errno(vol.remove_dir("/a/b/f")), libc::ENOTDIR);
        assert_eq!(errno(vol.open_file("/a/b")), libc::EISDIR);
        let long = format!("/{}", "x".repeat(256));
        assert_eq!(errno(vol.create_dir(&long)), libc::ENAMETOOLONG);
        vol.create_dir(&format!("/{}", "y".repeat(255))).unwrap();
        assert!(matches!(
            vol.create_dir("relative"),
            Err(Error::InvalidArgument(_))
        ));

        // rename: move, replace, noreplace, exchange, loops.
        vol.rename("/a/b/f", "/a/g").unwrap();
        assert!(!vol.exists("/a/b/f").unwrap());
        vol.write("/a/h", b"other").unwrap();
        vol.rename("/a/g", "/a/h").unwrap();
        assert_eq!(vol.read("/a/h").unwrap(), b"hello");
        vol.write("/a/i", b"i").unwrap();
        let noreplace = RenameFlags {
            noreplace: true,
            ..RenameFlags::default()
        };
        assert_eq!(
            errno(vol.rename_with("/a/h", "/a/i", noreplace)),
            libc::EEXIST
        );
        let exchange = RenameFlags {
            exchange: true,
            ..RenameFlags::default()
        };
        vol.rename_with("/a/h", "/a/b", exchange).unwrap();
        assert!(vol.metadata("/a/h").unwrap().is_dir());
        assert_eq!(vol.read("/a/b").unwrap(), b"hello");
        assert_eq!(errno(vol.rename("/a/h", "/a/h/c/z")), libc::EINVAL);
        assert_eq!(errno(vol.rename("/a/i", "/a/h")), libc::EISDIR);
        assert_eq!(errno(vol.rename("/a/h", "/a/i")), libc::ENOTDIR);
        vol.create_dir("/empty").unwrap();
        assert_eq!(errno(vol.rename("/empty", "/a")), libc::ENOTEMPTY);
        vol.rename("/a/h/c", "/empty").unwrap();
        assert!(vol.metadata("/empty").unwrap().is_dir());
        assert!(!vol.exists("/a/h/c").unwrap());

        // hard links and symbolic links.
        vol.hard_link("/a/b", "/a/b2").unwrap();
        assert_eq!(vol.metadata("/a/b").unwrap().nlink(), 2);
        assert_eq!(errno(vol.hard_link("/a", "/a2")), libc::EPERM);
        vol.symlink("/a/b", "/ln").unwrap();
        vol.symlink("a/h", "/rel").unwrap();
        assert_eq!(vol.read_link("/ln").unwrap().to_str(), Some("/a/b"));
        assert_eq!(vol.read("/ln").unwrap(), b"hello");
        assert!(vol.symlink_metadata("/ln").unwrap().is_symlink());
        assert!(vol.metadata("/rel").unwrap().is_dir());
        vol.write("/rel/through", b"t").unwrap();
        assert_eq!(vol.read("/a/h/through").unwrap(), b"t");
        vol.symlink("/loop2", "/loop1").unwrap();
        vol.symlink("/loop1", "/loop2").unwrap();
        assert_eq!(errno(vol.read("/loop1")), libc::ELOOP);
        vol.remove_file("/ln").unwrap();
        assert!(vol.exists("/a/b").unwrap());
        vol.remove_file("/a/b").unwrap();
        assert_eq!(vol.metadata("/a/b2").unwrap().nlink(), 1);

        // '.' and '..'.
        assert!(vol.metadata("/a/h/..").unwrap().is_dir());
        assert_eq!(
            vol.metadata("/a/h/../b2").unwrap().ino(),
            vol.metadata("/a/b2").unwrap().ino()
        );
        assert_eq!(errno(vol.remove_dir("/")), libc::EBUSY);

        // Directory listing and link counts.
        let mut names: Vec<String> = vol
            .read_dir("/a")
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["b2", "h", "i"]);
        assert_eq!(vol.metadata("/a").unwrap().nlink(), 3);
        assert_eq!(vol.metadata("/").unwrap().nlink(), 5);
        let st = vol.statfs().unwrap();
        assert!(st.free_blocks < st.total_blocks);
        assert_eq!(st.name_max, 255);
    }
}

#[test]
fn files_read_write_truncate_and_survive_reopen() {
    for kind in KINDS {
        let (vol, media) = fresh(kind);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&vol, "/data")
            .unwrap();
        let big: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
        f.write_all_at(&big, 100).unwrap();
        let mut back = vec![0u8; 20_100];
        assert_eq!(f.read_at(&mut back, 0).unwrap(), 20_100);
        assert!(back[..100].iter().all(|&b| b == 0));
        assert_eq!(&back[100..], &big[..]);
        f.set_len(5000).unwrap();
        f.set_len(9000).unwrap();
        let mut tail = vec![1u8; 4000];
        assert_eq!(f.read_at(&mut tail, 5000).unwrap(), 4000);
        assert!(tail.iter().all(|&b| b == 0), "extension reads as zeros");
        // A hole far away, then cursor-based io.
        f.write_all_at(b"end", 1 << 20).unwrap();
        assert_eq!(f.metadata().unwrap().len(), (1 << 20) + 3);
        let mut g = vol.open_file("/data").unwrap();
        g.seek(SeekFrom::Start(1 << 20)).unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "end");
        assert_eq!(errno(g.write_at(b"x", 0)), libc::EBADF);
        let mut a = OpenOptions::new().append(true).open(&vol, "/data").unwrap();
        a.write_all(b"!").unwrap();
        assert_eq!(vol.metadata("/data").unwrap().len(), (1 << 20) + 4);
        drop((f, g, a));

        vol.set_permissions("/data", Permissions::from_mode(0o600))
            .unwrap();
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        vol.set_times("/data", FileTimes::new().set_modified(t))
            .unwrap();
        vol.create_dir("/d").unwrap();
        vol.write("/d/x", b"x").unwrap();
        let before = common::snapshot(&vol);
        let ino = vol.metadata("/data").unwrap().ino();
        vol.close().unwrap();

        let vol = remount(&media);
        assert!(vol.mount_report().clean);
        assert_eq!(common::snapshot(&vol), before);
        let md = vol.metadata("/data").unwrap();
        assert_eq!(md.permissions().mode(), 0o600);
        assert_eq!(md.modified().unwrap(), t);
        assert_eq!(md.ino(), ino);
        let mut buf = vec![0u8; 3];
        vol.open_file("/data")
            .unwrap()
            .read_exact_at(&mut buf, 1 << 20)
            .unwrap();
        assert_eq!(&buf, b"end");
    }
}

#[test]
fn unlinked_open_file_stays_readable_until_last_close() {
    for kind in KINDS {
        let (vol, media) = fresh(kind);
        // The root's first dentry page exists before the measurement.
        vol.write("/other", b"").unwrap();
        let free_without_f = vol.statfs().unwrap().free_blocks;
        vol.write("/f", &vec![5u8; 10_000]).unwrap();
        let free_before = vol.statfs().unwrap().free_blocks;
        assert!(free_before <= free_without_f - 3);
        let f = vol.open_file("/f").unwrap();
        let g = f.try_clone().unwrap();
        vol.remove_file("/f").unwrap();
        assert!(!vol.exists("/f").unwrap());
        let mut buf = vec![0u8; 10_000];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 10_000);
        assert!(buf.iter().all(|&b| b == 5));
        drop(f);
        assert_eq!(g.read_at(&mut buf, 0).unwrap(), 10_000);
        assert_eq!(vol.statfs().unwrap().free_blocks, free_before);
        let free_inodes = vol.statfs().unwrap().free_inodes;
        drop(g);
        assert_eq!(vol.statfs().unwrap().free_inodes, free_inodes + 1);
        assert_eq!(vol.statfs().unwrap().free_blocks, free_without_f);
        vol.remove_file("/other").unwrap();
        vol.close().unwrap();
        let vol = remount(&media);
        assert!(vol.read_dir("/").unwrap().next().is_none());
    }
}

#[test]
fn volume_is_usable_from_many_threads() {
    let (vol, _m) = fresh(pmfs::MappingKind::HashFs);
    std::thread::scope(|s| {
        for t in 0..4 {
            let vol: &Volume = &vol;
            s.spawn(move || {
                let dir = format!("/t{t}");
                vol.create_dir(&dir).unwrap();
                for i in 0..200 {
                    vol.write(&format!("{dir}/f{i}"), &[t as u8; 10]).unwrap();
                }
                for i in (0..200).step_by(2) {
                    vol.rename(&format!("{dir}/f{i}"), &format!("/t{t}/g{i}"))
                        .unwrap();
                }
                for i in (1..200).step_by(2) {
                    vol.remove_file(&format!("{dir}/f{i}")).unwrap();
                }
            });
        }
    });
    for t in 0..4 {
        assert_eq!(vol.read_dir(&format!("/t{t}")).unwrap().count(), 100);
    }
}

#[test]
fn every_allocator_works_and_survives_clean_and_crash_reopen() {
    use pmfs::AllocatorKind;
    use std::sync::Arc;
    for allocator in [
        AllocatorKind::Simple,
        AllocatorKind::Baseline,
        AllocatorKind::Cffs,
    ] {
        for mapping in [pmfs::MappingKind::Extent, pmfs::MappingKind::Cuckoo] {
            let media: Arc<dyn pmfs_core::pm::Media> =
                Arc::new(pmfs_core::pm::HeapRegion::new(common::SIZE).unwrap());
            let opts = pmfs::Options {
                allocator,
                ..common::options(mapping)
            };
            let vol = Volume::format(media.clone(), &opts).unwrap();
            assert_eq!(vol.allocator(), allocator);
            vol.create_dir("/d").unwrap();
            for i in 0..20 {
                vol.write(&format!("/d/f{i}"), &vec![i as u8; 5000 * i])
                    .unwrap();
            }
            vol.remove_file("/d/f3").unwrap();
            let before = common::snapshot(&vol);
            let free = vol.statfs().unwrap().free_blocks;
            vol.close().unwrap();
            let vol = remount(&media);
            assert_eq!(common::snapshot(&vol), before);
            assert_eq!(vol.statfs().unwrap().free_blocks, free);
            let crashed = common::crash_copy(&media);
            drop(vol);
            let vol = remount(&crashed);
            assert_eq!(common::snapshot(&vol), before);
            assert_eq!(vol.statfs().unwrap().free_blocks, free);
            vol.close().unwrap();
            let report = pmfs::fsck::check(crashed).unwrap();
            assert!(
                report.is_clean(),
                "{allocator:?} {mapping:?}: {:#?}",
                report.problems
            );
        }
    }
}

#[test]
fn volume_and_files_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Volume>();
    shared::<pmfs::File>();
    shared::<pmfs::ReadDir>();
    shared::<pmfs::Error>();
}

/// Deleted files are released in batches when the volume runs out of space, so files
/// written and deleted over and over fill the HashFS table to the last slot. The batch
/// release then empties every tombstone no walk needs: without that, no slot would be empty
/// again before the next mount, and every lookup that misses would walk the whole table. The
/// unmount empties those that the batches on a table with room left, so the next mount's
/// purge finds nothing left to empty, and the files that stayed read back.
#[test]
fn churn_that_fills_a_hashfs_table_leaves_the_mount_purge_nothing_to_empty() {
    let (vol, media) = fresh(MappingKind::HashFs);
    let keep: Vec<u8> = (0..100_000u32).map(|i| (i * 31 % 251) as u8).collect();
    vol.write("/keep", &keep).unwrap();
    for round in 0..4 {
        for f in 0..12 {
            let data = vec![round as u8 + f as u8; 1 << 20];
            vol.write(&format!("/churn-{f}"), &data).unwrap();
        }
        for f in 0..12 {
            vol.remove_file(&format!("/churn-{f}")).unwrap();
        }
    }
    assert_eq!(vol.read("/keep").unwrap(), keep);
    vol.close().unwrap();

    let vol = remount(&media);
    assert_eq!(
        vol.mount_report().tombstones_purged,
        0,
        "{:?}",
        vol.mount_report()
    );
    assert_eq!(vol.read("/keep").unwrap(), keep);
}
