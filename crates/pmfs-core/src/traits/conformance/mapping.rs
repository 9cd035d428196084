//! The `FileMapping` conformance suite.
//!
//! Every implementation of [`FileMapping`] runs these checks from its own tests:
//!
//! - [`run_suite`]: a proptest state machine. Each case builds a fresh [`Subject`] (a mapping
//!   plus a few empty files), applies a random sequence of [`Op`]s to it and to a
//!   `BTreeMap<(file, lblk), pblk>` model, and after every step checks the whole state.
//! - [`stress_files`]: one thread per file, each mutating and reading its own file against its
//!   own model, all at once.
//! - [`stress_one_writer`]: one writer and several readers on the *same* file handle; every
//!   block a reader sees must hold a value the block had at some moment during the lookup.
//!
//! # What is checked
//!
//! After every step of [`run_suite`], for every file:
//! - a lookup of the whole logical range returns runs that are ascending, non-overlapping,
//!   non-empty and inside the range, and that equal the model once adjacent runs are merged
//!   (runs are compared *normalised*: how a structure splits a contiguous mapping into runs is
//!   its own business);
//! - [`owned_blocks`](FileMapping::owned_blocks) covers every mapped data block, and the owned
//!   extents of all files are pairwise disjoint (no block belongs to two files, none is listed
//!   twice);
//! - no physical block is mapped twice across all files;
//! - on a structure that keeps one table for all files, the runs
//!   [`visit_all`](FileMapping::visit_all) visits are, file by file, the model's, and their
//!   blocks are those the file owns;
//! - if the subject reports its free-block count, `free + Σ owned == free at the start`: removes
//!   free what they unmap, failed calls leak nothing, `remove_file` frees the structure's nodes.
//!
//! Per operation: an insert over any mapped block returns
//! [`Error::InvalidArgument`] and changes nothing; an insert may
//! fail with [`Error::NoSpace`] and then changes nothing; a successful
//! insert appends runs that cover exactly the range, in order, with physical blocks not mapped
//! anywhere else; `remove` returns the number of blocks the model had mapped in the range, or
//! fails with [`Error::NoSpace`] (a node had to split and no block was free) and then changes
//! nothing; lookups only append to the caller's vector;
//! [`first_mapped`](FileMapping::first_mapped) of the range looked up, of the rest of the
//! logical range from its start and of the whole logical range (after every step) is the
//! model's first key there.
//!
//! [`insert_at`](FileMapping::insert_at) is exercised when the subject has a [`BlockSource`]
//! (otherwise its operations are skipped): the suite obtains blocks for a range from the
//! source and hands each run to `insert_at`. Over any mapped block of the run it must return
//! [`Error::InvalidArgument`] and change nothing; it may fail with [`Error::NoSpace`] (the
//! structure's own nodes or slots ran out) and then changes nothing; on success the model maps
//! the run to exactly the given blocks. Runs `insert_at` refused go back to the source, so
//! the leak check also proves that a refused call kept none of them. [`Op::Overwrite`] is the
//! apply step of a copy-on-write commit done in two calls: `remove` of a range, then
//! `insert_at` of fresh blocks over it; [`Op::Replace`] does it in one,
//! [`replace`](FileMapping::replace), which must report the blocks the model had mapped in
//! the run and may fail only with [`Error::NoSpace`], leaving the run's old mapping or none.
//! [`Op::ReplaceMany`] hands [`replace_many`](FileMapping::replace_many) runs with gaps
//! between them, in reverse order, then the same runs again, which must free nothing.
//!
//! # How to use it
//!
//! ```
//! use std::sync::Arc;
//! use pmfs_core::layout::{BlockNo, PmOff};
//! use pmfs_core::traits::conformance::mapping::{FromAllocator, Subject, SuiteConfig, run_suite};
//! use pmfs_core::traits::{BlockAllocator, FileId, SimpleAllocator, SimpleMapping};
//!
//! // In a `#[test]` of the crate that implements the mapping (a real one would be formatted
//! // on a region here):
//! run_suite(&SuiteConfig::default(), |files| {
//!     let alloc = Arc::new(SimpleAllocator::new(BlockNo(64), 4096));
//!     let free = alloc.clone();
//!     let source = FromAllocator(alloc.clone());
//!     let mapping = SimpleMapping::new(alloc);
//!     let ids = (0..files).map(|i| FileId { ino: i as u64 + 1, root: PmOff(8 * i as u64) });
//!     Subject::new(mapping, ids.collect())
//!         .with_free_blocks(move || free.free_blocks())
//!         .with_block_source(source)
//! });
//! ```
//!
//! The suite opens every file once with [`open_file`](FileMapping::open_file), keeps at most
//! one handle per file, and drops and re-opens a handle after `remove_file` and at random
//! points (so state kept only in a handle's cursor is caught). Case counts honour
//! `PROPTEST_CASES` (default [`DEFAULT_CASES`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::error::{Error, Result as PmResult};
use crate::layout::BlockNo;
use crate::traits::{AllocHint, BlockAllocator, Extent, FileId, FileMapping, Run, merge_runs};

/// Proptest cases per [`run_suite`] call when `PROPTEST_CASES` is not set.
pub const DEFAULT_CASES: u32 = 32;

/// Where the suite gets the physical blocks it hands to
/// [`insert_at`](FileMapping::insert_at): for structures built over a [`BlockAllocator`], that
/// allocator ([`FromAllocator`]); for a structure that is its own allocator, whatever it offers
/// for claiming blocks of given keys (HashFS stages slots).
pub trait BlockSource<F: FileMapping>: Send + Sync {
    /// Obtains blocks for `[lblk, lblk + len)` of `file`: appends runs to `out` that cover the
    /// range exactly, in logical order. On error it appends nothing and keeps nothing.
    fn obtain(
        &self,
        mapping: &F,
        file: &F::File,
        lblk: u64,
        len: u64,
        out: &mut Vec<Run>,
    ) -> PmResult<()>;

    /// Takes back runs that [`obtain`](Self::obtain) returned and `insert_at` refused.
    fn release(&self, mapping: &F, runs: &[Run]) -> PmResult<()>;
}

/// A [`BlockSource`] that allocates from the allocator the mapping was built with (shared
/// through the `Arc`) and frees refused runs back to it.
#[derive(Debug)]
pub struct FromAllocator<A>(pub std::sync::Arc<A>);

impl<F: FileMapping, A: BlockAllocator> BlockSource<F> for FromAllocator<A> {
    fn obtain(
        &self,
        _mapping: &F,
        _file: &F::File,
        lblk: u64,
        len: u64,
        out: &mut Vec<Run>,
    ) -> PmResult<()> {
        let mut got: Vec<Run> = Vec::new();
        let mut done = 0;
        while done < len {
            let hint = AllocHint {
                goal: got.last().map(|r| r.extent().end()),
                ..AllocHint::default()
            };
            match self.0.alloc(len - done, hint) {
                Ok(e) => {
                    got.push(Run {
                        lblk: lblk + done,
                        pblk: e.start,
                        len: e.len,
                    });
                    done += e.len;
                }
                Err(err) => {
                    for r in &got {
                        self.0.free(r.extent())?;
                    }
                    return Err(err);
                }
            }
        }
        out.extend(got);
        Ok(())
    }

