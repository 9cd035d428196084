//! HashFS under the crash simulator: a crash at any fence of an insert, remove, truncate or
//! `remove_file` — single-block CAS paths, multi-block intent paths, and inserts that run out
//! of space and roll back — leaves an image that, after `open` and `recover`, maps exactly
//! what the table mapped before the operation or after it, holds no tentative slot, and
//! loses no free slot. Every operation that returned is durable.
//!
//! The expected states come from a twin table on a heap region with the same salt: claims are
//! deterministic in a single thread, so the twin predicts every physical block.

use std::cell::RefCell;
use std::collections::BTreeMap;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion};
use pmfs_core::traits::{Extent, FileId, FileMapping};
use pmfs_mapping::hashfs::{HashFs, LBLK_LIMIT};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SLOTS: u64 = 40;
const SALT: u64 = 0x00c0_ffee;
const INOS: [u64; 3] = [1, 2, 3];
/// Every logical block the workloads touch lies below this.
const MAX_LBLK: u64 = 80;

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
    Insert(usize, u64, u64),
    Remove(usize, u64, u64),
    Truncate(usize, u64),
    RemoveFile(usize),
}

/// Random operations on three files over logical blocks 0..76: inserts of 1..=12 blocks
/// (some over mapped blocks, many running the 40-slot table full), removes and truncates.
fn workload(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let f = rng.gen_range(0..INOS.len());
            let lblk = rng.gen_range(0..64);
            match rng.gen_range(0..10) {
                0..=4 => Op::Insert(f, lblk, rng.gen_range(1..=12)),
                5..=7 => Op::Remove(f, lblk, rng.gen_range(1..=10)),
                8 => Op::Truncate(f, lblk),
                _ => Op::RemoveFile(f),
            }
        })
        .collect()
}

type State = BTreeMap<(u64, u64), u64>;

/// The mapping as seen by a whole-table scan, checked against one lookup per block (which
/// walks each block's probe sequence): a cut chain shows up as a difference.
fn state<M: Media>(t: &HashFs<M>) -> Result<State, String> {
    let scanned = scanned_state(t)?;
    let mut walked = State::new();
    for ino in INOS {
        let f = t
            .open_file(FileId {
                ino,
                root: PmOff(0),
            })
            .map_err(|e| e.to_string())?;
        for l in 0..MAX_LBLK {
            let mut runs = Vec::new();
            t.lookup(&f, l, 1, &mut runs)
                .map_err(|e| format!("lookup: {e}"))?;
            for r in runs {
                walked.insert((ino, r.lblk), r.pblk.0);
            }
        }
    }
    if walked != scanned {
        return Err(format!(
            "probe walks see {walked:?}\nbut the table holds {scanned:?}"
        ));
    }
    Ok(scanned)
}

fn scanned_state<M: Media>(t: &HashFs<M>) -> Result<State, String> {
    let mut s = State::new();
    for ino in INOS {
        let f = t
            .open_file(FileId {
                ino,
                root: PmOff(0),
            })
            .map_err(|e| e.to_string())?;
        let mut runs = Vec::new();
        t.lookup(&f, 0, LBLK_LIMIT, &mut runs)
            .map_err(|e| format!("lookup: {e}"))?;
        for r in runs {
            for k in 0..r.len {
                s.insert((ino, r.lblk + k), r.pblk.0 + k);
            }
        }
    }
    Ok(s)
}

/// Applies `op`; returns the outcome as text so subject and twin can be compared.
fn apply<M: Media>(t: &HashFs<M>, op: Op) -> String {
    let file = |i: usize| {
        t.open_file(FileId {
            ino: INOS[i],
            root: PmOff(0),
        })
        .expect("open_file")
    };
    let r = match op {
        Op::Insert(f, l, n) => t.insert(&file(f), l, n, &mut Vec::new()).map(|()| 0),
        Op::Remove(f, l, n) => t.remove(&file(f), l, n),
        Op::Truncate(f, l) => t.remove(&file(f), l, u64::MAX - l),
        Op::RemoveFile(f) => t.remove_file(&file(f)).map(|()| 0),
    };
    format!("{r:?}")
}

/// Opens and recovers a crash image; the recovered table must be clean.
fn recovered(image: &[u8]) -> Result<State, String> {
    let region = HeapRegion::from_image(image).map_err(|e| e.to_string())?;
    let t = HashFs::open(&region, meta(), data()).map_err(|e| format!("open: {e}"))?;
    t.recover().map_err(|e| format!("recover: {e}"))?;
    let s = state(&t)?;
    let occ = t.occupancy().map_err(|e| e.to_string())?;
    if occ.tentative != 0 || occ.committed != s.len() as u64 {
        return Err(format!(
            "unclean table after recovery: {occ:?}, {} mapped",
            s.len()
        ));
    }
    t.recover().map_err(|e| format!("second recover: {e}"))?;
    let again = state(&t)?;
    if again != s {
        return Err(format!("a second recovery changed {s:?} into {again:?}"));
    }
    Ok(s)
}

