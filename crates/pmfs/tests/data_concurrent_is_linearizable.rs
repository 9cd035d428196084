//! Concurrent writers and readers on one file, each through its own handle, on every mapping
//! kind (and on a HashFS pool through a separately attached client per thread, where no DRAM
//! lock serialises the writers), are linearizable. Writers write block-aligned ranges of
//! 1..4 blocks, or (checked per 8-byte word) ranges of any 8-byte-aligned offset and length
//! up to 3 blocks, so that concurrent writes share partial blocks; every word of a write
//! holds the write's tag (writer, sequence number). Every read, and the final state, is
//! checked against the record of which writes started and returned when (per block, or per
//! word):
//! - no block is torn: it holds one tag of a write that had started and covers it;
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
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use data_common::lin::{
    Rec, check_final, check_read, check_words, check_words_final, tag, tags_of, words_of,
};
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

fn run(kind: MappingKind, unit: Unit, writers: u64, seed: u64) {
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
        unit,
        writers,
        seed,
    );
    vol.close().unwrap();
}

/// What a write covers and the checks work on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    /// Whole blocks (writes of 1..4 blocks).
    Block,
    /// 8-byte words (writes of 1..1536 words at any word, so most start and end inside
    /// blocks and share blocks with others).
    Word,
}

impl Unit {
    fn bytes(self) -> u64 {
        match self {
            Unit::Block => BS,
            Unit::Word => 8,
        }
    }

    fn count(self) -> u64 {
        BLOCKS * BS / self.bytes()
    }

    fn write_len(self, rng: &mut Rng) -> u64 {
        match self {
            Unit::Block => rng.range(1, 4),
            Unit::Word => rng.range(1, 3 * BS / 8),
        }
    }

    fn read_len(self, rng: &mut Rng) -> u64 {
        rng.range(1, self.count() / 2)
    }

    /// Checks a read of the units from `first`.
    fn check(
        self,
        buf: &[u8],
        first: u64,
        rstart: u64,
        rend: u64,
        writes: &HashMap<u64, Rec>,
    ) -> Result<(), String> {
        match self {
            Unit::Block => check_read(&tags_of(buf, first)?, first, rstart, rend, writes),
            Unit::Word => check_words(&words_of(buf), first, rstart, rend, writes),
        }
    }

    /// Checks the final state of the whole file.
    fn check_final(self, buf: &[u8], writes: &HashMap<u64, Rec>, now: u64) -> Result<(), String> {
        match self {
            Unit::Block => check_final(&tags_of(buf, 0)?, writes, now),
            Unit::Word => check_words_final(&words_of(buf), writes, now),
        }
    }
}

