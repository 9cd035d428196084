//! Hostile pool files: a truncated pool, a pool from a future format version (and one from
//! the previous version, upgraded when mounted for writing), a read-only
//! pool and files that cannot be pools open with an error, never a panic, and change nothing.

mod common;

use std::fs::OpenOptions as StdOpen;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pmfs::{
    Error, FORMAT_VERSION, MappingKind, OpenMode, OpenNode, Options, SeekTarget, Volume, fsck,
};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::{HeapRegion, Media, Tap, Tapped};

use common::{crash_copy, snapshot};

const POOL: u64 = 8 << 20;

/// A scratch directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("pmfs-hostile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Creates a pool file with a little content and closes it.
fn make_pool(path: &Path) {
    make_pool_of(path, MappingKind::Extent);
}

fn make_pool_of(path: &Path, kind: MappingKind) {
    let opts = Options {
        size: POOL,
        inodes: Some(64),
        journal_slots: 2,
        ..Options::with_mapping(kind)
    };
    let vol = Volume::create(path, &opts).unwrap();
    vol.create_dir("/d").unwrap();
    vol.write("/d/f", b"pool content").unwrap();
    vol.close().unwrap();
}

#[test]
fn truncated_pool_files_fail_to_open() {
    let dir = Scratch::new("truncated");
    let pool = dir.path("pool");
    make_pool(&pool);
    // Cut at a block boundary inside the data region, inside the metadata, to the
    // superblocks alone, below one block, to nothing, and off a block boundary.
    for len in [
        POOL - 4096,
        POOL / 2,
        3 * 4096,
        2 * 4096,
        4096,
        100,
        0,
        POOL - 1,
    ] {
        let copy = dir.path("copy");
        std::fs::copy(&pool, &copy).unwrap();
        StdOpen::new()
            .write(true)
            .open(&copy)
            .unwrap()
            .set_len(len)
            .unwrap();
        match Volume::open(&copy) {
            Err(Error::Corrupt { .. } | Error::InvalidArgument(_)) => {}
            other => panic!("pool cut to {len} bytes: {other:?}"),
        }
        // The file is left as it was.
        assert_eq!(std::fs::metadata(&copy).unwrap().len(), len);
        std::fs::remove_file(&copy).unwrap();
    }
    // The uncut pool is intact.
    let vol = Volume::open(&pool).unwrap();
    assert_eq!(vol.read("/d/f").unwrap(), b"pool content");
}

