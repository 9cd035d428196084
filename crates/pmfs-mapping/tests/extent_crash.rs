//! Every mutating extent-tree call is atomic across a crash: for every post-crash image the
//! crash simulator produces during inserts (of allocated or of caller-given blocks) that split
//! nodes and grow the root, the remove-then-`insert_at` of a copy-on-write apply and the same
//! apply in one `replace` (inside a leaf, splitting it, across leaves), removes that
//! merge nodes and shrink the tree, punched holes, truncates and whole-file removal, opening
//! and recovering yields exactly the state before or after the call in progress (after, once
//! it returned), with a consistent set of owned blocks and a tree that keeps working (every fourth crash point's recovery is crashed as well). The
//! simulator's fence count also shows the runs of a `replace_many` batch sharing one
//! transaction.

mod tree_common;

use std::sync::Arc;

use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion};
use pmfs_core::traits::{BlockAllocator, FileMapping, Run, SimpleAllocator};
use pmfs_mapping::extent::{ExtentOptions, ExtentTree};
use pmfs_mapping::undo::UndoGeometry;
use tree_common::{CrashOp, Geometry, Open, apply, crash_check, fresh_runs, many};

const OPTS: ExtentOptions = ExtentOptions {
    fanout: 4,
    undo: UndoGeometry {
        slots: 1,
        slot_blocks: 4,
    },
};

/// How often the harness crashes a recovery as well: at every 4th crash point.
const NESTED: u64 = 4;

/// The fanout-4 tree in a geometry's meta area.
struct Extents(Geometry);

impl Open for Extents {
    type On<M: Media> = ExtentTree<M, SimpleAllocator>;
    fn open<M: Media>(
        &self,
        media: M,
        alloc: Arc<SimpleAllocator>,
    ) -> pmfs_core::Result<Self::On<M>> {
        ExtentTree::open(media, self.0.meta, alloc)
    }
}

/// Formats a fanout-4 tree, applies `setup` (with every other data block reserved when
/// `fragmented`), then crash-checks `ops`.
fn run(explorer: Explorer, files: usize, fragmented: bool, setup: &[CrashOp], ops: &[CrashOp]) {
    let g = Geometry::new(files, OPTS.meta_blocks(), 256);
    let region = SimRegion::new(g.bytes()).unwrap();
    let reserved = if fragmented {
        g.odd_blocks()
    } else {
        Vec::new()
    };
    {
        let alloc = Arc::new(SimpleAllocator::new(g.data.start, g.data.len));
        alloc.rebuild(&mut reserved.clone().into_iter()).unwrap();
        let tree = ExtentTree::format_with(&region, g.meta, alloc.clone(), OPTS).unwrap();
        let handles: Vec<_> = g
            .ids()
            .iter()
            .map(|id| tree.open_file(*id).unwrap())
            .collect();
        for &op in setup {
            apply(&tree, &alloc, &handles, op).unwrap();
        }
    }
    let stats = crash_check(explorer, &region, &g, &reserved, ops, &Extents(g), NESTED);
    // Every operation is a transaction with at least its commit's fence: each was explored.
    assert!(stats.fences >= ops.len() as u64, "{stats:?}");
}

fn height_after(fragmented: bool, setup: &[CrashOp]) -> u8 {
    let g = Geometry::new(1, OPTS.meta_blocks(), 256);
    let region = HeapRegion::new(g.bytes()).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(g.data.start, g.data.len));
    if fragmented {
        alloc.rebuild(&mut g.odd_blocks().into_iter()).unwrap();
    }
    let tree = ExtentTree::format_with(&region, g.meta, alloc.clone(), OPTS).unwrap();
    let h = tree.open_file(g.ids()[0]).unwrap();
    for &op in setup {
        apply(&tree, &alloc, std::slice::from_ref(&h), op).unwrap();
    }
    tree.height(&h).unwrap()
}

#[test]
fn inserts_that_split_nodes_and_grow_the_root_are_atomic() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 3)];
    let ops = [
        Insert(0, 3, 1),    // fills the root leaf
        Insert(0, 4, 1),    // splits it: height 2
        Insert(0, 10, 6),   // six extents at once: several new leaves
        Insert(0, 100, 20), // twenty extents: new levels
        Insert(0, 7, 2),    // into the middle of a full leaf
        Insert(0, 5, 2),    // crosses a leaf boundary: raises a separator
    ];
    assert_eq!(height_after(true, &setup), 1);
    assert!(height_after(true, &[setup.as_slice(), &ops].concat()) >= 3);
    run(Explorer::new(1), 1, true, &setup, &ops);
}

