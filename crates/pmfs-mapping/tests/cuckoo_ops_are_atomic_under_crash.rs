//! The global cuckoo table under the crash simulator: a crash at any fence of an insert,
//! remove, truncate or `remove_file` — including inserts that displace other files' entries
//! through chains of moves, and cuts through the middle of ranged runs — leaves an image that,
//! after `open` and `recover`, maps exactly what the table mapped before the operation or after
//! it, and passes `verify` (no duplicate left by a half-done move, run fields consistent).
//! Every operation that returned is durable. The same holds for `insert_at` of blocks the
//! caller took from the table's allocator, alone, as the remove-then-`insert_at` of a
//! copy-on-write apply, and for runs longer than a ranged entry allows (split inside).
//! `replace_many` of fresh blocks may stop after any of its blocks (its contract): every
//! block it changes maps its old block, its new one or (inside a run that was not mapped
//! whole) none in a recovered image, and nothing else changes.
//!
//! An insert that finds no room leaves the table as it was. In one run of the main workload,
//! every eighth crash point's recovery is crashed as well, with an insert and a remove right after it: each such crash
//! recovers to the state the first one did (with the inserted blocks while they may be
//! mapped). A format, over garbage, is durable on return.
//!
//! The table starts 75% full so that inserts displace entries. The expected states come from
//! a twin table on a heap region with the same salt and an allocator in the same state.

mod tree_common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion};
use pmfs_core::traits::{
    AllocHint, BlockAllocator, Extent, FileId, FileMapping, Run, SimpleAllocator,
};
use pmfs_mapping::cuckoo::CuckooMapping;
use pmfs_mapping::cuckoo::bucket::RUN_MAX;
use pmfs_mapping::hashfs::LBLK_LIMIT;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tree_common::{between, fresh_runs, recovery_under_crash};

const SALT: u64 = 0xbeef;
const INOS: [u64; 4] = [1, 2, 3, 4];
/// Data blocks live outside the region: the table never touches them.
const DATA: u64 = 100_000;
const DATA_LEN: u64 = 5000;
/// How often `cuckoo_recoveries_are_atomic_under_crash` crashes a recovery as well: at every
/// 8th crash point.
const NESTED: u64 = 8;
/// A logical block no workload maps, which the insert after a recovery maps.
const FAR: u64 = 1000;

/// 64 buckets: 192 entries.
fn meta() -> Extent {
    Extent::new(BlockNo(0), 4)
}

/// 384 buckets: 1152 entries, room for a run longer than [`RUN_MAX`].
fn big_meta() -> Extent {
    Extent::new(BlockNo(0), 9)
}

fn alloc() -> Arc<SimpleAllocator> {
    Arc::new(SimpleAllocator::new(BlockNo(DATA), DATA_LEN))
}

type Table<M> = CuckooMapping<M, SimpleAllocator>;

#[derive(Clone, Copy, Debug)]
enum Op {
    Insert(usize, u64, u64),
    /// One extent of up to `len` blocks from the table's allocator, then `insert_at` of it
    /// (the extent goes back if that fails).
    InsertAt(usize, u64, u64),
    Remove(usize, u64, u64),
    Truncate(usize, u64),
    RemoveFile(usize),
    /// `replace_many` of `count` runs of `len` fresh blocks from the table's allocator at
    /// `lblk`, `lblk + stride`, … (the blocks go back if it fails).
    ReplaceMany {
        file: usize,
        lblk: u64,
        len: u64,
        stride: u64,
        count: u64,
    },
}

/// 144 entries in 192 ways: file 4 gets blocks 0..144 inserted one by one (so its blocks are
/// single-block runs spread over all buckets, and allocation gaps break physical contiguity).
fn setup<M: Media>(t: &Table<M>) {
    let f = t
        .open_file(FileId {
            ino: 4,
            root: PmOff(0),
        })
        .expect("open");
    for l in 0..144 {
        t.insert(&f, l * 2, 1, &mut Vec::new())
            .expect("setup insert");
    }
}

