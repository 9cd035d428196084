//! A HashFS table whose metadata (header, intent records, slot table) was damaged at random
//! never makes `open`, `recover` or any operation panic or hang: each returns a value or an
//! error.

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::traits::{Extent, FileId, FileMapping};
use pmfs_mapping::hashfs::HashFs;
use proptest::prelude::*;

const SLOTS: u64 = 300;

fn meta() -> Extent {
    Extent::new(BlockNo(0), HashFs::<HeapRegion>::meta_blocks(SLOTS))
}

fn data() -> Extent {
    Extent::new(meta().end(), SLOTS)
}

/// A populated table's image: three files, some removed blocks (tombstones).
fn populated() -> Vec<u8> {
    let r = HeapRegion::new(data().end().0 * BLOCK_SIZE).unwrap();
    let t = HashFs::format_with_salt(&r, meta(), data(), 9).unwrap();
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

/// Exercises everything; only panics (the test failure) or hangs matter.
fn exercise(image: &[u8]) {
    let r = HeapRegion::from_image(image).unwrap();
    let Ok(mut t) = HashFs::open(&r, meta(), data()) else {
        return;
    };
    let _ = t.recover();
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
        let _ = t.insert(&f, 90, 1, &mut out);
        let _ = t.remove(&f, 0, 20);
        let _ = t.owned_blocks(&f, &mut |_| {});
        let _ = t.remove_file(&f);
    }
    let _ = t.occupancy();
    let _ = t.purge_tombstones();
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(64),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn damaged_hashfs_tables_fail_cleanly(
        damage in proptest::collection::vec((0..3u64 * BLOCK_SIZE, any::<u8>()), 1..40),
        header_too in any::<bool>(),
    ) {
        let mut image = populated();
        for (at, byte) in damage {
            // Mostly the slot table and intent records; the header when asked.
            let at = if header_too { at } else { BLOCK_SIZE + at % (2 * BLOCK_SIZE) };
            image[at as usize] = byte;
        }
        exercise(&image);
    }
}
