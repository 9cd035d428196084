//! Log compaction (a new chain published with one CAS on the head word) and the deferred
//! reclamation of the blocks it replaced.

use std::collections::{BTreeSet, HashSet};

use super::chain::Walk;
use super::entry::Entry;
use super::epoch::Guard;
use super::format::{
    ENTRIES_PER_BLOCK, FIRST_SLOT, FLAG_COMPACTED, HeadWord, Indirect, MAX_SPAN, MIN_SEGMENT_SPAN,
    SEGMENT_HEADER_WORDS, SLOTS_PER_BLOCK, SegmentHeader, Slot, reserve_word, segment_words,
    slot_off,
};
use super::{Log, Position, pack};
use crate::error::{Error, Result};
use crate::layout::{BlockNo, PmOff};
use crate::pm::Media;
use crate::sync::atomic::Ordering;
use crate::traits::{BlockAllocator, Extent};

/// What [`Log::compact`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compaction {
    /// The new chain is published; `retired` old blocks await reclamation.
    Compacted {
        /// Blocks written for the live entries.
        written: u64,
        /// Blocks unlinked (reclaimed once no reader can be in them).
        retired: u64,
    },
    /// The live entries would not take fewer blocks than they replace; nothing changed.
    NotSmaller,
    /// Another compaction published first, or the point is no longer on the chain; nothing
    /// changed. Take a new [`compaction_point`](Log::compaction_point) and fold again.
    Raced,
}

/// Blocks retired by compactions and not yet freed.
#[derive(Debug, Default)]
pub(crate) struct Retired {
    /// Unlinked blocks, with the epoch read after their unlinking.
    batches: Vec<(Vec<BlockNo>, u64)>,
    /// Retired blocks still holding segments of entries of the current chain.
    held: Vec<BlockNo>,
}

/// Lays out live entries in compacted blocks (block-local entry slots, padding included).
struct Builder<'f> {
    owner: u64,
    /// Entry slots of each block, `ENTRIES_PER_BLOCK` words each once finished.
    blocks: Vec<Vec<u64>>,
    block_of: &'f dyn Fn(usize) -> BlockNo,
}

impl Builder<'_> {
    fn room(&self) -> u64 {
        self.blocks
            .last()
            .map_or(0, |b| ENTRIES_PER_BLOCK - b.len() as u64)
    }

    /// Pads the current block and opens the next.
    fn next_block(&mut self) {
        self.pad();
        self.blocks
            .push(Vec::with_capacity(ENTRIES_PER_BLOCK as usize));
    }

    fn pad(&mut self) {
        if let Some(b) = self.blocks.last_mut() {
            let left = ENTRIES_PER_BLOCK - b.len() as u64;
            if left > 0 {
                b.push(reserve_word(left - 1));
                b.resize(ENTRIES_PER_BLOCK as usize, 0);
            }
        }
    }

    /// Offset of the word about to be pushed.
    fn here(&self) -> PmOff {
        let k = self.blocks.len() - 1;
        slot_off((self.block_of)(k), FIRST_SLOT + self.blocks[k].len() as u64)
    }

    fn push_word(&mut self, w: u64) {
        if self.room() == 0 {
            self.next_block();
        }
        self.blocks.last_mut().expect("a block is open").push(w);
    }

    fn push(&mut self, e: &Entry) {
        if let Some(w) = e.inline_word() {
            self.push_word(w);
            return;
        }
        let words = e.record_words();
        let total = words.len() as u32;
        // Reserve the spans, then fill them in (each segment names the next one).
        let mut segs: Vec<(usize, usize, PmOff, usize)> = Vec::new();
        let mut left = words.len() as u64;
        while left > 0 {
            if self.room() < 1 + MIN_SEGMENT_SPAN {
                self.next_block();
            }
            let n = (self.room() - 1)
                .min(SEGMENT_HEADER_WORDS + left.min(MAX_SPAN - SEGMENT_HEADER_WORDS));
            self.push_word(reserve_word(n));
            let k = self.blocks.len() - 1;
            let i = self.blocks[k].len();
            segs.push((k, i, self.here(), (n - SEGMENT_HEADER_WORDS) as usize));
            self.blocks[k].resize(i + n as usize, 0);
            left -= n - SEGMENT_HEADER_WORDS;
        }
        let mut done = 0;
        let mut check = 0;
        for (j, &(k, i, _, n)) in segs.iter().enumerate() {
            let next = segs.get(j + 1).map_or(PmOff(0), |s| s.2);
            let sw = segment_words(self.owner, j as u16, next, total, &words[done..done + n]);
            if j == 0 {
                check = Indirect::check_of(SegmentHeader::from_words(&sw).crc.get());
            }
            self.blocks[k][i..i + sw.len()].copy_from_slice(&sw);
            done += n;
        }
        self.push_word(
            Indirect {
                off: segs[0].2,
                check,
            }
            .encode(),
        );
    }

    /// The blocks for `live`, every one full (the last padded); at least one.
    fn build(owner: u64, live: &[Entry], block_of: &dyn Fn(usize) -> BlockNo) -> Vec<Vec<u64>> {
        let mut b = Builder {
            owner,
            blocks: vec![Vec::with_capacity(ENTRIES_PER_BLOCK as usize)],
            block_of,
        };
        for e in live {
            b.push(e);
        }
        b.pad();
        b.blocks
    }
}

