//! Concurrent writers and readers on one file, each through its own handle, on every mapping
//! kind (and on a HashFS pool through a separately attached client per thread, where no DRAM
//! lock serialises the writers), are linearizable at block granularity. Writers write
//! block-aligned ranges of 1..4 blocks at random offsets, every 8-byte word of a write
//! holding the write's tag (writer, sequence number). Every read, and the final state, is
//! checked against the record of which writes started and returned when:
//! - no block is torn: it holds one tag of a write that had started;
//! - a write that returned before the read started is never undone by an older one;
//! - a multi-block write is seen whole: when one block of it shows it and another block of
//!   it shows a different write, that write is a later one (it did not return before the
//!   first started) that does not cover the first block;
//! - the final value of each block is a write no other write of that block follows in real
//!   time.
//!
//! Bounded by operation counts (a few seconds in debug).

mod data_common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use data_common::lin::{Rec, check_final, check_read, tag, tags_of};
use data_common::rng::Rng;
use data_common::{BS, Config, KINDS, RW, create, sim_options};
use pmfs::{MappingKind, OpenNode, Volume};
use pmfs_core::pm::{HeapRegion, Media};

/// Blocks of the shared file.
const BLOCKS: u64 = 16;
/// Writes per writer thread.
const WRITES: u64 = 250;

/// The shared record of writes and a logical clock.
#[derive(Default)]
struct History {
    clock: AtomicU64,
    writes: Mutex<HashMap<u64, Rec>>,
}

impl History {
    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn snapshot(&self) -> HashMap<u64, Rec> {
        self.writes.lock().unwrap().clone()
    }
}

fn run(kind: MappingKind, writers: u64, seed: u64) {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(8 << 20).unwrap());
    let cfg = Config {
        kind,
        alloc: pmfs::AllocatorKind::Cffs,
    };
    let vol = Volume::format(media, &sim_options(cfg)).unwrap();
    let ino = {
        let f = create(&vol, "f");
        f.write_at(&vec![0u8; (BLOCKS * BS) as usize], 0).unwrap();
        f.ino()
    };
    exercise(
        &format!("{kind:?}"),
        &|| vol.open_ino(ino, RW).unwrap(),
        writers,
        seed,
    );
    vol.close().unwrap();
}

