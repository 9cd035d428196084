//! The `BlockAllocator` conformance suite.
//!
//! Every implementation of [`BlockAllocator`] (and every wrapper around one, such as a
//! per-thread cache) runs these checks from its own tests:
//!
//! - [`run_suite`]: all of the checks below, with [`SuiteConfig::default`].
//! - [`check_model`]: a proptest state machine. Each case builds a fresh allocator over a
//!   generated managed range, applies a random sequence of [`Op`]s (allocations with random
//!   sizes, kinds and goals; whole and partial frees; double frees; frees outside the range;
//!   rebuilds from the held set or from a subset of it, as after a crash that leaked blocks;
//!   cache flushes) to it and to a model of the blocks the client holds, checks the state after
//!   every step, and ends every case by filling the range to 100 % and draining it again.
//! - [`check_errors`]: the argument errors of the contract.
//! - [`check_concurrent`]: several threads allocating and freeing at once; a shared claim map
//!   catches any block handed out twice.
//!
//! # What is checked
//!
//! - `alloc(want, _)` returns between 1 and `want` blocks inside the managed range, none of
//!   them held by the client; it returns [`Error::NoSpace`] only when the model has no free
//!   block, and a failed call changes nothing.
//! - `free_blocks() + held == total_blocks()` after every step (no leak, frees give space
//!   back; caching allocators count cached blocks as free).
//! - `free` of blocks that are not all held (double frees, overlaps with free space, blocks
//!   outside the range, empty extents) returns [`Error::InvalidArgument`] and changes nothing.
//!   `free_many` of a batch of held extents, with or without a free block among them, frees
//!   every held one and refuses the free block the same way.
//! - `rebuild(used)` leaves exactly `used` allocated: afterwards the allocator hands out every
//!   other block and nothing else.
//! - At 100 % use, `alloc` returns `NoSpace` (repeatedly, changing nothing); after frees the
//!   freed blocks, and only they, are handed out again.
//!
//! # How to use it
//!
//! ```
//! use pmfs_core::traits::SimpleAllocator;
//! use pmfs_core::traits::conformance::alloc::run_suite;
//!
//! // In a `#[test]` of the crate that implements the allocator:
//! run_suite(|first, count| SimpleAllocator::new(first, count));
//! ```
//!
//! The generated ranges include unaligned starts, ranges of a single block, ranges spanning
//! several 2 MiB huge pages and ranges that straddle a 1 GiB boundary (block 2^18), so
//! allocators that group blocks by huge pages or by 1 GiB groups see their edge cases. Case
//! counts honour `PROPTEST_CASES` (default [`DEFAULT_CASES`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::Error;
use crate::layout::BlockNo;
use crate::traits::{AllocHint, AllocKind, BlockAllocator, Extent};

/// Proptest cases per [`check_model`] call when `PROPTEST_CASES` is not set.
pub const DEFAULT_CASES: u32 = 32;

/// Blocks in a 1 GiB group of 4 KiB blocks; generated ranges straddle multiples of it.
const GIB_BLOCKS: u64 = 1 << 18;

/// Shape of the generated workloads.
#[derive(Clone, Debug)]
pub struct SuiteConfig {
    /// Largest managed range a case may use, in blocks.
    pub max_blocks: u64,
    /// Largest `want` of one allocation.
    pub max_want: u64,
    /// Most operations in one case (before the final fill and drain).
    pub max_ops: usize,
    /// Proptest cases; `PROPTEST_CASES` overrides it.
    pub cases: u32,
}

impl Default for SuiteConfig {
    fn default() -> Self {
        Self {
            max_blocks: 6000,
            max_want: 1500,
            max_ops: 60,
            cases: DEFAULT_CASES,
        }
    }
}

impl SuiteConfig {
    /// The case count: `PROPTEST_CASES` if set and valid, else [`cases`](Self::cases).
    pub fn effective_cases(&self) -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(self.cases)
    }
}

/// Which goal an allocation passes.
#[derive(Clone, Copy, Debug)]
pub enum Goal {
    /// No goal.
    None,
    /// The block right after a held extent (index modulo the number held), as a file append
    /// would pass it.
    AfterHeld(usize),
    /// An arbitrary block: `first + n % (count + 2)`, so sometimes just outside the range.
    Anywhere(u64),
}

