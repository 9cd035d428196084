//! The extent tree passes the shared `FileMapping` conformance suite, with the full 4 KiB
//! fanout and with a tiny fanout that makes every workload split, merge, grow and shrink
//! trees; and it survives the suite's concurrency stress.

use std::sync::Arc;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::HeapRegion;
use pmfs_core::traits::conformance::mapping::{
    FromAllocator, StressConfig, Subject, SuiteConfig, run_suite, stress_files, stress_one_writer,
};
use pmfs_core::traits::{AllocHint, BlockAllocator, Extent, FileId, SimpleAllocator};
use pmfs_mapping::extent::{ExtentOptions, ExtentTree};
use pmfs_mapping::undo::UndoGeometry;

type Tree = ExtentTree<HeapRegion, SimpleAllocator>;

/// Block 0 holds the files' root words, the meta area follows, the allocator manages the
/// rest. With `fragment`, every other data block is taken away first, so no two allocated
/// blocks are adjacent and every block becomes its own extent.
fn subject(files: usize, data_blocks: u64, fanout: usize, fragment: bool) -> Subject<Tree> {
    let opts = ExtentOptions {
        fanout,
        undo: UndoGeometry {
            slots: 4,
            slot_blocks: 16,
        },
    };
    let meta = Extent::new(BlockNo(1), opts.meta_blocks());
    let total = 1 + meta.len + data_blocks;
    let region = HeapRegion::new(total * BLOCK_SIZE).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(meta.end(), data_blocks));
    if fragment {
        let all = alloc.alloc(data_blocks, AllocHint::default()).unwrap();
        assert_eq!(all.len, data_blocks);
        for b in (0..data_blocks).step_by(2) {
            alloc.free(Extent::new(all.start + b, 1)).unwrap();
        }
    }
    let free = alloc.clone();
    let source = FromAllocator(alloc.clone());
    let tree = ExtentTree::format_with(region, meta, alloc, opts).unwrap();
    let ids = (0..files)
        .map(|i| FileId {
            ino: i as u64 + 1,
            root: PmOff(8 * i as u64),
        })
        .collect();
    Subject::new(tree, ids)
        .with_free_blocks(move || free.free_blocks())
        .with_block_source(source)
}

#[test]
fn extent_tree_passes_the_suite() {
    run_suite(&SuiteConfig::default(), |files| {
        subject(files, 1 << 14, 252, false)
    });
}

#[test]
fn extent_tree_with_tiny_nodes_passes_the_suite() {
    run_suite(&SuiteConfig::default(), |files| {
        subject(files, 1 << 14, 4, false)
    });
}

#[test]
fn extent_tree_with_tiny_nodes_and_fragmented_space_passes_the_suite() {
    let cfg = SuiteConfig {
        max_len: 24,
        ..SuiteConfig::default()
    };
    run_suite(&cfg, |files| subject(files, 1 << 12, 4, true));
}

#[test]
fn extent_tree_passes_the_suite_when_space_runs_out() {
    let cfg = SuiteConfig {
        max_lblk: 4096,
        ..SuiteConfig::default()
    };
    run_suite(&cfg, |files| subject(files, 300, 5, false));
}

#[test]
fn extent_tree_survives_concurrent_files() {
    stress_files(&subject(4, 1 << 14, 6, false), &StressConfig::default());
}

#[test]
fn extent_tree_survives_readers_with_one_writer() {
    stress_one_writer(&subject(1, 1 << 12, 6, true), 3, &StressConfig::default());
}
