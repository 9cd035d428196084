//! Radix-tree behaviour beyond the shared suite: heights follow the largest mapped block (up
//! to the full 64-bit logical space), damaged entries and root words are reported as
//! `Error::Corrupt` (never a panic or an endless walk), a call whose undo record does not
//! fit fails without changing anything, and `insert_at` refuses foreign or mapped blocks and
//! never frees the caller's blocks.

use std::sync::Arc;

use pmfs_core::Error;
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::traits::{
    AllocHint, BlockAllocator, Extent, FileId, FileMapping, Run, SimpleAllocator,
};
use pmfs_mapping::radix::{RadixFile, RadixOptions, RadixTree};
use pmfs_mapping::undo::UndoGeometry;
use proptest::prelude::*;

type Tree = RadixTree<Arc<HeapRegion>, SimpleAllocator>;

const ROOT: PmOff = PmOff(0);
const ID: FileId = FileId { ino: 1, root: ROOT };
const DATA: u64 = 4096;

struct Fixture {
    region: Arc<HeapRegion>,
    alloc: Arc<SimpleAllocator>,
    tree: Tree,
    file: RadixFile,
    meta: Extent,
}

fn fixture(slot_blocks: u32) -> Fixture {
    let opts = RadixOptions {
        undo: UndoGeometry {
            slots: 2,
            slot_blocks,
        },
    };
    let meta = Extent::new(BlockNo(1), opts.meta_blocks());
    let region = Arc::new(HeapRegion::new((meta.end().0 + DATA) * BLOCK_SIZE).unwrap());
    let alloc = Arc::new(SimpleAllocator::new(meta.end(), DATA));
    let tree = RadixTree::format_with(region.clone(), meta, alloc.clone(), opts).unwrap();
    let file = tree.open_file(ID).unwrap();
    Fixture {
        region,
        alloc,
        tree,
        file,
        meta,
    }
}

fn all_runs(f: &Fixture) -> Result<Vec<Run>, Error> {
    let mut v = Vec::new();
    f.tree.lookup(&f.file, 0, u64::MAX, &mut v)?;
    Ok(v)
}

fn root_block(f: &Fixture) -> u64 {
    f.region.load_u64(ROOT).unwrap() & ((1 << 48) - 1)
}

#[test]
fn heights_follow_the_largest_mapped_block() {
    let f = fixture(16);
    let points = [
        (0u64, 1u8),
        (511, 1),
        (512, 2),
        (1 << 18, 3),
        (1 << 40, 5),
        (u64::MAX - 1, 8),
    ];
    for &(lblk, h) in &points {
        f.tree.insert(&f.file, lblk, 1, &mut Vec::new()).unwrap();
        assert_eq!(f.tree.height(&f.file).unwrap(), h, "after mapping {lblk}");
    }
    let runs = all_runs(&f).unwrap();
    let lblks: Vec<u64> = runs.iter().flat_map(|r| r.lblk..r.lblk + r.len).collect();
    assert_eq!(lblks, vec![0, 511, 512, 1 << 18, 1 << 40, u64::MAX - 1]);
    // Removing from the top shrinks the tree level by level.
    for &(lblk, _) in points.iter().rev() {
        assert_eq!(f.tree.remove(&f.file, lblk, 1).unwrap(), 1);
    }
    assert_eq!(f.tree.height(&f.file).unwrap(), 0);
    assert_eq!(f.region.load_u64(ROOT).unwrap(), 0);
    assert_eq!(f.alloc.free_blocks(), DATA);
}

#[test]
fn shrinking_stops_at_the_highest_mapped_block() {
    let f = fixture(16);
    f.tree.insert(&f.file, 700, 2, &mut Vec::new()).unwrap();
    f.tree.insert(&f.file, 1 << 27, 2, &mut Vec::new()).unwrap();
    assert_eq!(f.tree.height(&f.file).unwrap(), 4);
    assert_eq!(
        f.tree
            .remove(&f.file, 1 << 20, u64::MAX - (1 << 20))
            .unwrap(),
        2
    );
    assert_eq!(f.tree.height(&f.file).unwrap(), 2);
    let runs = all_runs(&f).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].lblk, runs[0].len), (700, 2));
}