/// Which part of a held extent a free returns.
#[derive(Clone, Copy, Debug)]
pub enum Part {
    /// The whole extent.
    Whole,
    /// The first `n % len + 1` blocks.
    Head(u64),
    /// The last `n % len + 1` blocks.
    Tail(u64),
    /// One block from the middle (splits the extent in three).
    Middle,
}

/// One step of the state machine.
#[derive(Clone, Debug)]
pub enum Op {
    /// `alloc(want, hint)`.
    Alloc {
        /// Blocks wanted (at least 1).
        want: u64,
        /// The hint's kind.
        kind: AllocKind,
        /// The hint's goal.
        goal: Goal,
    },
    /// Free (part of) a held extent (index modulo the number held).
    Free {
        /// Which held extent.
        pick: usize,
        /// Which part of it.
        part: Part,
    },
    /// `free_many` of up to `count` held extents in address order, from the picked one on;
    /// with `stray`, a free block among them too (if one follows the last), which must be
    /// refused while the others are freed.
    FreeMany {
        /// The first held extent.
        pick: usize,
        /// How many held extents (1 to 8).
        count: usize,
        /// Whether to slip in a free block.
        stray: bool,
    },
    /// Free a held extent a second time, after freeing it once: must be refused.
    DoubleFree {
        /// Which held extent.
        pick: usize,
    },
    /// Free a held extent grown by one block into free space (if it borders any): must be
    /// refused.
    FreeOverlapping {
        /// Which held extent.
        pick: usize,
    },
    /// `rebuild` from exactly the held extents.
    Rebuild,
    /// `rebuild` from a subset of the held extents (the others count as leaked by a crash and
    /// must become free).
    RebuildSubset {
        /// Bit `i % 64` says whether held extent `i` survives.
        mask: u64,
    },
    /// `flush_caches`.
    Flush,
}

fn kind_strategy() -> BoxedStrategy<AllocKind> {
    prop_oneof![
        Just(AllocKind::Growing),
        Just(AllocKind::Fixed),
        Just(AllocKind::Metadata)
    ]
    .boxed()
}

fn op_strategy(cfg: &SuiteConfig) -> BoxedStrategy<Op> {
    let max_want = cfg.max_want.max(1);
    let want = prop_oneof![
        4 => 1..=4u64.min(max_want),
        3 => 1..=64u64.min(max_want),
        2 => 1..=max_want,
    ];
    let goal = prop_oneof![
        2 => Just(Goal::None),
        3 => any::<usize>().prop_map(Goal::AfterHeld),
        1 => any::<u64>().prop_map(Goal::Anywhere),
    ];
    let part = prop_oneof![
        3 => Just(Part::Whole),
        1 => any::<u64>().prop_map(Part::Head),
        1 => any::<u64>().prop_map(Part::Tail),
        1 => Just(Part::Middle),
    ];
    prop_oneof![
        10 => (want, kind_strategy(), goal)
            .prop_map(|(want, kind, goal)| Op::Alloc { want, kind, goal }),
        5 => (any::<usize>(), part).prop_map(|(pick, part)| Op::Free { pick, part }),
        2 => (any::<usize>(), 1..=8usize, any::<bool>())
            .prop_map(|(pick, count, stray)| Op::FreeMany { pick, count, stray }),
        1 => any::<usize>().prop_map(|pick| Op::DoubleFree { pick }),
        1 => any::<usize>().prop_map(|pick| Op::FreeOverlapping { pick }),
        1 => Just(Op::Rebuild),
        1 => any::<u64>().prop_map(|mask| Op::RebuildSubset { mask }),
        1 => Just(Op::Flush),
    ]
    .boxed()
}

