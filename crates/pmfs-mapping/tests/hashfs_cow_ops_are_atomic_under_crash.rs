//! HashFS copy-on-write operations under the crash simulator. A crash at any fence of
//! - `stage` or `unstage` (not atomic by design) leaves the mapping unchanged and a set of
//!   staged slots between the states before and after the call;
//! - `sweep_staged` likewise (every slot it has not swept yet is still staged);
//! - a `remove` leaves the state before or after it;
//! - the data path's apply of a staged run (`remove` of the run's range, then `insert_at`,
//!   multi-slot runs included) leaves the state before the apply, after its remove, or after
//!   it, never a half-promoted run; and re-applying it the way the data path does after a
//!   crash (skip if the run is mapped exactly, else remove and `insert_at`) always reaches the
//!   state after it.
//!
//! A crash during a log-block allocation or free leaves the file's log blocks as they were
//! before or after the call, each under its own key, and no tentative slot.
//!
//! Recovery keeps staged slots (the data path still has to replay its logs), leaves no
//! tentative slot, and a `sweep_staged` afterwards drops exactly the staged slots.
//! The expected states come from a twin table on a heap region with the same salt.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion};
use pmfs_core::traits::{AllocHint, BlockAllocator, Extent, FileId, FileMapping, Run};
use pmfs_mapping::hashfs::slot::Slot;
use pmfs_mapping::hashfs::{HashFs, LBLK_LIMIT, LOG_LBLK_END, LOG_LBLK_FIRST};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SLOTS: u64 = 48;
const SALT: u64 = 0x5eed_c0de;
const INOS: [u64; 2] = [1, 2];

fn meta() -> Extent {
    Extent::new(BlockNo(0), HashFs::<HeapRegion>::meta_blocks(SLOTS))
}

fn data() -> Extent {
    Extent::new(meta().end(), SLOTS)
}

fn region_bytes() -> u64 {
    data().end().0 * BLOCK_SIZE
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Stage(usize, u64, u64),
    Apply(usize),
    Unstage(usize),
    Remove(usize, u64, u64),
    Sweep,
}

fn workload(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let f = rng.gen_range(0..INOS.len());
            match rng.gen_range(0..20) {
                0..=6 => Op::Stage(f, rng.gen_range(0..24), rng.gen_range(1..=6)),
                7..=14 => Op::Apply(f),
                15..=16 => Op::Unstage(f),
                17..=18 => Op::Remove(f, rng.gen_range(0..24), rng.gen_range(1..=6)),
                _ => Op::Sweep,
            }
        })
        .collect()
}

/// Mapped blocks `(ino, lblk) -> pblk` and staged slots `(slot, ino, lblk)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct State {
    mapped: BTreeMap<(u64, u64), u64>,
    staged: BTreeSet<(u64, u64, u64)>,
}

fn file<M: Media>(t: &HashFs<M>, i: usize) -> pmfs_mapping::hashfs::HashFsFile {
    t.open_file(FileId {
        ino: INOS[i],
        root: PmOff(0),
    })
    .expect("open_file")
}

fn state<M: Media>(t: &HashFs<M>) -> Result<State, String> {
    let mut s = State::default();
    for (i, &ino) in INOS.iter().enumerate() {
        let f = file(t, i);
        let mut runs = Vec::new();
        t.lookup(&f, 0, LBLK_LIMIT, &mut runs)
            .map_err(|e| format!("lookup: {e}"))?;
        for r in runs {
            for k in 0..r.len {
                s.mapped.insert((ino, r.lblk + k), r.pblk.0 + k);
            }
        }
    }
    let table = (meta().start + 2).offset();
    for i in 0..SLOTS {
        let w = t
            .media()
            .load_u64(table + 8 * i)
            .map_err(|e| e.to_string())?;
        match Slot::decode(w) {
            Some(Slot::Staged(k)) => {
                s.staged.insert((i, k.ino, k.lblk));
            }
            Some(Slot::Tentative(k)) => return Err(format!("tentative slot {i}: {k:?}")),
            Some(_) => {}
            None => return Err(format!("corrupt slot {i}: {w:#x}")),
        }
    }
    Ok(s)
}