/// Runs `writers` writer threads and two readers, each on its own handle from `open`, and
/// checks every read and the final state.
fn exercise(
    label: &str,
    open: &(dyn Fn() -> OpenNode + Sync),
    unit: Unit,
    writers: u64,
    seed: u64,
) {
    let ub = unit.bytes();
    let hist = History::default();
    hist.writes.lock().unwrap().insert(
        tag(0, 0),
        Rec {
            first: 0,
            len: unit.count(),
            start: 0,
            end: 0,
        },
    );
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    // Writers and readers start together, so the reads overlap the writes.
    let start = Barrier::new(writers as usize + 2);
    thread::scope(|s| {
        let mut handles = Vec::new();
        for w in 1..=writers {
            let node: OpenNode = open();
            let (hist, start) = (&hist, &start);
            handles.push(s.spawn(move || {
                start.wait();
                let mut rng = Rng::new(seed ^ w);
                for seq in 1..=WRITES {
                    let len = unit.write_len(&mut rng);
                    let first = rng.range(0, unit.count() - len);
                    let t = tag(w, seq);
                    let mut buf = vec![0u8; (len * ub) as usize];
                    for word in buf.chunks_exact_mut(8) {
                        word.copy_from_slice(&t.to_le_bytes());
                    }
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
                    node.write_at(&buf, first * ub).unwrap();
                    let end = hist.tick();
                    hist.writes.lock().unwrap().get_mut(&t).unwrap().end = end;
                }
            }));
        }
        // Two readers: whole-file reads and random ranges.
        for r in 0..2u64 {
            let node: OpenNode = open();
            let (hist, done, reads, start) = (&hist, &done, &reads, &start);
            s.spawn(move || {
                start.wait();
                let mut rng = Rng::new(seed ^ (100 + r));
                // At least one read each, however fast the writers are.
                loop {
                    let (first, len) = if r == 0 {
                        (0, unit.count())
                    } else {
                        let len = unit.read_len(&mut rng);
                        (rng.range(0, unit.count() - len), len)
                    };
                    let mut buf = vec![0u8; (len * ub) as usize];
                    let rstart = hist.tick();
                    let n = node.read_at(&mut buf, first * ub).unwrap();
                    let rend = hist.tick();
                    assert_eq!(n, buf.len(), "{label}: short read");
                    unit.check(&buf, first, rstart, rend, &hist.snapshot())
                        .unwrap_or_else(|e| panic!("{label}: {e}"));
                    reads.fetch_add(1, Ordering::Relaxed);
                    if done.load(Ordering::SeqCst) {
                        break;
                    }
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
    drop(node);
    unit.check_final(&buf, &hist.snapshot(), hist.tick())
        .unwrap_or_else(|e| panic!("{label}: final: {e}"));
}

#[test]
fn two_writers_and_two_readers_are_linearizable() {
    for (i, kind) in KINDS.into_iter().enumerate() {
        run(kind, Unit::Block, 2, 11 + i as u64);
    }
}

#[test]
fn three_writers_and_two_readers_are_linearizable() {
    for (i, kind) in KINDS.into_iter().enumerate() {
        run(kind, Unit::Block, 3, 21 + i as u64);
    }
}

#[test]
fn unaligned_writes_are_linearizable_per_word() {
    for (i, kind) in KINDS.into_iter().enumerate() {
        run(kind, Unit::Word, 3, 41 + i as u64);
    }
}

/// Each thread attaches its own client to a HashFS pool: no DRAM lock is shared, so
/// concurrent writes race on the log tail (optimistic commits, re-copying the partial
/// blocks a concurrent commit changed, and retries).
fn attached(name: &str, unit: Unit, seed: u64) {
    let path =
        std::env::temp_dir().join(format!("pmfs-data-conc-{}-{name}.pool", std::process::id()));
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
        &format!("attached HashFS clients, {unit:?}"),
        &|| Volume::attach(&path).unwrap().open_ino(ino, RW).unwrap(),
        unit,
        3,
        seed,
    );
    vol.close().unwrap();
    let media: Arc<dyn Media> = Arc::new(pmfs_core::pm::PmRegion::open(&path).unwrap());
    data_common::fsck_clean(media).unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn attached_clients_in_threads_are_linearizable() {
    attached("blocks", Unit::Block, 31);
}

#[test]
fn unaligned_writes_of_attached_clients_are_linearizable_per_word() {
    attached("words", Unit::Word, 51);
}

#[test]
fn the_checkers_reject_torn_stale_and_partial_observations() {
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
    // Per word: (1, 1) wrote words 0..3, (2, 1) words 2..6 after it.
    let words: HashMap<u64, Rec> = [
        (tag(0, 0), rec(0, 8, 0, 0)),
        (tag(1, 1), rec(0, 3, 1, 2)),
        (tag(2, 1), rec(2, 4, 3, 4)),
    ]
    .into();
    let (a, b) = (tag(1, 1), tag(2, 1));
    check_words(&[a, a, b, b, b, b, 0, 0], 0, 5, 6, &words).unwrap();
    check_words_final(&[a, a, b, b, b, b, 0, 0], &words, 7).unwrap();
    // The head of (2, 1) lost to the older (1, 1): stale, and not a serial final state.
    assert!(check_words(&[a, a, a, b, b, b, 0, 0], 0, 5, 6, &words).is_err());
    assert!(check_words_final(&[a, a, a, b, b, b, 0, 0], &words, 7).is_err());
    // (1, 1) seen in word 0 only.
    assert!(check_words(&[a, 0, 0, 0, 0, 0, 0, 0], 0, 2, 6, &words).is_err());
    // A torn block.
    let mut blk = vec![0u8; BS as usize];
    blk[8..16].copy_from_slice(&tag(1, 1).to_le_bytes());
    assert!(tags_of(&blk, 0).is_err());
}