/// Managed ranges: single blocks, small unaligned ranges, several huge pages, ranges that
/// straddle a 1 GiB boundary, and random ones.
fn range_strategy(max_blocks: u64) -> BoxedStrategy<(u64, u64)> {
    let max = max_blocks.max(1);
    prop_oneof![
        1 => (0..2048u64).prop_map(|f| (f, 1)),
        2 => (0..2048u64, 1..=max.min(700)),
        3 => (0..4u64, 0..512u64, 1..=max)
            .prop_map(|(p, o, c)| (p * 512 + o, c)),
        2 => (1..4u64, 0..max, 1..=max)
            .prop_map(|(g, back, c)| (g * GIB_BLOCKS - back.min(g * GIB_BLOCKS), c)),
        1 => (0..(1u64 << 22), 1..=max),
    ]
    .boxed()
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)*) => {
        if !$cond {
            return Err(format!($($fmt)*));
        }
    };
}

fn err_string(e: &Error) -> String {
    format!("{e} ({e:?})")
}

/// The client's view: the extents it holds, keyed by start.
struct Machine<A> {
    a: A,
    first: u64,
    count: u64,
    held: BTreeMap<u64, u64>,
    held_total: u64,
}

impl<A: BlockAllocator> Machine<A> {
    fn new(a: A, first: u64, count: u64) -> Result<Self, String> {
        ensure!(
            a.total_blocks() == count,
            "total_blocks() = {}, managed range has {count}",
            a.total_blocks()
        );
        ensure!(
            a.free_blocks() == count,
            "a fresh allocator reports {} free of {count}",
            a.free_blocks()
        );
        Ok(Self {
            a,
            first,
            count,
            held: BTreeMap::new(),
            held_total: 0,
        })
    }

    fn end(&self) -> u64 {
        self.first + self.count
    }

    fn nth_held(&self, pick: usize) -> Option<(u64, u64)> {
        if self.held.is_empty() {
            return None;
        }
        self.held
            .iter()
            .nth(pick % self.held.len())
            .map(|(&s, &l)| (s, l))
    }

    /// Whether any block of `[s, s + len)` is held.
    fn overlaps_held(&self, s: u64, len: u64) -> bool {
        let e = s + len;
        self.held
            .range(..e)
            .next_back()
            .is_some_and(|(&hs, &hl)| hs + hl > s)
    }

    fn check_accounting(&self, what: &str) -> Result<(), String> {
        let free = self.a.free_blocks();
        ensure!(
            free + self.held_total == self.count,
            "after {what}: free_blocks() = {free}, client holds {}, total {}",
            self.held_total,
            self.count
        );
        Ok(())
    }

    /// Removes `[s, s + len)`, which must lie inside one held extent, from the model.
    fn unhold(&mut self, s: u64, len: u64) {
        let (&hs, &hl) = self
            .held
            .range(..=s)
            .next_back()
            .expect("the suite only unholds held blocks");
        self.held.remove(&hs);
        if s > hs {
            self.held.insert(hs, s - hs);
        }
        if s + len < hs + hl {
            self.held.insert(s + len, hs + hl - s - len);
        }
        self.held_total -= len;
    }

    fn alloc(&mut self, want: u64, hint: AllocHint) -> Result<Option<Extent>, String> {
        let before = self.a.free_blocks();
        match self.a.alloc(want, hint) {
            Ok(e) => {
                ensure!(
                    e.len >= 1 && e.len <= want,
                    "alloc({want}, {hint:?}) returned {e:?}: length outside 1..={want}"
                );
                ensure!(
                    e.start.0 >= self.first && e.start.0 + e.len <= self.end(),
                    "alloc({want}, {hint:?}) returned {e:?} outside the managed range \
                     [{}, {})",
                    self.first,
                    self.end()
                );
                ensure!(
                    !self.overlaps_held(e.start.0, e.len),
                    "alloc({want}, {hint:?}) returned {e:?}, which overlaps held blocks"
                );
                self.held.insert(e.start.0, e.len);
                self.held_total += e.len;
                self.check_accounting(&format!("alloc({want}, {hint:?}) = {e:?}"))?;
                Ok(Some(e))
            }
            Err(Error::NoSpace) => {
                ensure!(
                    self.held_total == self.count,
                    "alloc({want}, {hint:?}) returned NoSpace with {} of {} blocks free",
                    self.count - self.held_total,
                    self.count
                );
                ensure!(
                    self.a.free_blocks() == before,
                    "a failed alloc changed free_blocks() from {before} to {}",
                    self.a.free_blocks()
                );
                Ok(None)
            }
            Err(e) => Err(format!("alloc({want}, {hint:?}): {}", err_string(&e))),
        }
    }

