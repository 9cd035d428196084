//! loom models of digesting a log: committers that digest their own entries (two threads of
//! one process, sharing a holder id) while a reader replays; two processes racing for the
//! cursor while a third commits; a holder that dies with the cursor, taken over by two racing
//! digesters; a digester, a committer and the garbage collection of the applied prefix
//! (`compact_applied`) at once; a reader replaying while that garbage collection runs.
//!
//! Checked in every interleaving: every committed entry is applied exactly once and in LSN
//! order (with a dead holder: at least once, in order, never skipped, and only the dead
//! holder's entry twice), without a final digest after the threads are done (a caller that
//! finds the cursor busy leaves its entries to the holder); a committed slot is never
//! overwritten and no block is touched after it was freed (the loom media checks both); a
//! reader sees a prefix of the log.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p pmfs-core --release --test loom_digest
//! ```

#![cfg(loom)]

mod loom_common;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;
use loom_common::{LoomLog, e, is_prefix, model, open_other, replay, setup};
use pmfs_core::layout::PmOff;
use pmfs_core::log::{CURSOR_LSN_BITS, Compaction, Digest, ENTRIES_PER_BLOCK, Entry};
use pmfs_core::pm::Media;

/// The cursor word, in block 0 next to the head word.
const CURSOR: PmOff = PmOff(72);

/// What the apply callbacks did, in order, across all threads.
type Applied = Arc<Mutex<Vec<(u64, Entry)>>>;

fn digest(log: &LoomLog, holder: u32, alive: &dyn Fn(u32) -> bool, applied: &Applied) -> Digest {
    log.digest(CURSOR, holder, alive, &mut |lsn, entry| {
        applied.lock().unwrap().push((lsn, entry.clone()));
        Ok(())
    })
    .unwrap()
}

fn all_alive(_: u32) -> bool {
    true
}

/// The log from its head, with LSNs.
fn entries(log: &LoomLog) -> Vec<(u64, Entry)> {
    log.iter()
        .unwrap()
        .map(|r| r.map(|(p, x)| (p.lsn(), x)).unwrap())
        .collect()
}

fn append(log: &LoomLog, x: &Entry) -> (u64, Entry) {
    (log.append(x).unwrap().lsn(), x.clone())
}

fn applied_list(applied: &Applied) -> Vec<(u64, Entry)> {
    applied.lock().unwrap().clone()
}

/// The cursor is free and past everything in the log.
fn check_cursor_done(log: &LoomLog) {
    let w = log.media().load_u64(CURSOR).unwrap();
    assert_eq!(w >> CURSOR_LSN_BITS, 0, "the cursor is still held");
    assert_eq!(log.digested(CURSOR).unwrap(), log.tail().unwrap().lsn());
}

/// Two threads of one process (one holder id) each commit an entry and digest; a reader
/// replays meanwhile. A thread that finds the cursor held by its own process gets `Busy`, and
/// the holder applies its entry.
#[test]
fn committers_of_one_process_digest_each_others_entries() {
    model(|| {
        let (log, _alloc) = setup();
        let applied = Applied::default();
        let committer = |x: Entry| {
            let log = log.clone();
            let applied = applied.clone();
            thread::spawn(move || {
                append(&log, &x);
                digest(&log, 1, &all_alive, &applied);
            })
        };
        let ta = committer(e(1));
        let tb = committer(e(2));
        let seen = replay(&log);
        ta.join().unwrap();
        tb.join().unwrap();
        let fin = entries(&log);
        assert_eq!(fin.len(), 2);
        assert_eq!(
            applied_list(&applied),
            fin,
            "each entry applied once, in order"
        );
        let fin: Vec<Entry> = fin.into_iter().map(|(_, x)| x).collect();
        assert!(is_prefix(&seen, &fin), "the reader saw {seen:?}");
        check_cursor_done(&log);
    });
}

/// Two processes (two handles on the log, sharing only the media) race for the cursor over
/// two committed entries while one of them commits a third: one holds, the other gets `Busy`
/// (or finds nothing left). A `Busy` caller's commit reaches the holder through the cursor
/// word alone.
#[test]
fn two_processes_race_for_the_cursor() {
    model(|| {
        let (log, alloc) = setup();
        for i in 0..2 {
            log.append(&e(i)).unwrap();
        }
        let other = open_other(&log, &alloc);
        let applied = Applied::default();
        let t1 = {
            let applied = applied.clone();
            thread::spawn(move || digest(&other, 1, &all_alive, &applied))
        };
        append(&log, &e(9));
        let d2 = digest(&log, 2, &all_alive, &applied);
        let d1 = t1.join().unwrap();
        assert!(
            matches!(d1, Digest::Done { .. }) || matches!(d2, Digest::Done { .. }),
            "somebody digested: {d1:?} {d2:?}"
        );
        assert_eq!(applied_list(&applied), entries(&log));
        check_cursor_done(&log);
    });
}

