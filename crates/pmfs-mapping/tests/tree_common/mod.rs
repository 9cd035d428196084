//! Crash-test harness shared by the extent-tree and radix-tree crash tests.
//!
//! A test formats a structure on a [`SimRegion`], builds a starting state, and hands a list of
//! [`CrashOp`]s to [`crash_check`]. The harness first replays the operations on a heap copy of
//! the starting image to learn the exact state after each one (the structures and the
//! allocator are deterministic), then runs them on the simulated region under the
//! [`Explorer`]. Only an [`InsertAt`](CrashOp::InsertAt) over mapped blocks may fail (in both
//! runs alike); every other operation, [`Replace`](CrashOp::Replace) over mapped blocks
//! included, must succeed. Every post-crash image is opened,
//! recovered and compared, file by file and over the whole logical space, with the state before or after the operation in progress
//! (only "after" once the workload has returned; during a
//! [`ReplaceMany`](CrashOp::ReplaceMany), which may stop after any block, each block the call
//! changes may also map its old block, its new one, or — inside a run that was not mapped
//! whole, which is a remove and an insert — none); its owned blocks must rebuild an allocator
//! (inside the data area, no block owned twice), and it must accept a further insert and
//! remove. Every so many crash points the harness crashes the recovery too: recovering,
//! then inserting and removing a far block, on a simulated copy of the post-crash image, and
//! each crash of that recovers to the state the image recovers to (with the far block mapped
//! while the insert may have happened).

#![allow(dead_code)]

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion, Stats};
use pmfs_core::traits::merge_runs;
use pmfs_core::traits::{
    AllocHint, BlockAllocator, Extent, FileId, FileMapping, Run, SimpleAllocator,
};

/// Where things live in the test region: block 0 holds the files' root words, the meta area
/// follows, then the data area the allocator manages.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    /// Number of files (root words at offsets 0, 8, 16, ...).
    pub files: usize,
    /// The structure's meta area.
    pub meta: Extent,
    /// The blocks the allocator manages.
    pub data: Extent,
}

impl Geometry {
    /// A geometry with `meta_blocks` of meta area and `data_blocks` of data.
    pub fn new(files: usize, meta_blocks: u64, data_blocks: u64) -> Self {
        let meta = Extent::new(BlockNo(1), meta_blocks);
        Self {
            files,
            meta,
            data: Extent::new(meta.end(), data_blocks),
        }
    }

    /// Size of the region in bytes.
    pub fn bytes(&self) -> u64 {
        self.data.end().0 * BLOCK_SIZE
    }

    /// The files' ids.
    pub fn ids(&self) -> Vec<FileId> {
        (0..self.files)
            .map(|i| FileId {
                ino: i as u64 + 1,
                root: PmOff(8 * i as u64),
            })
            .collect()
    }

    /// Every other data block (the odd ones): reserving them leaves no two free blocks
    /// adjacent, so every allocated block becomes its own extent.
    pub fn odd_blocks(&self) -> Vec<Extent> {
        (1..self.data.len)
            .step_by(2)
            .map(|i| Extent::new(self.data.start + i, 1))
            .collect()
    }
}

/// Opens the structure under test, formatted in the test region's meta area, on any media.
pub trait Open {
    /// The structure on media `M`.
    type On<M: Media>: FileMapping;
    /// Opens it on `media`, drawing blocks from `alloc`.
    fn open<M: Media>(
        &self,
        media: M,
        alloc: Arc<SimpleAllocator>,
    ) -> pmfs_core::Result<Self::On<M>>;
}

/// One operation of a crash test.
#[derive(Clone, Copy, Debug)]
pub enum CrashOp {
    /// `insert(file, lblk, len)`.
    Insert(usize, u64, u64),
    /// One extent of up to `len` blocks from the allocator, then one `insert_at(file, run)`
    /// of it at `lblk` (the extent goes back to the allocator if `insert_at` fails). The
    /// harness expects it to be refused exactly when `[lblk, lblk + len)` has a mapped block,
    /// so tests use it where the allocator hands out the whole length.
    InsertAt(usize, u64, u64),
    /// One extent of up to `len` blocks from the allocator, then one `replace(file, run)` of
    /// it at `lblk`, over whatever the range maps (the extent goes back to the allocator if
    /// `replace` fails).
    Replace(usize, u64, u64),
    /// `replace_many(file, runs)` of `count` runs of `len` blocks from the allocator at
    /// `lblk`, `lblk + stride`, … (the extents go back to the allocator if it fails). Tests
    /// use it where the allocator hands out the whole length.
    ReplaceMany {
        file: usize,
        lblk: u64,
        len: u64,
        stride: u64,
        count: u64,
    },
    /// `remove(file, lblk, len)`.
    Remove(usize, u64, u64),
    /// `remove(file, lblk, u64::MAX - lblk)`: truncate from `lblk`.
    Truncate(usize, u64),
    /// `remove_file(file)`.
    RemoveFile(usize),
}