#[test]
fn damaged_root_words_and_entries_are_corrupt() {
    let f = fixture(16);
    f.tree.insert(&f.file, 0, 10, &mut Vec::new()).unwrap();
    f.tree.insert(&f.file, 5000, 10, &mut Vec::new()).unwrap();
    let good = f.region.load_u64(ROOT).unwrap();
    // No tag; a height of 9; a root inside the meta area.
    for bad in [
        good & ((1 << 56) - 1),
        (good & !(0xff << 48)) | (9 << 48),
        (good & !((1 << 48) - 1)) | f.meta.start.0,
    ] {
        f.region.store_u64(ROOT, bad).unwrap();
        assert!(
            matches!(all_runs(&f), Err(Error::Corrupt { .. })),
            "{bad:#x}"
        );
        assert!(matches!(
            f.tree.remove(&f.file, 0, 3),
            Err(Error::Corrupt { .. })
        ));
    }
    f.region.store_u64(ROOT, good).unwrap();
    // An entry with garbage between the block and the present bit.
    let e0 = PmOff(root_block(&f) * BLOCK_SIZE);
    let saved = f.region.load_u64(e0).unwrap();
    f.region.store_u64(e0, saved | (1 << 55)).unwrap();
    assert!(matches!(all_runs(&f), Err(Error::Corrupt { .. })));
    // An entry pointing past the region.
    f.region.store_u64(e0, (1 << 63) | (1 << 40)).unwrap();
    assert!(matches!(all_runs(&f), Err(Error::Corrupt { .. })));
    assert!(matches!(
        f.tree.owned_blocks(&f.file, &mut |_| {}),
        Err(Error::Corrupt { .. })
    ));
    f.region.store_u64(e0, saved).unwrap();
    assert_eq!(all_runs(&f).unwrap().len(), 2);
}