/// Random operations on files 1..3 over logical blocks 0..40 where blocks are mapped with
/// `insert_at`: alone (1..=10 blocks, over mapped blocks, then refused, or into holes) or as
/// a copy-on-write overwrite (remove, then `insert_at` of the same range), mixed with inserts
/// and truncates. Files 1 and 2 start with blocks 0..8 mapped.
fn cow_workload(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut ops = vec![Op::Insert(0, 0, 8), Op::Insert(1, 0, 8)];
    while ops.len() < n {
        let f = rng.gen_range(0..3);
        let lblk = rng.gen_range(0..40);
        let len = rng.gen_range(1..=10);
        match rng.gen_range(0..10) {
            0..=3 => ops.push(Op::InsertAt(f, rng.gen_range(0..12), len)),
            4..=7 => ops.extend([Op::Remove(f, lblk, len), Op::InsertAt(f, lblk, len)]),
            8 => ops.push(Op::Insert(f, lblk, len)),
            _ => ops.push(Op::Truncate(f, lblk)),
        }
    }
    ops
}

/// Random operations on files 1..3 over logical blocks 0..40, inserts of 1..=10 blocks.
fn workload(seed: u64, n: usize) -> Vec<Op> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let f = rng.gen_range(0..3);
            let lblk = rng.gen_range(0..40);
            match rng.gen_range(0..10) {
                0..=4 => Op::Insert(f, lblk, rng.gen_range(1..=10)),
                5..=7 => Op::Remove(f, lblk, rng.gen_range(1..=8)),
                8 => Op::Truncate(f, lblk),
                _ => Op::RemoveFile(f),
            }
        })
        .collect()
}

type State = BTreeMap<(u64, u64), u64>;

