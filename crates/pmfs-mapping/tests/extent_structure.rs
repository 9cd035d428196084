//! Extent-tree behaviour beyond the shared suite: trees grow and shrink level by level,
//! damaged nodes and root words are reported as `Error::Corrupt` (never a panic or an endless
//! walk), a call whose undo record does not fit fails without changing anything, and
//! `insert_at` refuses foreign or mapped blocks and never frees the caller's blocks.

use std::sync::Arc;

use pmfs_core::Error;
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::traits::{
    AllocHint, BlockAllocator, Extent, FileId, FileMapping, Run, SimpleAllocator,
};
use pmfs_mapping::extent::{ExtentFile, ExtentOptions, ExtentTree};
use pmfs_mapping::undo::UndoGeometry;
use proptest::prelude::*;

type Tree = ExtentTree<Arc<HeapRegion>, SimpleAllocator>;

const ROOT: PmOff = PmOff(0);
const ID: FileId = FileId { ino: 1, root: ROOT };

struct Fixture {
    region: Arc<HeapRegion>,
    alloc: Arc<SimpleAllocator>,
    tree: Tree,
    file: ExtentFile,
    meta: Extent,
}

/// A tree whose data area has every other block reserved, so each block is its own extent.
fn fixture(fanout: usize, slot_blocks: u32) -> Fixture {
    let opts = ExtentOptions {
        fanout,
        undo: UndoGeometry {
            slots: 2,
            slot_blocks,
        },
    };
    let meta = Extent::new(BlockNo(1), opts.meta_blocks());
    let data = 2048;
    let region = Arc::new(HeapRegion::new((meta.end().0 + data) * BLOCK_SIZE).unwrap());
    let alloc = Arc::new(SimpleAllocator::new(meta.end(), data));
    let all = alloc.alloc(data, AllocHint::default()).unwrap();
    for i in (0..data).step_by(2) {
        alloc.free(Extent::new(all.start + i, 1)).unwrap();
    }
    let tree = ExtentTree::format_with(region.clone(), meta, alloc.clone(), opts).unwrap();
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

/// The root node's block, from the root word.
fn root_block(f: &Fixture) -> u64 {
    f.region.load_u64(ROOT).unwrap() & ((1 << 48) - 1)
}

/// Entry `i`'s second word (valid | len | block) in `block`.
fn entry_word1(i: u64, block: u64) -> PmOff {
    PmOff(block * BLOCK_SIZE + 64 + 16 * i + 8)
}

#[test]
fn trees_grow_and_shrink_one_level_at_a_time() {
    let f = fixture(4, 4);
    let mut heights = Vec::new();
    for i in 0..100 {
        f.tree.insert(&f.file, i, 1, &mut Vec::new()).unwrap();
        heights.push(f.tree.height(&f.file).unwrap());
    }
    assert!(heights.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
    assert_eq!(heights[0], 1);
    assert_eq!(heights[99], 4, "{heights:?}");
    assert_eq!(all_runs(&f).unwrap().len(), 100);
    let mut shrinking = Vec::new();
    for i in (0..100).rev() {
        assert_eq!(f.tree.remove(&f.file, i, 1).unwrap(), 1);
        shrinking.push(f.tree.height(&f.file).unwrap());
    }
    assert!(shrinking.windows(2).all(|w| w[1] <= w[0]));
    assert_eq!(*shrinking.last().unwrap(), 0);
    assert_eq!(f.region.load_u64(ROOT).unwrap(), 0);
    // Every block went back to the allocator: data and nodes.
    assert_eq!(f.alloc.free_blocks(), 1024);
}

#[test]
fn appends_fill_nodes_completely() {
    let f = fixture(252, 16);
    f.tree.insert(&f.file, 0, 1000, &mut Vec::new()).unwrap();
    let mut nodes = 0;
    f.tree
        .owned_blocks(&f.file, &mut |e| {
            if e.len == 1 {
                nodes += 1;
            }
        })
        .unwrap();
    // 1000 data blocks of one block each plus ceil(1000 / 252) = 4 leaves and one root.
    assert_eq!(nodes, 1000 + 4 + 1);
    assert_eq!(f.tree.height(&f.file).unwrap(), 2);
}

#[test]
fn damaged_root_words_and_headers_are_corrupt() {
    let f = fixture(4, 4);
    f.tree.insert(&f.file, 0, 20, &mut Vec::new()).unwrap();
    let good = f.region.load_u64(ROOT).unwrap();

    // A root word without the tag.
    f.region.store_u64(ROOT, good & ((1 << 56) - 1)).unwrap();
    assert!(matches!(all_runs(&f), Err(Error::Corrupt { .. })));
    assert!(matches!(f.tree.open_file(ID), Err(Error::Corrupt { .. })));
    // A root pointing into the meta area, or past the region.
    for block in [f.meta.start.0, 1 << 40] {
        f.region
            .store_u64(ROOT, (good & !((1 << 48) - 1)) | block)
            .unwrap();
        assert!(matches!(all_runs(&f), Err(Error::Corrupt { .. })));
        assert!(matches!(
            f.tree.insert(&f.file, 100, 1, &mut Vec::new()),
            Err(Error::Corrupt { .. })
        ));
    }
    f.region.store_u64(ROOT, good).unwrap();

    // A damaged node header.
    let root = root_block(&f);
    let header = PmOff(root * BLOCK_SIZE);
    let saved = f.region.load_u64(header).unwrap();
    f.region.store_u64(header, saved ^ 0xff).unwrap();
    assert!(matches!(all_runs(&f), Err(Error::Corrupt { .. })));
    assert!(matches!(
        f.tree.remove(&f.file, 0, 5),
        Err(Error::Corrupt { .. })
    ));
    f.region.store_u64(header, saved).unwrap();
    assert_eq!(all_runs(&f).unwrap().len(), 20);
}

#[test]
fn cycles_and_cleared_valid_bits_are_corrupt() {
    let f = fixture(4, 4);
    f.tree.insert(&f.file, 0, 40, &mut Vec::new()).unwrap();
    let root = root_block(&f);
    // Point the root's second child back at the root itself: a cycle.
    let w = entry_word1(1, root);
    let saved = f.region.load_u64(w).unwrap();
    f.region
        .store_u64(w, (saved & !((1 << 48) - 1)) | root)
        .unwrap();
    let mut seen = 0;
    assert!(matches!(
        f.tree.owned_blocks(&f.file, &mut |_| seen += 1),
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(all_runs(&f), Err(Error::Corrupt { .. })));
    assert!(matches!(
        f.tree.remove_file(&f.file),
        Err(Error::Corrupt { .. })
    ));
    // A live entry without its valid bit.
    f.region.store_u64(w, saved & !(1 << 63)).unwrap();
    assert!(matches!(all_runs(&f), Err(Error::Corrupt { .. })));
    f.region.store_u64(w, saved).unwrap();
    assert_eq!(all_runs(&f).unwrap().len(), 40);
}

#[test]
fn an_insert_whose_undo_record_does_not_fit_changes_nothing() {
    // One-block slots hold about 4 KiB of old content; inserting before 250 extents of one
    // leaf must log them all.
    let f = fixture(252, 1);
    for i in 0..250 {
        f.tree.insert(&f.file, 10 + i, 1, &mut Vec::new()).unwrap();
    }
    let before = all_runs(&f).unwrap();
    let free = f.alloc.free_blocks();
    assert!(matches!(
        f.tree.insert(&f.file, 0, 2, &mut Vec::new()),
        Err(Error::NoSpace)
    ));
    assert_eq!(all_runs(&f).unwrap(), before);
    assert_eq!(f.alloc.free_blocks(), free);
    // Appends log only a header word and still work.
    f.tree.insert(&f.file, 260, 2, &mut Vec::new()).unwrap();
}

#[test]
fn open_checks_the_meta_area() {
    let f = fixture(8, 4);
    let (region, meta, alloc) = (f.region.clone(), f.meta, f.alloc.clone());
    drop(f);
    assert_eq!(
        ExtentTree::open(region.clone(), meta, alloc.clone())
            .unwrap()
            .fanout(),
        8
    );
    // Damage a byte of the header: the checksum catches it.
    region.write(meta.start.offset() + 41, &[0x55]).unwrap();
    assert!(matches!(
        ExtentTree::open(region, meta, alloc),
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
        flips in proptest::collection::vec((0usize..64, 0u64..BLOCK_SIZE, any::<u8>()), 1..12),
    ) {
        let f = fixture(4, 4);
        f.tree.insert(&f.file, 0, 60, &mut Vec::new()).unwrap();
        f.tree.insert(&f.file, 1000, 7, &mut Vec::new()).unwrap();
        let mut nodes = Vec::new();
        f.tree.owned_blocks(&f.file, &mut |e| nodes.push(e.start.0)).unwrap();
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
    let f = fixture(4, 16);
    let run = |lblk, pblk: BlockNo| pmfs_core::traits::Run { lblk, pblk, len: 1 };
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
fn replace_merges_a_continued_neighbour_only_when_the_shift_is_short() {
    let f = fixture(32, 16);
    f.tree.insert(&f.file, 0, 20, &mut Vec::new()).unwrap();
    let before = all_runs(&f).unwrap();
    assert_eq!(before.len(), 20, "every block is its own extent");
    let next_to = |lblk: usize| Run {
        lblk: lblk as u64,
        pblk: before[lblk - 1].pblk + 1,
        len: 1,
    };
    // Merging block 5 into block 4's extent would shift the 14 entries after it: it stays
    // an extent of its own, rewritten in place.
    assert_eq!(f.tree.replace(&f.file, next_to(5)).unwrap(), 1);
    let runs = all_runs(&f).unwrap();
    assert_eq!(runs.len(), 20);
    assert_eq!(runs[5], next_to(5));
    // Block 15 has 4 entries after it: it is merged.
    assert_eq!(f.tree.replace(&f.file, next_to(15)).unwrap(), 1);
    let runs = all_runs(&f).unwrap();
    assert_eq!(runs.len(), 19);
    assert_eq!(
        runs[14],
        Run {
            len: 2,
            ..before[14]
        }
    );
    assert_eq!(runs[15], before[16]);
    let mut blocks = Vec::new();
    for r in &runs {
        blocks.extend((0..r.len).map(|i| r.lblk + i));
    }
    assert_eq!(
        blocks,
        (0..20).collect::<Vec<u64>>(),
        "every block stays mapped once"
    );
}

#[test]
fn a_second_handle_sees_leaf_splits_made_through_the_first() {
    let f = fixture(4, 16);
    for l in 0..8u64 {
        f.tree.insert(&f.file, 2 * l, 1, &mut Vec::new()).unwrap();
    }
    assert_eq!(f.tree.height(&f.file).unwrap(), 2);
    let other = f.tree.open_file(ID).unwrap();
    // The second handle's cursor rests on the last leaf; the first splits it.
    f.tree.lookup(&other, 14, 1, &mut Vec::new()).unwrap();
    f.tree.insert(&f.file, 13, 1, &mut Vec::new()).unwrap();
    f.tree.insert(&f.file, 15, 1, &mut Vec::new()).unwrap();
    let first = all_runs(&f).unwrap();
    let mut second = Vec::new();
    for l in (0..16).rev() {
        f.tree.lookup(&other, l, 1, &mut second).unwrap();
    }
    second.reverse();
    assert_eq!(second, first);
}

/// A run of one block at `lblk`, taken from the fixture's allocator.
fn fresh(f: &Fixture, lblk: u64) -> Run {
    Run {
        lblk,
        pblk: f.alloc.alloc(1, AllocHint::default()).unwrap().start,
        len: 1,
    }
}

/// Runs of one `replace_many` that are not rewrites in place share a transaction. One that
/// fails rolls its batch back; the runs before it are then replaced one by one, and the call
/// fails at the bad run as a `replace` of it would, with the runs after it untouched.
#[test]
fn replace_many_stopped_by_a_bad_run_keeps_the_runs_before_it() {
    let f = fixture(4, 16);
    f.tree.insert(&f.file, 0, 10, &mut Vec::new()).unwrap();
    let (a, b) = (fresh(&f, 20), fresh(&f, 22));
    let bad = Run {
        lblk: 24,
        pblk: f.meta.start + 1,
        len: 1,
    };
    let after = fresh(&f, 26);
    let before = all_runs(&f).unwrap();
    let r = f.tree.replace_many(&f.file, &[a, b, bad, after]);
    assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
    let mut want = before;
    want.extend([a, b]);
    assert_eq!(all_runs(&f).unwrap(), want);
}

/// A run whose undo records do not fit in what its batch left of the undo slot gets a
/// transaction of its own. One-block slots: the first run, into a hole with 89 entries after
/// it, logs about 1.4 KiB and leaves more than half of the slot; the second, with 215 after
/// it, needs about 3.4 KiB.
#[test]
fn replace_many_gives_a_run_the_slot_cannot_hold_its_own_transaction() {
    let f = fixture(252, 1);
    for i in 0..230 {
        f.tree.insert(&f.file, 2 * i, 1, &mut Vec::new()).unwrap();
    }
    let runs = [fresh(&f, 281), fresh(&f, 31)];
    assert_eq!(f.tree.replace_many(&f.file, &runs).unwrap(), 0);
    let got = all_runs(&f).unwrap();
    assert_eq!(got.len(), 232);
    for r in runs {
        assert!(got.contains(&r), "{r:?} is mapped");
    }
}