#[test]
fn nodes_reached_twice_are_corrupt() {
    let f = fixture(16);
    f.tree.insert(&f.file, 0, 1, &mut Vec::new()).unwrap();
    f.tree.insert(&f.file, 1 << 27, 1, &mut Vec::new()).unwrap();
    let root = root_block(&f);
    // Make every entry of the top node point at its first child: a DAG of 512 paths.
    let child = f.region.load_u64(PmOff(root * BLOCK_SIZE)).unwrap();
    for i in 1..512 {
        f.region
            .store_u64(PmOff(root * BLOCK_SIZE + 8 * i), child)
            .unwrap();
    }
    assert!(matches!(
        f.tree.owned_blocks(&f.file, &mut |_| {}),
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(
        f.tree.remove_file(&f.file),
        Err(Error::Corrupt { .. })
    ));
    // A lookup of the whole space terminates: it visits at most as many nodes as the region
    // has blocks, whatever the entries say.
    let _ = all_runs(&f);
}

#[test]
fn a_truncate_whose_undo_record_does_not_fit_changes_nothing() {
    // A one-block slot holds about 4 KiB of old entries; truncating two full leaves needs 8.
    let f = fixture(1);
    f.tree.insert(&f.file, 0, 1024, &mut Vec::new()).unwrap();
    let before = all_runs(&f).unwrap();
    let free = f.alloc.free_blocks();
    assert!(matches!(
        f.tree.remove(&f.file, 1, 1022),
        Err(Error::NoSpace)
    ));
    assert_eq!(all_runs(&f).unwrap(), before);
    assert_eq!(f.alloc.free_blocks(), free);
    // Smaller removes still work.
    assert_eq!(f.tree.remove(&f.file, 1, 300).unwrap(), 300);
}

#[test]
fn open_checks_the_meta_area() {
    let f = fixture(4);
    let (region, meta, alloc) = (f.region.clone(), f.meta, f.alloc.clone());
    drop(f);
    RadixTree::open(region.clone(), meta, alloc.clone()).unwrap();
    region.write(meta.start.offset() + 9, &[0x77]).unwrap();
    assert!(matches!(
        RadixTree::open(region, meta, alloc),
        Err(Error::Corrupt { .. })
    ));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(24),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Random damage to the tree's nodes: every call returns (Ok or Err), none panics or hangs.
    #[test]
    fn random_node_damage_never_panics(
        flips in proptest::collection::vec((0usize..16, 0u64..BLOCK_SIZE, any::<u8>()), 1..12),
    ) {
        let f = fixture(16);
        f.tree.insert(&f.file, 0, 40, &mut Vec::new()).unwrap();
        f.tree.insert(&f.file, 1 << 20, 7, &mut Vec::new()).unwrap();
        let mut nodes = Vec::new();
        f.tree.owned_blocks(&f.file, &mut |e| if e.len == 1 { nodes.push(e.start.0) }).unwrap();
        for (which, off, byte) in flips {
            let b = nodes[which % nodes.len()];
            f.region.write(PmOff(b * BLOCK_SIZE + off), &[byte]).unwrap();
        }
        let _ = all_runs(&f);
        let _ = f.tree.owned_blocks(&f.file, &mut |_| {});
        let _ = f.tree.insert(&f.file, 500, 3, &mut Vec::new());
        let _ = f.tree.remove(&f.file, 10, 20);
        let _ = f.tree.remove(&f.file, 0, u64::MAX);
        let _ = f.tree.remove_file(&f.file);
    }
}

#[test]
fn insert_at_refuses_foreign_or_mapped_blocks_and_keeps_the_callers_blocks_without_nodes() {
    let f = fixture(16);
    let run = |lblk, pblk: BlockNo| Run { lblk, pblk, len: 1 };
    let own = f.alloc.alloc(1, AllocHint::default()).unwrap();
    f.tree.insert_at(&f.file, run(10, own.start)).unwrap();
    assert_eq!(all_runs(&f).unwrap(), vec![run(10, own.start)]);
    let spare = f.alloc.alloc(1, AllocHint::default()).unwrap();
    let blocks = f.region.size() / BLOCK_SIZE;
    for (bad, why) in [
        (run(10, spare.start), "mapped"),
        (run(20, f.meta.start + 1), "a meta block"),
        (run(20, BlockNo(blocks)), "past the region"),
        (run(u64::MAX, spare.start), "past the logical space"),
    ] {
        let r = f.tree.insert_at(&f.file, bad);
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{why}: {r:?}");
    }
    assert_eq!(all_runs(&f).unwrap(), vec![run(10, own.start)]);

    // Every free block in the caller's hands: a new file has no block for its first node.
    let mut held = vec![spare];
    while let Ok(e) = f.alloc.alloc(64, AllocHint::default()) {
        held.push(e);
    }
    assert_eq!(f.alloc.free_blocks(), 0);
    let other = f
        .tree
        .open_file(FileId {
            ino: 2,
            root: PmOff(8),
        })
        .unwrap();
    let r = f.tree.insert_at(&other, run(0, spare.start));
    assert!(matches!(r, Err(Error::NoSpace)), "{r:?}");
    assert_eq!(
        f.alloc.free_blocks(),
        0,
        "the caller's blocks were not freed"
    );
    assert_eq!(f.region.load_u64(PmOff(8)).unwrap(), 0);
    // One block back to the allocator is enough for the node.
    let last = held.pop().unwrap();
    f.alloc.free(last).unwrap();
    f.tree.insert_at(&other, run(0, spare.start)).unwrap();
    let mut got = Vec::new();
    f.tree.lookup(&other, 0, u64::MAX, &mut got).unwrap();
    assert_eq!(got, vec![run(0, spare.start)]);
    assert_eq!(all_runs(&f).unwrap(), vec![run(10, own.start)]);
}

#[test]
fn a_second_handle_sees_leaves_freed_and_made_through_the_first() {
    let f = fixture(16);
    for (l, n) in [(0, 1), (512, 2), (1024, 1)] {
        f.tree.insert(&f.file, l, n, &mut Vec::new()).unwrap();
    }
    let other = f.tree.open_file(ID).unwrap();
    let mut seen = Vec::new();
    f.tree.lookup(&other, 512, 1, &mut seen).unwrap();
    assert_eq!(seen.len(), 1);
    // The second leaf goes (the root keeps its other two children), its block is taken, and
    // a new leaf maps 513.
    f.tree.remove(&f.file, 512, 2).unwrap();
    let squat = f.alloc.alloc(8, AllocHint::default()).unwrap();
    f.tree.insert(&f.file, 513, 1, &mut Vec::new()).unwrap();
    let mut first = Vec::new();
    f.tree.lookup(&f.file, 0, u64::MAX, &mut first).unwrap();
    let mut second = Vec::new();
    f.tree.lookup(&other, 513, 1, &mut second).unwrap();
    assert_eq!(second, vec![first[1]]);
    f.alloc.free(squat).unwrap();
}