    fn release(&self, _mapping: &F, runs: &[Run]) -> PmResult<()> {
        runs.iter().try_for_each(|r| self.0.free(r.extent()))
    }
}

/// A mapping under test with the files the suite may use.
pub struct Subject<F: FileMapping> {
    /// The structure under test, freshly formatted.
    pub mapping: F,
    /// Distinct files (distinct inode numbers and distinct, zeroed root words).
    pub files: Vec<FileId>,
    /// The number of free blocks in the allocator the mapping draws from (or, for a structure
    /// that allocates by itself, its own free count). Enables the leak check.
    pub free_blocks: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
    /// Where blocks for `insert_at` come from; without one, the suite skips `insert_at`.
    pub blocks: Option<Box<dyn BlockSource<F>>>,
}

impl<F: FileMapping> Subject<F> {
    /// A subject without free-block accounting and without a block source.
    pub fn new(mapping: F, files: Vec<FileId>) -> Self {
        Self {
            mapping,
            files,
            free_blocks: None,
            blocks: None,
        }
    }

    /// Adds free-block accounting (the leak check).
    pub fn with_free_blocks(mut self, f: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.free_blocks = Some(Box::new(f));
        self
    }

    /// Adds a block source, which enables the `insert_at` operations.
    pub fn with_block_source(mut self, source: impl BlockSource<F> + 'static) -> Self {
        self.blocks = Some(Box::new(source));
        self
    }
}

impl<F: FileMapping> std::fmt::Debug for Subject<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subject")
            .field("files", &self.files)
            .field("free_blocks", &self.free_blocks.is_some())
            .field("blocks", &self.blocks.is_some())
            .finish_non_exhaustive()
    }
}

/// Shape of the generated workloads.
#[derive(Clone, Debug)]
pub struct SuiteConfig {
    /// How many files the suite asks `make` for (at least 1).
    pub files: usize,
    /// Every logical block the suite touches lies below this bound; whole-file lookups and
    /// truncates use `[x, max_lblk)`. Structures with a narrow logical space lower it.
    pub max_lblk: u64,
    /// Longest range of one insert or remove.
    pub max_len: u64,
    /// Most operations in one case.
    pub max_ops: usize,
    /// Whether truncates also use the open-ended range `[lblk, u64::MAX)` (trees can; a global
    /// table that has to visit every block of the range cannot).
    pub huge_ranges: bool,
    /// Proptest cases; `PROPTEST_CASES` overrides it.
    pub cases: u32,
}

