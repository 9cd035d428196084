//! What the loom models of the log share: a media of loom atomics over a few blocks of the
//! loom geometry (checking that no committed slot is overwritten and no freed block touched),
//! an allocator that never reuses a block, and entry helpers.

#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64 as StdAtomicU64, Ordering::SeqCst};

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::log::{Entry, HeadWord, Log};
use pmfs_core::pm::Media;
use pmfs_core::traits::{AllocHint, BlockAllocator, Extent};
use pmfs_core::{Error, Result};

/// Words modelled per block: the header line and the eight entry slots of the loom geometry.
pub const WORDS: u64 = 16;
/// Blocks in the modelled region (block 0 holds the head word and other roots).
pub const BLOCKS: u64 = 8;
/// Where the head word lives.
pub const ROOT: PmOff = PmOff(64);

/// The modelled words and block bookkeeping, shared by the media and the allocator. The
/// flags are plain std atomics: checks, not part of the modelled program.
pub struct Blocks {
    pub words: Vec<AtomicU64>,
    pub freed: Vec<AtomicBool>,
    /// Blocks reachable at some point (linked, or installed as head).
    pub published: Vec<AtomicBool>,
}

/// What a freed block is overwritten with.
pub const POISON: u64 = 0xDEAD_DEAD_DEAD_DEAD;

/// A media of loom atomics. Ordinary stores are relaxed word stores; flushes and fences only
/// check bounds (persistence is the crash simulator's business, not loom's).
pub struct LoomMedia {
    pub blocks: std::sync::Arc<Blocks>,
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
                HeadWord(new).head().map_or(0, |b| b.0)
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
pub struct LoomAlloc {
    pub next: StdAtomicU64,
    pub blocks: std::sync::Arc<Blocks>,
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

    /// The allocator serves one log: every block handed out and not freed.
    fn outstanding(&self) -> Result<Option<Vec<BlockNo>>> {
        let next = self.next.load(SeqCst).min(BLOCKS);
        Ok(Some(
            (1..next)
                .filter(|&b| !self.blocks.freed[b as usize].load(SeqCst))
                .map(BlockNo)
                .collect(),
        ))
    }
}

impl LoomAlloc {
    /// Blocks freed so far.
    pub fn freed(&self) -> usize {
        self.blocks.freed.iter().filter(|f| f.load(SeqCst)).count()
    }
}

/// A log over the loom media.
pub type LoomLog = Log<LoomMedia, LoomAlloc>;

/// A fresh log, and its allocator.
pub fn setup() -> (Arc<LoomLog>, std::sync::Arc<LoomAlloc>) {
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

/// A one-block write of logical block `i` (inline).
pub fn e(i: u64) -> Entry {
    Entry::write(i, BlockNo(1), 1, 0)
}

/// The whole log, from its head.
pub fn replay(log: &LoomLog) -> Vec<Entry> {
    log.iter().unwrap().map(|r| r.unwrap().1).collect()
}

/// Whether `p` is a prefix of `of`.
pub fn is_prefix(p: &[Entry], of: &[Entry]) -> bool {
    p.len() <= of.len() && p == &of[..p.len()]
}

/// Runs `f` in every interleaving loom explores.
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.max_branches = 100_000;
    b.check(f);
}

/// A second handle on `log`'s blocks, as another process opens it (its own tail hint and
/// grace-period epoch; only the media is shared).
pub fn open_other(log: &LoomLog, alloc: &std::sync::Arc<LoomAlloc>) -> Arc<LoomLog> {
    let media = LoomMedia {
        blocks: log.media().blocks.clone(),
    };
    Arc::new(LoomLog::open(media, ROOT, alloc.clone()).unwrap())
}