impl<M: Media, A: BlockAllocator + ?Sized> Log<M, A> {
    /// The start of the block holding the tail: the point up to which [`compact`](Log::compact)
    /// may replace the log. `None` when that block is the head (nothing to compact).
    pub fn compaction_point(&self) -> Result<Option<Position>> {
        let (_g, era) = self.pin();
        let chain = self.chain();
        let mut walk = self.walk_from_hint()?;
        chain.to_tail(&mut walk)?;
        let end = walk.slot;
        self.make_durable(&mut walk, end)?;
        let (head, _) = self.head()?;
        if walk.block == head {
            return Ok(None);
        }
        walk.slot = FIRST_SLOT;
        Ok(Some(self.position(&walk, era)))
    }

    /// Replaces the log before `point` (from [`compaction_point`](Log::compaction_point)) by
    /// `live`, the caller's compacted equivalent of the entries before it, and publishes the
    /// new chain with one CAS on the head word. Concurrent readers and appenders go on
    /// undisturbed; the replaced blocks are reclaimed later (see [`reclaim`](Log::reclaim),
    /// which this calls once).
    ///
    /// With no live entries nothing is written: the point's block becomes the head. The point
    /// may also be the start of any block before the one holding the tail (every such block is
    /// full and immutable too).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a point that is not a block start or no longer
    /// [current](Log::is_current), or invalid entries; allocation, media and corruption errors.
    pub fn compact(&self, point: Position, live: &[Entry]) -> Result<Compaction> {
        if point.slot != FIRST_SLOT {
            return Err(Error::InvalidArgument(
                "compaction point is not a block start",
            ));
        }
        for e in live {
            e.validate(self.blocks)?;
        }
        let guard = self.epoch.pin();
        self.check_pos(point)?;
        self.compact_pinned(guard, point, live)
    }