impl Default for SuiteConfig {
    fn default() -> Self {
        Self {
            files: 3,
            max_lblk: 1 << 32,
            max_len: 80,
            max_ops: 48,
            huge_ranges: true,
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

/// One step of the state machine. `file` indexes [`Subject::files`].
#[derive(Clone, Debug)]
pub enum Op {
    /// Insert `[lblk, lblk + len)`.
    Insert {
        /// File index.
        file: usize,
        /// First logical block.
        lblk: u64,
        /// Number of blocks.
        len: u64,
    },
    /// Insert `len` blocks right after the last mapped block (an append).
    Append {
        /// File index.
        file: usize,
        /// Number of blocks.
        len: u64,
    },
    /// Look up `[lblk, lblk + len)`, after hinting it with `prefetch` (and past it).
    Lookup {
        /// File index.
        file: usize,
        /// First logical block.
        lblk: u64,
        /// Number of blocks.
        len: u64,
    },
    /// Remove `[lblk, lblk + len)`.
    Remove {
        /// File index.
        file: usize,
        /// First logical block.
        lblk: u64,
        /// Number of blocks.
        len: u64,
    },
    /// Remove everything from `lblk` to the end of the file.
    Truncate {
        /// File index.
        file: usize,
        /// First removed logical block.
        lblk: u64,
        /// Use the open-ended range `[lblk, u64::MAX)` (if the config allows it).
        huge: bool,
    },
    /// Obtain blocks for `[lblk, lblk + len)` from the subject's [`BlockSource`] and map
    /// them run by run with `insert_at`.
    InsertAt {
        /// File index.
        file: usize,
        /// First logical block.
        lblk: u64,
        /// Number of blocks.
        len: u64,
    },
    /// The apply step of a copy-on-write commit: `remove` `[lblk, lblk + len)`, then
    /// [`InsertAt`](Op::InsertAt) the same range.
    Overwrite {
        /// File index.
        file: usize,
        /// First logical block.
        lblk: u64,
        /// Number of blocks.
        len: u64,
    },
    /// Obtain blocks for `[lblk, lblk + len)` from the subject's [`BlockSource`] and map them
    /// run by run with [`replace`](FileMapping::replace), over whatever the range maps.
    Replace {
        /// File index.
        file: usize,
        /// First logical block.
        lblk: u64,
        /// Number of blocks.
        len: u64,
    },
    /// Obtain blocks for `len` single blocks `stride` apart from `lblk` on, then map them all
    /// with one [`replace_many`](FileMapping::replace_many), the runs in reverse order; then
    /// the same call again, which must find them mapped and free nothing.
    ReplaceMany {
        /// File index.
        file: usize,
        /// First logical block.
        lblk: u64,
        /// Number of blocks.
        len: u64,
        /// Distance between the blocks, at least 1.
        stride: u64,
    },
    /// `remove_file`, then re-open the file.
    RemoveFile {
        /// File index.
        file: usize,
    },
    /// Drop the file's handle and open it again.
    Reopen {
        /// File index.
        file: usize,
    },
}

/// Generates logical block numbers that cluster near 0 and near radix/B-tree boundaries
/// (multiples of 512, 512², 512³), with some spread over the whole space.
fn lblk_strategy(max_lblk: u64, max_len: u64) -> BoxedStrategy<u64> {
    let top = max_lblk.saturating_sub(max_len).max(1);
    let boundaries: Vec<u64> = [512u64, 512 * 512, 512 * 512 * 512, 1 << 36]
        .into_iter()
        .filter(|&b| b < top)
        .collect();
    let near_zero = (0..top.min(1500)).boxed();
    let spread = (0..top).boxed();
    if boundaries.is_empty() {
        prop_oneof![6 => near_zero, 1 => spread].boxed()
    } else {
        let near_boundary = (
            proptest::sample::select(boundaries),
            0..64u64,
            any::<bool>(),
        )
            .prop_map(move |(b, d, below)| {
                if below {
                    b - d.min(b)
                } else {
                    (b + d).min(top - 1)
                }
            })
            .boxed();
        prop_oneof![6 => near_zero, 2 => near_boundary, 1 => spread].boxed()
    }
}

fn op_strategy(cfg: &SuiteConfig) -> BoxedStrategy<Op> {
    let files = cfg.files.max(1);
    let len = 1..=cfg.max_len.max(1);
    let lblk = lblk_strategy(cfg.max_lblk, cfg.max_len);
    let huge = cfg.huge_ranges;
    prop_oneof![
        5 => (0..files, lblk.clone(), len.clone())
            .prop_map(|(file, lblk, len)| Op::Insert { file, lblk, len }),
        4 => (0..files, len.clone()).prop_map(|(file, len)| Op::Append { file, len }),
        3 => (0..files, lblk.clone(), len.clone())
            .prop_map(|(file, lblk, len)| Op::Lookup { file, lblk, len }),
        3 => (0..files, lblk.clone(), len.clone())
            .prop_map(|(file, lblk, len)| Op::Remove { file, lblk, len }),
        4 => (0..files, lblk.clone(), len.clone())
            .prop_map(|(file, lblk, len)| Op::InsertAt { file, lblk, len }),
        2 => (0..files, lblk.clone(), len.clone())
            .prop_map(|(file, lblk, len)| Op::Overwrite { file, lblk, len }),
        3 => (0..files, lblk.clone(), len.clone())
            .prop_map(|(file, lblk, len)| Op::Replace { file, lblk, len }),
        2 => (0..files, lblk.clone(), len, 1..=3u64).prop_map(|(file, lblk, len, stride)| {
            Op::ReplaceMany {
                file,
                lblk,
                len,
                stride,
            }
        }),
        1 => (0..files, lblk, any::<bool>())
            .prop_map(move |(file, lblk, h)| Op::Truncate { file, lblk, huge: h && huge }),
        1 => (0..files).prop_map(|file| Op::RemoveFile { file }),
        1 => (0..files).prop_map(|file| Op::Reopen { file }),
    ]
    .boxed()
}

/// Checks that `runs` are non-empty, ascending, non-overlapping and inside `[lblk, lblk+len)`.
pub fn check_well_formed(runs: &[Run], lblk: u64, len: u64) -> Result<(), String> {
    let end = lblk.saturating_add(len);
    let mut prev_end = lblk;
    for r in runs {
        if r.len == 0 {
            return Err(format!("empty run {r:?}"));
        }
        let Some(r_end) = r.lblk.checked_add(r.len) else {
            return Err(format!("run {r:?} overflows the logical space"));
        };
        if r.pblk.0.checked_add(r.len).is_none() {
            return Err(format!("run {r:?} overflows the physical space"));
        }
        if r.lblk < prev_end {
            return Err(format!(
                "run {r:?} is out of order or overlaps (previous ended at {prev_end}) in {runs:?}"
            ));
        }
        if r_end > end {
            return Err(format!("run {r:?} lies outside [{lblk}, {end})"));
        }
        prev_end = r_end;
    }
    Ok(())
}

/// The model of one file: logical block -> physical block.
type FileModel = BTreeMap<u64, u64>;

/// The runs of `[lblk, lblk + len)` in a model, normalised.
fn model_runs(m: &FileModel, lblk: u64, len: u64) -> Vec<Run> {
    let end = lblk.saturating_add(len);
    let runs: Vec<Run> = m
        .range(lblk..end)
        .map(|(&l, &p)| Run {
            lblk: l,
            pblk: BlockNo(p),
            len: 1,
        })
        .collect();
    merge_runs(&runs)
}

struct Machine<'s, F: FileMapping> {
    s: &'s Subject<F>,
    cfg: &'s SuiteConfig,
    handles: Vec<Option<F::File>>,
    models: Vec<FileModel>,
    /// Physical block -> file index, over all files.
    phys: BTreeMap<u64, usize>,
    initial_free: Option<u64>,
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

const SENTINEL: Run = Run {
    lblk: u64::MAX - 7,
    pblk: BlockNo(u64::MAX - 7),
    len: 3,
};

impl<'s, F: FileMapping> Machine<'s, F> {
    fn new(s: &'s Subject<F>, cfg: &'s SuiteConfig) -> Result<Self, String> {
        let mut handles = Vec::new();
        for id in &s.files {
            handles.push(Some(
                s.mapping
                    .open_file(*id)
                    .map_err(|e| format!("open_file({id:?}): {}", err_string(&e)))?,
            ));
        }
        Ok(Self {
            s,
            cfg,
            handles,
            models: vec![FileModel::new(); s.files.len()],
            phys: BTreeMap::new(),
            initial_free: s.free_blocks.as_ref().map(|f| f()),
        })
    }

    fn handle(&self, i: usize) -> &F::File {
        self.handles[i]
            .as_ref()
            .expect("the suite always keeps a handle open")
    }

    /// The subject's block source; only called after [`obtain`](Self::obtain) returned runs.
    fn source(&self) -> &dyn BlockSource<F> {
        self.s
            .blocks
            .as_deref()
            .expect("runs were obtained from the block source")
    }

    fn reopen(&mut self, i: usize) -> Result<(), String> {
        self.handles[i] = None;
        let id = self.s.files[i];
        self.handles[i] = Some(
            self.s
                .mapping
                .open_file(id)
                .map_err(|e| format!("re-open of {id:?}: {}", err_string(&e)))?,
        );
        Ok(())
    }

    fn lookup(&self, i: usize, lblk: u64, len: u64) -> Result<Vec<Run>, String> {
        let mut out = vec![SENTINEL];
        self.s
            .mapping
            .lookup(self.handle(i), lblk, len, &mut out)
            .map_err(|e| format!("lookup(file {i}, {lblk}, {len}): {}", err_string(&e)))?;
        ensure!(
            out.first() == Some(&SENTINEL),
            "lookup overwrote the caller's vector instead of appending"
        );
        out.remove(0);
        check_well_formed(&out, lblk, len)
            .map_err(|e| format!("lookup(file {i}, {lblk}, {len}): {e}"))?;
        Ok(out)
    }

    /// Checks [`first_mapped`](FileMapping::first_mapped) of a range of file `i` against the
    /// model.
    fn check_first(&self, i: usize, lblk: u64, len: u64) -> Result<(), String> {
        let got = self
            .s
            .mapping
            .first_mapped(self.handle(i), lblk, len)
            .map_err(|e| format!("first_mapped(file {i}, {lblk}, {len}): {}", err_string(&e)))?;
        let want = self.models[i]
            .range(lblk..lblk.saturating_add(len))
            .next()
            .map(|(&l, _)| l);
        ensure!(
            got == want,
            "first_mapped(file {i}, {lblk}, {len}) = {got:?}, model {want:?}"
        );
        Ok(())
    }

    fn remove_model(&mut self, i: usize, lblk: u64, end: u64) -> u64 {
        let keys: Vec<u64> = self.models[i].range(lblk..end).map(|(&l, _)| l).collect();
        for l in &keys {
            if let Some(p) = self.models[i].remove(l) {
                self.phys.remove(&p);
            }
        }
        keys.len() as u64
    }

    fn insert(&mut self, i: usize, lblk: u64, len: u64) -> Result<(), String> {
        let end = lblk + len;
        let overlaps = self.models[i].range(lblk..end).next().is_some();
        let mut out = vec![SENTINEL];
        let r = self.s.mapping.insert(self.handle(i), lblk, len, &mut out);
        match r {
            Err(Error::InvalidArgument(_)) if overlaps => return Ok(()),
            Err(e) if overlaps => {
                return Err(format!(
                    "insert(file {i}, {lblk}, {len}) over mapped blocks must fail with \
                     InvalidArgument, got {}",
                    err_string(&e)
                ));
            }
            Ok(()) if overlaps => {
                return Err(format!(
                    "insert(file {i}, {lblk}, {len}) over mapped blocks succeeded"
                ));
            }
            Err(Error::NoSpace) => return Ok(()),
            Err(e) => {
                return Err(format!(
                    "insert(file {i}, {lblk}, {len}): {}",
                    err_string(&e)
                ));
            }
            Ok(()) => {}
        }
        ensure!(
            out.first() == Some(&SENTINEL),
            "insert overwrote the caller's vector instead of appending"
        );
        out.remove(0);
        check_well_formed(&out, lblk, len)
            .map_err(|e| format!("insert(file {i}, {lblk}, {len}) returned runs: {e}"))?;
        let covered: u64 = out.iter().map(|r| r.len).sum();
        ensure!(
            covered == len,
            "insert(file {i}, {lblk}, {len}) returned runs covering {covered} blocks: {out:?}"
        );
        for r in &out {
            for k in 0..r.len {
                let p = r.pblk.0 + k;
                if let Some(&other) = self.phys.get(&p) {
                    return Err(format!(
                        "insert(file {i}, {lblk}, {len}) mapped physical block {p}, which file \
                         {other} already maps"
                    ));
                }
                self.phys.insert(p, i);
                self.models[i].insert(r.lblk + k, p);
            }
        }
        Ok(())
    }

    /// Obtains blocks for `[lblk, lblk + len)` of file `i` from the subject's source and checks
    /// them; `None` when there is no source or it is out of space.
    fn obtain(&self, i: usize, lblk: u64, len: u64) -> Result<Option<Vec<Run>>, String> {
        let Some(source) = &self.s.blocks else {
            return Ok(None);
        };
        let mut runs = vec![SENTINEL];
        match source.obtain(&self.s.mapping, self.handle(i), lblk, len, &mut runs) {
            Ok(()) => {}
            Err(Error::NoSpace) => {
                ensure!(
                    runs == [SENTINEL],
                    "the block source failed but returned runs {runs:?}"
                );
                return Ok(None);
            }
            Err(e) => {
                return Err(format!(
                    "block source for (file {i}, {lblk}, {len}): {}",
                    err_string(&e)
                ));
            }
        }
        runs.remove(0);
        check_well_formed(&runs, lblk, len)
            .map_err(|e| format!("block source for (file {i}, {lblk}, {len}): {e}"))?;
        let covered: u64 = runs.iter().map(|r| r.len).sum();
        ensure!(
            covered == len,
            "block source for (file {i}, {lblk}, {len}) covered {covered} blocks: {runs:?}"
        );
        for r in &runs {
            for k in 0..r.len {
                let p = r.pblk.0 + k;
                if let Some(&other) = self.phys.get(&p) {
                    return Err(format!(
                        "block source handed out physical block {p}, which file {other} maps"
                    ));
                }
            }
        }
        Ok(Some(runs))
    }

    /// Obtains blocks for `[lblk, lblk + len)` and maps them run by run with `insert_at`.
    fn insert_at(&mut self, i: usize, lblk: u64, len: u64) -> Result<(), String> {
        let Some(runs) = self.obtain(i, lblk, len)? else {
            return Ok(());
        };
        let mapping = &self.s.mapping;
        let source = self.s.blocks.as_deref().expect("runs came from the source");
        for (n, &r) in runs.iter().enumerate() {
            let end = r.lblk + r.len;
            let overlaps = self.models[i].range(r.lblk..end).next().is_some();
            let result = mapping.insert_at(self.handle(i), r);
            let refused = match result {
                Ok(()) if overlaps => {
                    return Err(format!(
                        "insert_at(file {i}, {r:?}) over mapped blocks succeeded"
                    ));
                }
                Ok(()) => false,
                Err(Error::InvalidArgument(_)) if overlaps => true,
                Err(Error::NoSpace) if !overlaps => true,
                Err(e) => {
                    let what = if overlaps {
                        "over mapped blocks must fail with InvalidArgument, got"
                    } else {
                        "failed:"
                    };
                    return Err(format!(
                        "insert_at(file {i}, {r:?}) {what} {}",
                        err_string(&e)
                    ));
                }
            };
            if refused {
                // Over mapped blocks only this run is refused; out of space, the remaining
                // runs are not tried either.
                let back = if overlaps { &runs[n..=n] } else { &runs[n..] };
                source
                    .release(mapping, back)
                    .map_err(|e| format!("releasing refused runs {back:?}: {}", err_string(&e)))?;
                if overlaps {
                    continue;
                }
                return Ok(());
            }
            for k in 0..r.len {
                self.phys.insert(r.pblk.0 + k, i);
                self.models[i].insert(r.lblk + k, r.pblk.0 + k);
            }
        }
        Ok(())
    }

    /// Obtains blocks for `[lblk, lblk + len)` and maps them run by run with `replace`, over
    /// whatever the range maps.
    fn replace(&mut self, i: usize, lblk: u64, len: u64) -> Result<(), String> {
        let Some(runs) = self.obtain(i, lblk, len)? else {
            return Ok(());
        };
        for (n, &r) in runs.iter().enumerate() {
            let end = r.lblk + r.len;
            let result = self.s.mapping.replace(self.handle(i), r);
            match result {
                Ok(freed) => {
                    let want = self.remove_model(i, r.lblk, end);
                    ensure!(
                        freed == want,
                        "replace(file {i}, {r:?}) reported {freed} blocks freed, model had {want}"
                    );
                    for k in 0..r.len {
                        self.phys.insert(r.pblk.0 + k, i);
                        self.models[i].insert(r.lblk + k, r.pblk.0 + k);
                    }
                }
                Err(Error::NoSpace) => {
                    // The range keeps its mapping or (the default's remove went through) is
                    // unmapped; the run and the ones after it go back to the source.
                    let got = merge_runs(&self.lookup(i, r.lblk, r.len)?);
                    let had = model_runs(&self.models[i], r.lblk, r.len);
                    ensure!(
                        got == had || got.is_empty(),
                        "replace(file {i}, {r:?}) failed out of space and left {got:?}, \
                         model had {had:?}"
                    );
                    if got.is_empty() {
                        self.remove_model(i, r.lblk, end);
                    }
                    let back = &runs[n..];
                    self.source()
                        .release(&self.s.mapping, back)
                        .map_err(|e| format!("releasing runs {back:?}: {}", err_string(&e)))?;
                    return Ok(());
                }
                Err(e) => {
                    return Err(format!(
                        "replace(file {i}, {r:?}) failed: {}",
                        err_string(&e)
                    ));
                }
            }
        }
        Ok(())
    }

    /// Obtains blocks for `len` single blocks `stride` apart from `lblk` on and maps them
    /// with one `replace_many`, in reverse order; then checks that the same call again
    /// frees nothing.
    fn replace_many(&mut self, i: usize, lblk: u64, len: u64, stride: u64) -> Result<(), String> {
        let stride = stride.max(1);
        if len == 0
            || (len - 1)
                .checked_mul(stride)
                .and_then(|d| d.checked_add(lblk + 1))
                .is_none_or(|end| end > self.cfg.max_lblk)
        {
            return Ok(());
        }
        let mut runs = Vec::new();
        for k in 0..len {
            match self.obtain(i, lblk + k * stride, 1)? {
                Some(got) => runs.extend(got),
                None => break,
            }
        }
        runs.reverse();
        let call = |s: &Self| s.s.mapping.replace_many(s.handle(i), &runs);
        match call(self) {
            Ok(freed) => {
                let mut want = 0;
                for r in &runs {
                    want += self.remove_model(i, r.lblk, r.lblk + r.len);
                    for k in 0..r.len {
                        self.phys.insert(r.pblk.0 + k, i);
                        self.models[i].insert(r.lblk + k, r.pblk.0 + k);
                    }
                }
                ensure!(
                    freed == want,
                    "replace_many(file {i}, {runs:?}) reported {freed} blocks freed, model had \
                     {want}"
                );
                let again = call(self).map_err(|e| {
                    format!("replace_many(file {i}, {runs:?}) again: {}", err_string(&e))
                })?;
                ensure!(
                    again == 0,
                    "replace_many(file {i}, {runs:?}) again freed {again} blocks"
                );
                Ok(())
            }
            Err(Error::NoSpace) => {
                // Each run is replaced, or keeps its old mapping or (the default's remove
                // went through) none; the runs not replaced go back to the source.
                let mut back = Vec::new();
                for &r in &runs {
                    let got = merge_runs(&self.lookup(i, r.lblk, r.len)?);
                    if got == [r] {
                        self.remove_model(i, r.lblk, r.lblk + r.len);
                        for k in 0..r.len {
                            self.phys.insert(r.pblk.0 + k, i);
                            self.models[i].insert(r.lblk + k, r.pblk.0 + k);
                        }
                        continue;
                    }
                    let had = model_runs(&self.models[i], r.lblk, r.len);
                    ensure!(
                        got == had || got.is_empty(),
                        "replace_many(file {i}, {runs:?}) failed out of space and left {got:?} \
                         at {r:?}, model had {had:?}"
                    );
                    if got.is_empty() {
                        self.remove_model(i, r.lblk, r.lblk + r.len);
                    }
                    back.push(r);
                }
                self.source()
                    .release(&self.s.mapping, &back)
                    .map_err(|e| format!("releasing runs {back:?}: {}", err_string(&e)))
            }
            Err(e) => Err(format!(
                "replace_many(file {i}, {runs:?}) failed: {}",
                err_string(&e)
            )),
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Insert { file, lblk, len } => self.insert(file, lblk, len),
            Op::Append { file, len } => {
                let lblk = self.models[file].keys().next_back().map_or(0, |&l| l + 1);
                if lblk.saturating_add(len) > self.cfg.max_lblk {
                    return Ok(());
                }
                self.insert(file, lblk, len)
            }
            Op::Lookup { file, lblk, len } => {
                // Hinted first, as the engine does: hints anywhere must change nothing.
                for at in [lblk, lblk.saturating_add(len), u64::MAX] {
                    self.s.mapping.prefetch(self.handle(file), at);
                }
                let got = merge_runs(&self.lookup(file, lblk, len)?);
                let want = model_runs(&self.models[file], lblk, len);
                ensure!(
                    got == want,
                    "lookup(file {file}, {lblk}, {len}) returned {got:?}, model has {want:?}"
                );
                self.check_first(file, lblk, len)?;
                self.check_first(file, lblk, self.cfg.max_lblk)
            }
            Op::Remove { file, lblk, len } => {
                let n = match self.s.mapping.remove(self.handle(file), lblk, len) {
                    Ok(n) => n,
                    Err(Error::NoSpace) => {
                        // Splitting a node took a block and none was left: nothing changed.
                        let got = merge_runs(&self.lookup(file, lblk, len)?);
                        let had = model_runs(&self.models[file], lblk, len);
                        ensure!(
                            got == had,
                            "remove(file {file}, {lblk}, {len}) failed out of space and left \
                             {got:?}, model had {had:?}"
                        );
                        return Ok(());
                    }
                    Err(e) => {
                        return Err(format!(
                            "remove(file {file}, {lblk}, {len}): {}",
                            err_string(&e)
                        ));
                    }
                };
                let want = self.remove_model(file, lblk, lblk + len);
                ensure!(
                    n == want,
                    "remove(file {file}, {lblk}, {len}) reported {n} blocks, model had {want}"
                );
                Ok(())
            }
            Op::InsertAt { file, lblk, len } => self.insert_at(file, lblk, len),
            Op::Overwrite { file, lblk, len } => {
                if self.s.blocks.is_none() {
                    return Ok(());
                }
                self.apply(&Op::Remove { file, lblk, len })?;
                self.insert_at(file, lblk, len)
            }
            Op::Replace { file, lblk, len } => self.replace(file, lblk, len),
            Op::ReplaceMany {
                file,
                lblk,
                len,
                stride,
            } => self.replace_many(file, lblk, len, stride),
            Op::Truncate { file, lblk, huge } => {
                let len = if huge {
                    u64::MAX - lblk
                } else {
                    self.cfg.max_lblk - lblk
                };
                let n = self
                    .s
                    .mapping
                    .remove(self.handle(file), lblk, len)
                    .map_err(|e| {
                        format!(
                            "truncate(file {file}, {lblk}, len {len}): {}",
                            err_string(&e)
                        )
                    })?;
                let want = self.remove_model(file, lblk, u64::MAX);
                ensure!(
                    n == want,
                    "truncate(file {file}, {lblk}) reported {n} blocks, model had {want}"
                );
                Ok(())
            }
            Op::RemoveFile { file } => {
                self.s
                    .mapping
                    .remove_file(self.handle(file))
                    .map_err(|e| format!("remove_file(file {file}): {}", err_string(&e)))?;
                self.remove_model(file, 0, u64::MAX);
                self.reopen(file)?;
                let mut owned = Vec::new();
                self.s
                    .mapping
                    .owned_blocks(self.handle(file), &mut |e| owned.push(e))
                    .map_err(|e| format!("owned_blocks(file {file}): {}", err_string(&e)))?;
                ensure!(
                    owned.is_empty(),
                    "after remove_file, file {file} still owns {owned:?}"
                );
                Ok(())
            }
            Op::Reopen { file } => self.reopen(file),
        }
    }

    /// Checks [`visit_all`](FileMapping::visit_all), if the structure keeps one table for all
    /// files: each file's runs, merged, are the model's, and their blocks are the ones the
    /// file owns; runs of files the subject does not have are not visited.
    fn check_visit_all(&self) -> Result<(), String> {
        let mut by_file: Vec<Vec<Run>> = vec![Vec::new(); self.s.files.len()];
        let mut stray = None;
        let global = self
            .s
            .mapping
            .visit_all(
                &mut |ino, r| match self.s.files.iter().position(|f| f.ino == ino) {
                    Some(i) => by_file[i].push(r),
                    None => stray = Some((ino, r)),
                },
            )
            .map_err(|e| format!("visit_all: {}", err_string(&e)))?;
        if !global {
            return Ok(());
        }
        ensure!(stray.is_none(), "visit_all visited {stray:?} of no file");
        for (i, runs) in by_file.iter_mut().enumerate() {
            runs.sort_unstable_by_key(|r| r.lblk);
            let got = merge_runs(runs);
            let want = model_runs(&self.models[i], 0, u64::MAX);
            ensure!(
                got == want,
                "file {i}: visit_all visited {got:?}, model has {want:?}"
            );
            let mut owned = Vec::new();
            self.s
                .mapping
                .owned_blocks(self.handle(i), &mut |e| owned.extend(e.start.0..e.end().0))
                .map_err(|e| format!("owned_blocks(file {i}): {}", err_string(&e)))?;
            owned.sort_unstable();
            let mut blocks: Vec<u64> = got
                .iter()
                .flat_map(|r| r.extent().start.0..r.extent().end().0)
                .collect();
            blocks.sort_unstable();
            ensure!(
                owned == blocks,
                "file {i}: visit_all's blocks {blocks:?} are not the owned blocks {owned:?}"
            );
        }
        Ok(())
    }

    /// The whole-state check run after every step.
    fn check(&self) -> Result<(), String> {
        let mut all_owned: Vec<(Extent, usize)> = Vec::new();
        for i in 0..self.s.files.len() {
            let got = merge_runs(&self.lookup(i, 0, self.cfg.max_lblk)?);
            let want = model_runs(&self.models[i], 0, u64::MAX);
            ensure!(
                got == want,
                "file {i}: whole-file lookup returned {got:?}, model has {want:?}"
            );
            self.check_first(i, 0, self.cfg.max_lblk)?;
            let mut owned = Vec::new();
            self.s
                .mapping
                .owned_blocks(self.handle(i), &mut |e| owned.push(e))
                .map_err(|e| format!("owned_blocks(file {i}): {}", err_string(&e)))?;
            for e in &owned {
                ensure!(e.len > 0, "file {i}: owned_blocks reported an empty extent");
            }
            // Every mapped data block must be owned.
            owned.sort();
            for (&l, &p) in &self.models[i] {
                let idx = owned.partition_point(|e| e.start.0 <= p);
                let hit = idx > 0 && owned[idx - 1].contains(BlockNo(p));
                ensure!(
                    hit,
                    "file {i}: data block {p} (lblk {l}) is missing from owned_blocks {owned:?}"
                );
            }
            all_owned.extend(owned.into_iter().map(|e| (e, i)));
        }
        self.check_visit_all()?;
        all_owned.sort();
        for w in all_owned.windows(2) {
            let ((a, fa), (b, fb)) = (w[0], w[1]);
            ensure!(
                a.end() <= b.start,
                "owned extents overlap: {a:?} of file {fa} and {b:?} of file {fb}"
            );
        }
        if let (Some(free), Some(initial)) = (&self.s.free_blocks, self.initial_free) {
            let owned: u64 = all_owned.iter().map(|(e, _)| e.len).sum();
            let now = free();
            ensure!(
                now + owned == initial,
                "block accounting: {now} free + {owned} owned != {initial} free at the start"
            );
        }
        Ok(())
    }
}

/// Runs the proptest state machine against fresh subjects from `make(cfg.files)`.
///
/// # Panics
/// On the first (shrunk) failing sequence, with the operations and the reason.
pub fn run_suite<F, Mk>(cfg: &SuiteConfig, make: Mk)
where
    F: FileMapping,
    Mk: Fn(usize) -> Subject<F>,
{
    let mut runner = TestRunner::new(Config {
        cases: cfg.effective_cases(),
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(op_strategy(cfg), 1..=cfg.max_ops.max(1));
    let result = runner.run(&strategy, |ops| {
        let subject = make(cfg.files);
        assert_eq!(
            subject.files.len(),
            cfg.files,
            "make must return the requested number of files"
        );
        run_ops(&subject, cfg, &ops).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("FileMapping conformance failure: {e}");
    }
}

/// Applies `ops` to `subject` and the model, checking after every step. Exposed so that an
/// implementation can replay a specific sequence as a regression test.
pub fn run_ops<F: FileMapping>(
    subject: &Subject<F>,
    cfg: &SuiteConfig,
    ops: &[Op],
) -> Result<(), String> {
    let mut m = Machine::new(subject, cfg)?;
    m.check().map_err(|e| format!("fresh subject: {e}"))?;
    for (n, op) in ops.iter().enumerate() {
        m.apply(op).map_err(|e| format!("step {n} {op:?}: {e}"))?;
        m.check()
            .map_err(|e| format!("after step {n} {op:?}: {e}"))?;
    }
    Ok(())
}

/// Shape of the concurrency stress runs.
#[derive(Clone, Debug)]
pub struct StressConfig {
    /// Operations per thread (for [`stress_one_writer`]: writer operations).
    pub ops: usize,
    /// Logical blocks used lie below this bound.
    pub max_lblk: u64,
    /// Longest range of one operation.
    pub max_len: u64,
    /// Seed of the per-thread random generators.
    pub seed: u64,
}

impl Default for StressConfig {
    fn default() -> Self {
        Self {
            ops: 400,
            max_lblk: 4096,
            max_len: 24,
            seed: 0x5eed,
        }
    }
}

/// Checks every file of `subject` against `models` from one thread: whole-file lookups,
/// owned-block coverage and disjointness, no physical block mapped twice, and the free-block
/// accounting against `initial_free`.
fn check_quiescent<F: FileMapping>(
    subject: &Subject<F>,
    handles: &[F::File],
    models: &[FileModel],
    max_lblk: u64,
    initial_free: Option<u64>,
) -> Result<(), String> {
    let cfg = SuiteConfig {
        files: handles.len(),
        max_lblk,
        ..SuiteConfig::default()
    };
    let mut all_owned: Vec<(Extent, usize)> = Vec::new();
    let mut phys: BTreeMap<u64, usize> = BTreeMap::new();
    for (i, (h, model)) in handles.iter().zip(models).enumerate() {
        let mut runs = Vec::new();
        subject
            .mapping
            .lookup(h, 0, cfg.max_lblk, &mut runs)
            .map_err(|e| format!("final lookup of file {i}: {}", err_string(&e)))?;
        check_well_formed(&runs, 0, cfg.max_lblk)?;
        let got = merge_runs(&runs);
        let want = model_runs(model, 0, u64::MAX);
        ensure!(
            got == want,
            "file {i}: final lookup {got:?} differs from model {want:?}"
        );
        for &p in model.values() {
            if let Some(other) = phys.insert(p, i) {
                return Err(format!(
                    "physical block {p} mapped by files {other} and {i}"
                ));
            }
        }
        let mut owned = Vec::new();
        subject
            .mapping
            .owned_blocks(h, &mut |e| owned.push(e))
            .map_err(|e| format!("owned_blocks(file {i}): {}", err_string(&e)))?;
        owned.sort();
        for &p in model.values() {
            let idx = owned.partition_point(|e| e.start.0 <= p);
            ensure!(
                idx > 0 && owned[idx - 1].contains(BlockNo(p)),
                "file {i}: data block {p} missing from owned_blocks"
            );
        }
        all_owned.extend(owned.into_iter().map(|e| (e, i)));
    }
    all_owned.sort();
    for w in all_owned.windows(2) {
        ensure!(
            w[0].0.end() <= w[1].0.start,
            "owned extents overlap: {:?} of file {} and {:?} of file {}",
            w[0].0,
            w[0].1,
            w[1].0,
            w[1].1
        );
    }
    if let (Some(free), Some(initial)) = (&subject.free_blocks, initial_free) {
        let owned: u64 = all_owned.iter().map(|(e, _)| e.len).sum();
        let now = free();
        ensure!(
            now + owned == initial,
            "block accounting: {now} free + {owned} owned != {initial} free at the start"
        );
    }
    Ok(())
}

/// One random mutation or lookup by the only mutator of a file, checked against its model.
/// Returns the logical blocks whose value changed, with their new values.
fn random_step<F: FileMapping>(
    mapping: &F,
    source: Option<&dyn BlockSource<F>>,
    h: &F::File,
    model: &mut FileModel,
    rng: &mut SmallRng,
    cfg: &StressConfig,
) -> Result<Vec<(u64, Option<u64>)>, String> {
    let len = rng.gen_range(1..=cfg.max_len.max(1));
    let top = cfg.max_lblk.saturating_sub(len).max(1);
    let end_of_file = model.keys().next_back().map_or(0, |&l| l + 1);
    let lblk = if rng.gen_bool(0.5) && end_of_file < top {
        end_of_file
    } else {
        rng.gen_range(0..top)
    };
    let mut changes = Vec::new();
    match rng.gen_range(0..10) {
        0..=3 if source.is_some() && rng.gen_bool(0.5) => {
            let source = source.expect("checked by the guard");
            let mut runs = Vec::new();
            match source.obtain(mapping, h, lblk, len, &mut runs) {
                Ok(()) => {}
                Err(Error::NoSpace) => return Ok(changes),
                Err(e) => return Err(format!("block source: {}", err_string(&e))),
            }
            check_well_formed(&runs, lblk, len)?;
            for (n, &r) in runs.iter().enumerate() {
                let overlaps = model.range(r.lblk..r.lblk + r.len).next().is_some();
                match mapping.insert_at(h, r) {
                    Ok(()) if !overlaps => {
                        for k in 0..r.len {
                            model.insert(r.lblk + k, r.pblk.0 + k);
                            changes.push((r.lblk + k, Some(r.pblk.0 + k)));
                        }
                    }
                    Err(Error::InvalidArgument(_)) if overlaps => source
                        .release(mapping, &runs[n..=n])
                        .map_err(|e| format!("release: {}", err_string(&e)))?,
                    Err(Error::NoSpace) if !overlaps => {
                        source
                            .release(mapping, &runs[n..])
                            .map_err(|e| format!("release: {}", err_string(&e)))?;
                        break;
                    }
                    other => {
                        return Err(format!(
                            "insert_at({r:?}) with overlap={overlaps}: {other:?}"
                        ));
                    }
                }
            }
        }
        0..=3 => {
            let overlaps = model.range(lblk..lblk + len).next().is_some();
            let mut out = Vec::new();
            match mapping.insert(h, lblk, len, &mut out) {
                Ok(()) if !overlaps => {
                    check_well_formed(&out, lblk, len)?;
                    let mut l = lblk;
                    for r in &out {
                        ensure!(r.lblk == l, "insert({lblk}, {len}) left a gap: {out:?}");
                        for k in 0..r.len {
                            model.insert(l + k, r.pblk.0 + k);
                            changes.push((l + k, Some(r.pblk.0 + k)));
                        }
                        l += r.len;
                    }
                    ensure!(l == lblk + len, "insert({lblk}, {len}) returned {out:?}");
                }
                Err(Error::InvalidArgument(_)) if overlaps => {}
                Err(Error::NoSpace) if !overlaps => {}
                other => {
                    return Err(format!(
                        "insert({lblk}, {len}) with overlap={overlaps}: {other:?}"
                    ));
                }
            }
        }
        4..=6 => {
            let mut out = Vec::new();
            mapping
                .lookup(h, lblk, len, &mut out)
                .map_err(|e| format!("lookup({lblk}, {len}): {}", err_string(&e)))?;
            check_well_formed(&out, lblk, len)?;
            let got = merge_runs(&out);
            let want = model_runs(model, lblk, len);
            ensure!(
                got == want,
                "lookup({lblk}, {len}) = {got:?}, model {want:?}"
            );
        }
        7..=8 => {
            let n = mapping
                .remove(h, lblk, len)
                .map_err(|e| format!("remove({lblk}, {len}): {}", err_string(&e)))?;
            let keys: Vec<u64> = model.range(lblk..lblk + len).map(|(&l, _)| l).collect();
            ensure!(
                n == keys.len() as u64,
                "remove({lblk}, {len}) reported {n}, model {}",
                keys.len()
            );
            for l in keys {
                model.remove(&l);
                changes.push((l, None));
            }
        }
        _ => {
            let at = rng.gen_range(0..=end_of_file);
            let n = mapping
                .remove(h, at, cfg.max_lblk - at.min(cfg.max_lblk))
                .map_err(|e| format!("truncate({at}): {}", err_string(&e)))?;
            let keys: Vec<u64> = model.range(at..).map(|(&l, _)| l).collect();
            ensure!(
                n == keys.len() as u64,
                "truncate({at}) reported {n}, model {}",
                keys.len()
            );
            for l in keys {
                model.remove(&l);
                changes.push((l, None));
            }
        }
    }
    Ok(changes)
}

/// Concurrency stress on different files: thread `t` owns `subject.files[t]` and runs
/// `cfg.ops` random inserts, appends, lookups, removes and truncates on it (with a
/// [`BlockSource`], half the inserts are `insert_at`s of blocks from it), checking every
/// result against its own model while the other threads do the same. At the end, every file is
/// checked as in [`run_suite`] (whole-file lookups, owned blocks, no block mapped twice,
/// accounting).
///
/// # Panics
/// On the first mismatch or error, naming the thread.
pub fn stress_files<F: FileMapping>(subject: &Subject<F>, cfg: &StressConfig) {
    let initial_free = subject.free_blocks.as_ref().map(|f| f());
    let source = subject.blocks.as_deref();
    let handles: Vec<F::File> = subject
        .files
        .iter()
        .map(|id| subject.mapping.open_file(*id).expect("open_file"))
        .collect();
    let models: Vec<FileModel> = std::thread::scope(|scope| {
        let joins: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(t, h)| {
                let mapping = &subject.mapping;
                scope.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(cfg.seed ^ (t as u64 + 1) << 32);
                    let mut model = FileModel::new();
                    for n in 0..cfg.ops {
                        if let Err(e) = random_step(mapping, source, h, &mut model, &mut rng, cfg) {
                            panic!("stress_files: thread {t}, op {n}: {e}");
                        }
                    }
                    model
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    if let Err(e) = check_quiescent(subject, &handles, &models, cfg.max_lblk, initial_free) {
        panic!("stress_files: final check: {e}");
    }
}

/// The values a logical block took over time: `(version, value)` pairs, ascending by version;
/// a block absent from the map, or before its first entry, was unmapped.
type History = BTreeMap<u64, Vec<(u64, Option<u64>)>>;

/// Concurrency stress on one file: a writer runs `cfg.ops` random mutations on
/// `subject.files[0]` while `readers` threads look up random ranges of it through the *same*
/// handle. Each writer operation `k` is bracketed by version counters; a reader that looked up
/// while versions `f0..=s1` were current checks, block by block, that every block it saw (mapped
/// to `p`, or unmapped) had that value in one of those versions, and that its runs are well
/// formed. The writer checks its own results exactly, and the file is checked as a whole at
/// the end.
///
/// # Panics
/// On the first mismatch or error.
pub fn stress_one_writer<F: FileMapping>(subject: &Subject<F>, readers: usize, cfg: &StressConfig) {
    let initial_free = subject.free_blocks.as_ref().map(|f| f());
    let source = subject.blocks.as_deref();
    let id = subject.files[0];
    let handle = subject.mapping.open_file(id).expect("open_file");
    let started = AtomicU64::new(0);
    let finished = AtomicU64::new(0);
    let history: Mutex<History> = Mutex::new(History::new());
    let done = AtomicU64::new(0);
    let mapping = &subject.mapping;

    let model = std::thread::scope(|scope| {
        let (h, started, finished, history, done) = (&handle, &started, &finished, &history, &done);
        let writer = scope.spawn(move || {
            let mut rng = SmallRng::seed_from_u64(cfg.seed);
            let mut model = FileModel::new();
            for k in 1..=cfg.ops as u64 {
                started.store(k, Ordering::SeqCst);
                let changes = random_step(mapping, source, h, &mut model, &mut rng, cfg);
                let changes = match changes {
                    Ok(c) => c,
                    Err(e) => {
                        done.store(1, Ordering::SeqCst);
                        panic!("stress_one_writer: writer op {k}: {e}");
                    }
                };
                {
                    let mut hist = history.lock().unwrap_or_else(|e| e.into_inner());
                    for (l, v) in changes {
                        hist.entry(l).or_default().push((k, v));
                    }
                }
                finished.store(k, Ordering::SeqCst);
            }
            done.store(1, Ordering::SeqCst);
            model
        });
        let reader_joins: Vec<_> = (0..readers)
            .map(|t| {
                scope.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(cfg.seed ^ 0xabcd ^ (t as u64) << 40);
                    let mut lookups = 0u64;
                    while done.load(Ordering::SeqCst) == 0 || lookups == 0 {
                        let len = rng.gen_range(1..=cfg.max_len.max(1) * 4);
                        let lblk = rng.gen_range(0..cfg.max_lblk.saturating_sub(len).max(1));
                        let f0 = finished.load(Ordering::SeqCst);
                        let mut out = Vec::new();
                        if let Err(e) = mapping.lookup(h, lblk, len, &mut out) {
                            panic!("stress_one_writer: reader {t}: lookup({lblk}, {len}): {e}");
                        }
                        let s1 = started.load(Ordering::SeqCst);
                        if let Err(e) = check_well_formed(&out, lblk, len) {
                            panic!("stress_one_writer: reader {t}: {e}");
                        }
                        while finished.load(Ordering::SeqCst) < s1
                            && done.load(Ordering::SeqCst) == 0
                        {
                            std::thread::yield_now();
                        }
                        let hist = history.lock().unwrap_or_else(|e| e.into_inner());
                        let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
                        for r in &out {
                            for k in 0..r.len {
                                seen.insert(r.lblk + k, r.pblk.0 + k);
                            }
                        }
                        for l in lblk..lblk + len {
                            let got = seen.get(&l).copied();
                            let entries = hist.get(&l).map(Vec::as_slice).unwrap_or(&[]);
                            let at_f0 = entries
                                .iter()
                                .rev()
                                .find(|(v, _)| *v <= f0)
                                .and_then(|&(_, p)| p);
                            let ok = got == at_f0
                                || entries.iter().any(|&(v, p)| v > f0 && v <= s1 && p == got);
                            if !ok {
                                panic!(
                                    "stress_one_writer: reader {t}: lblk {l} read as {got:?}, \
                                     but during versions {f0}..={s1} it was {at_f0:?} then \
                                     {entries:?}"
                                );
                            }
                        }
                        lookups += 1;
                    }
                    lookups
                })
            })
            .collect();
        let model = writer
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        for j in reader_joins {
            j.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
        model
    });
    if let Err(e) = check_quiescent(
        subject,
        std::slice::from_ref(&handle),
        std::slice::from_ref(&model),
        cfg.max_lblk,
        initial_free,
    ) {
        panic!("stress_one_writer: final check: {e}");
    }
}