#[test]
fn insert_at_of_given_blocks_that_splits_and_grows_the_root_is_atomic() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 3)];
    let ops = [
        InsertAt(0, 3, 1),  // continues the first extent physically: merged into it
        InsertAt(0, 10, 2), // the leaf fills up
        InsertAt(0, 20, 2),
        InsertAt(0, 30, 2),
        InsertAt(0, 40, 3), // splits the full root leaf: height 2
        InsertAt(0, 50, 2),
        InsertAt(0, 60, 2),
        InsertAt(0, 70, 2),
        InsertAt(0, 80, 2),
        InsertAt(0, 90, 2),
        InsertAt(0, 100, 2),
        InsertAt(0, 110, 2),
        InsertAt(0, 120, 2),
        InsertAt(0, 130, 2),
        InsertAt(0, 140, 2),
        InsertAt(0, 150, 2),
        InsertAt(0, 5, 4),  // into the middle of a full leaf
        InsertAt(0, 12, 7), // up to the next extent
    ];
    assert_eq!(height_after(false, &setup), 1);
    assert_eq!(
        height_after(false, &[setup.as_slice(), &ops[..5]].concat()),
        2
    );
    assert!(height_after(false, &[setup.as_slice(), &ops].concat()) >= 3);
    run(Explorer::new(7), 1, false, &setup, &ops);
}

#[test]
fn copy_on_write_remove_then_insert_at_over_mapped_ranges_is_atomic() {
    use CrashOp::*;
    let setup = [
        Insert(0, 0, 4),
        Insert(0, 10, 4),
        Insert(0, 20, 4),
        Insert(0, 30, 4),
        Insert(0, 40, 4),
        Insert(1, 0, 6),
    ];
    let ops = [
        Remove(0, 2, 4),   // the apply of a commit: old blocks out ...
        InsertAt(0, 2, 4), // ... fresh blocks in
        Remove(0, 10, 14), // across two extents and the hole between them
        InsertAt(0, 10, 14),
        Remove(1, 0, 6), // a whole file rewritten
        InsertAt(1, 0, 6),
        InsertAt(0, 12, 2), // over mapped blocks: refused, nothing changes
    ];
    assert_eq!(height_after(false, &setup[..5]), 2);
    run(Explorer::new(8), 2, false, &setup, &ops);
}

#[test]
fn replace_in_one_call_is_atomic_inside_a_leaf_and_across_leaves() {
    use CrashOp::*;
    let setup = [
        Insert(0, 0, 4),
        Insert(0, 10, 4),
        Insert(0, 20, 4),
        Insert(0, 30, 4),
        Insert(1, 0, 6),
    ];
    let ops = [
        Replace(0, 11, 2), // the middle of an extent: one becomes three, the full leaf splits
        Replace(0, 14, 2), // into the hole right after it: merges with the new block before
        Replace(0, 2, 9),  // across an extent's tail, a hole and the next extent's head
        Replace(0, 24, 10), // across a leaf boundary: remove and insert in one transaction
        Replace(0, 60, 3), // past everything: a plain insert
        Replace(1, 0, 6),  // a whole file rewritten
        Replace(2, 5, 2),  // an empty file gets its first leaf
    ];
    assert_eq!(height_after(false, &setup[..4]), 1);
    run(Explorer::new(9), 3, false, &setup, &ops);
}

#[test]
fn replace_many_rewrites_whole_entries_in_place_and_stops_only_between_them() {
    use CrashOp::*;
    let setup = [
        Insert(0, 0, 4),
        Insert(0, 10, 4),
        Insert(0, 20, 4),
        Insert(0, 30, 4),
        Insert(0, 40, 4),
    ];
    let ops = [
        many(0, 0, 4, 10, 5),  // five whole entries in two leaves: stored in place
        many(0, 10, 4, 20, 2), // two of them again
        many(0, 1, 2, 10, 2),  // parts of entries: replaces
        many(0, 20, 14, 0, 1), // two entries and the hole between them: a replace
        many(0, 0, 1, 1, 4),   // the entries the cuts left, one block each
        many(0, 31, 1, 3, 6),  // cuts and holes: six replaces in one transaction
    ];
    assert!(height_after(false, &setup) > 1);
    run(Explorer::new(19), 1, false, &setup, &ops);
}