    fn free(&mut self, e: Extent) -> Result<(), String> {
        self.a
            .free(e)
            .map_err(|err| format!("free({e:?}) of held blocks: {}", err_string(&err)))?;
        self.unhold(e.start.0, e.len);
        self.check_accounting(&format!("free({e:?})"))
    }

    fn free_many(&mut self, pick: usize, count: usize, stray: bool) -> Result<(), String> {
        let Some((s, _)) = self.nth_held(pick) else {
            return Ok(());
        };
        let mut batch: Vec<Extent> = self
            .held
            .range(s..)
            .take(count)
            .map(|(&s, &l)| Extent::new(BlockNo(s), l))
            .collect();
        let after = batch.last().map_or(s, |e| e.end().0);
        let stray = (stray && after < self.end() && !self.overlaps_held(after, 1))
            .then(|| Extent::new(BlockNo(after), 1));
        batch.extend(stray);
        let r = self.a.free_many(&batch);
        match (stray, &r) {
            (None, Ok(())) | (Some(_), Err(Error::InvalidArgument(_))) => {}
            _ => {
                return Err(format!(
                    "free_many({batch:?}) (stray block: {stray:?}) returned {r:?}"
                ));
            }
        }
        for e in batch.iter().filter(|e| Some(**e) != stray) {
            self.unhold(e.start.0, e.len);
        }
        self.check_accounting(&format!("free_many({batch:?})"))
    }

    fn refused_free(&mut self, e: Extent, why: &str) -> Result<(), String> {
        let before = self.a.free_blocks();
        match self.a.free(e) {
            Err(Error::InvalidArgument(_)) => {}
            other => {
                return Err(format!(
                    "free({e:?}) of {why} returned {other:?}, want InvalidArgument"
                ));
            }
        }
        ensure!(
            self.a.free_blocks() == before,
            "refused free({e:?}) changed free_blocks() from {before} to {}",
            self.a.free_blocks()
        );
        Ok(())
    }

