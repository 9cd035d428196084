//! `Volume::open_read_only` mounts a pool file through a read-only descriptor and mapping: the
//! volume reads as it was closed (or, after a crash, as the next read-write mount will
//! recover it), every change fails with `ReadOnly`, the pool file's bytes stay as they were,
//! and the owner lock, which other read-only volumes share, keeps read-write owners out for as
//! long as it lives (and it waits for them). On every mapping kind.

mod common;

use std::path::{Path, PathBuf};

use pmfs::{
    Error, FileTimes, MappingKind, OpenMode, OpenOptions, Options, Permissions, SeekTarget, Volume,
};

use common::{KINDS, Snapshot, snapshot};

fn pool_path(kind: MappingKind, tag: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "pmfs-read-only-{tag}-{kind:?}-{}.pool",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    path
}

fn options(kind: MappingKind) -> Options {
    Options {
        size: 16 << 20,
        inodes: Some(256),
        ..Options::with_mapping(kind)
    }
}

/// A volume with a little of everything: directories, files with holes and a symbolic link.
fn fill(v: &Volume) {
    v.create_dir("/d").unwrap();
    v.write("/d/a", &vec![7u8; 20_000]).unwrap();
    let f = v.create_file("/sparse").unwrap();
    f.write_all_at(b"far", 1 << 20).unwrap();
    v.symlink("d/a", "/ln").unwrap();
    v.hard_link("/d/a", "/a2").unwrap();
}

/// The permissions of the process's mappings of `path`, as `/proc/self/maps` lists them.
fn mappings_of(path: &Path) -> Vec<String> {
    let path = path.canonicalize().unwrap();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.ends_with(path.to_str().unwrap()))
        .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
        .collect()
}

/// Every change the API offers fails with `ReadOnly` on `v`.
fn refuses_changes(v: &Volume) {
    let changes: [(&str, pmfs::Result<()>); 9] = [
        ("write", v.write("/new", b"x")),
        ("overwrite", v.write("/d/a", b"x")),
        ("create_dir", v.create_dir("/e")),
        ("remove_file", v.remove_file("/d/a")),
        ("remove_dir", v.remove_dir("/d")),
        ("rename", v.rename("/d/a", "/b")),
        ("hard_link", v.hard_link("/d/a", "/b")),
        (
            "set_permissions",
            v.set_permissions("/d/a", Permissions::from_mode(0o600)),
        ),
        (
            "set_times",
            v.set_times(
                "/d/a",
                FileTimes::new().set_modified(std::time::SystemTime::UNIX_EPOCH),
            ),
        ),
    ];
    for (what, r) in changes {
        assert!(matches!(r, Err(Error::ReadOnly)), "{what}: {r:?}");
    }
    let r = OpenOptions::new().write(true).open(v, "/d/a");
    assert!(matches!(r, Err(Error::ReadOnly)), "open for writing: {r:?}");
}

/// What `pmfs info` and the FUSE daemon ask of a volume they only read.
fn reads_through_every_interface(v: &Volume) {
    v.statfs().unwrap();
    v.usage(&mut |_, _| {}).unwrap();
    let a = v.lookup(v.root(), b"a2").unwrap();
    v.getattr(a.ino).unwrap();
    v.list_dir(v.root(), None, 100).unwrap();
    let read = OpenMode {
        read: true,
        write: false,
        truncate: false,
    };
    let f = v.open_ino(a.ino, read).unwrap();
    let mut buf = vec![0u8; 8192];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 8192);
    assert_eq!(f.read_for_kernel(&mut buf, 4096).unwrap(), 8192);
    f.seek(0, SeekTarget::Hole).unwrap();
    drop(f);
    let link = v.lookup(v.root(), b"ln").unwrap();
    assert_eq!(v.readlink(link.ino).unwrap(), b"d/a");
    v.list_xattr(a.ino).unwrap();
}