/// The data path's apply of a staged run: skip if mapped exactly, else remove and insert_at.
/// Returns the state after the remove (what a crash between the two calls may leave).
fn apply_run<M: Media>(t: &HashFs<M>, i: usize, run: Run) -> Result<(), String> {
    let f = file(t, i);
    let mut now = Vec::new();
    t.lookup(&f, run.lblk, run.len, &mut now)
        .map_err(|e| e.to_string())?;
    if now == [run] {
        return Ok(());
    }
    t.remove(&f, run.lblk, run.len).map_err(|e| e.to_string())?;
    t.insert_at(&f, run).map_err(|e| e.to_string())
}

/// Staged runs per file, oldest first (from the twin; the subject must agree).
type Pending = [Vec<Run>; INOS.len()];

/// Runs `op` on `t`; returns its outcome as text and the runs it staged.
fn run_op<M: Media>(t: &HashFs<M>, op: Op, pending: &Pending) -> (String, Vec<Run>) {
    let mut out = Vec::new();
    let text = match op {
        Op::Stage(i, l, n) => {
            let r = t.stage(&file(t, i), l, n, &mut out);
            format!("{r:?} {out:?}")
        }
        Op::Apply(i) => match pending[i].first() {
            Some(&run) => format!("{:?}", apply_run(t, i, run)),
            None => "nothing staged".into(),
        },
        Op::Unstage(i) => match pending[i].last() {
            Some(&run) => format!("{:?}", t.unstage(&[run])),
            None => "nothing staged".into(),
        },
        Op::Remove(i, l, n) => format!("{:?}", t.remove(&file(t, i), l, n)),
        Op::Sweep => format!("{:?}", t.sweep_staged()),
    };
    (text, out)
}

/// What a crash during an operation may leave (before recovery's effects).
#[derive(Clone, Debug, Default)]
struct Window {
    op: Option<Op>,
    before: State,
    mid: State,
    after: State,
    run: Option<(usize, Run)>,
}

fn recovered(image: &[u8], w: &Window) -> Result<(), String> {
    let region = HeapRegion::from_image(image).map_err(|e| e.to_string())?;
    let t = HashFs::open(&region, meta(), data()).map_err(|e| format!("open: {e}"))?;
    t.recover().map_err(|e| format!("recover: {e}"))?;
    let got = state(&t)?;
    let occ = t.occupancy().map_err(|e| e.to_string())?;
    if occ.committed != got.mapped.len() as u64 || occ.staged != got.staged.len() as u64 {
        return Err(format!("unclean table after recovery: {occ:?}, {got:?}"));
    }
    let (b, a) = (&w.before, &w.after);
    match w.op {
        Some(Op::Stage(..) | Op::Unstage(_) | Op::Sweep) => {
            let between = got
                .staged
                .iter()
                .all(|s| b.staged.contains(s) || a.staged.contains(s))
                && b.staged
                    .intersection(&a.staged)
                    .all(|s| got.staged.contains(s));
            if got.mapped != b.mapped || !between {
                return Err(format!("got {got:?}\nbefore {b:?}\nafter {a:?}"));
            }
        }
        Some(Op::Apply(_)) => {
            if got != *b && got != w.mid && got != *a {
                return Err(format!(
                    "half-applied run: {got:?}\nbefore {b:?}\nmid {:?}\nafter {a:?}",
                    w.mid
                ));
            }
            if let Some((i, run)) = w.run {
                apply_run(&t, i, run).map_err(|e| format!("re-apply: {e}"))?;
                let again = state(&t)?;
                if again != *a {
                    return Err(format!("re-apply reached {again:?}\nwant {a:?}"));
                }
            }
        }
        Some(Op::Remove(..)) | None => {
            if got != *b && got != *a {
                return Err(format!("got {got:?}\nbefore {b:?}\nafter {a:?}"));
            }
        }
    }
    let now = state(&t)?;
    let staged = t.sweep_staged().map_err(|e| format!("sweep: {e}"))?;
    let swept = state(&t)?;
    if staged != now.staged.len() as u64 || !swept.staged.is_empty() || swept.mapped != now.mapped {
        return Err(format!("sweep after recovery: {staged} swept, {swept:?}"));
    }
    Ok(())
}

