//! The baseline allocator's persistent bitmap under the crash simulator:
//! - a crash at any point of an `alloc` or `free` leaves, after `open`, exactly the allocated
//!   set from before the call or from after it, and every call that returned is durable;
//! - so do the calls made after an `open` that recovered from such a crash: the next crash
//!   neither undoes them nor replays the interrupted call over them;
//! - `format` and `rebuild` are durable when they return; a crash during `format` leaves a
//!   region that `open` refuses or opens empty, and one during `rebuild` a bitmap that opens;
//! - a `rebuild` after a call that failed past its commit point (the media refused a store)
//!   drops the intent that call left, which `open` would otherwise replay over the rebuild.
//!
//! With `Durability::AtSync` the calls fence nothing, and `sync` makes them all durable at once.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering};

use pmfs_alloc::FreeExtentAllocator;
use pmfs_alloc::baseline::{Durability, bitmap_area_size};
use pmfs_core::Error;
use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Tap, Tapped};
use pmfs_core::sim::{CrashFailure, CrashPoint, Explorer, SimRegion, Stats};
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const AREA: PmOff = PmOff(192);
const FIRST: u64 = 300;
const COUNT: u64 = 3000;
/// Blocks per bitmap word.
const WORD: u64 = 64;
/// The outer crash points whose images `operations_after_a_recovery_survive_the_next_crash`
/// recovers and continues from: every `RECOVERED_EVERY`-th (odd, so that they cycle through
/// the four fences of a multi-word call).
const RECOVERED_EVERY: u64 = 3;

/// One operation of a workload.
#[derive(Clone, Copy, Debug)]
enum Op {
    Alloc(u64, AllocHint),
    Free(Extent),
}

fn managed() -> Extent {
    Extent::new(BlockNo(FIRST), COUNT)
}