#[test]
fn a_closed_pool_reads_as_it_was_and_stays_unchanged() {
    for kind in KINDS {
        let path = pool_path(kind, "closed");
        let v = Volume::create(&path, &options(kind)).unwrap();
        fill(&v);
        let want: Snapshot = snapshot(&v);
        v.close().unwrap();
        let bytes = std::fs::read(&path).unwrap();

        let v = Volume::open_read_only(&path).unwrap();
        assert_eq!(
            mappings_of(&path),
            ["r--s"],
            "{kind:?}: one read-only mapping"
        );
        assert!(v.mount_report().clean);
        assert_eq!(snapshot(&v), want, "{kind:?}");
        assert_eq!(v.read("/sparse").unwrap().len(), (1 << 20) + 3);
        assert_eq!(v.read("/a2").unwrap(), vec![7u8; 20_000]);
        reads_through_every_interface(&v);
        refuses_changes(&v);
        assert!(matches!(Volume::open(&path), Err(Error::PoolInUse)));
        // Readers share the pool.
        let second = Volume::open_read_only(&path).unwrap();
        assert_eq!(snapshot(&second), want, "{kind:?}");
        v.close().unwrap();
        assert!(matches!(Volume::open(&path), Err(Error::PoolInUse)));
        second.close().unwrap();
        assert!(mappings_of(&path).is_empty(), "{kind:?}: unmapped at close");
        assert!(
            std::fs::read(&path).unwrap() == bytes,
            "{kind:?}: pool changed"
        );

        let owner = Volume::open(&path).unwrap();
        assert!(matches!(
            Volume::open_read_only(&path),
            Err(Error::PoolInUse)
        ));
        owner.close().unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn a_crashed_pool_reads_as_recovered_and_stays_as_the_crash_left_it() {
    for kind in KINDS {
        let (live, crashed) = (pool_path(kind, "live"), pool_path(kind, "crashed"));
        let v = Volume::create(&live, &options(kind)).unwrap();
        fill(&v);
        let held = v.open_file("/sparse").unwrap();
        v.remove_file("/sparse").unwrap();
        v.write("/late", b"written last").unwrap();
        // What a crash now leaves: every store reached the file (tmpfs keeps them all), the
        // volume is not closed, a file is unlinked but open.
        std::fs::copy(&live, &crashed).unwrap();
        let want = snapshot(&v);
        drop(held);
        v.close().unwrap();
        let bytes = std::fs::read(&crashed).unwrap();

        let v = Volume::open_read_only(&crashed).unwrap();
        let report = v.mount_report();
        assert!(!report.clean, "{kind:?}: {report:?}");
        assert_eq!(report.orphans_freed, 1, "{kind:?}: {report:?}");
        assert_eq!(snapshot(&v), want, "{kind:?}");
        refuses_changes(&v);
        v.close().unwrap();
        assert!(
            std::fs::read(&crashed).unwrap() == bytes,
            "{kind:?}: the read-only mount wrote to the pool"
        );
        let v = Volume::open(&crashed).unwrap();
        assert!(!v.mount_report().clean);
        assert_eq!(
            snapshot(&v),
            want,
            "{kind:?}: the read-write mount's recovery"
        );
        v.close().unwrap();
        for p in [live, crashed] {
            std::fs::remove_file(p).unwrap();
        }
    }
}

#[test]
fn what_is_not_a_pool_fails_as_it_does_for_a_writable_open() {
    let dir = std::env::temp_dir().join(format!("pmfs-read-only-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    let absent = dir.join("absent");
    assert!(matches!(
        Volume::open_read_only(&absent),
        Err(Error::NotFound)
    ));
    let zeros = dir.join("zeros");
    std::fs::write(&zeros, vec![0u8; 4 << 20]).unwrap();
    assert!(matches!(
        Volume::open_read_only(&zeros),
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(
        Volume::open_read_only(&dir),
        Err(Error::InvalidArgument(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}