    fn rebuild(&mut self, keep: impl Fn(usize) -> bool) -> Result<(), String> {
        let kept: BTreeMap<u64, u64> = self
            .held
            .iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(_, (&s, &l))| (s, l))
            .collect();
        let mut it = kept.iter().map(|(&s, &l)| Extent::new(BlockNo(s), l));
        self.a
            .rebuild(&mut it)
            .map_err(|e| format!("rebuild of {} extents: {}", kept.len(), err_string(&e)))?;
        self.held_total = kept.values().sum();
        self.held = kept;
        self.check_accounting("rebuild")
    }

    fn apply(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Alloc { want, kind, goal } => {
                let goal = match goal {
                    Goal::None => None,
                    Goal::AfterHeld(i) => self.nth_held(i).map(|(s, l)| BlockNo(s + l)),
                    Goal::Anywhere(n) => Some(BlockNo(self.first + n % (self.count + 2))),
                };
                self.alloc(want, AllocHint { kind, goal }).map(drop)
            }
            Op::Free { pick, part } => {
                let Some((s, l)) = self.nth_held(pick) else {
                    return Ok(());
                };
                let e = match part {
                    Part::Whole => Extent::new(BlockNo(s), l),
                    Part::Head(n) => Extent::new(BlockNo(s), n % l + 1),
                    Part::Tail(n) => {
                        let k = n % l + 1;
                        Extent::new(BlockNo(s + l - k), k)
                    }
                    Part::Middle => Extent::new(BlockNo(s + l / 2), 1),
                };
                self.free(e)
            }
            Op::FreeMany { pick, count, stray } => self.free_many(pick, count, stray),
            Op::DoubleFree { pick } => {
                let Some((s, l)) = self.nth_held(pick) else {
                    return Ok(());
                };
                let e = Extent::new(BlockNo(s), l);
                self.free(e)?;
                self.refused_free(e, "blocks freed just before")
            }
            Op::FreeOverlapping { pick } => {
                let Some((s, l)) = self.nth_held(pick) else {
                    return Ok(());
                };
                if s + l < self.end() && !self.overlaps_held(s + l, 1) {
                    self.refused_free(
                        Extent::new(BlockNo(s), l + 1),
                        "held blocks plus a free one after them",
                    )?;
                }
                if s > self.first && !self.overlaps_held(s - 1, 1) {
                    self.refused_free(
                        Extent::new(BlockNo(s - 1), l + 1),
                        "held blocks plus a free one before them",
                    )?;
                }
                Ok(())
            }
            Op::Rebuild => self.rebuild(|_| true),
            Op::RebuildSubset { mask } => self.rebuild(|i| mask >> (i % 64) & 1 == 1),
            Op::Flush => {
                self.a.flush_caches();
                self.check_accounting("flush_caches")
            }
        }
    }

    /// Fills the range to 100 %, checks NoSpace, frees some extents, refills them exactly,
    /// then frees everything.
    fn fill_and_drain(&mut self, seed: u64) -> Result<(), String> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let kinds = [AllocKind::Growing, AllocKind::Fixed, AllocKind::Metadata];
        let mut calls = 0u64;
        loop {
            let want = if rng.gen_bool(0.5) {
                rng.gen_range(1..=8)
            } else {
                rng.gen_range(1..=600)
            };
            let hint = AllocHint {
                kind: kinds[rng.gen_range(0..3)],
                goal: None,
            };
            match self.alloc(want, hint)? {
                Some(_) => calls += 1,
                None => break,
            }
            ensure!(
                calls <= self.count,
                "{calls} successful allocations from {} blocks",
                self.count
            );
        }
        ensure!(
            self.a.free_blocks() == 0,
            "at 100 % use free_blocks() = {}",
            self.a.free_blocks()
        );
        ensure!(
            self.alloc(1, AllocHint::metadata())?.is_none(),
            "NoSpace is not repeatable"
        );
        // Free about a third of the held extents, then allocate until full again: exactly the
        // freed blocks must come back.
        let picks: Vec<(u64, u64)> = self
            .held
            .iter()
            .filter(|_| rng.gen_bool(0.33))
            .map(|(&s, &l)| (s, l))
            .collect();
        let mut freed: BTreeMap<u64, u64> = BTreeMap::new();
        for &(s, l) in &picks {
            self.free(Extent::new(BlockNo(s), l))?;
            // Adjacent freed extents form one free run the allocator may hand out at once.
            match freed.iter_mut().next_back() {
                Some((&fs, fl)) if fs + *fl == s => *fl += l,
                _ => {
                    freed.insert(s, l);
                }
            }
        }
        let freed_total: u64 = freed.values().sum();
        let mut regained = 0u64;
        while regained < freed_total {
            let want = rng.gen_range(1..=64);
            let hint = AllocHint {
                kind: kinds[rng.gen_range(0..3)],
                goal: None,
            };
            let Some(e) = self.alloc(want, hint)? else {
                return Err(format!(
                    "NoSpace after freeing {freed_total} blocks and regaining {regained}"
                ));
            };
            let inside = freed
                .range(..=e.start.0)
                .next_back()
                .is_some_and(|(&s, &l)| e.start.0 + e.len <= s + l);
            ensure!(
                inside,
                "at 100 % use minus freed extents {freed:?}, alloc returned {e:?}"
            );
            regained += e.len;
        }
        ensure!(
            self.alloc(1, AllocHint::default())?.is_none(),
            "allocation succeeded after the freed blocks were all regained"
        );
        let all: Vec<(u64, u64)> = self.held.iter().map(|(&s, &l)| (s, l)).collect();
        for (s, l) in all {
            self.free(Extent::new(BlockNo(s), l))?;
        }
        self.a.flush_caches();
        self.check_accounting("freeing everything")
    }
}

fn runner(cfg: &SuiteConfig) -> TestRunner {
    TestRunner::new(Config {
        cases: cfg.effective_cases(),
        failure_persistence: None,
        ..Config::default()
    })
}

