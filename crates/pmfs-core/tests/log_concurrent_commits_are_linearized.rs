//! Real threads on one log: appenders (plain, extended, and optimistic retry loops), a reader
//! that replays over and over, and a compactor that folds everything before the tail block
//! into one entry and reclaims. The fold of every replay only moves forward and includes every
//! append that had returned when the replay began; the final log folds to the last write of
//! every block; no block leaks or is freed twice.

#![cfg(not(loom))]

mod log_common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::thread;

use log_common::ROOT;
use pmfs_core::layout::{BLOCK_SIZE, BlockNo};
use pmfs_core::log::{Commit, Compaction, Entry, Log, owned_blocks};
use pmfs_core::pm::HeapRegion;
use pmfs_core::traits::{BlockAllocator, Run, SimpleAllocator};

const BLOCKS: u64 = 8192;
const THREADS: u64 = 3;
const APPENDS: u64 = 5000;
/// Logical blocks per thread; append `i` of thread `t` maps block `t * LBLKS + i % LBLKS` to
/// physical block `i + 1`, so the fold of a log says how far each thread got.
const LBLKS: u64 = 16;
/// Appenders wait every this many appends for the reader and the compactor to finish another
/// round, so the three kinds of work overlap on any machine.
const ROUND: u64 = 250;

type HeapLog = Log<Arc<HeapRegion>, SimpleAllocator>;

fn entry(t: u64, i: u64) -> Entry {
    let lblk = t * LBLKS + i % LBLKS;
    // Every seventh append carries an unaligned size and needs an extended entry.
    let extend_to = if i % 7 == 3 { lblk * BLOCK_SIZE + 1 } else { 0 };
    Entry::write(lblk, BlockNo(i + 1), 1, extend_to)
}

/// Logical block -> physical block after applying `entries` in order (writes only).
fn fold<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> BTreeMap<u64, u64> {
    let mut m = BTreeMap::new();
    for e in entries {
        if let Entry::Write { runs, .. } = e {
            for r in runs {
                for k in 0..r.len {
                    m.insert(r.lblk + k, r.pblk.0 + k);
                }
            }
        }
    }
    m
}

fn append(log: &HeapLog, t: u64, i: u64) {
    let e = entry(t, i);
    if i.is_multiple_of(5) {
        // Optimistic commit: retry from the new tail until nothing was committed meanwhile.
        let mut since = log.tail().unwrap();
        let mut p = log.prepare(&e).unwrap();
        loop {
            match p.try_commit(since).unwrap() {
                Commit::Done(_) => return,
                Commit::Moved { prepared, tail } => {
                    assert!(tail > since);
                    p = prepared;
                    since = tail;
                }
            }
        }
    }
    log.append(&e).unwrap();
}

fn compact_once(log: &HeapLog) -> Compaction {
    let Some(point) = log.compaction_point().unwrap() else {
        return Compaction::NotSmaller;
    };
    let before: Vec<Entry> = log
        .iter_from(log.start().unwrap())
        .unwrap()
        .map(|r| r.unwrap())
        .take_while(|(p, _)| *p < point)
        .map(|(_, e)| e)
        .collect();
    let runs = fold(&before)
        .into_iter()
        .map(|(lblk, pblk)| Run {
            lblk,
            pblk: BlockNo(pblk),
            len: 1,
        })
        .collect();
    log.compact(point, &[Entry::Write { runs, extend_to: 0 }])
        .unwrap()
}

#[test]
fn appenders_reader_and_compactor() {
    let r = Arc::new(HeapRegion::new(BLOCKS * BLOCK_SIZE).unwrap());
    let a = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    let log = Arc::new(HeapLog::create(r.clone(), ROOT, a.clone()).unwrap());
    let returned: Arc<Vec<AtomicU64>> = Arc::new((0..THREADS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    // Rounds completed by the reader and by the compactor.
    let rounds: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);

    let appenders: Vec<_> = (0..THREADS)
        .map(|t| {
            let (log, returned, rounds) = (log.clone(), returned.clone(), rounds.clone());
            thread::spawn(move || {
                let mut seen = [0, 0];
                for i in 0..APPENDS {
                    if i.is_multiple_of(ROUND) {
                        for (k, r) in rounds.iter().enumerate() {
                            while r.load(SeqCst) == seen[k] {
                                thread::yield_now();
                            }
                            seen[k] = r.load(SeqCst);
                        }
                    }
                    append(&log, t, i);
                    returned[t as usize].store(i + 1, SeqCst);
                }
            })
        })
        .collect();
    let reader = {
        let (log, returned, done) = (log.clone(), returned.clone(), done.clone());
        let rounds = rounds.clone();
        thread::spawn(move || {
            let mut last = BTreeMap::new();
            let mut replays = 0u64;
            while !done.load(SeqCst) || replays == 0 {
                let floor: Vec<u64> = returned.iter().map(|c| c.load(SeqCst)).collect();
                let entries: Vec<Entry> = log.iter().unwrap().map(|r| r.unwrap().1).collect();
                let now = fold(&entries);
                for (lblk, pblk) in &last {
                    assert!(
                        now.get(lblk).is_some_and(|p| p >= pblk),
                        "a replay went back"
                    );
                }
                for t in 0..THREADS {
                    let n = floor[t as usize];
                    // The latest returned append of each of the thread's blocks is visible.
                    for i in n.saturating_sub(LBLKS)..n {
                        let lblk = t * LBLKS + i % LBLKS;
                        assert!(
                            now[&lblk] > i,
                            "append {i} of thread {t} returned but is missing"
                        );
                    }
                }
                last = now;
                replays += 1;
                rounds[0].fetch_add(1, SeqCst);
            }
        })
    };
    let compactor = {
        let (log, done, rounds) = (log.clone(), done.clone(), rounds.clone());
        thread::spawn(move || {
            let mut compacted = 0u64;
            while !done.load(SeqCst) {
                if matches!(compact_once(&log), Compaction::Compacted { .. }) {
                    compacted += 1;
                }
                log.reclaim().unwrap();
                rounds[1].fetch_add(1, SeqCst);
            }
            compacted
        })
    };
    for h in appenders {
        h.join().unwrap();
    }
    done.store(true, SeqCst);
    reader.join().unwrap();
    compactor.join().unwrap();

    // A last compaction with nobody else around always succeeds and frees everything.
    let entries: Vec<Entry> = log.iter().unwrap().map(|r| r.unwrap().1).collect();
    let want: BTreeMap<u64, u64> = (0..THREADS)
        .flat_map(|t| (APPENDS - LBLKS..APPENDS).map(move |i| (t * LBLKS + i % LBLKS, i + 1)))
        .collect();
    assert_eq!(fold(&entries), want);
    compact_once(&log);
    log.reclaim().unwrap();
    let entries: Vec<Entry> = log.iter().unwrap().map(|r| r.unwrap().1).collect();
    assert_eq!(fold(&entries), want);
    Arc::into_inner(log).unwrap().close().unwrap();
    let mut owned = 0;
    owned_blocks(&*r, ROOT, &mut |_| owned += 1).unwrap();
    assert_eq!(
        a.free_blocks() + owned,
        BLOCKS - 1,
        "no block leaked or freed twice"
    );
}