/// Runs `writers` writer threads and two readers, each on its own handle from `open`, and
/// checks every read and the final state.
fn exercise(label: &str, open: &(dyn Fn() -> OpenNode + Sync), writers: u64, seed: u64) {
    let hist = History::default();
    hist.writes.lock().unwrap().insert(
        tag(0, 0),
        Rec {
            first: 0,
            len: BLOCKS,
            start: 0,
            end: 0,
        },
    );
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    thread::scope(|s| {
        let mut handles = Vec::new();
        for w in 1..=writers {
            let node: OpenNode = open();
            let hist = &hist;
            handles.push(s.spawn(move || {
                let mut rng = Rng::new(seed ^ w);
                for seq in 1..=WRITES {
                    let len = rng.range(1, 4);
                    let first = rng.range(0, BLOCKS - len);
                    let t = tag(w, seq);
                    let buf: Vec<u8> =
                        std::iter::repeat_n(t.to_le_bytes(), (len * BS / 8) as usize)
                            .flatten()
                            .collect();
                    let start = hist.tick();
                    hist.writes.lock().unwrap().insert(
                        t,
                        Rec {
                            first,
                            len,
                            start,
                            end: u64::MAX,
                        },
                    );
                    node.write_at(&buf, first * BS).unwrap();
                    let end = hist.tick();
                    hist.writes.lock().unwrap().get_mut(&t).unwrap().end = end;
                }
            }));
        }
        // Two readers: whole-file reads and random ranges.
        for r in 0..2u64 {
            let node: OpenNode = open();
            let (hist, done, reads) = (&hist, &done, &reads);
            s.spawn(move || {
                let mut rng = Rng::new(seed ^ (100 + r));
                while !done.load(Ordering::SeqCst) {
                    let (first, len) = if r == 0 {
                        (0, BLOCKS)
                    } else {
                        let len = rng.range(1, 8);
                        (rng.range(0, BLOCKS - len), len)
                    };
                    let mut buf = vec![0u8; (len * BS) as usize];
                    let rstart = hist.tick();
                    let n = node.read_at(&mut buf, first * BS).unwrap();
                    let rend = hist.tick();
                    assert_eq!(n, buf.len(), "{label}: short read");
                    let tags = tags_of(&buf, first).unwrap_or_else(|e| panic!("{label}: {e}"));
                    check_read(&tags, first, rstart, rend, &hist.snapshot())
                        .unwrap_or_else(|e| panic!("{label}: {e}"));
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for h in handles {
            h.join().unwrap();
        }
        done.store(true, Ordering::SeqCst);
    });
    assert!(reads.load(Ordering::Relaxed) > 0, "{label}: no read ran");
    // The final state: a serial order of all writes.
    let node = open();
    assert_eq!(node.size().unwrap(), BLOCKS * BS);
    let mut buf = vec![0u8; (BLOCKS * BS) as usize];
    node.read_at(&mut buf, 0).unwrap();
    let tags = tags_of(&buf, 0).unwrap_or_else(|e| panic!("{label}: final: {e}"));
    drop(node);
    let writes = hist.snapshot();
    check_final(&tags, &writes, hist.tick()).unwrap_or_else(|e| panic!("{label}: {e}"));
}

#[test]
fn two_writers_and_two_readers_are_linearizable() {
    for (i, kind) in KINDS.into_iter().enumerate() {
        run(kind, 2, 11 + i as u64);
    }
}

#[test]
fn three_writers_and_two_readers_are_linearizable() {
    for (i, kind) in KINDS.into_iter().enumerate() {
        run(kind, 3, 21 + i as u64);
    }
}

#[test]
fn attached_clients_in_threads_are_linearizable() {
    // Each thread attaches its own client to a HashFS pool: no DRAM lock is shared, so
    // concurrent writes race on the log tail (optimistic commits and retries).
    let path = std::env::temp_dir().join(format!("pmfs-data-conc-{}.pool", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let opts = pmfs::Options {
        inodes: Some(64),
        journal_slots: 4,
        size: 16 << 20,
        ..pmfs::Options::with_mapping(MappingKind::HashFs)
    };
    let vol = Volume::create(&path, &opts).unwrap();
    let ino = {
        let f = create(&vol, "f");
        f.write_at(&vec![0u8; (BLOCKS * BS) as usize], 0).unwrap();
        f.ino()
    };
    exercise(
        "attached HashFS clients",
        &|| Volume::attach(&path).unwrap().open_ino(ino, RW).unwrap(),
        3,
        31,
    );
    vol.close().unwrap();
    let media: Arc<dyn Media> = Arc::new(pmfs_core::pm::PmRegion::open(&path).unwrap());
    data_common::fsck_clean(media).unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_checker_rejects_torn_stale_and_partial_observations() {
    let rec = |first, len, start, end| Rec {
        first,
        len,
        start,
        end,
    };
    let writes: HashMap<u64, Rec> = [
        (tag(0, 0), rec(0, 4, 0, 0)),
        (tag(1, 1), rec(0, 2, 1, 2)),
        (tag(2, 1), rec(1, 2, 3, 4)),
    ]
    .into();
    // Serial states are accepted.
    check_read(&[tag(1, 1), tag(2, 1), tag(2, 1), 0], 0, 5, 6, &writes).unwrap();
    check_read(&[tag(1, 1), tag(1, 1), 0, 0], 0, 2, 6, &writes).unwrap();
    // Stale: (2, 1) returned before the read started, yet block 1 shows the older (1, 1).
    assert!(check_read(&[tag(1, 1), tag(1, 1), tag(2, 1), 0], 0, 5, 6, &writes).is_err());
    // Partial: (1, 1) seen in block 1 but block 0 still holds the initial write.
    assert!(check_read(&[0, tag(1, 1), 0, 0], 0, 2, 6, &writes).is_err());
    // A tag outside the write's blocks, and a write from the future.
    assert!(check_read(&[0, 0, 0, tag(1, 1)], 0, 5, 6, &writes).is_err());
    assert!(check_read(&[tag(1, 1), tag(2, 1), tag(2, 1), 0], 0, 0, 2, &writes).is_err());
    // A torn block.
    let mut blk = vec![0u8; BS as usize];
    blk[8..16].copy_from_slice(&tag(1, 1).to_le_bytes());
    assert!(tags_of(&blk, 0).is_err());
}
