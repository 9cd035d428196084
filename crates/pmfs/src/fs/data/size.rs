//! Sizes and block counts of open files: the digested size, the size with the log folded in,
//! and the blocks a file holds (`st_blocks`), counted from the mapping and the overlay.

use pmfs_core::log::CURSOR_LSN_BITS;

use crate::error::Result;
use crate::format::MAPPED_END_VERSION;
use crate::fs::{Fs, MAX_FILE_SIZE};
use crate::inode::{Handle, field, flag};
use crate::mapping::MapFile;
use crate::overlay::Src;

use super::{BS, Node, RUNS, Shared};

/// Ranges an [`Underneath`](super::Underneath) keeps at most; past it they are all dropped.
const UNDERNEATH_MAX: usize = 4096;

/// What a count of a mapping's blocks ([`Fs::mapped_blocks`]) was counted at. It stays true
/// while the file is the same incarnation, its counted range the same and its digest cursor
/// word the same: every change of a file's mapping is a digest, which moves the cursor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counted {
    generation: u32,
    cursor: u64,
    end: u64,
}

/// Block counts a process keeps at most ([`Fs::mapped_blocks`]); past it they are all dropped.
const BLOCKS_SEEN_MAX: usize = 4096;

/// Times a block count with undigested entries starts again when a digest ran during it
/// ([`Fs::overlaid_blocks`]); the last count stands.
const COUNT_TRIES: u32 = 4;

impl Fs {
    /// The digested size word.
    pub(super) fn digested_size(&self, ino: u32) -> Result<u64> {
        self.inodes.load(self.m(), ino, field::SIZE)
    }

    /// The data blocks regular file `h` of `size` bytes maps (its `st_blocks`, in blocks).
    /// A file that never had a hole ([`flag::HOLES`]) maps every block below its size, and
    /// past it those allocated with `KEEP_SIZE`, up to its mapped end: no lookup. The blocks
    /// of any other file are counted in its mapping, and the ranges that undigested entries
    /// changed as the overlay has them, as reads see them ([`overlaid_blocks`]).
    ///
    /// [`overlaid_blocks`]: Fs::overlaid_blocks
    pub fn blocks_of(&self, h: Handle, size: u64) -> Result<u64> {
        let ino = h.ino;
        let end = self.block_span(ino, size)?.min(MAX_FILE_SIZE / BS);
        if self.inodes.flags(self.m(), ino)? & flag::HOLES == 0 {
            return Ok(end);
        }
        let _il = self.tree_read_lock(ino);
        let f = self.map.open_file(self.file_id(ino))?;
        match self.with_live_log(ino, |s| self.overlaid_blocks(h, s, &f, end))? {
            Some(n) => Ok(n),
            None => self.mapped_blocks(h, &f, end),
        }
    }