    /// [`compact`](Log::compact) for a checked point and valid entries, under `guard` (taken
    /// before the point was); drops the guard before reclaiming.
    pub(crate) fn compact_pinned(
        &self,
        guard: Guard<'_>,
        point: Position,
        live: &[Entry],
    ) -> Result<Compaction> {
        let chain = self.chain();
        let (head, hh) = self.head()?;
        // The blocks before the point, and segment blocks outside them that their entries use
        // (blocks held by an earlier compaction).
        let mut old = Vec::new();
        let mut walk = Walk::new(head, hh.base.get(), FIRST_SLOT, self.blocks);
        while walk.block != point.block {
            old.push(walk.block);
            walk.slot = SLOTS_PER_BLOCK;
            if !walk.step(&chain)? {
                return Ok(Compaction::Raced);
            }
        }
        if walk.base != point.base() {
            return Ok(Compaction::Raced);
        }
        if old.is_empty() {
            return Ok(Compaction::NotSmaller);
        }
        let in_old: HashSet<BlockNo> = old.iter().copied().collect();
        let mut foreign = HashSet::new();
        for &b in &old {
            let base = chain.base(b)?;
            let mut w = Walk::new(b, base, FIRST_SLOT, self.blocks);
            chain.scan(&mut w, |w, s| {
                if let Slot::Indirect(ind) = s {
                    chain.segments(ind, slot_off(w.block, w.slot), |off, _| {
                        if !in_old.contains(&off.block()) {
                            foreign.insert(off.block());
                        }
                        Ok(())
                    })?;
                }
                Ok(())
            })?;
        }
        // Nothing live: the point's block becomes the head, no block is written.
        let count = if live.is_empty() {
            0
        } else {
            Builder::build(self.root.0, live, &|_| BlockNo(1)).len()
        };
        if count >= old.len() {
            return Ok(Compaction::NotSmaller);
        }
        let flight = self.blocks_in_flight();
        let mut fresh = Vec::with_capacity(count);
        for _ in 0..count {
            match self.alloc_block() {
                Ok(b) => fresh.push(b),
                Err(e) => {
                    self.free_all(&fresh);
                    return Err(e);
                }
            }
        }
        let published = self.publish(head, point, live, &fresh);
        match published {
            Ok(true) => {}
            Ok(false) => {
                self.free_all(&fresh);
                return Ok(Compaction::Raced);
            }
            Err(e) => {
                self.free_all(&fresh);
                return Err(e);
            }
        }
        let stamp = self.epoch.now();
        let retired = old.len() as u64;
        let mut blocks = old;
        blocks.extend(foreign);
        self.retired_queue().batches.push((blocks, stamp));
        // Retired blocks are in the queue now, where a sweep sees them.
        drop(flight);
        drop(guard);
        self.reclaim()?;
        Ok(Compaction::Compacted {
            written: count as u64,
            retired,
        })
    }

