//! PmRegion round trips on pool files under /dev/shm (tmpfs: no MAP_SYNC, so these also
//! exercise the fallback), for every backend this build has.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::pm::persist::DispatchPath;
use crate::pm::{Media, MediaExt};

const MIB: u64 = 1 << 20;

/// A pool path under /dev/shm, removed on drop.
struct TempPool(PathBuf);

impl TempPool {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = PathBuf::from(format!(
            "/dev/shm/pmfs-region-test-{}-{n}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        Self(p)
    }

    fn write_file(&self, len: usize) {
        std::fs::write(&self.0, vec![0u8; len]).unwrap();
    }
}

impl Drop for TempPool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn backends() -> Vec<Backend> {
    if cfg!(feature = "libpmem") {
        vec![Backend::Mmap, Backend::Libpmem]
    } else {
        vec![Backend::Mmap]
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn read_vec(r: &PmRegion, off: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    r.read(PmOff(off), &mut v).unwrap();
    v
}

#[test]
fn create_write_reopen_round_trip() {
    for backend in backends() {
        let pool = TempPool::new();
        let data = pattern(100_000, 7);
        {
            let r = PmRegion::create_with(&pool.0, 4 * MIB, backend).unwrap();
            assert_eq!(r.backend(), backend);
            assert_eq!(r.size(), 4 * MIB);
            assert_eq!(r.path(), pool.0.as_path());
            // SAFETY: only the address is inspected.
            let base = unsafe { r.as_ptr() };
            assert_eq!(base.addr() % HUGE_PAGE as usize, 0, "{backend:?}");
            assert!(read_vec(&r, 0, 4 * MIB as usize).iter().all(|&b| b == 0));
            r.write_persist(PmOff(13), &data).unwrap();
            r.write_nt(PmOff(200_001), &data[..5000]).unwrap();
            r.fence();
            r.write(PmOff(300_000), b"cached").unwrap();
            r.persist(PmOff(300_000), 6).unwrap();
            r.fill_nt(PmOff(400_003), 9000, 0xa5).unwrap();
            r.copy_within_nt(PmOff(20), PmOff(500_001), 7000).unwrap();
            r.fence();
            r.store_u64_persist(PmOff(4 * MIB - 8), 0x0123_4567_89ab_cdef)
                .unwrap();
            assert_eq!(
                r.cas_u64_persist(PmOff(4 * MIB - 8), 0x0123_4567_89ab_cdef, 42)
                    .unwrap(),
                Ok(0x0123_4567_89ab_cdef)
            );
            r.msync(PmOff(0), 4 * MIB).unwrap();
            r.msync(PmOff(4097), 10).unwrap();
        }
        assert_eq!(std::fs::metadata(&pool.0).unwrap().len(), 4 * MIB);
        for reopen in backends() {
            let r = PmRegion::open_with(&pool.0, reopen).unwrap();
            assert_eq!(r.size(), 4 * MIB);
            assert_eq!(
                read_vec(&r, 13, data.len()),
                data,
                "{backend:?}->{reopen:?}"
            );
            assert_eq!(read_vec(&r, 200_001, 5000), data[..5000]);
            assert_eq!(read_vec(&r, 300_000, 6), b"cached");
            assert_eq!(read_vec(&r, 500_001, 7000), data[7..7007]);
            let fill = read_vec(&r, 400_002, 9002);
            assert_eq!((fill[0], fill[9001]), (0, 0));
            assert!(fill[1..9001].iter().all(|&b| b == 0xa5));
            assert_eq!(r.load_u64(PmOff(4 * MIB - 8)).unwrap(), 42);
            assert_eq!(
                r.read_pod::<crate::layout::Le64>(PmOff(4 * MIB - 8))
                    .unwrap()
                    .get(),
                42
            );
        }
    }
}

#[test]
fn tmpfs_is_not_real_pm() {
    // tmpfs rejects MAP_SYNC: the region falls back to MAP_SHARED and says so.
    let pool = TempPool::new();
    let r = PmRegion::create(&pool.0, 2 * MIB).unwrap();
    assert!(!r.map_sync());
    assert!(!r.is_pmem());
    assert_eq!(r.flush_kind(), persist::flush_kind());
    assert_eq!(r.copy_kind(), persist::copy_kind());
    assert!(r.needs_flush());
}

#[test]
fn grow_keeps_data_and_persists_the_new_size() {
    for backend in backends() {
        let pool = TempPool::new();
        let mut r = PmRegion::create_with(&pool.0, MIB, backend).unwrap();
        let head = pattern(4096, 1);
        r.write_persist(PmOff(0), &head).unwrap();
        r.store_u64_persist(PmOff(MIB - 8), 77).unwrap();

        r.grow(MIB).unwrap();
        assert_eq!(r.size(), MIB);
        r.grow(5 * MIB + 4096).unwrap();
        assert_eq!(r.size(), 5 * MIB + 4096);
        // SAFETY: only the address is inspected.
        assert_eq!(unsafe { r.as_ptr() }.addr() % HUGE_PAGE as usize, 0);
        assert_eq!(read_vec(&r, 0, 4096), head);
        assert_eq!(r.load_u64(PmOff(MIB - 8)).unwrap(), 77);
        assert!(
            read_vec(&r, MIB, 4 * MIB as usize + 4096)
                .iter()
                .all(|&b| b == 0)
        );
        r.store_u64_persist(PmOff(5 * MIB + 4088), 99).unwrap();
        assert!(matches!(
            r.load_u64(PmOff(5 * MIB + 4096)),
            Err(Error::OutOfBounds { .. })
        ));

        assert!(matches!(r.grow(MIB), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            r.grow(6 * MIB + 1),
            Err(Error::PoolSizeUnaligned { .. })
        ));
        assert_eq!(r.size(), 5 * MIB + 4096);
        drop(r);

        let r = PmRegion::open_with(&pool.0, backend).unwrap();
        assert_eq!(r.size(), 5 * MIB + 4096);
        assert_eq!(read_vec(&r, 0, 4096), head);
        assert_eq!(r.load_u64(PmOff(MIB - 8)).unwrap(), 77);
        assert_eq!(r.load_u64(PmOff(5 * MIB + 4088)).unwrap(), 99);
    }
}

#[test]
fn bad_pools_are_refused_with_clear_errors() {
    for backend in backends() {
        let pool = TempPool::new();
        assert!(matches!(
            PmRegion::open_with(&pool.0, backend),
            Err(Error::PoolNotFound(p)) if p == pool.0
        ));
        assert!(matches!(
            PmRegion::create_with(&pool.0, 0, backend),
            Err(Error::PoolTooSmall {
                size: 0,
                min: MIN_POOL_SIZE
            })
        ));
        assert!(matches!(
            PmRegion::create_with(&pool.0, 5000, backend),
            Err(Error::PoolSizeUnaligned {
                size: 5000,
                block: BLOCK_SIZE
            })
        ));
        assert!(!pool.0.exists(), "a refused create leaves no file");

        pool.write_file(100);
        assert!(matches!(
            PmRegion::open_with(&pool.0, backend),
            Err(Error::PoolTooSmall { size: 100, .. })
        ));
        pool.write_file(3 * 4096 + 512);
        assert!(matches!(
            PmRegion::open_with(&pool.0, backend),
            Err(Error::PoolSizeUnaligned { size: 12800, .. })
        ));
        assert!(matches!(
            PmRegion::create_with(&pool.0, 8192, backend),
            Err(Error::PoolExists(p)) if p == pool.0
        ));
        // The refused create did not touch the existing file.
        assert_eq!(std::fs::metadata(&pool.0).unwrap().len(), 12800);

        assert!(matches!(
            PmRegion::open_with("/dev/shm", backend),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            PmRegion::open_with("/dev/zero", backend),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            PmRegion::create_with("/nonexistent-dir/pool", 8192, backend),
            Err(Error::Io(_))
        ));
    }
}

#[cfg(not(feature = "libpmem"))]
#[test]
fn libpmem_backend_needs_the_feature() {
    let pool = TempPool::new();
    assert!(matches!(
        PmRegion::create_with(&pool.0, 8192, Backend::Libpmem),
        Err(Error::Unsupported(_))
    ));
    assert!(!pool.0.exists());
    pool.write_file(8192);
    assert!(matches!(
        PmRegion::open_with(&pool.0, Backend::Libpmem),
        Err(Error::Unsupported(_))
    ));
}

#[test]
fn media_bounds_and_atomics() {
    for backend in backends() {
        let pool = TempPool::new();
        let r = PmRegion::create_with(&pool.0, 8192, backend).unwrap();
        let mut b = [0u8; 5];
        assert!(matches!(
            r.read(PmOff(8190), &mut b),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.write_nt(PmOff(8190), &b),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.write_persist(PmOff(u64::MAX), &b),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.fill_nt(PmOff(0), 8193, 1),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.flush(PmOff(8192), 1),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.persist(PmOff(1), 8192),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.msync(PmOff(4096), 4097),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(r.load_u64(PmOff(4)), Err(Error::Unaligned(_))));
        assert!(matches!(
            r.store_u64(PmOff(8192), 1),
            Err(Error::OutOfBounds { .. })
        ));
        r.flush(PmOff(8192), 0).unwrap();
        r.store_u64(PmOff(64), 7).unwrap();
        assert_eq!(r.cas_u64(PmOff(64), 7, 9).unwrap(), Ok(7));
        assert_eq!(r.cas_u64_persist(PmOff(64), 7, 11).unwrap(), Err(9));
        r.prefetch(PmOff(64));
        r.prefetch(PmOff(1 << 40));
        assert_eq!(r.blocks(), 2);
    }
}

#[test]
fn two_mappings_of_one_pool_share_bytes() {
    for backend in backends() {
        let pool = TempPool::new();
        let a = PmRegion::create_with(&pool.0, 3 * MIB, backend).unwrap();
        let b = PmRegion::open(&pool.0).unwrap();
        a.write_persist(PmOff(MIB + 5), b"shared").unwrap();
        assert_eq!(read_vec(&b, MIB + 5, 6), b"shared");
        assert_eq!(b.cas_u64_persist(PmOff(2 * MIB), 0, 5).unwrap(), Ok(0));
        assert_eq!(a.load_u64(PmOff(2 * MIB)).unwrap(), 5);
    }
}

#[test]
fn a_region_opened_from_a_descriptor_names_its_pool_after_the_number_is_reused() {
    let pool = TempPool::new();
    let a = PmRegion::create(&pool.0, 3 * MIB).unwrap();
    let id = DevIno::of(&std::fs::metadata(&pool.0).unwrap());
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pool.0)
        .unwrap();
    let b = PmRegion::open_file(file, &pool.0).unwrap();
    a.write_persist(PmOff(MIB), b"opened").unwrap();
    assert_eq!(read_vec(&b, MIB, 6), b"opened");
    // What a program sharing the descriptor table may do: put another file at the number.
    let other = File::open("/dev/null").unwrap();
    // SAFETY: both are open descriptors; `b` only reads its own number's file identity,
    // which must no longer come from the number.
    assert!(unsafe { libc::dup2(other.as_raw_fd(), b.file.as_raw_fd()) } >= 0);
    assert_eq!(b.file_id(), Some(id));
    assert_eq!(a.file_id(), Some(id));
    assert!(matches!(
        PmRegion::open_file(File::open("/dev/shm").unwrap(), "/dev/shm"),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn every_dispatch_path_writes_through_the_region() {
    let pool = TempPool::new();
    let r = PmRegion::create(&pool.0, MIB).unwrap();
    let data = pattern(70_000, 3);
    for (i, path) in DispatchPath::available().into_iter().enumerate() {
        persist::with_path(path, || {
            assert_eq!((r.flush_kind(), r.copy_kind()), (path.flush, path.copy));
            let off = 1 + i as u64 * 80_001 % (MIB - 80_000);
            r.write_nt(PmOff(off), &data).unwrap();
            r.fill_nt(PmOff(off + 70_000), 300, i as u8).unwrap();
            let to = if off > MIB / 2 { 5 } else { MIB - 6000 };
            r.copy_within_nt(PmOff(off + 11), PmOff(to), 5000).unwrap();
            r.fence();
            assert_eq!(read_vec(&r, to, 5000), data[11..5011], "{path}");
            assert_eq!(read_vec(&r, off, data.len()), data, "{path}");
            assert!(
                read_vec(&r, off + 70_000, 300)
                    .iter()
                    .all(|&b| b == i as u8)
            );
        })
        .unwrap();
    }
}

#[test]
fn concurrent_writers_on_disjoint_ranges() {
    let pool = TempPool::new();
    let r = Arc::new(PmRegion::create(&pool.0, 2 * MIB).unwrap());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let r = Arc::clone(&r);
            std::thread::spawn(move || {
                let data = pattern(100_000, t);
                let off = PmOff(u64::from(t) * 400_000 + 3);
                for _ in 0..20 {
                    r.write_persist(off, &data).unwrap();
                }
                r.cas_u64_persist(PmOff(2 * MIB - 8 * (u64::from(t) + 1)), 0, 1)
                    .unwrap()
                    .unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for t in 0..4u8 {
        assert_eq!(
            read_vec(&r, u64::from(t) * 400_000 + 3, 100_000),
            pattern(100_000, t)
        );
        assert_eq!(
            r.load_u64(PmOff(2 * MIB - 8 * (u64::from(t) + 1))).unwrap(),
            1
        );
    }
}

/// Threads that map two pools on a disk file system (`std::env::temp_dir()`, where ext4 and
/// xfs without DAX refuse `MAP_SYNC` only after unmapping the range a `MAP_FIXED` mapping was
/// to replace) each always see their own pool: a retried `MAP_FIXED` used to clobber a mapping
/// another thread had just made in the hole, which read the other pool or faulted later.
#[test]
fn threads_mapping_pools_at_once_each_see_their_own() {
    let dir = std::env::temp_dir();
    let paths: Vec<PathBuf> = (0..2u8)
        .map(|i| {
            let p = dir.join(format!("pmfs-region-race-{}-{i}.pool", std::process::id()));
            let _ = std::fs::remove_file(&p);
            let r = PmRegion::create(&p, 2 * MIB).unwrap();
            r.write(PmOff(0), &[i + 1; 64]).unwrap();
            p
        })
        .collect();
    std::thread::scope(|s| {
        for t in 0..8usize {
            let path = &paths[t % 2];
            s.spawn(move || {
                for _ in 0..150 {
                    let r = PmRegion::open(path).unwrap();
                    assert_eq!(read_vec(&r, 0, 64), vec![(t % 2) as u8 + 1; 64]);
                }
            });
        }
    });
    for p in paths {
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn preallocate_extends_allocates_and_reports_progress() {
    for dir in ["/dev/shm", std::env::temp_dir().to_str().unwrap()] {
        let path = PathBuf::from(format!(
            "{dir}/pmfs-prealloc-test-{}.pool",
            std::process::id()
        ));
        let pool = TempPool(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&pool.0)
            .unwrap();
        let mut seen = Vec::new();
        preallocate(&file, 0, 130 * MIB, &mut |done| seen.push(done)).unwrap();
        assert_eq!(seen, [64 * MIB, 128 * MIB, 130 * MIB], "{dir}");
        let meta = file.metadata().unwrap();
        assert_eq!(meta.len(), 130 * MIB, "{dir}");
        assert!(
            std::os::unix::fs::MetadataExt::blocks(&meta) * 512 >= 130 * MIB,
            "{dir}"
        );

        // Growing from an offset inside a step reports bytes of the range only.
        seen.clear();
        preallocate(&file, 130 * MIB, 200 * MIB, &mut |done| seen.push(done)).unwrap();
        assert_eq!(seen, [62 * MIB, 70 * MIB], "{dir}");
        assert_eq!(file.metadata().unwrap().len(), 200 * MIB, "{dir}");

        preallocate(&file, 8192, 8192, &mut |_| panic!("no step")).unwrap();
        for (from, to) in [(1, 8192), (0, 4097), (8192, 4096)] {
            assert!(matches!(
                preallocate(&file, from, to, &mut |_| {}),
                Err(Error::InvalidArgument(_))
            ));
        }
        assert_eq!(file.metadata().unwrap().len(), 200 * MIB, "{dir}");
    }
}

/// Whether the tmpfs at `/dev/shm` may allocate transparent huge pages for a mapping advised
/// `MADV_HUGEPAGE`: by its mount options, unless the kernel-wide `shmem_enabled` setting
/// overrides every mount (`deny` or `force`).
fn dev_shm_allows_huge_pages() -> bool {
    let global = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .unwrap_or_default();
    if global.contains("[deny]") {
        return false;
    }
    if global.contains("[force]") {
        return true;
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .rfind(|l| l.split(' ').nth(4) == Some("/dev/shm"))
        .is_some_and(|l| {
            ["huge=advise", "huge=always", "huge=within_size"]
                .iter()
                .any(|o| l.contains(o))
        })
}

/// The bytes of `[base, base+len)` that `/proc/self/smaps` reports mapped with PMD-sized pages.
fn pmd_mapped_bytes(base: usize, len: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    let mut total = 0;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((lo, hi)) = range.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            inside = lo >= base && hi <= base + len;
        } else if inside && let Some(kb) = line.strip_prefix("ShmemPmdMapped:") {
            total += kb
                .trim()
                .trim_end_matches(" kB")
                .trim()
                .parse::<u64>()
                .unwrap()
                * 1024;
        }
    }
    total
}

#[test]
fn a_pool_on_a_huge_page_tmpfs_is_mapped_with_huge_pages() {
    // Created, closed and opened again (as `pmfs mkfs` then `pmfs mount` do): the memory
    // allocated at creation stays in 2 MiB pages, and the new mapping maps them whole. On a
    // /dev/shm mounted without `huge=`, the kernel allocates 4 KiB pages, and the check is
    // that none are PMD-mapped.
    let pool = TempPool::new();
    drop(PmRegion::create(&pool.0, 8 * MIB).unwrap());
    let r = PmRegion::open(&pool.0).unwrap();
    // Fault every page in (a read touches each 4 KiB page's first byte).
    for off in (0..8 * MIB).step_by(4096) {
        r.load_u64(PmOff(off)).unwrap();
    }
    let base = r.raw.base() as usize;
    let mapped = pmd_mapped_bytes(base, 8 * MIB as usize);
    if dev_shm_allows_huge_pages() {
        assert!(r.huge_pages());
        assert_eq!(mapped, 8 * MIB);
    } else {
        assert_eq!(mapped, 0);
    }
}

#[test]
fn the_owner_sees_the_client_locks_of_other_descriptors() {
    let pool = TempPool::new();
    let owner = PmRegion::create(&pool.0, 2 * MIB).unwrap();
    assert_eq!(owner.client_locks_elsewhere(), Some(false));
    let client = PmRegion::open(&pool.0).unwrap();
    assert_eq!(owner.client_locks_elsewhere(), Some(false));
    client.lock_as_client().unwrap();
    assert_eq!(owner.client_locks_elsewhere(), Some(true));
    // A second client's shared lock goes beside the first.
    let second = PmRegion::open(&pool.0).unwrap();
    second.lock_as_client().unwrap();
    drop(client);
    assert_eq!(owner.client_locks_elsewhere(), Some(true));
    // The lock goes with the descriptor.
    drop(second);
    assert_eq!(owner.client_locks_elsewhere(), Some(false));
}
