//! Property tests of the log against a `Vec<Entry>` model: every entry round-trips through its
//! encoding (inline, extended, multi-segment), and random sequences of appends, optimistic
//! commits that lose a race, compactions, reclamations and reopenings replay exactly as the
//! model says. Also: damaged images never panic.

#![cfg(not(loom))]

mod log_common;

use std::sync::Arc;

use log_common::{ROOT, mixed};
use pmfs_core::layout::{BLOCK_SIZE, BlockNo};
use pmfs_core::log::{Commit, Compaction, Entry, Log, MAX_RUN_LEN, owned_blocks, recover};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::traits::{BlockAllocator, Run, SimpleAllocator};
use proptest::prelude::*;

const BLOCKS: u64 = 1024;

type HeapLog = Log<Arc<HeapRegion>, SimpleAllocator>;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

fn run() -> impl Strategy<Value = Run> {
    (
        prop_oneof![0..64u64, 0..1u64 << 30, (u64::MAX - 4096)..u64::MAX - 1024],
        1..BLOCKS / 2,
        prop_oneof![1..65u64, 1..BLOCKS / 2],
    )
        .prop_map(|(lblk, pblk, len)| Run {
            lblk,
            pblk: BlockNo(pblk),
            len: len.min(BLOCKS - pblk).min(MAX_RUN_LEN),
        })
}

fn entry() -> impl Strategy<Value = Entry> {
    prop_oneof![
        4 => (run(), any::<bool>()).prop_map(|(r, ext)| {
            let extend_to = if ext { (r.lblk.saturating_add(r.len)).saturating_mul(BLOCK_SIZE) } else { 0 };
            Entry::Write { runs: smallvec::smallvec![r], extend_to }
        }),
        2 => (prop::collection::vec(run(), 0..6), any::<u64>())
            .prop_map(|(runs, extend_to)| Entry::Write { runs: runs.into(), extend_to }),
        1 => (prop::collection::vec(run(), 200..700), any::<u64>())
            .prop_map(|(runs, extend_to)| Entry::Write { runs: runs.into(), extend_to }),
        1 => any::<u64>().prop_map(|size| Entry::Truncate { size }),
        1 => any::<u64>().prop_map(|size| Entry::Resize { size }),
        1 => (any::<u64>(), 1..1000u64).prop_map(|(lblk, len)| Entry::Punch {
            lblk: lblk.min(u64::MAX - len),
            len,
        }),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Append(Entry),
    /// An optimistic commit whose snapshot goes stale: `.1` wins first.
    LoseRace(Entry, Entry),
    /// Compacts, keeping the entries before the point whose index is a multiple of `.0`.
    Compact(usize),
    Reclaim,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => entry().prop_map(Op::Append),
        2 => (entry(), entry()).prop_map(|(a, b)| Op::LoseRace(a, b)),
        2 => (1..6usize).prop_map(Op::Compact),
        1 => Just(Op::Reclaim),
        1 => Just(Op::Reopen),
    ]
}

