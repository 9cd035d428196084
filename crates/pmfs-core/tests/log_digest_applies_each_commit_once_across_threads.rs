//! Real threads in two "processes" (two handles on one log, sharing only the media; one holder
//! id per process): each thread commits entries and digests after every commit, and now and
//! then drops the applied prefix with `compact_applied`. No digest runs after the threads are
//! done, yet every committed entry has been applied exactly once, in LSN order (a committer
//! that finds the cursor busy leaves its entry to the holder), the cursor is free at the tail,
//! and the log keeps no block it could drop.

#![cfg(not(loom))]

mod log_common;

use std::collections::HashSet;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use log_common::ROOT;
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::log::{Compaction, Digest, ENTRIES_PER_BLOCK, Entry, Log, init_cursor};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::traits::{Run, SimpleAllocator};

const BLOCKS: u64 = 4096;
const CURSOR: PmOff = PmOff(72);
const PROCESSES: u32 = 2;
const THREADS: u64 = 2;
const APPENDS: u64 = 600;
/// The threads wait for each other every this many appends, so they overlap on any machine.
const ROUND: u64 = 25;

type HeapLog = Log<Arc<HeapRegion>, SimpleAllocator>;

/// Append `i` of thread `t` of process `p`: unique, and every fifth an extended entry.
fn entry(p: u32, t: u64, i: u64) -> Entry {
    let id = (u64::from(p) * THREADS + t) * APPENDS + i;
    if i % 5 == 2 {
        Entry::Write {
            runs: smallvec::smallvec![
                Run {
                    lblk: id,
                    pblk: BlockNo(1),
                    len: 1,
                },
                Run {
                    lblk: id + 1_000_000,
                    pblk: BlockNo(2),
                    len: 1,
                },
            ],
            extend_to: id * BLOCK_SIZE + 3,
        }
    } else {
        Entry::write(id, BlockNo(1), 1, 0)
    }
}

#[test]
fn every_commit_is_applied_once_in_order_without_a_final_digest() {
    let region = Arc::new(HeapRegion::new(BLOCKS * BLOCK_SIZE).unwrap());
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    init_cursor(&*region, CURSOR).unwrap();
    let first = HeapLog::create(region.clone(), ROOT, alloc.clone()).unwrap();
    let mut logs = vec![Arc::new(first)];
    for _ in 1..PROCESSES {
        let other = HeapLog::open(region.clone(), ROOT, alloc.clone()).unwrap();
        logs.push(Arc::new(other));
    }
    let applied = Arc::new(Mutex::new(Vec::new()));
    let barrier = Arc::new(Barrier::new((PROCESSES as u64 * THREADS) as usize));
    let mut workers = Vec::new();
    for (p, log) in logs.iter().enumerate() {
        let holder = p as u32 + 1;
        for t in 0..THREADS {
            let log = log.clone();
            let applied = applied.clone();
            let barrier = barrier.clone();
            workers.push(thread::spawn(move || {
                let mut committed = Vec::new();
                for i in 0..APPENDS {
                    if i % ROUND == 0 {
                        barrier.wait();
                    }
                    let e = entry(holder, t, i);
                    let at = log.append(&e).unwrap();
                    committed.push((at.lsn(), e));
                    let d = log
                        .digest(CURSOR, holder, &|_| true, &mut |lsn, e| {
                            applied.lock().unwrap().push((lsn, e.clone()));
                            // Hold the cursor a little longer: more committers find it busy.
                            thread::yield_now();
                            Ok(())
                        })
                        .unwrap();
                    match d {
                        Digest::Done { applied } => assert!(applied > at.lsn()),
                        Digest::Busy => {}
                    }
                    if i % 50 == 49 {
                        let c = log.compact_applied(CURSOR).unwrap();
                        assert!(
                            matches!(
                                c,
                                Compaction::Compacted { written: 0, .. }
                                    | Compaction::NotSmaller
                                    | Compaction::Raced
                            ),
                            "{c:?}"
                        );
                    }
                }
                committed
            }));
        }
    }
    let mut committed = Vec::new();
    for w in workers {
        committed.extend(w.join().unwrap());
    }
    committed.sort_by_key(|(lsn, _)| *lsn);
    let lsns: HashSet<u64> = committed.iter().map(|(l, _)| *l).collect();
    assert_eq!(lsns.len(), committed.len(), "every commit has its own LSN");

    let applied = applied.lock().unwrap().clone();
    assert_eq!(
        applied.len(),
        committed.len(),
        "each commit applied exactly once"
    );
    assert_eq!(applied, committed, "applied in LSN order");

    let log = &logs[0];
    let tail = log.tail().unwrap().lsn();
    assert_eq!(
        region.load_u64(CURSOR).unwrap(),
        tail,
        "the cursor is free at the tail"
    );
    log.compact_applied(CURSOR).unwrap();
    assert_eq!(
        log.start().unwrap().lsn(),
        (tail - 1) / ENTRIES_PER_BLOCK * ENTRIES_PER_BLOCK,
        "only the tail block is left"
    );
    let kept: Vec<(u64, Entry)> = log
        .iter()
        .unwrap()
        .map(|r| r.map(|(p, e)| (p.lsn(), e)).unwrap())
        .collect();
    let from = committed.partition_point(|(l, _)| *l < log.start().unwrap().lsn());
    assert_eq!(kept, committed[from..]);
}
