//! loom models of the log's concurrency: committers racing for the last slot of a block and
//! for the link to the next one while a reader replays; a committer racing with a compaction;
//! a reader racing with a compaction and its reclamation.
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

use std::sync::atomic::{AtomicBool, AtomicU64 as StdAtomicU64, Ordering::SeqCst};

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::log::{Compaction, ENTRIES_PER_BLOCK, Entry, Log};
use pmfs_core::pm::Media;
use pmfs_core::traits::{AllocHint, BlockAllocator, Extent};
use pmfs_core::{Error, Result};

/// Words modelled per block: the header line and the eight entry slots of the loom geometry.
const WORDS: u64 = 16;
const BLOCKS: u64 = 8;
const ROOT: PmOff = PmOff(64);

/// The modelled words and block bookkeeping, shared by the media and the allocator. The
/// flags are plain std atomics: checks, not part of the modelled program.
struct Blocks {
    words: Vec<AtomicU64>,
    freed: Vec<AtomicBool>,
    /// Blocks reachable at some point (linked, or installed as head).
    published: Vec<AtomicBool>,
}

/// What a freed block is overwritten with.
const POISON: u64 = 0xDEAD_DEAD_DEAD_DEAD;

/// A media of loom atomics. Ordinary stores are relaxed word stores; flushes and fences only
/// check bounds (persistence is the crash simulator's business, not loom's).
struct LoomMedia {
    blocks: std::sync::Arc<Blocks>,
}

impl LoomMedia {
    fn word(&self, off: PmOff) -> &AtomicU64 {
        assert!(off.is_aligned(8), "unaligned word access at {off}");
        let block = off.0 / BLOCK_SIZE;
        let w = off.0 % BLOCK_SIZE / 8;
        assert!(
            block < BLOCKS && w < WORDS,
            "access outside the model at {off}"
        );
        assert!(
            !self.blocks.freed[block as usize].load(SeqCst),
            "block {block} used after it was freed"
        );
        &self.blocks.words[(block * WORDS + w) as usize]
    }

    /// A committed slot of a published block never changes.
    fn check_overwrite(&self, off: PmOff, old: u64, new: u64) {
        let block = off.0 / BLOCK_SIZE;
        let w = off.0 % BLOCK_SIZE / 8;
        if block > 0 && w >= 8 && old != 0 && old != new {
            assert!(
                !self.blocks.published[block as usize].load(SeqCst),
                "committed slot {off} overwritten"
            );
        }
    }

    fn words_of(&self, off: PmOff, len: usize) -> impl Iterator<Item = (PmOff, &AtomicU64)> {
        assert!(len.is_multiple_of(8), "partial word access at {off}");
        (0..len as u64 / 8).map(move |i| (off + i * 8, self.word(off + i * 8)))
    }
}

impl Media for LoomMedia {
    fn size(&self) -> u64 {
        BLOCKS * BLOCK_SIZE
    }

    fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
        let n = buf.len();
        for (i, (_, w)) in self.words_of(off, n).enumerate() {
            buf[i * 8..i * 8 + 8].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        Ok(())
    }

    fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
        for (i, (at, w)) in self.words_of(off, src.len()).enumerate() {
            let new = u64::from_le_bytes(src[i * 8..i * 8 + 8].try_into().unwrap());
            self.check_overwrite(at, w.load(Ordering::Relaxed), new);
            w.store(new, Ordering::Relaxed);
        }
        Ok(())
    }

    fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.write(off, src)
    }

    fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
        self.write(off, &vec![byte; len as usize])
    }

    fn flush(&self, off: PmOff, len: u64) -> Result<()> {
        if off.0 + len > self.size() {
            return Err(Error::OutOfBounds {
                off,
                len,
                size: self.size(),
            });
        }
        Ok(())
    }

    fn fence(&self) {}

    fn load_u64(&self, off: PmOff) -> Result<u64> {
        Ok(self.word(off).load(Ordering::Acquire))
    }

    fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
        let w = self.word(off);
        self.check_overwrite(off, w.load(Ordering::Relaxed), val);
        w.store(val, Ordering::Release);
        Ok(())
    }

    fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
        self.check_overwrite(off, current, new);
        let r = self
            .word(off)
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire);
        if r.is_ok() {
            // A link or a head installs a block.
            let installed = if off == ROOT {
                new & ((1 << 48) - 1)
            } else if off.0 % BLOCK_SIZE == 8 {
                new
            } else {
                0
            };
            if installed != 0 {
                self.blocks.published[installed as usize].store(true, SeqCst);
            }
        }
        Ok(r)
    }
}

/// Hands out each block once. Freed blocks are never reused, so a late access is caught; they
/// are overwritten with loom stores, so loom orders the free against every access to them.
struct LoomAlloc {
    next: StdAtomicU64,
    blocks: std::sync::Arc<Blocks>,
}

impl BlockAllocator for LoomAlloc {
    fn alloc(&self, _want: u64, _hint: AllocHint) -> Result<Extent> {
        let b = self.next.fetch_add(1, SeqCst);
        if b >= BLOCKS {
            return Err(Error::NoSpace);
        }
        Ok(Extent::new(BlockNo(b), 1))
    }

    fn free(&self, ext: Extent) -> Result<()> {
        for b in ext.start.0..ext.end().0 {
            assert!(
                !self.blocks.freed[b as usize].swap(true, SeqCst),
                "block {b} freed twice"
            );
            for w in &self.blocks.words[(b * WORDS) as usize..((b + 1) * WORDS) as usize] {
                w.store(POISON, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn free_blocks(&self) -> u64 {
        BLOCKS - self.next.load(SeqCst)
    }

    fn total_blocks(&self) -> u64 {
        BLOCKS - 1
    }

    fn rebuild(&self, _used: &mut dyn Iterator<Item = Extent>) -> Result<()> {
        Err(Error::Unsupported("rebuild in a loom model"))
    }
}

impl LoomAlloc {
    fn freed(&self) -> usize {
        self.blocks.freed.iter().filter(|f| f.load(SeqCst)).count()
    }
}

type LoomLog = Log<LoomMedia, LoomAlloc>;

fn setup() -> (Arc<LoomLog>, std::sync::Arc<LoomAlloc>) {
    let blocks = std::sync::Arc::new(Blocks {
        words: (0..BLOCKS * WORDS).map(|_| AtomicU64::new(0)).collect(),
        freed: (0..BLOCKS).map(|_| AtomicBool::new(false)).collect(),
        published: (0..BLOCKS).map(|_| AtomicBool::new(false)).collect(),
    });
    let media = LoomMedia {
        blocks: blocks.clone(),
    };
    let alloc = std::sync::Arc::new(LoomAlloc {
        next: StdAtomicU64::new(1),
        blocks,
    });
    let log = LoomLog::create(media, ROOT, alloc.clone()).unwrap();
    (Arc::new(log), alloc)
}

fn e(i: u64) -> Entry {
    Entry::write(i, BlockNo(1), 1, 0)
}

fn replay(log: &LoomLog) -> Vec<Entry> {
    log.iter().unwrap().map(|r| r.unwrap().1).collect()
}

fn is_prefix(p: &[Entry], of: &[Entry]) -> bool {
    p.len() <= of.len() && p == &of[..p.len()]
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.max_branches = 100_000;
    b.check(f);
}

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