/// Runs the whole suite with [`SuiteConfig::default`]: [`check_errors`], [`check_model`] and
/// [`check_concurrent`].
///
/// `make(first, count)` builds a fresh allocator managing blocks `[first, first + count)`, all
/// free.
///
/// # Panics
/// On the first violation, with the failing (shrunk) case and a description.
pub fn run_suite<A, F>(make: F)
where
    A: BlockAllocator,
    F: Fn(BlockNo, u64) -> A,
{
    let cfg = SuiteConfig::default();
    check_errors(&make);
    check_model(&cfg, &make);
    check_concurrent(&make, 4, 1500);
}

/// The proptest state machine (see the module documentation).
///
/// # Panics
/// On the first violation, with the shrunk failing case.
pub fn check_model<A, F>(cfg: &SuiteConfig, make: F)
where
    A: BlockAllocator,
    F: Fn(BlockNo, u64) -> A,
{
    let strategy = (
        range_strategy(cfg.max_blocks),
        prop::collection::vec(op_strategy(cfg), 1..=cfg.max_ops.max(1)),
        any::<u64>(),
    );
    let result = runner(cfg).run(&strategy, |((first, count), ops, seed)| {
        let mut m =
            Machine::new(make(BlockNo(first), count), first, count).map_err(TestCaseError::fail)?;
        for (i, op) in ops.iter().enumerate() {
            m.apply(op)
                .map_err(|e| TestCaseError::fail(format!("step {i} ({op:?}): {e}")))?;
        }
        m.fill_and_drain(seed)
            .map_err(|e| TestCaseError::fail(format!("fill and drain: {e}")))?;
        Ok(())
    });
    if let Err(e) = result {
        panic!("BlockAllocator conformance (model): {e}");
    }
}

/// The argument errors of the contract: `alloc(0)`, frees that are empty, outside the range
/// or of free blocks, and rebuilds from overlapping or out-of-range extents.
///
/// # Panics
/// On the first violation.
pub fn check_errors<A, F>(make: F)
where
    A: BlockAllocator,
    F: Fn(BlockNo, u64) -> A,
{
    let (first, count) = (1000u64, 3000u64);
    let a = make(BlockNo(first), count);
    assert!(
        matches!(
            a.alloc(0, AllocHint::default()),
            Err(Error::InvalidArgument(_))
        ),
        "alloc(0) must be refused"
    );
    assert_eq!(
        a.free_blocks(),
        count,
        "a refused alloc(0) changed the state"
    );
    let e = a
        .alloc(10, AllocHint::default())
        .expect("alloc from a fresh allocator");
    for bad in [
        Extent::new(e.start, 0),
        Extent::new(BlockNo(first - 1), 2),
        Extent::new(BlockNo(first + count - 1), 2),
        Extent::new(BlockNo(u64::MAX - 1), 1),
    ] {
        assert!(
            matches!(a.free(bad), Err(Error::InvalidArgument(_))),
            "free({bad:?}) must be refused"
        );
    }
    let free_one = (first..first + count)
        .find(|&b| !e.contains(BlockNo(b)))
        .expect("the range has free blocks");
    assert!(
        matches!(
            a.free(Extent::new(BlockNo(free_one), 1)),
            Err(Error::InvalidArgument(_))
        ),
        "free of a free block must be refused"
    );
    assert_eq!(
        a.free_blocks(),
        count - e.len,
        "refused frees changed the state"
    );
    for bad in [
        vec![
            Extent::new(BlockNo(first), 10),
            Extent::new(BlockNo(first + 5), 10),
        ],
        vec![Extent::new(BlockNo(first + count - 2), 5)],
        vec![Extent::new(BlockNo(first - 3), 5)],
        vec![Extent::new(BlockNo(first + 3), 0)],
    ] {
        let mut it = bad.clone().into_iter();
        assert!(
            matches!(a.rebuild(&mut it), Err(Error::Corrupt { .. })),
            "rebuild from {bad:?} must return Corrupt"
        );
    }
    let used = [
        Extent::new(BlockNo(first + 100), 50),
        Extent::new(BlockNo(first), 1),
    ];
    let mut it = used.into_iter();
    a.rebuild(&mut it)
        .expect("a valid rebuild after failed ones");
    assert_eq!(a.free_blocks(), count - 51, "rebuild accounting");
    a.free(Extent::new(BlockNo(first + 120), 30))
        .expect("free of rebuilt-used blocks");
    assert!(
        matches!(
            a.free(Extent::new(BlockNo(first + 2), 1)),
            Err(Error::InvalidArgument(_))
        ),
        "blocks not in the rebuilt set must be free"
    );
}