fn growing(goal: Option<BlockNo>) -> AllocHint {
    AllocHint {
        kind: AllocKind::Growing,
        goal,
    }
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
            Op::Alloc(want, growing(goal))
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

/// Random operations that each change several bitmap words: allocations of 65..=400 blocks
/// and frees of whole allocated extents.
fn multi_word_workload(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let twin = twin();
    let mut held: Vec<Extent> = Vec::new();
    let mut ops = Vec::new();
    for _ in 0..n {
        let op = if held.is_empty() || rng.gen_bool(0.6) {
            let want = rng.gen_range(WORD + 1..=400);
            let e = twin
                .alloc(want, growing(None))
                .expect("the range never fills up");
            assert_eq!(e.len, want, "next fit finds room for the whole allocation");
            held.push(e);
            Op::Alloc(want, growing(None))
        } else {
            let e = held.swap_remove(rng.gen_range(0..held.len()));
            twin.free(e).expect("free of held blocks");
            Op::Free(e)
        };
        ops.push(op);
    }
    ops
}

/// Operations that each change one bitmap word (words are counted from `FIRST`), from the
/// allocated extents `used`: frees of all of them, in pieces that stay inside a word, then an
/// allocation of 1..=8 blocks at the start of every word (so that every range spanning two
/// words has a block allocated again).
fn one_word_ops(used: &[Extent]) -> Vec<Op> {
    let mut ops = Vec::new();
    for e in used {
        let mut b = e.start.0;
        while b < e.end().0 {
            let word_end = FIRST + ((b - FIRST) / WORD + 1) * WORD;
            let len = word_end.min(e.end().0) - b;
            ops.push(Op::Free(Extent::new(BlockNo(b), len)));
            b += len;
        }
    }
    for w in 0..COUNT.div_ceil(WORD) {
        ops.push(Op::Alloc(
            1 + w % 8,
            growing(Some(BlockNo(FIRST + w * WORD))),
        ));
    }
    ops
}

/// A volatile allocator in the same state as the one under test: it tells the checker what
/// each operation will do before the simulated one does it.
fn twin() -> FreeExtentAllocator<HeapRegion> {
    let region = HeapRegion::new(AREA.0 + bitmap_area_size(COUNT)).expect("heap region");
    FreeExtentAllocator::format(region, AREA, managed()).expect("format")
}

/// A simulated region with a durable, empty allocator at `AREA`.
fn formatted() -> SimRegion {
    let region = SimRegion::new(4096).expect("sim region");
    FreeExtentAllocator::format(&region, AREA, managed()).expect("format");
    region.persist_all();
    region
}

fn apply(a: &impl BlockAllocator, op: Op) {
    match op {
        Op::Alloc(want, hint) => {
            a.alloc(want, hint).expect("the range never fills up");
        }
        Op::Free(e) => a.free(e).expect("free of held blocks"),
    }
}

/// The allocator `open` recovers from a copy of `image`.
fn open_copy(image: &[u8]) -> Result<FreeExtentAllocator<HeapRegion>, String> {
    let region = HeapRegion::from_image(image).map_err(|e| e.to_string())?;
    FreeExtentAllocator::open(region, AREA).map_err(|e| format!("open: {e}"))
}

fn recovered(image: &[u8]) -> Result<Vec<Extent>, String> {
    Ok(open_copy(image)?.used_extents())
}

/// Runs `open` on `region` followed by `ops` under `explorer`, with `twin` in the state
/// `open` must recover. Every crash image must recover to the state before or after the
/// operation in progress (during `open`, the state `twin` started in); the images that do
/// then go to `also`.
fn explore_ops(
    explorer: &Explorer,
    region: &SimRegion,
    twin: &FreeExtentAllocator<HeapRegion>,
    ops: &[Op],
    mut also: impl FnMut(&CrashPoint<'_>) -> Result<(), String>,
) -> Result<Stats, CrashFailure> {
    // (state before the operation in progress, state after it)
    let window = RefCell::new((twin.used_extents(), twin.used_extents()));
    explorer.run(
        region,
        |pm| {
            let a = FreeExtentAllocator::open(pm, AREA).expect("open");
            for &op in ops {
                let before = twin.used_extents();
                apply(twin, op);
                *window.borrow_mut() = (before, twin.used_extents());
                apply(&a, op);
                let after = window.borrow().1.clone();
                *window.borrow_mut() = (after.clone(), after);
            }
        },
        |cp| {
            let got = recovered(cp.image)?;
            let (before, after) = &*window.borrow();
            if got != *before && got != *after {
                return Err(format!(
                    "recovered {got:?}\nbefore the operation: {before:?}\nafter it: {after:?}"
                ));
            }
            also(cp)
        },
    )
}

/// Runs `ops` under the explorer; every crash image must recover to the state before or after
/// the operation in progress.
fn check_ops(seed: u64, ops: &[Op], prefixes: bool) {
    let twin = twin();
    let result = explore_ops(
        &Explorer::new(seed).store_prefixes(prefixes),
        &formatted(),
        &twin,
        ops,
        |_| Ok(()),
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
    let region = formatted();
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
    let region = formatted();
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

/// Calls made after `open` recovered from a crash in a multi-word call are all-or-nothing and
/// durable too: a crash during or after them does not undo them (say, by replaying the
/// interrupted call again over blocks freed or allocated since). The calls change one bitmap
/// word each: all the recovered extents are freed, then blocks are allocated again.
#[test]
fn operations_after_a_recovery_survive_the_next_crash() {
    let twin = twin();
    let continued = Cell::new(0u64);
    let result = explore_ops(
        &Explorer::new(11),
        &formatted(),
        &twin,
        &multi_word_workload(11, 8),
        |cp| {
            if cp.fence % RECOVERED_EVERY != 0 {
                return Ok(());
            }
            let again = open_copy(cp.image)?;
            let region = SimRegion::from_image(cp.image).map_err(|e| e.to_string())?;
            let ops = one_word_ops(&again.used_extents());
            explore_ops(&Explorer::new(cp.fence), &region, &again, &ops, |_| Ok(()))
                .map_err(|f| format!("after a recovery: {f}"))?;
            continued.set(continued.get() + 1);
            Ok(())
        },
    );
    if let Err(f) = result {
        panic!("{f}");
    }
    assert!(continued.get() > 0, "no crash image was continued from");
}

/// `format` is durable when it returns; a crash before leaves a region that `open` refuses
/// as not formatted (it was zeroed) or that opens to the empty allocator.
#[test]
fn format_is_durable_on_return() {
    let region = SimRegion::new(4096).expect("sim region");
    let refused = Cell::new(0u64);
    let result = Explorer::new(1).store_prefixes(true).run(
        &region,
        |pm| {
            FreeExtentAllocator::format(pm, AREA, managed()).expect("format");
        },
        |cp| {
            let heap = HeapRegion::from_image(cp.image).map_err(|e| e.to_string())?;
            match FreeExtentAllocator::open(&heap, AREA) {
                Ok(a) if a.managed() == managed() && a.used_extents().is_empty() => Ok(()),
                Ok(a) => Err(format!(
                    "opened managing {:?} with {:?} allocated",
                    a.managed(),
                    a.used_extents()
                )),
                Err(Error::Corrupt { .. }) if !cp.end => {
                    refused.set(refused.get() + 1);
                    Ok(())
                }
                Err(e) => Err(format!("open: {e}")),
            }
        },
    );
    if let Err(f) = result {
        panic!("{f}");
    }
    assert!(refused.get() > 0, "no crash left the region unformatted");
}

/// `rebuild` is durable when it returns; a crash before leaves a bitmap that opens (the
/// rebuild is then run again).
#[test]
fn rebuild_is_durable_on_return() {
    let region = formatted();
    let a = FreeExtentAllocator::open(&region, AREA).expect("open");
    for want in [100, 7, 300] {
        a.alloc(want, AllocHint::default()).expect("alloc");
    }
    assert_eq!(recovered(&region.durable_image()), Ok(a.used_extents()));
    let rebuilt = vec![
        Extent::new(BlockNo(FIRST + 50), 20),
        Extent::new(BlockNo(FIRST + 600), 900),
        Extent::new(BlockNo(FIRST + COUNT - 3), 3),
    ];
    assert_ne!(a.used_extents(), rebuilt);
    let result = Explorer::new(3).run(
        &region,
        |_| {
            a.rebuild(&mut rebuilt.iter().rev().copied())
                .expect("rebuild")
        },
        |cp| {
            let got = recovered(cp.image)?;
            if cp.end && got != rebuilt {
                Err(format!("recovered {got:?}\nafter rebuild to {rebuilt:?}"))
            } else {
                Ok(())
            }
        },
    );
    if let Err(f) = result {
        panic!("{f}");
    }
    assert_eq!(a.used_extents(), rebuilt);
}

/// Refuses every store to a bitmap word while `on` is set; lets the intent record through.
#[derive(Default)]
struct RefuseWords {
    on: AtomicBool,
}

impl Tap for RefuseWords {
    fn store(&self, off: PmOff) -> pmfs_core::Result<()> {
        if self.on.load(Ordering::Relaxed) && off.0 >= AREA.0 + 128 {
            return Err(Error::Io(std::io::Error::other("store refused")));
        }
        Ok(())
    }
}

/// A multi-word free whose word stores the media refuses fails after its intent committed,
/// which stays on the media. The owner's rebuild that follows replaces the whole bitmap, so the
/// next `open` must not replay that intent over it.
#[test]
fn a_rebuild_drops_the_intent_a_failed_call_left() {
    let region = HeapRegion::new(AREA.0 + bitmap_area_size(COUNT)).expect("heap region");
    let media = Tapped::new(&region, RefuseWords::default());
    let a = FreeExtentAllocator::format(&media, AREA, managed()).expect("format");
    let e = a.alloc(700, growing(None)).expect("alloc");
    assert!(e.len > 2 * WORD, "{e:?} spans several words");
    media.tap().on.store(true, Ordering::Relaxed);
    assert!(a.free(e).is_err());
    media.tap().on.store(false, Ordering::Relaxed);
    a.rebuild(&mut std::iter::once(e)).expect("rebuild");
    drop(a);
    let reopened = FreeExtentAllocator::open(&region, AREA).expect("open");
    assert_eq!(reopened.used_extents(), vec![e]);
}
