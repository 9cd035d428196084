//! A cuckoo table whose metadata (header, lock epoch, intent records, buckets) was damaged at
//! random never makes `open`, `recover`, `verify` or any operation panic or hang: each returns
//! a value or an error.

use std::sync::Arc;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::traits::{Extent, FileId, FileMapping, SimpleAllocator};
use pmfs_mapping::cuckoo::CuckooMapping;
use proptest::prelude::*;

fn meta() -> Extent {
    Extent::new(BlockNo(0), 5)
}

fn alloc() -> Arc<SimpleAllocator> {
    Arc::new(SimpleAllocator::new(BlockNo(1000), 1000))
}

/// A populated table's image: three files with runs cut by removes.
fn populated() -> Vec<u8> {
    let r = HeapRegion::new(meta().len * BLOCK_SIZE).unwrap();
    let t = CuckooMapping::format_with_salt(&r, meta(), alloc(), 4).unwrap();
    for ino in 1..=3 {
        let f = t
            .open_file(FileId {
                ino,
                root: PmOff(0),
            })
            .unwrap();
        t.insert(&f, 0, 60, &mut Vec::new()).unwrap();
        t.remove(&f, 10, 20).unwrap();
    }
    let mut image = vec![0u8; r.size() as usize];
    r.read(PmOff(0), &mut image).unwrap();
    image
}

fn exercise(image: &[u8]) {
    let r = HeapRegion::from_image(image).unwrap();
    let Ok(t) = CuckooMapping::open(&r, meta(), alloc()) else {
        return;
    };
    if t.recover().is_err() {
        // Locks of the old epoch may look held; without a recovery every access to such a
        // bucket waits its full patience, which the lock test covers.
        return;
    }
    let _ = t.verify();
    for ino in 1..=4 {
        let Ok(f) = t.open_file(FileId {
            ino,
            root: PmOff(0),
        }) else {
            continue;
        };
        let mut out = Vec::new();
        let _ = t.lookup(&f, 0, 100, &mut out);
        let _ = t.lookup(&f, 5, 3, &mut out);
        let _ = t.insert(&f, 70, 5, &mut out);
        let _ = t.remove(&f, 0, 20);
        let _ = t.owned_blocks(&f, &mut |_| {});
        let _ = t.remove_file(&f);
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(64),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn damaged_cuckoo_tables_fail_cleanly(
        damage in proptest::collection::vec((0..5 * BLOCK_SIZE, any::<u8>()), 1..40),
        header_too in any::<bool>(),
    ) {
        let mut image = populated();
        for (at, byte) in damage {
            let at = if header_too { at } else { BLOCK_SIZE + at % (4 * BLOCK_SIZE) };
            image[at as usize] = byte;
        }
        exercise(&image);
    }
}