/// Runs `ops` under the explorer; returns how many staged runs were applied, and how many of
/// them had several blocks.
fn check(seed: u64, ops: &[Op], prefixes: bool) -> (u32, u32) {
    let region = SimRegion::new(region_bytes()).expect("sim region");
    HashFs::format_with_salt(&region, meta(), data(), SALT).expect("format");
    region.persist_all();
    let twin_region = HeapRegion::new(region_bytes()).expect("heap region");
    let twin = HashFs::format_with_salt(&twin_region, meta(), data(), SALT).expect("twin");
    let window = RefCell::new(Window::default());
    let (mut applied, mut multi) = (0, 0);
    let result = Explorer::new(seed).store_prefixes(prefixes).run(
        &region,
        |pm| {
            let t = HashFs::open(pm, meta(), data()).expect("open");
            let mut pending: Pending = Default::default();
            for &op in ops {
                let before = state(&twin).expect("twin state");
                let mut mid = before.clone();
                let mut run = None;
                if let Op::Apply(i) = op
                    && let Some(&r) = pending[i].first()
                {
                    // The state after the apply's remove: the run's range unmapped.
                    mid.mapped.retain(|&(ino, l), _| {
                        ino != INOS[i] || !(r.lblk..r.lblk + r.len).contains(&l)
                    });
                    run = Some((i, r));
                }
                let (want, staged) = run_op(&twin, op, &pending);
                let after = state(&twin).expect("twin state");
                *window.borrow_mut() = Window {
                    op: Some(op),
                    before,
                    mid,
                    after: after.clone(),
                    run,
                };
                let (got, _) = run_op(&t, op, &pending);
                assert_eq!(got, want, "{op:?} differs from the twin");
                match op {
                    Op::Stage(i, ..) => pending[i].extend(staged),
                    Op::Apply(i) => {
                        if !pending[i].is_empty() {
                            let r = pending[i].remove(0);
                            multi += u32::from(r.len > 1);
                            applied += 1;
                        }
                    }
                    Op::Unstage(i) => {
                        pending[i].pop();
                    }
                    Op::Sweep => pending = Default::default(),
                    Op::Remove(..) => {}
                }
                *window.borrow_mut() = Window {
                    before: after.clone(),
                    after,
                    ..Window::default()
                };
            }
        },
        |cp| recovered(cp.image, &window.borrow()),
    );
    if let Err(f) = result {
        panic!("{f}");
    }
    assert!(
        applied > 3,
        "the workload applied only {applied} staged runs"
    );
    (applied, multi)
}

#[test]
fn cow_operations_are_atomic_or_resumable_under_crash() {
    let multi: u32 = (0..3)
        .map(|seed| check(seed, &workload(seed, 40), false).1)
        .sum();
    assert!(multi > 0, "no multi-block run was applied");
}

#[test]
fn cow_operations_with_store_prefixes() {
    check(41, &workload(41, 30), true);
}

#[test]
fn a_multi_slot_promote_over_an_old_version_is_atomic_under_crash() {
    // File 2 maps blocks 0..4; file 1 fills the rest of the table. Freeing four adjacent
    // slots of file 1 can make a stage of 0..4 land there as one physically contiguous run.
    let mut found = None;
    // Windows that straddle a cache line of the slot table, so the four flips reach PM in
    // two lines that a crash can separate.
    for window in (0..SLOTS - 4).filter(|w| w % 8 > 4) {
        let r = SimRegion::new(region_bytes()).expect("sim region");
        let t = HashFs::format_with_salt(&r, meta(), data(), SALT).expect("format");
        let (one, two) = (file(&t, 0), file(&t, 1));
        t.insert(&two, 0, 4, &mut Vec::new()).expect("old version");
        t.insert(&one, 0, SLOTS - 4, &mut Vec::new()).expect("fill");
        let mut victims = Vec::new();
        let mut runs = Vec::new();
        t.lookup(&one, 0, SLOTS, &mut runs).expect("lookup");
        for r in runs {
            for k in 0..r.len {
                let slot = r.pblk.0 + k - data().start.0;
                if (window..window + 4).contains(&slot) {
                    victims.push(r.lblk + k);
                }
            }
        }
        if victims.len() != 4 {
            continue;
        }
        for l in victims {
            t.remove(&one, l, 1).expect("remove");
        }
        let mut staged = Vec::new();
        t.stage(&two, 0, 4, &mut staged).expect("stage");
        if staged.len() == 1 {
            r.persist_all();
            found = Some((r, staged[0]));
            break;
        }
    }
    let (region, run) = found.expect("some window gives a contiguous run");
    assert_eq!(run.len, 4);
    let twin_region = HeapRegion::from_image(&region.image()).expect("twin");
    let twin = HashFs::open(&twin_region, meta(), data()).expect("twin");
    let before = state(&twin).expect("state");
    let mut mid = before.clone();
    mid.mapped.retain(|&(ino, _), _| ino != INOS[1]);
    apply_run(&twin, 1, run).expect("twin apply");
    let w = Window {
        op: Some(Op::Apply(1)),
        before,
        mid,
        after: state(&twin).expect("state"),
        run: Some((1, run)),
    };
    assert!(w.after.staged.is_empty() && w.after.mapped.len() == SLOTS as usize - 4);
    let result = Explorer::new(5).store_prefixes(true).run(
        &region,
        |pm| {
            let t = HashFs::open(pm, meta(), data()).expect("open");
            apply_run(&t, 1, run).expect("apply");
        },
        |cp| recovered(cp.image, &w),
    );
    if let Err(f) = result {
        panic!("{f}");
    }
}