fn state<M: Media>(t: &Table<M>) -> Result<State, String> {
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

fn apply<M: Media>(t: &Table<M>, op: Op) -> String {
    let file = |i: usize| {
        t.open_file(FileId {
            ino: INOS[i],
            root: PmOff(0),
        })
        .expect("open_file")
    };
    let r = match op {
        Op::Insert(f, l, n) => t.insert(&file(f), l, n, &mut Vec::new()).map(|()| 0),
        Op::InsertAt(f, l, n) => t.allocator().alloc(n, AllocHint::default()).and_then(|e| {
            let run = Run {
                lblk: l,
                pblk: e.start,
                len: e.len,
            };
            t.insert_at(&file(f), run).map(|()| 0).or_else(|err| {
                t.allocator().free(e)?;
                Err(err)
            })
        }),
        Op::Remove(f, l, n) => t.remove(&file(f), l, n),
        Op::Truncate(f, l) => t.remove(&file(f), l, u64::MAX - l),
        Op::RemoveFile(f) => t.remove_file(&file(f)).map(|()| 0),
        Op::ReplaceMany {
            file: f,
            lblk,
            len,
            stride,
            count,
        } => {
            let runs =
                fresh_runs(&**t.allocator(), lblk, len, stride, count).expect("fresh blocks");
            t.replace_many(&file(f), &runs)
        }
    };
    format!("{r:?}")
}

fn recovered(image: &[u8], meta: Extent) -> Result<State, String> {
    let region = HeapRegion::from_image(image).map_err(|e| e.to_string())?;
    let t = CuckooMapping::open(&region, meta, alloc()).map_err(|e| format!("open: {e}"))?;
    t.recover().map_err(|e| format!("recover: {e}"))?;
    let entries = t.verify().map_err(|e| format!("verify: {e}"))?;
    let s = state(&t)?;
    if entries != s.len() as u64 {
        return Err(format!("{entries} entries but {} mapped blocks", s.len()));
    }
    Ok(s)
}

fn check_ops(seed: u64, ops: &[Op], prefixes: bool) -> Vec<String> {
    check_ops_in(meta(), seed, ops, prefixes, 0)
}

/// [`check_ops`] on a table whose meta area is `meta`, crashing the recovery of every
/// `nested`-th crash point as well (none if 0). Returns the operations' results.
fn check_ops_in(meta: Extent, seed: u64, ops: &[Op], prefixes: bool, nested: u64) -> Vec<String> {
    let region = SimRegion::new(meta.len * BLOCK_SIZE).expect("sim region");
    let sim_alloc = alloc();
    let t =
        CuckooMapping::format_with_salt(&region, meta, sim_alloc.clone(), SALT).expect("format");
    setup(&t);
    drop(t);
    region.persist_all();
    let twin_region = HeapRegion::new(meta.len * BLOCK_SIZE).expect("heap region");
    let twin = CuckooMapping::format_with_salt(&twin_region, meta, alloc(), SALT).expect("twin");
    setup(&twin);
    let window = RefCell::new((State::new(), State::new(), false));
    let mut results = Vec::new();
    let result = Explorer::new(seed).store_prefixes(prefixes).run(
        &region,
        |pm| {
            let t = CuckooMapping::open(pm, meta, sim_alloc).expect("open");
            for &op in ops {
                let before = state(&twin).expect("twin state");
                let want = apply(&twin, op);
                let many = matches!(op, Op::ReplaceMany { .. });
                *window.borrow_mut() = (before, state(&twin).expect("twin state"), many);
                let got = apply(&t, op);
                assert_eq!(got, want, "{op:?} differs from the twin");
                results.push(got);
                let after = window.borrow().1.clone();
                *window.borrow_mut() = (after.clone(), after, false);
            }
        },
        |cp| {
            let got = recovered(cp.image, meta)?;
            let (before, after, many) = &*window.borrow();
            if !(got == *before || got == *after || (*many && between(&got, before, after))) {
                return Err(format!(
                    "recovered {got:?}\nbefore the operation: {before:?}\nafter it: {after:?}"
                ));
            }
            if nested > 0 && !cp.end && cp.index == 0 && cp.fence % nested == 0 {
                let with_far = {
                    let region = HeapRegion::from_image(cp.image).map_err(|e| e.to_string())?;
                    let t =
                        CuckooMapping::open(&region, meta, alloc()).map_err(|e| e.to_string())?;
                    t.recover().map_err(|e| e.to_string())?;
                    far_and_back(&t)?
                };
                recovery_under_crash(
                    cp.image,
                    cp.fence,
                    |pm, after_recovery| {
                        let t = CuckooMapping::open(pm, meta, alloc()).expect("open");
                        t.recover().expect("recover");
                        after_recovery();
                        far_and_back(&t).expect("the far blocks");
                    },
                    |image| recovered(image, meta),
                    &got,
                    &with_far,
                )
                .map_err(|e| format!("a crash during recovery: {e}"))?;
            }
            Ok(())
        },
    );
    if let Err(f) = result {
        panic!("{f}");
    }
    results
}

/// Inserts two blocks at [`FAR`] in the first file and removes them (an insert that finds
/// no room changes nothing); returns the state in between. The table's allocator must be
/// fresh: it first learns the blocks the table maps.
fn far_and_back<M: Media>(t: &Table<M>) -> Result<State, String> {
    let mapped = state(t)?
        .into_values()
        .map(|pblk| Extent::new(BlockNo(pblk), 1));
    t.allocator()
        .rebuild(&mut mapped.collect::<Vec<_>>().into_iter())
        .map_err(|e| format!("mapped blocks do not rebuild an allocator: {e}"))?;
    let f = t
        .open_file(FileId {
            ino: INOS[0],
            root: PmOff(0),
        })
        .map_err(|e| e.to_string())?;
    match t.insert(&f, FAR, 2, &mut Vec::new()) {
        Ok(()) | Err(pmfs_core::Error::NoSpace) => {}
        Err(e) => return Err(format!("insert after recovery: {e}")),
    }
    let mapped = state(t)?;
    t.remove(&f, FAR, 2)
        .map_err(|e| format!("remove after recovery: {e}"))?;
    Ok(mapped)
}

/// How many `insert_at`s of `ops` mapped their blocks and how many were refused as overlapping.
fn insert_at_outcomes(ops: &[Op], results: &[String]) -> (usize, usize) {
    let at: Vec<&String> = ops
        .iter()
        .zip(results)
        .filter(|(op, _)| matches!(op, Op::InsertAt(..)))
        .map(|(_, r)| r)
        .collect();
    let mapped = at.iter().filter(|r| r.as_str() == "Ok(0)").count();
    let refused = at.iter().filter(|r| r.contains("InvalidArgument")).count();
    (mapped, refused)
}

#[test]
fn cuckoo_operations_are_all_or_nothing_and_durable() {
    for seed in 0..2 {
        check_ops(seed, &workload(seed, 24), false);
    }
}

#[test]
fn cuckoo_recoveries_are_atomic_under_crash() {
    check_ops_in(meta(), 0, &workload(0, 24), false, NESTED);
}

#[test]
fn cuckoo_operations_are_all_or_nothing_with_store_prefixes() {
    check_ops(41, &workload(41, 14), true);
}

#[test]
fn cuckoo_insert_at_and_copy_on_write_overwrites_are_all_or_nothing() {
    for (seed, n, prefixes) in [(7, 16, false), (9, 10, true)] {
        let ops = cow_workload(seed, n);
        let results = check_ops(seed, &ops, prefixes);
        let (mapped, refused) = insert_at_outcomes(&ops, &results);
        assert!(
            mapped >= 3 && refused >= 1,
            "{mapped} mapped, {refused} refused"
        );
    }
}

#[test]
fn cuckoo_insert_at_of_runs_longer_than_an_entry_allows_is_all_or_nothing() {
    let ops = [
        Op::InsertAt(0, 0, RUN_MAX + 40), // two ranged runs
        Op::Remove(0, RUN_MAX - 10, 20),  // cuts across their boundary
        Op::InsertAt(0, RUN_MAX - 10, 20),
        Op::InsertAt(0, 3, 2), // over mapped blocks: refused
    ];
    let results = check_ops_in(big_meta(), 21, &ops, false, 0);
    assert_eq!(insert_at_outcomes(&ops, &results), (2, 1), "{results:?}");
}

#[test]
fn cuckoo_replace_many_in_place_keeps_every_block_old_or_new() {
    let many = |file, lblk, len, stride, count| Op::ReplaceMany {
        file,
        lblk,
        len,
        stride,
        count,
    };
    let ops = [
        Op::Insert(0, 0, 24),
        many(0, 1, 1, 3, 6),  // single blocks cut out of a run: recorded
        many(0, 1, 1, 3, 6),  // single blocks that are whole runs: lone stores
        many(0, 12, 4, 5, 2), // longer pieces, cutting runs on both sides
        many(0, 20, 8, 0, 1), // reaches past the mapped blocks: remove, then insert
        Op::Insert(1, 0, 8),
        many(1, 1, 3, 4, 2),
        many(1, 40, 3, 5, 3), // nothing mapped there: inserts
    ];
    let results = check_ops(33, &ops, false);
    let freed: Vec<&str> = results.iter().map(String::as_str).collect();
    assert_eq!(
        freed,
        [
            "Ok(0)", "Ok(6)", "Ok(6)", "Ok(8)", "Ok(4)", "Ok(0)", "Ok(6)", "Ok(0)"
        ]
    );
}

#[test]
fn cuckoo_replace_many_of_a_run_longer_than_an_entry_allows_keeps_every_block_old_or_new() {
    let ops = [
        Op::Insert(0, 0, RUN_MAX + 40),
        Op::ReplaceMany {
            file: 0,
            lblk: 5,
            len: RUN_MAX + 20,
            stride: 0,
            count: 1,
        },
    ];
    let results = check_ops_in(big_meta(), 22, &ops, false, 0);
    assert_eq!(results[1], format!("Ok({})", RUN_MAX + 20));
}

#[test]
fn cuckoo_inserts_that_find_no_room_leave_the_table_as_it_was() {
    // 48 ways are free: the first insert runs out of room half-way, the second fits.
    let ops = [Op::Insert(0, 0, 60), Op::Insert(1, 0, 20)];
    let results = check_ops(51, &ops, false);
    assert!(results[0].contains("NoSpace"), "{results:?}");
    assert_eq!(results[1], "Ok(0)");
}

/// A format over a region full of garbage is durable on return: the table opens without a
/// recovery, verifies, and takes inserts that displace entries (a move gate left closed would
/// stop them). A crash inside the format leaves a region that does not open as a table, or
/// the empty table.
#[test]
fn cuckoo_format_is_durable_on_return() {
    let region = SimRegion::new(meta().len * BLOCK_SIZE).expect("sim region");
    region
        .write(PmOff(0), &vec![0xa5; (meta().len * BLOCK_SIZE) as usize])
        .expect("garbage");
    region.persist_all();
    let stats = Explorer::new(3)
        .run(
            &region,
            |pm| {
                CuckooMapping::format_with_salt(pm, meta(), alloc(), SALT).expect("format");
            },
            |cp| {
                if cp.end {
                    let heap = HeapRegion::from_image(cp.image).map_err(|e| e.to_string())?;
                    let t = CuckooMapping::open(&heap, meta(), alloc())
                        .map_err(|e| format!("open after the format: {e}"))?;
                    t.verify()
                        .map_err(|e| format!("verify after the format: {e}"))?;
                    setup(&t);
                    return match state(&t)?.len() {
                        144 => Ok(()),
                        n => Err(format!("{n} blocks mapped after the setup, not 144")),
                    };
                }
                match recovered(cp.image, meta()) {
                    Ok(s) if s.is_empty() => Ok(()),
                    Err(e) if e.starts_with("open: ") => Ok(()),
                    r => Err(format!("during the format: {r:?}")),
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
    assert!(stats.fences >= 1, "{stats:?}");
}