/// A [`CrashOp::ReplaceMany`] of `file`.
pub fn many(file: usize, lblk: u64, len: u64, stride: u64, count: u64) -> CrashOp {
    CrashOp::ReplaceMany {
        file,
        lblk,
        len,
        stride,
        count,
    }
}

/// `count` runs of `len` blocks from `alloc` at `lblk`, `lblk + stride`, … (for
/// `replace_many`).
pub fn fresh_runs<A: BlockAllocator + ?Sized>(
    alloc: &A,
    lblk: u64,
    len: u64,
    stride: u64,
    count: u64,
) -> pmfs_core::Result<Vec<Run>> {
    (0..count)
        .map(|i| {
            let e = alloc.alloc(len, AllocHint::default())?;
            Ok(Run {
                lblk: lblk + i * stride,
                pblk: e.start,
                len: e.len,
            })
        })
        .collect()
}

/// Whether the block map `got` is `before` with some of the blocks that differ in `after`
/// mapped as in `after`, or unmapped (what a `replace_many` cut short leaves, see
/// [`CrashOp::ReplaceMany`]).
pub fn between<K: Ord>(
    got: &BTreeMap<K, u64>,
    before: &BTreeMap<K, u64>,
    after: &BTreeMap<K, u64>,
) -> bool {
    let keys: BTreeSet<&K> = before.keys().chain(after.keys()).collect();
    got.keys().all(|k| keys.contains(k))
        && keys.iter().all(|k| {
            let (g, b, a) = (got.get(k), before.get(k), after.get(k));
            g == b || g == a || (g.is_none() && b != a)
        })
}

/// Applies `op`; `alloc` is the allocator `m` was built with.
pub fn apply<F: FileMapping>(
    m: &F,
    alloc: &SimpleAllocator,
    files: &[F::File],
    op: CrashOp,
) -> Result<(), String> {
    let r = match op {
        CrashOp::Insert(f, l, n) => m.insert(&files[f], l, n, &mut Vec::new()),
        CrashOp::InsertAt(f, l, n) => alloc.alloc(n, AllocHint::default()).and_then(|e| {
            let run = Run {
                lblk: l,
                pblk: e.start,
                len: e.len,
            };
            m.insert_at(&files[f], run).or_else(|err| {
                alloc.free(e)?;
                Err(err)
            })
        }),
        CrashOp::Replace(f, l, n) => alloc.alloc(n, AllocHint::default()).and_then(|e| {
            let run = Run {
                lblk: l,
                pblk: e.start,
                len: e.len,
            };
            m.replace(&files[f], run).map(drop).or_else(|err| {
                alloc.free(e)?;
                Err(err)
            })
        }),
        CrashOp::ReplaceMany {
            file,
            lblk,
            len,
            stride,
            count,
        } => {
            let runs =
                fresh_runs(alloc, lblk, len, stride, count).map_err(|e| format!("{op:?}: {e}"))?;
            m.replace_many(&files[file], &runs)
                .map(drop)
                .or_else(|err| {
                    for r in &runs {
                        alloc.free(r.extent())?;
                    }
                    Err(err)
                })
        }
        CrashOp::Remove(f, l, n) => m.remove(&files[f], l, n).map(drop),
        CrashOp::Truncate(f, l) => m.remove(&files[f], l, u64::MAX - l).map(drop),
        CrashOp::RemoveFile(f) => m.remove_file(&files[f]),
    };
    r.map_err(|e| format!("{op:?}: {e}"))
}

/// The whole mapping of every file, normalised.
pub type State = Vec<Vec<Run>>;

/// Opens every file and looks up its whole logical space.
pub fn state_of<F: FileMapping>(m: &F, ids: &[FileId]) -> Result<State, String> {
    let mut s = Vec::new();
    for id in ids {
        let h = m.open_file(*id).map_err(|e| format!("open_file: {e}"))?;
        let mut runs = Vec::new();
        m.lookup(&h, 0, u64::MAX, &mut runs)
            .map_err(|e| format!("lookup of {id:?}: {e}"))?;
        s.push(merge_runs(&runs));
    }
    Ok(s)
}