/// Holder 3 takes the cursor, applies the first entry and dies before moving the cursor.
/// Two digesters of other processes race to take over once it is dead (while it runs, they
/// get `Busy`); after they are done, one more digest runs (the takeover may all have
/// happened before the death).
#[test]
fn a_dead_holder_is_taken_over_once() {
    model(|| {
        let (log, _alloc) = setup();
        for i in 0..2 {
            log.append(&e(i)).unwrap();
        }
        let all = entries(&log);
        let applied = Applied::default();
        let dead = Arc::new(AtomicBool::new(false));
        let dier = {
            let log = log.clone();
            let applied = applied.clone();
            let dead = dead.clone();
            let first = all[0].clone();
            thread::spawn(move || {
                let held = 3 << CURSOR_LSN_BITS | first.0;
                if log.media().cas_u64(CURSOR, first.0, held).unwrap().is_ok() {
                    applied.lock().unwrap().push(first);
                }
                dead.store(true, Ordering::Release);
            })
        };
        let alive = {
            let dead = dead.clone();
            move |h: u32| h != 3 || !dead.load(Ordering::Acquire)
        };
        let taker = {
            let log = log.clone();
            let applied = applied.clone();
            let alive = alive.clone();
            thread::spawn(move || digest(&log, 1, &alive, &applied))
        };
        digest(&log, 2, &alive, &applied);
        taker.join().unwrap();
        dier.join().unwrap();
        digest(&log, 2, &alive, &applied);

        let got = applied_list(&applied);
        assert!(
            got.windows(2).all(|w| w[0].0 <= w[1].0),
            "applied out of order: {got:?}"
        );
        let mut once = got.clone();
        once.dedup();
        assert_eq!(once, all, "every entry applied, none skipped");
        assert!(
            got.len() == all.len() || (got.len() == all.len() + 1 && got[0] == got[1]),
            "only the dead holder's entry twice: {got:?}"
        );
        check_cursor_done(&log);
    });
}

/// A full block and one entry in the next; a digester, a compaction of the applied prefix,
/// and a committer that digests after its commit, all at once. The compaction drops the full
/// block only once every entry of it is applied, and drops nothing anybody still needs.
#[test]
fn digest_and_compact_applied_with_a_committer() {
    model(|| {
        let (log, alloc) = setup();
        for i in 0..=ENTRIES_PER_BLOCK {
            log.append(&e(i)).unwrap();
        }
        let mut all = entries(&log);
        let applied = Applied::default();
        let digester = {
            let log = log.clone();
            let applied = applied.clone();
            thread::spawn(move || digest(&log, 1, &all_alive, &applied))
        };
        let gc = {
            let log = log.clone();
            thread::spawn(move || log.compact_applied(CURSOR).unwrap())
        };
        all.push(append(&log, &e(50)));
        digest(&log, 1, &all_alive, &applied);
        digester.join().unwrap();
        let c = gc.join().unwrap();
        assert_eq!(
            applied_list(&applied),
            all,
            "each entry applied once, in order"
        );
        check_cursor_done(&log);
        let kept = entries(&log);
        match c {
            Compaction::Compacted {
                written: 0,
                retired: 1,
            } => assert_eq!(kept, all[ENTRIES_PER_BLOCK as usize..]),
            Compaction::NotSmaller => {
                assert_eq!(kept, all);
                assert_eq!(
                    log.compact_applied(CURSOR).unwrap(),
                    Compaction::Compacted {
                        written: 0,
                        retired: 1
                    }
                );
            }
            c => panic!("unexpected {c:?}"),
        }
        log.reclaim().unwrap();
        assert_eq!(alloc.freed(), 1);
    });
}

/// Every entry of a full block and one more are applied; a reader replays from LSN 0 while
/// the applied prefix is compacted away and a committer commits and digests. The reader sees
/// a prefix of the log before or after the compaction (from the head it found), never a freed
/// block; the new entry is applied once.
#[test]
fn reader_and_compact_applied_with_a_committer() {
    model(|| {
        let (log, alloc) = setup();
        for i in 0..=ENTRIES_PER_BLOCK {
            log.append(&e(i)).unwrap();
        }
        let applied = Applied::default();
        digest(&log, 1, &all_alive, &applied);
        let mut all = entries(&log);
        let reader = {
            let log = log.clone();
            thread::spawn(move || {
                log.iter_from_lsn(0)
                    .unwrap()
                    .map(|r| r.map(|(p, x)| (p.lsn(), x)).unwrap())
                    .collect::<Vec<_>>()
            })
        };
        let gc = {
            let log = log.clone();
            thread::spawn(move || log.compact_applied(CURSOR).unwrap())
        };
        all.push(append(&log, &e(50)));
        digest(&log, 1, &all_alive, &applied);
        let seen = reader.join().unwrap();
        let c = gc.join().unwrap();
        assert_eq!(
            c,
            Compaction::Compacted {
                written: 0,
                retired: 1
            }
        );
        assert_eq!(
            applied_list(&applied),
            all,
            "each entry applied once, in order"
        );
        let kept = &all[ENTRIES_PER_BLOCK as usize..];
        assert_eq!(entries(&log), kept);
        assert!(
            seen.len() <= all.len() && seen[..] == all[..seen.len()]
                || seen.len() <= kept.len() && seen[..] == kept[..seen.len()],
            "the reader saw {seen:?}"
        );
        check_cursor_done(&log);
        log.reclaim().unwrap();
        assert_eq!(alloc.freed(), 1);
    });
}
