//! Files written and then rewritten from start to end in pieces, two at a time, stay one
//! contiguous run each with the CFFS allocator (fragment extension and implicit
//! preallocation): each piece's goal is the block after the previous piece's new blocks,
//! which the overlay has until the writes are digested, even though an overwrite inside a
//! file never looks its goal up in the mapping.

mod common;

use std::sync::Arc;

use pmfs::{AllocatorKind, MappingKind, Options, Volume};
use pmfs_core::pm::{HeapRegion, Media};

use common::{SIZE, open_rw, options};

const PIECE: u64 = 64 << 10;
const FILE: u64 = 4 << 20;

/// Physically contiguous runs of the volume's file blocks.
fn extents(vol: &Volume) -> u64 {
    vol.usage(&mut |_, _| {}).unwrap().file_extents
}

/// Writes `byte` over the whole of both files, a piece of each in turn.
fn write_both(vol: &Volume, byte: u8) {
    let (a, b) = (open_rw(vol, "/a"), open_rw(vol, "/b"));
    let data = vec![byte; PIECE as usize];
    for at in (0..FILE).step_by(PIECE as usize) {
        a.write_at(&data, at).unwrap();
        b.write_at(&data, at).unwrap();
    }
}

#[test]
fn sequential_rewrites_keep_each_file_in_one_run() {
    for kind in [MappingKind::Extent, MappingKind::Radix, MappingKind::Cuckoo] {
        let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIZE).unwrap());
        let opts = Options {
            allocator: AllocatorKind::Cffs,
            ..options(kind)
        };
        let vol = Volume::format(media, &opts).unwrap();
        write_both(&vol, 1);
        assert_eq!(extents(&vol), 2, "{kind:?}: first write");
        write_both(&vol, 2);
        assert_eq!(extents(&vol), 2, "{kind:?}: rewrite");
        for path in ["/a", "/b"] {
            let mut back = vec![0u8; FILE as usize];
            open_rw(&vol, path).read_exact_at(&mut back, 0).unwrap();
            assert!(back.iter().all(|&b| b == 2), "{kind:?}: contents of {path}");
        }
    }
}