/// Every block the files own, checked to lie in the data area without overlaps by
/// rebuilding a fresh allocator (plus `reserved`) from them. Returns that allocator.
pub fn rebuild_alloc<F: FileMapping>(
    m: &F,
    g: &Geometry,
    reserved: &[Extent],
) -> Result<Arc<SimpleAllocator>, String> {
    let alloc = Arc::new(SimpleAllocator::new(g.data.start, g.data.len));
    rebuild_into(&alloc, m, g, reserved)?;
    Ok(alloc)
}

/// [`rebuild_alloc`] into `alloc`, which `m` may draw its blocks from.
fn rebuild_into<F: FileMapping>(
    alloc: &SimpleAllocator,
    m: &F,
    g: &Geometry,
    reserved: &[Extent],
) -> Result<(), String> {
    let mut used = reserved.to_vec();
    for id in g.ids() {
        let h = m.open_file(id).map_err(|e| format!("open_file: {e}"))?;
        m.owned_blocks(&h, &mut |e| used.push(e))
            .map_err(|e| format!("owned_blocks of {id:?}: {e}"))?;
    }
    alloc
        .rebuild(&mut used.into_iter())
        .map_err(|e| format!("owned blocks do not rebuild an allocator: {e}"))
}

/// Every mapped block of `s`, by file and logical block.
fn blocks(s: &State) -> BTreeMap<(usize, u64), u64> {
    s.iter()
        .enumerate()
        .flat_map(|(f, runs)| {
            runs.iter()
                .flat_map(move |r| (0..r.len).map(move |k| ((f, r.lblk + k), r.pblk.0 + k)))
        })
        .collect()
}