    /// The blocks of `[0, end)` that `h`'s mapping maps. The count costs a lookup of the
    /// range (on the hashed structures at most one pass over the table: 2 ms for a 100 MiB
    /// HashFS file with one block at 50 MB), so it is kept until the file's digest cursor
    /// moves ([`Counted`]). The caller holds the [tree lock](Fs::tree_read_lock).
    fn mapped_blocks(&self, h: Handle, f: &MapFile, end: u64) -> Result<u64> {
        let (m, ino) = (self.m(), h.ino);
        // The cursor before the bound: a digest that moves the bound after it was read also
        // moves the cursor, and the count is not kept.
        let cursor = self.inodes.load(m, ino, field::DIGEST)?;
        let end = end.min(self.mapped_bound(ino)?);
        let counted = Counted {
            generation: h.generation,
            cursor,
            end,
        };
        if let Some(&(_, n)) = self
            .blocks_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ino)
            .filter(|(at, _)| *at == counted)
        {
            return Ok(n);
        }
        let blocks = self.blocks_in(f, 0, end)?;
        // Kept only if no digest ran meanwhile, nor was running (a holder in the cursor).
        if counted.cursor >> CURSOR_LSN_BITS == 0
            && self.inodes.load(m, ino, field::DIGEST)? == counted.cursor
        {
            let mut c = self.blocks_seen.lock().unwrap_or_else(|e| e.into_inner());
            if c.len() >= BLOCKS_SEEN_MAX {
                c.clear();
            }
            c.insert(ino, (counted, blocks));
        }
        Ok(blocks)
    }

    /// The blocks of `[lblk, lblk + len)` that the mapping maps.
    fn blocks_in(&self, f: &MapFile, lblk: u64, len: u64) -> Result<u64> {
        let mut runs = RUNS.take();
        runs.clear();
        let r = self.map.lookup(f, lblk, len, &mut runs);
        let blocks = runs.iter().map(|r| r.len).sum();
        RUNS.set(runs);
        r.map(|()| blocks)
    }

    /// [`mapped_blocks`](Fs::mapped_blocks) with the undigested entries of `s`: the ranges
    /// they changed are counted as the overlay has them instead of as the mapping does. A
    /// write counts from its commit, not from its digest, which may come much later (while
    /// the file stays open): a file whose new blocks did not count would look like holes to
    /// `tar --sparse` and `cp`. A digest that runs meanwhile changes the mapping under the
    /// count, which then starts again, a few times at most.
    fn overlaid_blocks(&self, h: Handle, s: &Shared, f: &MapFile, end: u64) -> Result<u64> {
        let (m, ino) = (self.m(), h.ino);
        let mut pieces = Vec::new();
        let mut tries = 0;
        loop {
            tries += 1;
            let t0 = s.log.tail()?.lsn();
            let cursor = self.inodes.load(m, ino, field::DIGEST)?;
            let mapped = self.mapped_blocks(h, f, end)?;
            // The mapping maps nothing past its bound: pieces there (a file growing, the
            // common case) need no lookup.
            let digested_end = self.mapped_bound(ino)?;
            {
                let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
                self.catch_up(ino, s, &mut ov, t0)?;
                pieces.clear();
                ov.lookup(0, end, &mut pieces);
            }
            let mut blocks = mapped;
            for p in &pieces {
                let now = match p.src {
                    Src::Base => continue,
                    Src::Mapped(_) => p.len,
                    Src::Hole => 0,
                };
                let was = match digested_end.saturating_sub(p.lblk).min(p.len) {
                    0 => 0,
                    len => self.blocks_under(ino, s, f, cursor, p.lblk, len)?,
                };
                blocks = (blocks + now).saturating_sub(was);
            }
            let settled = cursor >> CURSOR_LSN_BITS == 0
                && self.inodes.load(m, ino, field::DIGEST)? == cursor
                && s.log.tail()?.lsn() == t0;
            if settled || tries == COUNT_TRIES {
                return Ok(blocks);
            }
            std::thread::yield_now();
        }
    }

    /// [`blocks_in`](Fs::blocks_in) for a range of an undigested piece of `s`'s file, where
    /// `cursor` is the digest cursor word the count started at: kept in `s` while that word
    /// stays (and no digest is running), so the next count looks up only pieces it has not
    /// seen.
    fn blocks_under(
        &self,
        ino: u32,
        s: &Shared,
        f: &MapFile,
        cursor: u64,
        lblk: u64,
        len: u64,
    ) -> Result<u64> {
        let keep = cursor >> CURSOR_LSN_BITS == 0;
        if keep {
            let u = s.underneath.lock().unwrap_or_else(|e| e.into_inner());
            if u.cursor == cursor
                && let Some(&n) = u.blocks.get(&(lblk, len))
            {
                return Ok(n);
            }
        }
        let n = self.blocks_in(f, lblk, len)?;
        // Kept only if no digest ran meanwhile (as in `mapped_blocks`).
        if keep && self.inodes.load(self.m(), ino, field::DIGEST)? == cursor {
            let mut u = s.underneath.lock().unwrap_or_else(|e| e.into_inner());
            if u.cursor != cursor || u.blocks.len() >= UNDERNEATH_MAX {
                u.cursor = cursor;
                u.blocks.clear();
            }
            u.blocks.insert((lblk, len), n);
        }
        Ok(n)
    }

    /// The logical blocks regular file `ino` of `size` bytes may map: those below its size
    /// or below its mapped end, whichever reaches further.
    fn block_span(&self, ino: u32, size: u64) -> Result<u64> {
        let mapped_end = self.inodes.load(self.m(), ino, field::MAPPED_END)?;
        Ok(size.div_ceil(BS).max(mapped_end))
    }

    /// The logical block below which regular file `ino` maps every block it maps: its
    /// `MAPPED_END` word, or on a volume older than [`MAPPED_END_VERSION`] (mounted
    /// read-only: a mount for writing upgrades it) the [block span](Fs::block_span) of its
    /// digested size. A digest raises the word before it maps blocks past it and lowers it
    /// only after it unmapped them: a lookup clipped to a bound read before it misses only
    /// blocks that a digest mapped meanwhile, those of entries that readers take from their
    /// overlay (or see after their tail check). Undigested entries are not bounded by it.
    pub(crate) fn mapped_bound(&self, ino: u32) -> Result<u64> {
        if self.geo.version >= MAPPED_END_VERSION {
            self.inodes.load(self.m(), ino, field::MAPPED_END)
        } else {
            self.block_span(ino, self.digested_size(ino)?)
        }
    }

    /// Marks `ino` as a file that may have holes ([`flag::HOLES`]), before an update that may
    /// make one commits (durable at its fence).
    pub(super) fn mark_holes(&self, ino: u32) -> Result<()> {
        self.inodes.set_flags(self.m(), ino, flag::HOLES)
    }

    /// The file's size.
    pub fn size_of(&self, n: &Node) -> Result<u64> {
        match self.shared(n, false)? {
            Some(s) => self.folded_size(n.h.ino, &s),
            None => self.digested_size(n.h.ino),
        }
    }

    /// The size with every committed entry of `s`'s log folded in.
    pub(super) fn folded_size(&self, ino: u32, s: &Shared) -> Result<u64> {
        loop {
            let t0 = s.log.tail()?.lsn();
            let mut ov = s.ov.lock().unwrap_or_else(|e| e.into_inner());
            self.catch_up(ino, s, &mut ov, t0)?;
            let size = ov.size(self.digested_size(ino)?);
            if s.log.tail()?.lsn() == t0 {
                return Ok(size);
            }
        }
    }

    /// The size of regular file `ino` whose size word reads `digested`, with the writes its
    /// log has not digested yet. Writes are digested in batches, so while some process has
    /// the file open the size word may lag; a log that nobody has open (no pins) is digested
    /// (every process digests at its last close, mount digests what a crash left, and the
    /// owner what killed processes left before it takes their pins for dead,
    /// [`clear_dead_pins`](Fs::clear_dead_pins)).
    pub fn live_size(&self, ino: u32, digested: u64) -> Result<u64> {
        Ok(self
            .with_live_log(ino, |s| self.folded_size(ino, s))?
            .unwrap_or(digested))
    }
}
