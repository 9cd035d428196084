//! Property test of digesting against a model (the history of appended entries, how many of
//! them are applied, how many were dropped): random sequences of appends, digests that fail
//! after some entries, dead holders left in the cursor, `compact_applied`, reclamations and
//! reopenings (recover and reset the holder, as a mount does). After every step: the log
//! replays as the history minus the dropped prefix, the dropped prefix is applied, a replay
//! from the cursor's LSN yields exactly the unapplied entries, and every block before the
//! cursor's is dropped by `compact_applied`.

#![cfg(not(loom))]

mod log_common;

use std::sync::Arc;

use log_common::{ROOT, mixed, scattered};
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::log::{
    CURSOR_LSN_BITS, Compaction, Digest, ENTRIES_PER_BLOCK, Entry, Log, init_cursor, recover,
    reset_holder,
};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::traits::{BlockAllocator, SimpleAllocator};
use pmfs_core::{Error, Result};
use proptest::prelude::*;

const BLOCKS: u64 = 1024;
const CURSOR: PmOff = PmOff(72);
const HOLDER: u32 = 1;
const DEAD: u32 = 9;

type HeapLog = Log<Arc<HeapRegion>, SimpleAllocator>;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

#[derive(Clone, Debug)]
enum Op {
    /// Appends this many entries of the varied sequence, from an offset.
    Append(u64, u64),
    /// Appends one entry of this many scattered runs (several segments).
    AppendLarge(u64),
    /// Digests; `apply` fails on the call after this many, if any.
    Digest(Option<usize>),
    /// A holder died with the cursor (its id left in the word).
    DeadHolder,
    CompactApplied,
    Reclaim,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1..200u64, 0..1000u64).prop_map(|(n, at)| Op::Append(n, at)),
        1 => (200..700u64).prop_map(Op::AppendLarge),
        5 => prop::option::of(0..300usize).prop_map(Op::Digest),
        1 => Just(Op::DeadHolder),
        3 => Just(Op::CompactApplied),
        1 => Just(Op::Reclaim),
        1 => Just(Op::Reopen),
    ]
}

struct Model {
    history: Vec<Entry>,
    applied: usize,
    dropped: usize,
}

fn with_lsns(log: &HeapLog, from: u64) -> Vec<(u64, Entry)> {
    log.iter_from_lsn(from)
        .unwrap()
        .map(|r| r.map(|(p, e)| (p.lsn(), e)).unwrap())
        .collect()
}

fn check(log: &HeapLog, m: &Model) -> std::result::Result<(), TestCaseError> {
    let all = with_lsns(log, 0);
    let entries: Vec<Entry> = all.iter().map(|(_, e)| e.clone()).collect();
    prop_assert_eq!(
        &entries[..],
        &m.history[m.dropped..],
        "the log is the history"
    );
    prop_assert!(m.dropped <= m.applied, "an unapplied entry was dropped");
    let cursor = log.digested(CURSOR).unwrap();
    let unapplied: Vec<Entry> = with_lsns(log, cursor).into_iter().map(|(_, e)| e).collect();
    prop_assert_eq!(
        &unapplied[..],
        &m.history[m.applied..],
        "the cursor names the unapplied"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn digest_sequences_match_the_model(ops in prop::collection::vec(op(), 1..30)) {
        let r = Arc::new(HeapRegion::new(BLOCKS * BLOCK_SIZE).unwrap());
        let a = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
        init_cursor(&*r, CURSOR).unwrap();
        let mut log = HeapLog::create(r.clone(), ROOT, a.clone()).unwrap();
        let mut m = Model { history: Vec::new(), applied: 0, dropped: 0 };
        for op in ops {
            match op {
                Op::Append(n, at) => {
                    for i in at..at + n {
                        let e = mixed(i);
                        log.append(&e).unwrap();
                        m.history.push(e);
                    }
                }
                Op::AppendLarge(runs) => {
                    let e = scattered(runs);
                    log.append(&e).unwrap();
                    m.history.push(e);
                }
                Op::Digest(fail_after) => {
                    let mut got = Vec::new();
                    let d = log.digest(CURSOR, HOLDER, &|_| false, &mut |_, e| {
                        if Some(got.len()) == fail_after {
                            return Err(Error::NoSpace);
                        }
                        got.push(e.clone());
                        Ok::<(), Error>(())
                    });
                    let left = m.history.len() - m.applied;
                    match fail_after {
                        Some(k) if k < left => {
                            prop_assert!(matches!(d, Err(Error::NoSpace)), "{:?}", d);
                        }
                        _ => {
                            let tail = log.tail().unwrap().lsn();
                            prop_assert_eq!(d.unwrap(), Digest::Done { applied: tail });
                        }
                    }
                    prop_assert_eq!(&got[..], &m.history[m.applied..m.applied + got.len()]);
                    m.applied += got.len();
                    prop_assert_eq!(r.load_u64(CURSOR).unwrap() >> CURSOR_LSN_BITS, 0);
                }
                Op::DeadHolder => {
                    let w = r.load_u64(CURSOR).unwrap();
                    r.store_u64(CURSOR, w | u64::from(DEAD) << CURSOR_LSN_BITS).unwrap();
                    // A live holder makes a digest busy; it applies nothing.
                    let d = log
                        .digest(CURSOR, HOLDER, &|_| true, &mut |_, _| -> Result<()> {
                            Err(Error::NoSpace)
                        })
                        .unwrap();
                    prop_assert_eq!(d, Digest::Busy);
                }
                Op::CompactApplied => {
                    let c = log.compact_applied(CURSOR).unwrap();
                    prop_assert!(matches!(
                        c,
                        Compaction::Compacted { written: 0, .. } | Compaction::NotSmaller
                    ), "{:?}", c);
                    m.dropped = m.history.len() - with_lsns(&log, 0).len();
                    // Every block before the cursor's is gone.
                    let start = log.start().unwrap().lsn();
                    let cursor = log.digested(CURSOR).unwrap();
                    prop_assert!(start <= cursor && cursor - start <= ENTRIES_PER_BLOCK);
                }
                Op::Reclaim => {
                    log.reclaim().unwrap();
                }
                Op::Reopen => {
                    log.close().unwrap();
                    recover(&*r, ROOT).unwrap();
                    reset_holder(&*r, CURSOR).unwrap();
                    log = HeapLog::open(r.clone(), ROOT, a.clone()).unwrap();
                }
            }
            check(&log, &m)?;
        }
        log.close().unwrap();
        let mut owned = 0;
        pmfs_core::log::owned_blocks(&*r, ROOT, &mut |_| owned += 1).unwrap();
        prop_assert_eq!(a.free_blocks() + owned, BLOCKS - 1, "no block leaks");
    }
}
