//! The baseline allocator's persistent bitmap under the crash simulator: a crash at any point
//! of an `alloc` or `free` leaves, after `open`, exactly the allocated set from before the call
//! or from after it, and every call that returned is durable. With `Durability::AtSync` the
//! calls fence nothing, and `sync` makes them all durable at once.

use std::cell::RefCell;

use pmfs_alloc::FreeExtentAllocator;
use pmfs_alloc::baseline::{Durability, bitmap_area_size};
use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::pm::HeapRegion;
use pmfs_core::sim::{Explorer, SimRegion};
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const AREA: PmOff = PmOff(192);
const FIRST: u64 = 300;
const COUNT: u64 = 3000;

/// One operation of a workload.
#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc(u64, AllocHint),
    Free(Extent),
}

/// Random operations: allocations of 1..=700 blocks (most span several bitmap words), frees
/// of whole extents and of parts that split them.
fn workload(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let twin = twin();
    let mut held: Vec<Extent> = Vec::new();
    let mut ops = Vec::new();
    for _ in 0..n {
        let op = if held.is_empty() || rng.gen_bool(0.6) {
            let want = if rng.gen_bool(0.5) {
                rng.gen_range(1..=8)
            } else {
                rng.gen_range(1..=700)
            };
            let goal = held.last().filter(|_| rng.gen_bool(0.5)).map(Extent::end);
            Op::Alloc(
                want,
                AllocHint {
                    kind: AllocKind::Growing,
                    goal,
                },
            )
        } else {
            let e = held.swap_remove(rng.gen_range(0..held.len()));
            let skip = rng.gen_range(0..e.len);
            let len = rng.gen_range(1..=e.len - skip);
            if skip > 0 {
                held.push(Extent::new(e.start, skip));
            }
            if skip + len < e.len {
                held.push(Extent::new(
                    BlockNo(e.start.0 + skip + len),
                    e.len - skip - len,
                ));
            }
            Op::Free(Extent::new(BlockNo(e.start.0 + skip), len))
        };
        match op {
            Op::Alloc(want, hint) => {
                if let Ok(e) = twin.alloc(want, hint) {
                    held.push(e);
                }
            }
            Op::Free(e) => twin.free(e).expect("free of held blocks"),
        }
        ops.push(op);
    }
    ops
}

/// A volatile allocator in the same state as the one under test: it tells the checker what
/// each operation will do before the simulated one does it.
fn twin() -> FreeExtentAllocator<HeapRegion> {
    let region = HeapRegion::new(AREA.0 + bitmap_area_size(COUNT)).expect("heap region");
    FreeExtentAllocator::format(region, AREA, Extent::new(BlockNo(FIRST), COUNT)).expect("format")
}

fn apply(a: &impl BlockAllocator, op: Op) {
    match op {
        Op::Alloc(want, hint) => {
            a.alloc(want, hint).expect("the range never fills up");
        }
        Op::Free(e) => a.free(e).expect("free of held blocks"),
    }
}

fn recovered(image: &[u8]) -> Result<Vec<Extent>, String> {
    let region = HeapRegion::from_image(image).map_err(|e| e.to_string())?;
    let a = FreeExtentAllocator::open(&region, AREA).map_err(|e| format!("open: {e}"))?;
    Ok(a.used_extents())
}

/// Runs `ops` under the explorer; every crash image must recover to the state before or after
/// the operation in progress.
fn check_ops(seed: u64, ops: &[Op], prefixes: bool) {
    let region = SimRegion::new(4096).expect("sim region");
    FreeExtentAllocator::format(&region, AREA, Extent::new(BlockNo(FIRST), COUNT)).expect("format");
    region.persist_all();
    let twin = twin();
    // (state before the operation in progress, state after it)
    let window = RefCell::new((Vec::new(), Vec::new()));
    let result = Explorer::new(seed).store_prefixes(prefixes).run(
        &region,
        |pm| {
            let a = FreeExtentAllocator::open(pm, AREA).expect("open");
            for &op in ops {
                let before = twin.used_extents();
                apply(&twin, op);
                *window.borrow_mut() = (before, twin.used_extents());
                apply(&a, op);
                let after = window.borrow().1.clone();
                *window.borrow_mut() = (after.clone(), after);
            }
        },
        |cp| {
            let got = recovered(cp.image)?;
            let (before, after) = &*window.borrow();
            if got == *before || got == *after {
                Ok(())
            } else {
                Err(format!(
                    "recovered {got:?}\nbefore the operation: {before:?}\nafter it: {after:?}"
                ))
            }
        },
    );
    if let Err(f) = result {
        panic!("{f}");
    }
}

#[test]
fn alloc_and_free_are_all_or_nothing_and_durable() {
    for seed in 0..4 {
        check_ops(seed, &workload(seed, 40), false);
    }
}

#[test]
fn alloc_and_free_are_all_or_nothing_with_store_prefixes() {
    check_ops(99, &workload(99, 30), true);
}

#[test]
fn the_checker_rejects_a_bitmap_written_without_the_intent() {
    // Sanity check of the harness: writing two bitmap words with plain stores and a single
    // fence (no intent record) must produce a torn image the checker catches.
    let region = SimRegion::new(4096).expect("sim region");
    FreeExtentAllocator::format(&region, AREA, Extent::new(BlockNo(FIRST), COUNT)).expect("format");
    region.persist_all();
    let words = AREA + 128;
    let torn = Explorer::new(5).run(
        &region,
        |pm| {
            use pmfs_core::pm::Media;
            pm.store_u64(words, u64::MAX).unwrap();
            pm.store_u64(words + 64, u64::MAX).unwrap();
            pm.flush(words, 72).unwrap();
            pm.fence();
        },
        |cp| {
            let got = recovered(cp.image)?;
            let none: Vec<Extent> = Vec::new();
            let both = vec![
                Extent::new(BlockNo(FIRST), 64),
                Extent::new(BlockNo(FIRST + 512), 64),
            ];
            if got == none || got == both {
                Ok(())
            } else {
                Err(format!("torn: {got:?}"))
            }
        },
    );
    assert!(
        torn.is_err(),
        "two unordered word stores must be able to tear"
    );
}

#[test]
fn deferred_changes_are_durable_at_sync_and_not_before() {
    let region = SimRegion::new(4096).expect("sim region");
    FreeExtentAllocator::format(&region, AREA, Extent::new(BlockNo(FIRST), COUNT)).expect("format");
    region.persist_all();
    let a = FreeExtentAllocator::open(&region, AREA)
        .and_then(|a| a.with_durability(Durability::AtSync))
        .expect("open");
    let ops = workload(7, 40);
    let stats = Explorer::new(7)
        .run(
            &region,
            |_| ops.iter().for_each(|&op| apply(&a, op)),
            |_| Ok(()),
        )
        .expect("no checker to fail");
    assert_eq!(stats.fences, 0, "calls under AtSync must not fence");
    let used = a.used_extents();
    assert!(!used.is_empty());
    // Nothing was flushed: the durable bitmap is still the formatted, empty one.
    assert_eq!(recovered(&region.durable_image()), Ok(Vec::new()));
    a.sync().expect("sync");
    assert_eq!(recovered(&region.durable_image()), Ok(used.clone()));
    // A sync with nothing new to flush changes nothing, and so does going back to
    // per-call durability (which syncs first).
    a.sync().expect("sync");
    let a = a.with_durability(Durability::EachCall).expect("each call");
    assert_eq!(recovered(&region.durable_image()), Ok(used));
    a.free(a.used_extents()[0]).expect("free");
    assert_eq!(recovered(&region.durable_image()), Ok(a.used_extents()));
}