#[test]
fn a_pool_from_a_future_format_version_is_unsupported() {
    let dir = Scratch::new("future");
    let pool = dir.path("pool");
    make_pool(&pool);
    let original = std::fs::read(&pool).unwrap();
    // The superblock record: version at byte 8, crc32c of bytes 0..248 at byte 248; the
    // backup copy in block 1. A future build bumps the version and reseals both copies.
    let mut img = original.clone();
    for base in [0usize, 4096] {
        img[base + 8..base + 12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        let crc = crc32c(&img[base..base + 248]);
        img[base + 248..base + 252].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(&pool, &img).unwrap();
    for r in [
        Volume::open(&pool).map(drop),
        Volume::mount_read_only(region(&img)).map(drop),
        fsck::check(region(&img)).map(drop),
        fsck::repair(region(&img)).map(drop),
    ] {
        match r {
            Err(e @ Error::Unsupported(_)) => {
                assert_eq!(
                    std::io::Error::from(e).raw_os_error(),
                    Some(libc::EOPNOTSUPP)
                )
            }
            other => panic!("future version: {other:?}"),
        }
    }
    // Nothing was written to the pool, not even the mount-state word.
    assert_eq!(std::fs::read(&pool).unwrap(), img);
    // Only the primary from the future (backup still current): still refused, the
    // backup is not taken as a way around the version.
    let mut img = original;
    img[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    let crc = crc32c(&img[..248]);
    img[248..252].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        Volume::mount(region(&img)),
        Err(Error::Unsupported(_))
    ));
}

#[test]
fn a_pool_of_the_previous_format_version_is_upgraded_when_mounted_for_writing() {
    let dir = Scratch::new("previous");
    let pool = dir.path("pool");
    // HashFS, which data-only clients attach to.
    make_pool_of(&pool, MappingKind::HashFs);
    // The previous version in both superblock copies.
    let previous = FORMAT_VERSION - 1;
    let mut img = std::fs::read(&pool).unwrap();
    for base in [0usize, 4096] {
        img[base + 8..base + 12].copy_from_slice(&previous.to_le_bytes());
        let crc = crc32c(&img[base..base + 248]);
        img[base + 248..base + 252].copy_from_slice(&crc.to_le_bytes());
    }
    std::fs::write(&pool, &img).unwrap();
    // Read-only, it is read as it is, and nothing is written.
    let ro = Volume::mount_read_only(region(&img)).unwrap();
    assert_eq!(ro.info().format_version, previous);
    assert_eq!(ro.read("/d/f").unwrap(), b"pool content");
    drop(ro);
    assert!(fsck::check(region(&img)).unwrap().is_clean());
    // A data-only client would write what the previous version's code may not read: refused.
    let attached = Volume::attach(&pool).map(drop);
    assert!(
        matches!(attached, Err(Error::Unsupported(_))),
        "attach: {attached:?}"
    );
    // Mounted for writing, both copies move to the current version.
    let vol = Volume::open(&pool).unwrap();
    vol.write("/d/f", b"pool content, then more").unwrap();
    vol.close().unwrap();
    let after = std::fs::read(&pool).unwrap();
    for base in [0usize, 4096] {
        assert_eq!(&after[base + 8..base + 12], &FORMAT_VERSION.to_le_bytes());
    }
    let vol = Volume::open(&pool).unwrap();
    assert_eq!(vol.info().format_version, FORMAT_VERSION);
    assert_eq!(vol.read("/d/f").unwrap(), b"pool content, then more");
}

/// A volume of format version 2 made before the copy-on-write data path kept the inode's
/// `MAPPED_END` word: its files map blocks below their size past the word. A mount for
/// writing raises the word to the size before it upgrades the volume, so that truncations
/// (which unmap up to the word) free the blocks; a read-only mount takes the size for the
/// bound of `SEEK_DATA`.
#[test]
fn a_version_2_pool_gets_its_mapped_ends_raised_before_its_upgrade() {
    const RO: OpenMode = OpenMode {
        read: true,
        write: false,
        truncate: false,
    };
    for kind in [MappingKind::HashFs, MappingKind::Extent] {
        let dir = Scratch::new("version-2");
        let pool = dir.path("pool");
        make_pool_of(&pool, kind);
        let vol = Volume::open(&pool).unwrap();
        vol.write("/d/g", &[5u8; 9000]).unwrap();
        let ino = vol.symlink_metadata("/d/g").unwrap().ino();
        let info = vol.info();
        vol.close().unwrap();
        let mut img = std::fs::read(&pool).unwrap();
        for base in [0usize, 4096] {
            img[base + 8..base + 12].copy_from_slice(&2u32.to_le_bytes());
            let crc = crc32c(&img[base..base + 248]);
            img[base + 248..base + 252].copy_from_slice(&crc.to_le_bytes());
        }
        let mapped_end = (info.inode_table_offset + ino * info.inode_size + 120) as usize;
        img[mapped_end..mapped_end + 8].copy_from_slice(&0u64.to_le_bytes());
        std::fs::write(&pool, &img).unwrap();

        let ro = Volume::mount_read_only(region(&img)).unwrap();
        let g = node(&ro, "g", RO);
        assert_eq!(g.seek(0, SeekTarget::Data).unwrap(), Some(0), "{kind:?}");
        assert_eq!(g.seek(8192, SeekTarget::Data).unwrap(), Some(8192));
        drop(g);
        ro.close().unwrap();
        assert!(fsck::check(region(&img)).unwrap().is_clean());

        let vol = Volume::open(&pool).unwrap();
        assert_eq!(vol.info().format_version, FORMAT_VERSION);
        let g = node(&vol, "g", RO);
        assert_eq!(g.seek(4096, SeekTarget::Data).unwrap(), Some(4096));
        drop(g);
        vol.write("/d/g", b"short").unwrap();
        vol.close().unwrap();
        let r = fsck::check(region(&std::fs::read(&pool).unwrap())).unwrap();
        assert!(r.is_clean(), "{kind:?}: {:#?}", r.problems);
        let vol = Volume::open(&pool).unwrap();
        assert_eq!(vol.read("/d/g").unwrap(), b"short");
        vol.close().unwrap();
    }
}

/// The open file `/d/<name>` of `vol`.
fn node(vol: &Volume, name: &str, mode: OpenMode) -> OpenNode {
    let d = vol.lookup(vol.root(), b"d").unwrap();
    let f = vol.lookup(d.ino, name.as_bytes()).unwrap();
    vol.open_ino(f.ino, mode).unwrap()
}

fn crc32c(bytes: &[u8]) -> u32 {
    pmfs_core::layout::crc32c(bytes)
}

fn region(img: &[u8]) -> Arc<dyn Media> {
    Arc::new(HeapRegion::from_image(img).unwrap())
}

/// Refuses every store: a pool file that is mapped read-only.
struct ReadOnly;

fn refused() -> pmfs_core::Result<()> {
    Err(pmfs_core::Error::Io(std::io::Error::from_raw_os_error(
        libc::EROFS,
    )))
}

impl Tap for ReadOnly {
    fn write(&self, _: PmOff, _: u64) -> pmfs_core::Result<()> {
        refused()
    }
    fn store(&self, _: PmOff) -> pmfs_core::Result<()> {
        refused()
    }
    fn cas(&self, _: PmOff, _: u64) -> pmfs_core::Result<()> {
        refused()
    }
}

/// A media with the content of `img` that refuses every store.
fn read_only(img: &[u8]) -> Arc<dyn Media> {
    Arc::new(Tapped::new(HeapRegion::from_image(img).unwrap(), ReadOnly))
}

#[test]
fn a_read_only_pool_mounts_read_only_and_refuses_writes() {
    let dir = Scratch::new("readonly");
    let pool = dir.path("pool");
    make_pool(&pool);
    let img = std::fs::read(&pool).unwrap();

    // A mapping that refuses stores: the read-only mount works and never writes; a
    // read-write mount fails with the store's error instead of panicking.
    let ro: Arc<dyn Media> = read_only(&img);
    let vol = Volume::mount_read_only(ro.clone()).unwrap();
    assert_eq!(vol.read("/d/f").unwrap(), b"pool content");
    // Its free space is what a read-write mount counts (the blocks of file logs included).
    let rw = Volume::mount(region(&img)).unwrap();
    assert_eq!(
        vol.statfs().unwrap().free_blocks,
        rw.statfs().unwrap().free_blocks
    );
    drop(rw);
    let before = snapshot(&vol);
    for r in [
        vol.write("/d/f", b"x"),
        vol.create_dir("/e"),
        vol.remove_file("/d/f"),
        vol.rename("/d/f", "/g"),
        vol.symlink("/d/f", "/s"),
        vol.hard_link("/d/f", "/h"),
    ] {
        assert!(matches!(r, Err(Error::ReadOnly)), "{r:?}");
    }
    assert_eq!(snapshot(&vol), before);
    vol.close().unwrap();
    match Volume::mount(ro.clone()) {
        Err(Error::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::EROFS)),
        other => panic!("read-write mount of a read-only media: {other:?}"),
    }
    let report = fsck::check(ro.clone()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
    assert!(fsck::repair(ro).is_ok());

    // A volume that needs recovery mounts read-only too, recovered in memory: the media
    // takes no store.
    let dirty = {
        let m = region(&img);
        let vol = Volume::mount(m.clone()).unwrap();
        vol.write("/d/new", b"n").unwrap();
        let copy = crash_copy(&m);
        drop(vol);
        copy
    };
    let mut dirty_img = vec![0u8; dirty.size() as usize];
    dirty.read(PmOff(0), &mut dirty_img).unwrap();
    let ro_dirty: Arc<dyn Media> = read_only(&dirty_img);
    let vol = Volume::mount_read_only(ro_dirty).unwrap();
    assert!(!vol.mount_report().clean);
    assert_eq!(vol.read("/d/new").unwrap(), b"n");
    assert!(matches!(vol.write("/d/f", b"x"), Err(Error::ReadOnly)));
    vol.close().unwrap();

    // The pool file itself made read-only: an unprivileged process cannot open it for
    // writing; a privileged one (root ignores file modes) opens it and finds it intact.
    std::fs::set_permissions(&pool, std::fs::Permissions::from_mode(0o444)).unwrap();
    // SAFETY: geteuid has no preconditions and touches no memory of ours.
    let root = unsafe { libc::geteuid() } == 0;
    match Volume::open(&pool) {
        Err(Error::Io(e)) if !root => {
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied)
        }
        Ok(vol) if root => {
            assert_eq!(vol.read("/d/f").unwrap(), b"pool content");
            vol.close().unwrap();
        }
        other => panic!("read-only pool file (root: {root}): {other:?}"),
    }
}

