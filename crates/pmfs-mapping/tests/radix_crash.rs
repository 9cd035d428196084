//! Every mutating radix-tree call is atomic across a crash: for every post-crash image the
//! crash simulator produces while levels are added on top (by `insert`, or by `insert_at` of
//! caller-given blocks, also as the remove-then-`insert_at` or the `replace` of a copy-on-write
//! apply), removed
//! again, leaves are filled across their boundaries, large ranges are truncated and files
//! removed, opening and recovering yields exactly the state before or after the call in
//! progress (after, once it returned), with a consistent set of owned blocks and a tree that
//! keeps working. Every fourth crash point's recovery is crashed as well.

mod tree_common;

use std::sync::Arc;

use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion};
use pmfs_core::traits::{BlockAllocator, FileMapping, SimpleAllocator};
use pmfs_mapping::radix::{RadixOptions, RadixTree};
use pmfs_mapping::undo::UndoGeometry;
use tree_common::{CrashOp, Geometry, Open, apply, crash_check, many};

const OPTS: RadixOptions = RadixOptions {
    undo: UndoGeometry {
        slots: 1,
        slot_blocks: 8,
    },
};

/// How often the harness crashes a recovery as well: at every 4th crash point.
const NESTED: u64 = 4;

/// The tree in a geometry's meta area.
struct Radix(Geometry);

impl Open for Radix {
    type On<M: Media> = RadixTree<M, SimpleAllocator>;
    fn open<M: Media>(
        &self,
        media: M,
        alloc: Arc<SimpleAllocator>,
    ) -> pmfs_core::Result<Self::On<M>> {
        RadixTree::open(media, self.0.meta, alloc)
    }
}

/// Formats a tree, applies `setup` (with every other data block reserved when `fragmented`),
/// then crash-checks `ops`.
fn run(explorer: Explorer, files: usize, fragmented: bool, setup: &[CrashOp], ops: &[CrashOp]) {
    let g = Geometry::new(files, OPTS.meta_blocks(), 512);
    let region = SimRegion::new(g.bytes()).unwrap();
    let reserved = if fragmented {
        g.odd_blocks()
    } else {
        Vec::new()
    };
    {
        let alloc = Arc::new(SimpleAllocator::new(g.data.start, g.data.len));
        alloc.rebuild(&mut reserved.clone().into_iter()).unwrap();
        let tree = RadixTree::format_with(&region, g.meta, alloc.clone(), OPTS).unwrap();
        let handles: Vec<_> = g
            .ids()
            .iter()
            .map(|id| tree.open_file(*id).unwrap())
            .collect();
        for &op in setup {
            apply(&tree, &alloc, &handles, op).unwrap();
        }
    }
    let stats = crash_check(explorer, &region, &g, &reserved, ops, &Radix(g), NESTED);
    assert!(stats.fences > ops.len() as u64, "{stats:?}");
}

fn height_after(setup: &[CrashOp]) -> u8 {
    let g = Geometry::new(1, OPTS.meta_blocks(), 512);
    let region = HeapRegion::new(g.bytes()).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(g.data.start, g.data.len));
    let tree = RadixTree::format_with(&region, g.meta, alloc.clone(), OPTS).unwrap();
    let h = tree.open_file(g.ids()[0]).unwrap();
    for &op in setup {
        apply(&tree, &alloc, std::slice::from_ref(&h), op).unwrap();
    }
    tree.height(&h).unwrap()
}

const L2: u64 = 1 << 18;
const L3: u64 = 1 << 27;

#[test]
fn inserts_that_add_levels_are_atomic() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 3)];
    let ops = [
        Insert(0, 600, 2),        // height 1 -> 2
        Insert(0, L2, 1),         // -> 3
        Insert(0, L3 + 5, 3),     // -> 4, a new path of fresh nodes
        Insert(0, 510, 4),        // across a leaf boundary into an existing leaf
        Insert(0, 2 * L2 - 2, 4), // across a level-1 subtree boundary
    ];
    assert_eq!(height_after(&setup), 1);
    assert_eq!(height_after(&[setup.as_slice(), &ops].concat()), 4);
    run(Explorer::new(11), 1, false, &setup, &ops);
}