fn describe(s: &State) -> String {
    s.iter()
        .enumerate()
        .map(|(i, runs)| format!("file {i}: {runs:?}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A far logical block of the first file, which no test maps: the recovered structure must
/// map and unmap it.
const FAR: u64 = 3 << 20;

/// Runs `ops` under `explorer` (see the module docs) on the structure `open` opens, with
/// `reserved` blocks allocated throughout; crashes the recovery of the durable image of every
/// `nested`-th crash point as well (none if 0). Returns the explorer's statistics.
pub fn crash_check<O: Open>(
    explorer: Explorer,
    region: &SimRegion,
    g: &Geometry,
    reserved: &[Extent],
    ops: &[CrashOp],
    open: &O,
    nested: u64,
) -> Stats {
    region.persist_all();
    let ids = g.ids();
    let heap = |image: &[u8]| HeapRegion::from_image(image).map_err(|e| e.to_string());
    let fresh = || Arc::new(SimpleAllocator::new(g.data.start, g.data.len));

    // Dry run on a heap copy: the exact state after each operation.
    let probe = open
        .open(heap(&region.image()).unwrap(), fresh())
        .expect("open the starting image");
    let alloc = rebuild_alloc(&probe, g, reserved).expect("starting state");
    drop(probe);
    let dry = open
        .open(heap(&region.image()).unwrap(), alloc.clone())
        .expect("open the starting image");
    let handles: Vec<_> = ids.iter().map(|id| dry.open_file(*id).unwrap()).collect();
    let mut states = vec![state_of(&dry, &ids).unwrap()];
    let mut outcomes = Vec::new();
    for &op in ops {
        let overlaps = match op {
            CrashOp::InsertAt(f, l, n) => {
                let cur: &State = states.last().expect("the starting state");
                cur[f].iter().any(|r| r.lblk < l + n && l < r.lblk + r.len)
            }
            _ => false,
        };
        let outcome = apply(&dry, &alloc, &handles, op);
        match &outcome {
            Err(e) if overlaps => assert!(e.contains("over mapped blocks"), "{op:?}: {e}"),
            Ok(()) if overlaps => panic!("{op:?} over mapped blocks succeeded"),
            r => assert!(r.is_ok(), "{op:?}: {r:?}"),
        }
        outcomes.push(outcome);
        states.push(state_of(&dry, &ids).unwrap());
    }
    drop(handles);
    drop(dry);

    // The real run.
    let probe = open.open(region, fresh()).expect("open the starting image");
    let alloc = rebuild_alloc(&probe, g, reserved).expect("starting state");
    drop(probe);
    let tree = open
        .open(region, alloc.clone())
        .expect("open the starting image");
    let handles: Vec<_> = ids.iter().map(|id| tree.open_file(*id).unwrap()).collect();
    let done = Cell::new(0usize);
    let stats = explorer.run(
        region,
        |_| {
            for (i, &op) in ops.iter().enumerate() {
                let outcome = apply(&tree, &alloc, &handles, op);
                assert_eq!(outcome, outcomes[i], "{op:?} differs from the dry run");
                done.set(i + 1);
            }
        },
        |cp| {
            let k = done.get();
            let m = open
                .open(heap(cp.image)?, fresh())
                .map_err(|e| format!("open after crash: {e}"))?;
            m.recover().map_err(|e| format!("recover: {e}"))?;
            let got = state_of(&m, &ids)?;
            let before = &states[k];
            let after = states.get(k + 1);
            let ok = if cp.end {
                got == states[ops.len()]
            } else {
                got == *before
                    || after == Some(&got)
                    || (matches!(ops.get(k), Some(CrashOp::ReplaceMany { .. }))
                        && after
                            .is_some_and(|a| between(&blocks(&got), &blocks(before), &blocks(a))))
            };
            if !ok {
                return Err(format!(
                    "after a crash in op {k} ({:?}), state is {}\nbefore: {}\nafter: {}",
                    ops.get(k),
                    describe(&got),
                    describe(before),
                    after.map_or("-".to_string(), describe)
                ));
            }
            let alloc = rebuild_alloc(&m, g, reserved)?;
            // The recovered structure must keep working: map and unmap a far block.
            let m = open
                .open(heap(cp.image)?, alloc)
                .map_err(|e| e.to_string())?;
            m.recover().map_err(|e| format!("second recover: {e}"))?;
            let far = far_and_back(&m, &ids)?;
            if far.last() != Some(&got) {
                return Err("insert + remove after recovery changed the state".into());
            }
            if nested > 0 && !cp.end && cp.index == 0 && cp.fence % nested == 0 {
                recovery_under_crash(
                    cp.image,
                    cp.fence,
                    |pm, after_recovery| {
                        let alloc = fresh();
                        let m = open.open(pm, alloc.clone()).expect("open");
                        m.recover().expect("recover");
                        rebuild_into(&alloc, &m, g, reserved).expect("recovered blocks");
                        after_recovery();
                        far_and_back(&m, &ids).expect("the far blocks");
                    },
                    |image| {
                        let m = open
                            .open(heap(image)?, fresh())
                            .map_err(|e| format!("open: {e}"))?;
                        m.recover().map_err(|e| format!("recover: {e}"))?;
                        state_of(&m, &ids)
                    },
                    &got,
                    &far[0],
                )
                .map_err(|e| format!("a crash during recovery: {e}"))?;
            }
            Ok(())
        },
    );
    match stats {
        Ok(s) => s,
        Err(f) => panic!("crash check failed: {f}"),
    }
}

/// Maps two blocks at [`FAR`] in the first file and unmaps them; returns the state with them
/// mapped and the state after.
fn far_and_back<F: FileMapping>(m: &F, ids: &[FileId]) -> Result<[State; 2], String> {
    let h = m.open_file(ids[0]).map_err(|e| e.to_string())?;
    m.insert(&h, FAR, 2, &mut Vec::new())
        .map_err(|e| format!("insert after recovery: {e}"))?;
    let mapped = state_of(m, ids)?;
    let n = m
        .remove(&h, FAR, 2)
        .map_err(|e| format!("remove after recovery: {e}"))?;
    if n != 2 {
        return Err(format!("remove after recovery freed {n} blocks"));
    }
    Ok([mapped, state_of(m, ids)?])
}

/// Explores crashes of `run` on a simulated copy of `image`: it recovers the structure
/// there, calls the function it is given once recovered, then maps and unmaps far blocks. Every crash must
/// recover (`recovered`) to `want`, what the image recovers to, or, while the far blocks may
/// be mapped, to `with_far`; to `want` once `run` has returned.
pub fn recovery_under_crash<S: PartialEq + std::fmt::Debug>(
    image: &[u8],
    seed: u64,
    run: impl Fn(&SimRegion, &dyn Fn()),
    recovered: impl Fn(&[u8]) -> Result<S, String>,
    want: &S,
    with_far: &S,
) -> Result<(), String> {
    let region = SimRegion::from_image(image).map_err(|e| e.to_string())?;
    // 0: recovering, 1: mapping or unmapping the far blocks, 2: done.
    let phase = Cell::new(0u8);
    Explorer::new(seed)
        .run(
            &region,
            |pm| {
                run(pm, &|| phase.set(1));
                phase.set(2);
            },
            |cp| {
                let got = recovered(cp.image)?;
                if got == *want || (phase.get() == 1 && !cp.end && got == *with_far) {
                    Ok(())
                } else {
                    Err(format!(
                        "in phase {} the state is {got:?}\nnot {want:?}",
                        phase.get()
                    ))
                }
            },
        )
        .map(drop)
        .map_err(|f| f.to_string())
}