#[test]
fn files_that_cannot_be_pools_fail_to_open() {
    let dir = Scratch::new("notpools");
    // Missing, a directory, zeros, random bytes of a valid size.
    assert!(matches!(
        Volume::open(dir.path("missing")),
        Err(Error::NotFound)
    ));
    assert!(matches!(
        Volume::open(&dir.0),
        Err(Error::InvalidArgument(_))
    ));
    let zeros = dir.path("zeros");
    std::fs::write(&zeros, vec![0u8; POOL as usize]).unwrap();
    assert!(matches!(Volume::open(&zeros), Err(Error::Corrupt { .. })));
    let noise = dir.path("noise");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let bytes: Vec<u8> = (0..POOL)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&noise, &bytes).unwrap();
    assert!(matches!(Volume::open(&noise), Err(Error::Corrupt { .. })));
    assert!(matches!(
        fsck::check(region(&bytes)),
        Err(Error::Corrupt { .. })
    ));
    // A pool that exists already is not formatted over.
    let opts = Options {
        size: POOL,
        ..Options::default()
    };
    assert!(matches!(
        Volume::create(&noise, &opts),
        Err(Error::AlreadyExists)
    ));
    assert_eq!(std::fs::read(&noise).unwrap(), bytes);
}

#[test]
fn a_pool_has_one_owner_at_a_time() {
    let dir = Scratch::new("owner");
    let pool = dir.path("pool");
    make_pool(&pool);
    let owner = Volume::open(&pool).unwrap();
    // A second owner would run recovery under the live volume.
    assert!(matches!(Volume::open(&pool), Err(Error::PoolInUse)));
    let f = owner.open_file("/d/f").unwrap();
    owner.close().unwrap();
    // The engine lives on while a file is open, and so does its lock.
    assert!(matches!(Volume::open(&pool), Err(Error::PoolInUse)));
    drop(f);
    let again = Volume::open(&pool).unwrap();
    assert!(again.mount_report().clean, "the first owner closed cleanly");
    assert_eq!(again.read("/d/f").unwrap(), b"pool content");
    again.close().unwrap();
}