#[test]
fn insert_at_of_given_blocks_that_adds_levels_is_atomic() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 3)];
    let ops = [
        InsertAt(0, 600, 2),        // height 1 -> 2
        InsertAt(0, L2, 1),         // -> 3
        InsertAt(0, L3 + 5, 3),     // -> 4, a new path of fresh nodes
        InsertAt(0, 510, 4),        // across a leaf boundary into an existing leaf
        InsertAt(0, 2 * L2 - 2, 4), // across a level-1 subtree boundary
        Remove(0, 600, 2),          // copy-on-write apply: old blocks out ...
        InsertAt(0, 600, 2),        // ... fresh blocks in
        InsertAt(0, 1, 4),          // over mapped blocks: refused, nothing changes
    ];
    assert_eq!(height_after(&setup), 1);
    assert_eq!(height_after(&[setup.as_slice(), &ops[..1]].concat()), 2);
    assert_eq!(height_after(&[setup.as_slice(), &ops[..2]].concat()), 3);
    assert_eq!(height_after(&[setup.as_slice(), &ops[..7]].concat()), 4);
    run(Explorer::new(15), 1, false, &setup, &ops);
}

#[test]
fn replace_in_one_call_is_atomic_over_mapped_blocks_holes_and_new_levels() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 6), Insert(0, 508, 4)];
    let ops = [
        Replace(0, 2, 2),      // inside a leaf: the old blocks freed, new ones mapped
        Replace(0, 4, 6),      // half mapped, half hole
        Replace(0, 505, 10),   // across the leaf's end, over blocks and holes: a new level
        Replace(0, L2 + 3, 2), // past everything: a new level and a fresh path
        Replace(1, 7, 3),      // an empty file
        Replace(0, 1, 1),      // one word of an existing leaf: a sole store, no undo record
        Insert(0, 12, 1),      // the same into a hole
    ];
    assert_eq!(height_after(&setup), 1);
    assert_eq!(height_after(&[setup.as_slice(), &ops[..3]].concat()), 2);
    assert_eq!(height_after(&[setup.as_slice(), &ops[..4]].concat()), 3);
    run(Explorer::new(16), 2, false, &setup, &ops);
}

#[test]
fn replace_many_overwrites_in_place_and_stops_only_between_blocks() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 24), Insert(0, 508, 8)];
    let ops = [
        many(0, 1, 1, 3, 6),   // single blocks of a leaf: stores in place
        many(0, 504, 2, 4, 3), // across the leaf's end, over holes and blocks: a replace
        many(0, 508, 8, 0, 1), // a run across two leaves, all mapped: in place
        many(0, 20, 6, 0, 1),  // reaches past the mapped blocks: a replace
        many(0, 2, 4, 6, 2),   // the same blocks again, and others
    ];
    run(Explorer::new(17), 1, false, &setup, &ops);
}

#[test]
fn removes_that_drop_levels_are_atomic() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 4), Insert(0, L2, 2), Insert(0, L3, 1)];
    let ops = [
        Remove(0, L3, 1), // height 4 -> 3
        Remove(0, L2, 2), // -> 1: two levels at once
        Truncate(0, 2),
        Remove(0, 0, 2),      // the tree disappears
        Insert(0, L2 + 1, 1), // and comes back two levels high
    ];
    assert_eq!(height_after(&setup), 4);
    assert_eq!(height_after(&[setup.as_slice(), &ops[..2]].concat()), 1);
    run(Explorer::new(12), 1, false, &setup, &ops);
}

#[test]
fn truncating_hundreds_of_blocks_and_remove_file_are_atomic() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 300), Insert(1, 1000, 100)];
    let ops = [
        Truncate(0, 100), // zeroes parts of one leaf
        Remove(1, 1010, 80),
        Insert(0, 700, 10),
        Truncate(0, 0),
        RemoveFile(1),
    ];
    run(Explorer::new(13), 2, false, &setup, &ops);
}

#[test]
fn fragmented_inserts_and_removes_are_atomic_with_store_prefixes() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 20)];
    let ops = [Insert(0, 505, 12), Remove(0, 3, 510), Insert(0, L2 + 3, 2)];
    run(
        Explorer::new(14).store_prefixes(true),
        1,
        true,
        &setup,
        &ops,
    );
}