fn check_ops(seed: u64, ops: &[Op], prefixes: bool) {
    let region = SimRegion::new(region_bytes()).expect("sim region");
    HashFs::format_with_salt(&region, meta(), data(), SALT).expect("format");
    region.persist_all();
    let twin_region = HeapRegion::new(region_bytes()).expect("heap region");
    let twin = HashFs::format_with_salt(&twin_region, meta(), data(), SALT).expect("twin");
    let window = RefCell::new((State::new(), State::new()));
    let result = Explorer::new(seed).store_prefixes(prefixes).run(
        &region,
        |pm| {
            let t = HashFs::open(pm, meta(), data()).expect("open");
            for &op in ops {
                let before = scanned_state(&twin).expect("twin state");
                let want = apply(&twin, op);
                *window.borrow_mut() = (before, scanned_state(&twin).expect("twin state"));
                let got = apply(&t, op);
                assert_eq!(got, want, "{op:?} differs from the twin");
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
fn hashfs_operations_are_all_or_nothing_and_durable() {
    for seed in 0..3 {
        check_ops(seed, &workload(seed, 40), false);
    }
}

#[test]
fn hashfs_operations_are_all_or_nothing_with_store_prefixes() {
    check_ops(77, &workload(77, 30), true);
}

#[test]
fn the_checker_rejects_two_slots_committed_without_an_intent() {
    // Harness check: committing two slots with plain stores and one fence (no intent record)
    // must produce an image with only one of them, which the checker rejects.
    let region = SimRegion::new(region_bytes()).expect("sim region");
    let t = HashFs::format_with_salt(&region, meta(), data(), SALT).expect("format");
    region.persist_all();
    let table = (meta().start + 2).offset();
    let torn = Explorer::new(3).run(
        &region,
        |pm| {
            // Logical blocks whose home slots lie in different cache lines.
            let mut picked: Vec<(u64, u64)> = Vec::new();
            for l in 0..64 {
                let h = t.home_of(1, l);
                if picked.iter().all(|&(_, p)| p / 8 != h / 8) {
                    picked.push((l, h));
                }
            }
            for &(l, h) in &picked[..2] {
                let committed = l | (1 << 32) | (3 << 61);
                pm.store_u64(table + 8 * h, committed).unwrap();
                pm.flush(table + 8 * h, 8).unwrap();
            }
            pm.fence();
        },
        |cp| {
            let got = recovered(cp.image)?;
            if got.len() == 1 {
                Err(format!("torn: {got:?}"))
            } else {
                Ok(())
            }
        },
    );
    assert!(
        torn.is_err(),
        "two unordered slot stores must be able to tear"
    );
}

#[test]
fn purging_tombstones_never_cuts_a_chain_at_any_crash_point() {
    // Build a table full of tombstones between live entries, then purge under the explorer.
    // Images are checked *without* recovery: the purge must be safe on its own.
    let region = SimRegion::new(region_bytes()).expect("sim region");
    let t = HashFs::format_with_salt(&region, meta(), data(), SALT).expect("format");
    let files: Vec<_> = INOS
        .iter()
        .map(|&ino| {
            t.open_file(FileId {
                ino,
                root: PmOff(0),
            })
            .unwrap()
        })
        .collect();
    t.insert(&files[0], 0, 30, &mut Vec::new()).expect("insert");
    t.insert(&files[1], 0, 6, &mut Vec::new()).expect("insert");
    for l in (0..30).step_by(2) {
        t.remove(&files[0], l, 1).expect("remove");
    }
    // Remove more blocks until some tombstone directly precedes an empty slot (a trial purge
    // on a copy of the image tells), keeping live entries behind other tombstones.
    let purgeable = || {
        let copy = HeapRegion::from_image(&region.image()).expect("copy");
        let mut trial = HashFs::open(&copy, meta(), data()).expect("open copy");
        trial.purge_tombstones().expect("trial purge")
    };
    let mut victims = (0..6)
        .map(|l| (1, l))
        .chain((1..30).rev().step_by(2).map(|l| (0, l)));
    while purgeable() == 0 {
        let (f, l) = victims
            .next()
            .expect("some removal makes a tombstone purgeable");
        t.remove(&files[f], l, 1).expect("remove");
    }
    assert!(
        victims.count() > 4,
        "the setup emptied too much of the table"
    );
    let want = state(&t).expect("state");
    let tombstones = t.occupancy().expect("occupancy").tombstones;
    assert!(tombstones > 5, "only {tombstones} tombstones to purge");
    region.persist_all();
    let result = Explorer::new(11).run(
        &region,
        |pm| {
            let mut t = HashFs::open(pm, meta(), data()).expect("open");
            let purged = t.purge_tombstones().expect("purge");
            assert!(purged > 0);
        },
        |cp| {
            let r = HeapRegion::from_image(cp.image).map_err(|e| e.to_string())?;
            let t = HashFs::open(&r, meta(), data()).map_err(|e| format!("open: {e}"))?;
            let got = state(&t)?;
            if got == want {
                Ok(())
            } else {
                Err(format!("purge changed the mapping: {got:?}\nwant {want:?}"))
            }
        },
    );
    if let Err(f) = result {
        panic!("{f}");
    }
}