/// Every block its own extent and every free extent one block long: each replace maps one
/// block under an unchanged key, a transaction of one atomic store of the entry's block word.
#[test]
fn fragmented_replaces_rewriting_one_entry_word_are_atomic() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 12)];
    let ops = [
        Replace(0, 1, 1),
        Replace(0, 4, 1),
        Replace(0, 7, 1),
        Replace(0, 3, 3),
        Replace(0, 10, 5),
    ];
    assert!(height_after(true, &setup) >= 2);
    run(Explorer::new(10), 1, true, &setup, &ops);
}

#[test]
fn removes_that_merge_and_shrink_are_atomic() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 40)];
    let ops = [
        Remove(0, 10, 1),  // underfull leaf merges with a sibling
        Remove(0, 12, 10), // whole leaves dropped, boundaries merged
        Remove(0, 30, 10), // the tail
        Remove(0, 0, 9),   // the head
        Truncate(0, 0),    // everything: the tree disappears
    ];
    assert!(height_after(true, &setup) >= 3);
    run(Explorer::new(2), 1, true, &setup, &ops);
}

#[test]
fn removes_are_atomic_even_when_stores_inside_a_line_reach_media_in_part() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 24)];
    let ops = [Remove(0, 5, 1), Remove(0, 7, 9), Truncate(0, 2)];
    run(Explorer::new(5).store_prefixes(true), 1, true, &setup, &ops);
}

#[test]
fn punching_a_hole_that_splits_a_full_leaf_is_atomic() {
    use CrashOp::*;
    let setup = [
        Insert(0, 0, 4),
        Insert(0, 10, 4),
        Insert(0, 20, 4),
        Insert(0, 30, 4),
    ];
    let ops = [
        Remove(0, 11, 2), // one extent becomes two: the full leaf splits
        Remove(0, 21, 1),
        Truncate(0, 3),
        Remove(0, 0, 2),
    ];
    assert_eq!(height_after(false, &setup), 1);
    run(Explorer::new(3), 1, false, &setup, &ops);
}

#[test]
fn interleaved_files_truncate_and_remove_file_are_atomic() {
    use CrashOp::*;
    let setup = [Insert(0, 0, 12), Insert(1, 0, 12)];
    let ops = [
        Insert(1, 50, 5),
        Truncate(0, 4),
        Insert(0, 20, 6),
        RemoveFile(1),
        Insert(1, 7, 3),
        RemoveFile(0),
    ];
    run(Explorer::new(4), 2, true, &setup, &ops);
}

/// A mapping whose insert and insert_at are two separate (each atomic) calls for the two
/// halves: not atomic as a whole.
struct TwoStepInsert<F>(F);

impl<F: FileMapping> FileMapping for TwoStepInsert<F> {
    type File = F::File;
    fn kind(&self) -> pmfs_core::traits::MappingKind {
        self.0.kind()
    }
    fn open_file(&self, id: pmfs_core::traits::FileId) -> pmfs_core::Result<F::File> {
        self.0.open_file(id)
    }
    fn lookup(
        &self,
        f: &F::File,
        lblk: u64,
        len: u64,
        out: &mut Vec<pmfs_core::traits::Run>,
    ) -> pmfs_core::Result<()> {
        self.0.lookup(f, lblk, len, out)
    }
    fn insert(
        &self,
        f: &F::File,
        lblk: u64,
        len: u64,
        out: &mut Vec<pmfs_core::traits::Run>,
    ) -> pmfs_core::Result<()> {
        let half = len / 2;
        self.0.insert(f, lblk, half, out)?;
        self.0.insert(f, lblk + half, len - half, out)
    }
    fn insert_at(&self, f: &F::File, run: pmfs_core::traits::Run) -> pmfs_core::Result<()> {
        let half = run.len / 2;
        let first = pmfs_core::traits::Run { len: half, ..run };
        self.0.insert_at(f, first)?;
        self.0.insert_at(
            f,
            pmfs_core::traits::Run {
                lblk: run.lblk + half,
                pblk: run.pblk + half,
                len: run.len - half,
            },
        )
    }
    fn remove(&self, f: &F::File, lblk: u64, len: u64) -> pmfs_core::Result<u64> {
        self.0.remove(f, lblk, len)
    }
    fn remove_file(&self, f: &F::File) -> pmfs_core::Result<()> {
        self.0.remove_file(f)
    }
    fn owned_blocks(
        &self,
        f: &F::File,
        visit: &mut dyn FnMut(pmfs_core::traits::Extent),
    ) -> pmfs_core::Result<()> {
        self.0.owned_blocks(f, visit)
    }
    fn recover(&self) -> pmfs_core::Result<()> {
        self.0.recover()
    }
}

