//! loom models of the log's concurrency: committers racing for the last slot of a block and
//! for the link to the next one while a reader replays; a committer racing with a compaction;
//! a reader racing with a compaction and its reclamation; a sweep of blocks another handle
//! left behind racing with a new handle that links a block.
//!
//! Checked in every interleaving: every committed entry is replayed exactly once and in commit
//! order, a committed slot is never overwritten, a reader sees a prefix of the final log
//! (before or after the compaction), and no block is touched after it was freed.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p pmfs-core --release --test loom_log
//! ```
//!
//! Under `cfg(loom)` a log block uses 16 slots (8 entries), so the models chain blocks after a
//! few appends.

#![cfg(loom)]

mod loom_common;

use loom::sync::Arc;
use loom::thread;
use loom_common::{LoomAlloc, LoomLog, e, is_prefix, model, open_other, replay, setup};
use pmfs_core::log::{Compaction, ENTRIES_PER_BLOCK, Entry};

/// Two committers append after `prefill` entries while a reader replays.
fn two_committers_and_a_reader(prefill: u64) {
    model(move || {
        let (log, _alloc) = setup();
        let prefill: Vec<Entry> = (0..prefill).map(e).collect();
        for x in &prefill {
            log.append(x).unwrap();
        }
        let (a, b) = (e(100), e(200));
        let ta = {
            let log = log.clone();
            let a = a.clone();
            thread::spawn(move || log.append(&a).unwrap())
        };
        let tb = {
            let log = log.clone();
            let b = b.clone();
            thread::spawn(move || log.append(&b).unwrap())
        };
        let seen = replay(&log);
        let (pa, pb) = (ta.join().unwrap(), tb.join().unwrap());
        let fin = replay(&log);
        let mut want = prefill.clone();
        if pa < pb {
            want.extend([a, b]);
        } else {
            want.extend([b, a]);
        }
        assert_eq!(fin, want, "each commit once, in commit order");
        assert!(is_prefix(&seen, &fin), "the reader saw {seen:?}");
        assert_eq!(pa.lsn().abs_diff(pb.lsn()), 1, "adjacent slots");
    });
}

/// The committers race for the last slot of a block; the loser links the next block.
#[test]
fn two_committers_race_for_the_last_slot() {
    two_committers_and_a_reader(ENTRIES_PER_BLOCK - 1);
}

/// The block is full: both committers prepare a block and race to link it; the loser keeps
/// its block as the spare and commits into the winner's.
#[test]
fn two_committers_race_to_link() {
    two_committers_and_a_reader(ENTRIES_PER_BLOCK);
}

/// Two full blocks, one entry in the tail block, and what compacting the full blocks to one
/// entry yields.
fn compaction_setup() -> (
    Arc<LoomLog>,
    std::sync::Arc<LoomAlloc>,
    Vec<Entry>,
    Entry,
    Entry,
) {
    let (log, alloc) = setup();
    let old: Vec<Entry> = (0..2 * ENTRIES_PER_BLOCK).map(e).collect();
    for x in &old {
        log.append(x).unwrap();
    }
    let tail_entry = e(50);
    log.append(&tail_entry).unwrap();
    (log, alloc, old, tail_entry, e(77))
}

fn compact_full_blocks(log: &LoomLog, live: &Entry) {
    let point = log.compaction_point().unwrap().unwrap();
    let c = log.compact(point, std::slice::from_ref(live)).unwrap();
    assert_eq!(
        c,
        Compaction::Compacted {
            written: 1,
            retired: 2
        }
    );
}

/// A committer races with a compaction of the full blocks: the append is not lost, and lands
/// after the retained suffix in both the old and the new chain.
#[test]
fn committer_and_compaction() {
    model(|| {
        let (log, alloc, _old, tail_entry, live) = compaction_setup();
        let a = e(100);
        let ta = {
            let log = log.clone();
            let a = a.clone();
            thread::spawn(move || log.append(&a).unwrap())
        };
        compact_full_blocks(&log, &live);
        ta.join().unwrap();
        assert_eq!(replay(&log), vec![live, tail_entry, a]);
        log.reclaim().unwrap();
        assert_eq!(alloc.freed(), 2);
    });
}

/// A reader replays from the old head while the full blocks are compacted and reclaimed: it
/// sees a prefix of the old or of the new log, and never a block after it was freed (the
/// reclamation waits for it, or is done later).
#[test]
fn reader_and_compaction_with_reclamation() {
    model(|| {
        let (log, alloc, old, tail_entry, live) = compaction_setup();
        let tr = {
            let log = log.clone();
            thread::spawn(move || replay(&log))
        };
        compact_full_blocks(&log, &live);
        let seen = tr.join().unwrap();
        let fin = replay(&log);
        assert_eq!(fin, vec![live, tail_entry.clone()]);
        let mut before = old;
        before.push(tail_entry);
        assert!(
            is_prefix(&seen, &fin) || is_prefix(&seen, &before),
            "the reader saw {seen:?}"
        );
        log.reclaim().unwrap();
        assert_eq!(alloc.freed(), 2);
    });
}

/// A handle compacts the full blocks while another has the log open, so it cannot free them,
/// and closes: it leaves them to a sweep. The other handle, alone now, sweeps while a third
/// opens, fills the tail block and links a new one (allocated while the sweep may be asking
/// the allocator for the log's blocks), and closes. The sweep frees the two retired blocks
/// or gives up; it never frees a block of the chain (the media panics on any access to a
/// freed block, and the final replay walks the whole chain).
#[test]
fn sweep_and_an_opener_that_links_a_block() {
    model(|| {
        let (log, alloc, _old, tail_entry, live) = compaction_setup();
        let alone = open_other(&log, &alloc);
        compact_full_blocks(&log, &live);
        drop(log);
        let late: Vec<Entry> = (0..ENTRIES_PER_BLOCK).map(|i| e(300 + i)).collect();
        let t = {
            let (alone, alloc, late) = (alone.clone(), alloc.clone(), late.clone());
            thread::spawn(move || {
                let third = open_other(&alone, &alloc);
                for x in &late {
                    third.append(x).unwrap();
                }
                drop(third);
            })
        };
        let swept = alone.reclaim().unwrap();
        t.join().unwrap();
        assert!(swept == 0 || swept == 2, "swept {swept}");
        let mut want = vec![live, tail_entry];
        want.extend(late);
        assert_eq!(replay(&alone), want);
        // Alone for good: what is left is swept now.
        alone.reclaim().unwrap();
        assert_eq!(alloc.freed(), 2);
        assert_eq!(replay(&alone).len(), want.len());
    });
}