fn replay(log: &HeapLog) -> Vec<Entry> {
    log.iter().unwrap().map(|r| r.unwrap().1).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn every_entry_round_trips(entries in prop::collection::vec(entry(), 1..12)) {
        let r = Arc::new(HeapRegion::new(BLOCKS * BLOCK_SIZE).unwrap());
        let a = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
        let log = HeapLog::create(r, ROOT, a).unwrap();
        for e in &entries {
            let p = log.prepare(e).unwrap();
            prop_assert_eq!(p.is_inline(), e.inline_word().is_some());
            p.commit().unwrap();
        }
        prop_assert_eq!(replay(&log), entries);
    }

    #[test]
    fn operation_sequences_match_the_model(ops in prop::collection::vec(op(), 1..40)) {
        let r = Arc::new(HeapRegion::new(BLOCKS * BLOCK_SIZE).unwrap());
        let a = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
        let mut log = HeapLog::create(r.clone(), ROOT, a.clone()).unwrap();
        let mut model: Vec<Entry> = Vec::new();
        for op in ops {
            match op {
                Op::Append(e) => {
                    let before = log.tail().unwrap();
                    let at = log.append(&e).unwrap();
                    prop_assert!(at >= before);
                    model.push(e);
                }
                Op::LoseRace(mine, theirs) => {
                    let since = log.tail().unwrap();
                    let p = log.prepare(&mine).unwrap();
                    log.append(&theirs).unwrap();
                    let Commit::Moved { prepared, tail } = p.try_commit(since).unwrap() else {
                        return Err(TestCaseError::fail("commit over a stale snapshot"));
                    };
                    let won: Vec<Entry> = log
                        .iter_from(since)
                        .unwrap()
                        .map(|r| r.unwrap())
                        .take_while(|(p, _)| *p < tail)
                        .map(|(_, e)| e)
                        .collect();
                    prop_assert_eq!(won, vec![theirs.clone()]);
                    let Commit::Done(_) = prepared.try_commit(tail).unwrap() else {
                        return Err(TestCaseError::fail("commit over a fresh snapshot"));
                    };
                    model.push(theirs);
                    model.push(mine);
                }
                Op::Compact(keep) => {
                    let Some(point) = log.compaction_point().unwrap() else { continue };
                    let before: Vec<Entry> = log
                        .iter()
                        .unwrap()
                        .map(|r| r.unwrap())
                        .take_while(|(p, _)| *p < point)
                        .map(|(_, e)| e)
                        .collect();
                    let live: Vec<Entry> =
                        before.iter().step_by(keep).cloned().collect();
                    match log.compact(point, &live).unwrap() {
                        Compaction::Compacted { .. } => {
                            let rest = model.split_off(before.len());
                            model = live;
                            model.extend(rest);
                        }
                        Compaction::NotSmaller => {}
                        Compaction::Raced => {
                            return Err(TestCaseError::fail("raced without a rival"));
                        }
                    }
                }
                Op::Reclaim => {
                    log.reclaim().unwrap();
                }
                Op::Reopen => {
                    log.close().unwrap();
                    let rec = recover(&*r, ROOT).unwrap();
                    prop_assert_eq!(rec.discarded, 0);
                    prop_assert_eq!(rec.entries, model.len() as u64);
                    log = HeapLog::open(r.clone(), ROOT, a.clone()).unwrap();
                }
            }
            prop_assert_eq!(&replay(&log), &model);
        }
        // Every block is either free or owned by the log, once it is closed.
        log.close().unwrap();
        let mut owned = 0;
        owned_blocks(&*r, ROOT, &mut |_| owned += 1).unwrap();
        prop_assert_eq!(a.free_blocks() + owned, BLOCKS - 1);
    }

    #[test]
    fn damaged_images_fail_cleanly(
        flips in prop::collection::vec((0..8 * BLOCK_SIZE, any::<u8>()), 1..8),
    ) {
        let r = Arc::new(HeapRegion::new(8 * BLOCK_SIZE).unwrap());
        let a = Arc::new(SimpleAllocator::new(BlockNo(1), 7));
        let log = HeapLog::create(r.clone(), ROOT, a.clone()).unwrap();
        for i in 0..300 {
            let e = mixed(i);
            if e.validate(8).is_ok() {
                log.append(&e).unwrap();
            }
        }
        drop(log);
        let mut image = vec![0u8; 8 * BLOCK_SIZE as usize];
        r.read(pmfs_core::layout::PmOff(0), &mut image).unwrap();
        for (off, x) in flips {
            image[off as usize] ^= x.max(1);
        }
        let damaged = Arc::new(HeapRegion::from_image(&image).unwrap());
        // Whatever the damage, every call returns (an error or a result) without panicking.
        let _ = recover(&*damaged, ROOT);
        let _ = owned_blocks(&*damaged, ROOT, &mut |_| {});
        if let Ok(log) = HeapLog::open(damaged, ROOT, Arc::new(SimpleAllocator::new(BlockNo(1), 7))) {
            if let Ok(it) = log.iter() {
                let _ = it.count();
            }
            let _ = log.append(&mixed(1));
            let _ = log.tail();
        }
    }
}