/// The fanout-4 tree with [`TwoStepInsert`]s.
struct TwoSteps(Geometry);

impl Open for TwoSteps {
    type On<M: Media> = TwoStepInsert<ExtentTree<M, SimpleAllocator>>;
    fn open<M: Media>(
        &self,
        media: M,
        alloc: Arc<SimpleAllocator>,
    ) -> pmfs_core::Result<Self::On<M>> {
        ExtentTree::open(media, self.0.meta, alloc).map(TwoStepInsert)
    }
}

#[test]
fn the_checker_rejects_an_insert_insert_at_or_replace_done_in_two_steps() {
    for op in [
        CrashOp::Insert(0, 0, 4),
        CrashOp::InsertAt(0, 0, 4),
        CrashOp::Replace(0, 0, 4),
    ] {
        the_checker_rejects(op);
    }
}

fn the_checker_rejects(op: CrashOp) {
    let g = Geometry::new(1, OPTS.meta_blocks(), 64);
    let region = SimRegion::new(g.bytes()).unwrap();
    {
        let alloc = Arc::new(SimpleAllocator::new(g.data.start, g.data.len));
        ExtentTree::format_with(&region, g.meta, alloc, OPTS).unwrap();
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crash_check(Explorer::new(6), &region, &g, &[], &[op], &TwoSteps(g), 0)
    }));
    let Err(message) = result else {
        panic!("a torn {op:?} must be caught");
    };
    let text = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("crash check failed"), "{text}");
}

/// The runs of a `replace_many` that are not rewrites in place share one transaction: a
/// record each and the commit's two fences, after the fence of the rewrites in place. Here
/// the first run fills a hole with the block after the extent before it (that extent grows:
/// one changed word, which alone would be a transaction's sole store, without a record) and
/// the second appends an extent: 1 + 2 + 2 fences. Were the first run's change a sole store,
/// the second's record would fail the batch, and the runs would be done again one by one.
#[test]
fn the_runs_of_a_batch_share_one_transaction() {
    let g = Geometry::new(1, OPTS.meta_blocks(), 256);
    let region = SimRegion::new(g.bytes()).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(g.data.start, g.data.len));
    alloc.rebuild(&mut g.odd_blocks().into_iter()).unwrap();
    let tree = ExtentTree::format_with(&region, g.meta, alloc.clone(), OPTS).unwrap();
    let h = tree.open_file(g.ids()[0]).unwrap();
    for lblk in 0..3 {
        tree.insert(&h, lblk, 1, &mut Vec::new()).unwrap();
    }
    let mut got = Vec::new();
    tree.lookup(&h, 2, 1, &mut got).unwrap();
    let before = got[0];
    let grow = Run {
        lblk: 3,
        pblk: before.pblk + 1,
        len: 1,
    };
    let append = fresh_runs(&*alloc, 10, 1, 1, 1).unwrap()[0];
    let stats = Explorer::new(0)
        .samples(1)
        .exhaustive_limit(1)
        .run(
            &region,
            |_| assert_eq!(tree.replace_many(&h, &[grow, append]).unwrap(), 0),
            |_| Ok(()),
        )
        .unwrap();
    assert_eq!(stats.fences, 5, "{stats:?}");
    got.clear();
    tree.lookup(&h, 2, 9, &mut got).unwrap();
    assert_eq!(got, [Run { len: 2, ..before }, append]);
}