/// Concurrency stress: `threads` threads each run `ops` random allocations (all kinds, goals
/// right after their own last extent) and frees of their own extents on one allocator. Every
/// block handed out is claimed in a shared bitmap with an atomic `fetch_or`; a block claimed
/// twice fails the check. At the end everything is freed and the accounting must balance.
///
/// # Panics
/// On a block handed out twice, an error other than `NoSpace`, or unbalanced accounting.
pub fn check_concurrent<A, F>(make: F, threads: usize, ops: usize)
where
    A: BlockAllocator,
    F: Fn(BlockNo, u64) -> A,
{
    let (first, count) = (GIB_BLOCKS - 3000, 9000u64);
    let a = make(BlockNo(first), count);
    let claims: Vec<AtomicU64> = (0..count.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
    let claim = |e: Extent, set: bool| -> Result<(), String> {
        ensure!(
            e.start.0 >= first && e.start.0 + e.len <= first + count && e.len >= 1,
            "extent {e:?} outside the managed range"
        );
        for b in e.start.0..e.start.0 + e.len {
            let i = b - first;
            let bit = 1u64 << (i % 64);
            let w = &claims[(i / 64) as usize];
            if set {
                let old = w.fetch_or(bit, Ordering::SeqCst);
                ensure!(old & bit == 0, "block {b} handed out twice (in {e:?})");
            } else {
                w.fetch_and(!bit, Ordering::SeqCst);
            }
        }
        Ok(())
    };
    std::thread::scope(|scope| {
        let joins: Vec<_> = (0..threads)
            .map(|t| {
                let (a, claim) = (&a, &claim);
                scope.spawn(move || -> Result<(), String> {
                    let mut rng = SmallRng::seed_from_u64(0xa110c ^ (t as u64) << 20);
                    let kinds = [AllocKind::Growing, AllocKind::Fixed, AllocKind::Metadata];
                    let mut mine: Vec<Extent> = Vec::new();
                    for _ in 0..ops {
                        if mine.is_empty() || rng.gen_bool(0.55) {
                            let top = if rng.gen_bool(0.8) { 8 } else { 600 };
                            let want = rng.gen_range(1..=top);
                            let goal = mine.last().filter(|_| rng.gen_bool(0.6)).map(Extent::end);
                            let hint = AllocHint {
                                kind: kinds[rng.gen_range(0..3)],
                                goal,
                            };
                            match a.alloc(want, hint) {
                                Ok(e) => {
                                    ensure!(
                                        e.len <= want,
                                        "alloc({want}) returned {} blocks",
                                        e.len
                                    );
                                    claim(e, true)?;
                                    mine.push(e);
                                }
                                Err(Error::NoSpace) => {}
                                Err(e) => return Err(format!("alloc({want}): {e}")),
                            }
                        } else {
                            let e = mine.swap_remove(rng.gen_range(0..mine.len()));
                            claim(e, false)?;
                            a.free(e).map_err(|err| format!("free({e:?}): {err}"))?;
                        }
                    }
                    for e in mine {
                        claim(e, false)?;
                        a.free(e).map_err(|err| format!("free({e:?}): {err}"))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for (t, j) in joins.into_iter().enumerate() {
            match j.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("BlockAllocator conformance (concurrent): thread {t}: {e}"),
                Err(p) => std::panic::resume_unwind(p),
            }
        }
    });
    a.flush_caches();
    assert_eq!(
        a.free_blocks(),
        count,
        "BlockAllocator conformance (concurrent): blocks leaked after every thread freed all"
    );
    let e = a
        .alloc(count, AllocHint::default())
        .expect("allocation after the stress");
    assert!(e.len >= 1, "allocation after the stress returned nothing");
}