/// The log blocks of inode `ino` in a table: slot index by key.
fn log_blocks_of<M: Media>(t: &HashFs<M>, ino: u64) -> Result<BTreeMap<u64, u64>, String> {
    let table = (meta().start + 2).offset();
    let mut out = BTreeMap::new();
    for i in 0..SLOTS {
        let w = t
            .media()
            .load_u64(table + 8 * i)
            .map_err(|e| e.to_string())?;
        match Slot::decode(w) {
            Some(Slot::Committed(k)) if k.ino == ino => {
                if !(LOG_LBLK_FIRST..LOG_LBLK_END).contains(&k.lblk) {
                    return Err(format!("slot {i} maps data block {}", k.lblk));
                }
                if out.insert(k.lblk, i).is_some() {
                    return Err(format!("log key {} held twice", k.lblk));
                }
            }
            Some(Slot::Tentative(k)) => return Err(format!("tentative slot {i}: {k:?}")),
            _ => {}
        }
    }
    Ok(out)
}

#[test]
fn log_block_allocations_and_frees_are_atomic_under_crash() {
    // Each allocation either happened (one more log block, uniquely keyed) or left nothing;
    // each free either happened or not.
    let region = SimRegion::new(region_bytes()).expect("sim region");
    HashFs::format_with_salt(&region, meta(), data(), SALT).expect("format");
    region.persist_all();
    // (log blocks before the call, the block a free gives back)
    let window = RefCell::new((BTreeSet::new(), None::<u64>));
    let result = Explorer::new(8).run(
        &region,
        |pm| {
            let t = Arc::new(HashFs::open(pm, meta(), data()).expect("open"));
            let logs = t.log_blocks(3);
            let mut held = BTreeSet::new();
            for round in 0..12 {
                *window.borrow_mut() = (held.clone(), None);
                if round % 3 == 2 {
                    let b = *held.iter().next().expect("a held block");
                    window.borrow_mut().1 = Some(b);
                    logs.free(Extent::new(BlockNo(b), 1)).expect("free");
                    held.remove(&b);
                } else {
                    let e = logs.alloc(1, AllocHint::metadata()).expect("alloc");
                    held.insert(e.start.0);
                }
            }
        },
        |cp| {
            let r = HeapRegion::from_image(cp.image).map_err(|e| e.to_string())?;
            let t = HashFs::open(&r, meta(), data()).map_err(|e| format!("open: {e}"))?;
            t.recover().map_err(|e| format!("recover: {e}"))?;
            let got: BTreeSet<u64> = log_blocks_of(&t, 3)?
                .values()
                .map(|i| data().start.0 + i)
                .collect();
            let (before, freed) = &*window.borrow();
            let ok = match freed {
                Some(b) => {
                    let mut after = before.clone();
                    after.remove(b);
                    got == *before || got == after
                }
                None => got.is_superset(before) && got.len() <= before.len() + 1,
            };
            if ok {
                Ok(())
            } else {
                Err(format!("log blocks {got:?}, before the call {before:?}"))
            }
        },
    );
    if let Err(f) = result {
        panic!("{f}");
    }
}
