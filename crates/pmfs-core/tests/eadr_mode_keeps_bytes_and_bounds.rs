//! eADR mode (caches inside the persistence domain) is process-wide, so it is tested in its own
//! test binary: flushes become no-ops, but every copy path still writes the right bytes, fences
//! still run, and bounds are still checked.

use pmfs_core::Error;
use pmfs_core::layout::PmOff;
use pmfs_core::pm::persist::{self, DispatchPath};
use pmfs_core::pm::{HeapRegion, Media, PmRegion};

#[test]
fn eadr_mode_keeps_bytes_and_bounds() {
    assert!(persist::needs_flush());
    persist::set_eadr(true);
    assert!(!persist::needs_flush());

    let path = format!("/dev/shm/pmfs-eadr-{}.pool", std::process::id());
    let _ = std::fs::remove_file(&path);
    let pool = PmRegion::create(&path, 1 << 20).unwrap();
    let heap = HeapRegion::new(1 << 20).unwrap();
    #[allow(unused_mut)]
    let mut regions: Vec<Box<dyn Media>> = vec![Box::new(pool), Box::new(heap)];
    #[cfg(feature = "libpmem")]
    regions.push(Box::new(
        PmRegion::open_with(&path, pmfs_core::pm::Backend::Libpmem).unwrap(),
    ));
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 13 % 251) as u8).collect();
    for r in &regions {
        assert!(!r.needs_flush());
        for (i, p) in DispatchPath::available().into_iter().enumerate() {
            persist::with_path(p, || {
                let off = 7 + i as u64 * 30_011;
                r.write_persist(PmOff(off), &data).unwrap();
                r.write(PmOff(off + 20_000), &data[..100]).unwrap();
                r.persist(PmOff(off + 20_000), 100).unwrap();
                r.fill_nt(PmOff(off + 20_100), 700, 0x3c).unwrap();
                r.fence();
                let mut back = vec![0u8; 20_800];
                r.read(PmOff(off), &mut back).unwrap();
                assert_eq!(&back[..20_000], &data[..], "{p}");
                assert_eq!(&back[20_000..20_100], &data[..100]);
                assert!(back[20_100..].iter().all(|&b| b == 0x3c));
            })
            .unwrap();
        }
        assert!(matches!(
            r.flush(PmOff(1 << 20), 1),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.persist(PmOff(0), (1 << 20) + 1),
            Err(Error::OutOfBounds { .. })
        ));
        r.store_u64_persist(PmOff(8), 5).unwrap();
        assert_eq!(r.cas_u64_persist(PmOff(8), 5, 6).unwrap(), Ok(5));
        assert_eq!(r.load_u64(PmOff(8)).unwrap(), 6);
    }
    drop(regions);
    std::fs::remove_file(&path).unwrap();

    persist::set_eadr(false);
    assert!(persist::needs_flush());
}