    /// Writes and persists the compacted blocks, then swings the head word from `head` to
    /// them. Returns `false` if the head moved meanwhile (nothing published).
    fn publish(
        &self,
        head: BlockNo,
        point: Position,
        live: &[Entry],
        fresh: &[BlockNo],
    ) -> Result<bool> {
        let image = if fresh.is_empty() {
            Vec::new()
        } else {
            Builder::build(self.root.0, live, &|k| fresh[k])
        };
        debug_assert_eq!(image.len(), fresh.len());
        let n = fresh.len() as u64;
        let first = point.lsn - n * ENTRIES_PER_BLOCK;
        for (k, slots) in image.iter().enumerate() {
            let next = fresh.get(k + 1).unwrap_or(&point.block).0;
            let base = first + k as u64 * ENTRIES_PER_BLOCK;
            self.write_block(fresh[k], base, FLAG_COMPACTED, slots, next)?;
        }
        self.media.fence();
        let new_head = fresh.first().copied().unwrap_or(point.block);
        let mut cur = self.media.load_u64(self.root)?;
        loop {
            let hw = HeadWord(cur);
            if hw.head() != Some(head) {
                return Ok(false);
            }
            // Only the pin count and the flags may have changed: retry with them.
            match self
                .media
                .cas_u64(self.root, cur, hw.with_head(new_head).0)?
            {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        self.media.persist(self.root, 8)?;
        Ok(true)
    }

    fn free_all(&self, blocks: &[BlockNo]) {
        for &b in blocks {
            let _ = self.alloc.free(Extent::new(b, 1));
        }
    }

    fn retired_queue(&self) -> crate::sync::MutexGuard<'_, Retired> {
        self.retired
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Frees the blocks retired by this handle's compactions once that is safe: no operation of
    /// this process pinned before the retirement is still running, and no other handle (in any
    /// process) has the log open. Under the same conditions, if the head word's orphans flag is
    /// set, it also sweeps the blocks that other handles retired and left behind (see the
    /// module docs, "Across processes"). Returns how many blocks were freed; 0 when it is not
    /// yet safe (retry later; closing the handle retries too). Never waits.
    pub fn reclaim(&self) -> Result<u64> {
        let mut q = self.retired_queue();
        // Read before the hint retreats: a sweep goes ahead only if this word is unchanged.
        let seen = HeadWord(self.media.load_u64(self.root)?);
        if q.batches.is_empty() && q.held.is_empty() && !seen.orphans() {
            return Ok(0);
        }
        if seen.opens() != 1 {
            return Ok(0);
        }
        // Keep new operations out of blocks outside the current chain: move the hint to the
        // retained suffix if it is behind it, and refuse older positions below it.
        let suffix = {
            let _g = self.epoch.pin();
            self.retreat_hint()?
        };
        self.reclaimed_below.fetch_max(suffix.lsn, Ordering::SeqCst);
        self.era.fetch_add(1, Ordering::SeqCst);
        if !self.epoch.has_passed(self.epoch.now()) {
            return Ok(0);
        }
        let referenced = {
            let _g = self.epoch.pin();
            self.chain_blocks(false)?
        };
        let mut freed = 0;
        let mut first_err = None;
        let Retired { batches, held } = &mut *q;
        // A held block is retired again by the compaction that rewrites its referrer: once.
        let candidates: BTreeSet<BlockNo> = batches
            .drain(..)
            .flat_map(|(b, _)| b)
            .chain(held.drain(..))
            .collect();
        for b in candidates {
            if referenced.contains(&b) {
                held.push(b);
            } else {
                match self.alloc.free(Extent::new(b, 1)) {
                    Ok(()) => freed += 1,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        if seen.orphans() {
            match self.sweep(seen, held) {
                Ok(n) => freed += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(freed), Err)
    }

    /// Whether this handle holds blocks its compactions unlinked and it has not freed. Blocks
    /// it keeps because entries of the current chain still use their segments (`held`) do
    /// not count: the compaction that drops those entries retires them again, whichever
    /// handle makes it, so a handle that closes holding only those orphans nothing.
    pub(super) fn has_unlinked(&self) -> bool {
        !self.retired_queue().batches.is_empty()
    }

    /// Sets the orphans flag in the head word: this handle closes with retired blocks that
    /// another handle may still be reading, and leaves them to a [`sweep`](Log::sweep).
    pub(super) fn mark_orphans(&self) -> Result<()> {
        let mut cur = self.media.load_u64(self.root)?;
        loop {
            let hw = HeadWord(cur);
            if hw.orphans() {
                return Ok(());
            }
            match self.media.cas_u64(self.root, cur, hw.with_orphans().0)? {
                Ok(_) => return Ok(()),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Frees every block the allocator handed out for this log that nothing uses: not in
    /// the current chain, holding no segment of its entries, not `held` by this handle and
    /// not its spare. Those are the blocks that handles retired and left behind when they
    /// closed while another handle was open (the orphans flag, which `seen` has), found by
    /// asking the allocator for the blocks it handed out
    /// ([`outstanding`](BlockAllocator::outstanding); an allocator that cannot tell leaves
    /// them to the next rebuild).
    ///
    /// Called by [`reclaim`](Log::reclaim) once no operation of this process can be outside
    /// the chain that `seen` heads, which it read before moving the hint, and while `seen`
    /// says that this handle is the only one open. The sweep marks the word *sweeping* by a
    /// CAS from `seen`, and at the end clears both flags by a CAS from the marked word,
    /// freeing nothing if either fails: a compaction that published meanwhile (whose readers
    /// may be in the blocks it unlinked) changed the head, and an open cleared the mark (the
    /// opener may have allocated blocks not linked yet). Allocations of this process are
    /// caught by [`flight_seq`](Log::flight_seq): a sweep that sees it move frees nothing.
    fn sweep(&self, seen: HeadWord, held: &[BlockNo]) -> Result<u64> {
        let seq = self.flight_seq.load(Ordering::SeqCst);
        if self.blocks_in_flight.load(Ordering::SeqCst) != 0 {
            return Ok(0);
        }
        let marked = seen.with_sweeping();
        if self.media.cas_u64(self.root, seen.0, marked.0)?.is_err() {
            return Ok(0);
        }
        let Some(outstanding) = self.alloc.outstanding()? else {
            return Ok(0);
        };
        // A block of this process that the allocator reported went in flight before it was
        // claimed: the count below sees that.
        crate::sync::atomic::fence(Ordering::SeqCst);
        let mut keep = {
            let _g = self.epoch.pin();
            self.chain_blocks(true)?
        };
        keep.extend(held.iter().copied());
        let spare = self.spare.load(Ordering::SeqCst);
        if spare != 0 {
            keep.insert(BlockNo(spare));
        }
        if self.flight_seq.load(Ordering::SeqCst) != seq {
            return Ok(0);
        }
        // The flags need not be durable: after a crash, the mount's rebuild frees the blocks.
        if self
            .media
            .cas_u64(self.root, marked.0, marked.without_flags().0)?
            .is_err()
        {
            return Ok(0);
        }
        let mut freed = 0;
        let mut first_err = None;
        for b in outstanding.into_iter().filter(|b| !keep.contains(b)) {
            match self.alloc.free(Extent::new(b, 1)) {
                Ok(()) => freed += 1,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(freed), Err)
    }

    /// The first position of the current chain's retained suffix (its first block not written
    /// by a compaction); moves the hint there if the hint lies in a block before it that is
    /// not part of the current chain.
    fn retreat_hint(&self) -> Result<Position> {
        let chain = self.chain();
        let (head, hh) = self.head()?;
        let mut walk = Walk::new(head, hh.base.get(), FIRST_SLOT, self.blocks);
        let mut compacted = hh.compacted();
        while compacted {
            walk.slot = SLOTS_PER_BLOCK;
            let Some(next) = chain.next(walk.block)? else {
                return Err(Error::Corrupt {
                    what: "compacted log block at the tail",
                    at: walk.block.offset(),
                });
            };
            compacted = walk.enter(&chain, next)?.compacted();
        }
        let suffix = self.position(&walk, self.era.load(Ordering::SeqCst));
        let seen = self.hint.load(Ordering::Acquire);
        if self.hint_lsn(seen)? < suffix.lsn {
            self.advance_hint(seen, pack(walk.block, FIRST_SLOT), suffix.lsn)?;
        }
        Ok(suffix)
    }

    /// Every block holding a segment of an extended entry of the current chain, and with
    /// `with_chain` the chain's own blocks too.
    fn chain_blocks(&self, with_chain: bool) -> Result<HashSet<BlockNo>> {
        let chain = self.chain();
        let mut out = HashSet::new();
        let mut walk = self.walk_from_head()?;
        loop {
            if with_chain {
                out.insert(walk.block);
            }
            chain.scan(&mut walk, |w, s| {
                if let Slot::Indirect(ind) = s {
                    chain.segments(ind, slot_off(w.block, w.slot), |off, _| {
                        out.insert(off.block());
                        Ok(())
                    })?;
                }
                Ok(())
            })?;
            if !walk.at_end() || !walk.step(&chain)? {
                return Ok(out);
            }
        }
    }
}
