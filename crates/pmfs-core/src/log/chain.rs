//! Validated reads of a log chain: block headers, slots, extended entries, and walks along the
//! chain. Everything read from media is checked; nothing here panics or loops unboundedly on
//! damaged content.

use super::entry::Entry;
use super::format::{
    BASE_OFF, BlockHeader, ENTRIES_PER_BLOCK, FIRST_SLOT, HEADER_SLOTS, Indirect, NEXT_OFF,
    SEGMENT_HEADER_WORDS, SEGMENT_MAGIC, SEGMENT_VERSION, SLOT_BYTES, SLOTS_PER_BLOCK,
    SegmentHeader, Slot, slot_off,
};
use crate::error::{Error, Result};
use crate::layout::{BLOCK_SIZE, BlockNo, PmOff};
use crate::pm::Media;
use crate::traits::Runs;

/// Read access to the blocks of one log.
pub(crate) struct Chain<'m, M: ?Sized> {
    pub(crate) media: &'m M,
    /// The log's identity: the offset of its head word.
    pub(crate) owner: u64,
    /// Blocks in the region.
    pub(crate) blocks: u64,
}

impl<M: Media + ?Sized> Chain<'_, M> {
    /// Checks that `b` can be a log block and that its header belongs to this log.
    pub(crate) fn check_block(&self, b: BlockNo, at: PmOff) -> Result<BlockHeader> {
        if b.0 == 0 || b.0 >= self.blocks {
            return Err(Error::Corrupt {
                what: "log block pointer",
                at,
            });
        }
        let mut w = [0u64; HEADER_SLOTS as usize];
        for (i, x) in w.iter_mut().enumerate() {
            *x = self.media.load_u64(slot_off(b, i as u64))?;
        }
        let h = BlockHeader::from_words(&w);
        h.validate(self.owner, b.offset())?;
        Ok(h)
    }

    /// The next block after `b`, if linked (the pointer is range-checked only).
    pub(crate) fn next(&self, b: BlockNo) -> Result<Option<BlockNo>> {
        let at = b.offset() + NEXT_OFF;
        let n = self.media.load_u64(at)?;
        if n == 0 {
            return Ok(None);
        }
        if n >= self.blocks {
            return Err(Error::Corrupt {
                what: "log next pointer",
                at,
            });
        }
        Ok(Some(BlockNo(n)))
    }

    /// The raw word of a slot.
    pub(crate) fn word(&self, b: BlockNo, slot: u64) -> Result<u64> {
        self.media.load_u64(slot_off(b, slot))
    }

    /// The decoded boundary slot `slot` of `b`.
    pub(crate) fn slot(&self, b: BlockNo, slot: u64) -> Result<Slot> {
        let at = slot_off(b, slot);
        Slot::decode(self.media.load_u64(at)?, slot, at)
    }

    /// Advances `walk` over the filled boundary slots of its block, calling `seen` for each
    /// entry slot (with the walk at that slot). Returns `true` when it stopped at an empty slot
    /// (the tail), `false` at the end of the block.
    pub(crate) fn scan(
        &self,
        walk: &mut Walk,
        mut seen: impl FnMut(&Walk, Slot) -> Result<()>,
    ) -> Result<bool> {
        while !walk.at_end() {
            let s = self.slot(walk.block, walk.slot)?;
            if s == Slot::Empty {
                return Ok(true);
            }
            if s.is_entry() {
                seen(walk, s)?;
            }
            walk.slot += s.width();
        }
        Ok(false)
    }

    /// Walks to the tail: the first empty boundary slot, or the end of the last block.
    pub(crate) fn to_tail(&self, walk: &mut Walk) -> Result<()> {
        while !self.scan(walk, |_, _| Ok(()))? {
            if !walk.step(self)? {
                break;
            }
        }
        Ok(())
    }

    /// The base sequence number of a block known to belong to the log.
    pub(crate) fn base(&self, b: BlockNo) -> Result<u64> {
        self.media.load_u64(b.offset() + BASE_OFF)
    }

    /// The entry an entry slot stands for, reading extended entries from their segments.
    pub(crate) fn entry(&self, s: Slot, at: PmOff) -> Result<Entry> {
        match s {
            Slot::Inline(i) => Entry::from_inline(i, self.blocks, at),
            Slot::Grow(size) => Ok(Entry::Write {
                runs: Runs::new(),
                extend_to: size,
            }),
            Slot::Indirect(ind) => {
                let mut words = Vec::new();
                self.segments(ind, at, |_, payload| {
                    words.extend_from_slice(payload);
                    Ok(())
                })?;
                Entry::from_record(&words, self.blocks, at)
            }
            Slot::Empty | Slot::Reserve(_) => Err(Error::Corrupt {
                what: "log entry expected",
                at,
            }),
        }
    }

    /// Calls `visit` with the offset and payload of every segment of an extended entry, in
    /// order, after validating each (placement inside a reservation of a block of this log,
    /// magic, version, index, lengths, checksum, and the indirect entry's check bits).
    pub(crate) fn segments(
        &self,
        ind: Indirect,
        at: PmOff,
        mut visit: impl FnMut(PmOff, &[u64]) -> Result<()>,
    ) -> Result<()> {
        let corrupt = |what| Err(Error::Corrupt { what, at });
        let mut off = ind.off;
        let mut seen = 0u64;
        let mut total = None;
        // Each segment carries at least one payload word and its index is 16 bits wide.
        for index in 0..=u64::from(u16::MAX) {
            let block = off.block();
            let slot = (off.0 % BLOCK_SIZE) / SLOT_BYTES;
            if !off.is_aligned(SLOT_BYTES)
                || slot <= FIRST_SLOT
                || slot + SEGMENT_HEADER_WORDS >= SLOTS_PER_BLOCK
            {
                return corrupt("log segment pointer");
            }
            self.check_block(block, at)?;
            let Slot::Reserve(span) = self.slot(block, slot - 1)? else {
                return corrupt("log segment outside a reservation");
            };
            let mut hw = [0u64; SEGMENT_HEADER_WORDS as usize];
            for (i, x) in hw.iter_mut().enumerate() {
                *x = self.word(block, slot + i as u64)?;
            }
            let h = SegmentHeader::from_words(&hw);
            let words = u64::from(h.words.get());
            if h.magic.get() != SEGMENT_MAGIC || h.version != SEGMENT_VERSION || h.flags != 0 {
                return corrupt("log segment header");
            }
            if u64::from(h.index.get()) != index
                || words == 0
                || SEGMENT_HEADER_WORDS + words > span
                || *total.get_or_insert(h.total.get()) != h.total.get()
                || seen + words > u64::from(h.total.get())
            {
                return corrupt("log segment length");
            }
            let mut payload = vec![0u64; words as usize];
            let mut bytes = vec![0u8; (words * SLOT_BYTES) as usize];
            self.media
                .read(slot_off(block, slot + SEGMENT_HEADER_WORDS), &mut bytes)?;
            for (w, c) in payload.iter_mut().zip(bytes.chunks_exact(8)) {
                *w = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
            }
            let crc = h.checksum(self.owner, &payload);
            if crc != h.crc.get() || (index == 0 && Indirect::check_of(crc) != ind.check) {
                return corrupt("log segment checksum");
            }
            visit(off, &payload)?;
            seen += words;
            match h.next.get() {
                0 if seen == u64::from(h.total.get()) => return Ok(()),
                0 => return corrupt("log segment chain ends early"),
                n => off = PmOff(n),
            }
        }
        corrupt("log segment chain too long")
    }
}

/// A position during a walk along the chain, with the blocks crossed to get there.
#[derive(Clone, Debug)]
pub(crate) struct Walk {
    /// The current block.
    pub(crate) block: BlockNo,
    /// Sequence number of its first entry slot.
    pub(crate) base: u64,
    /// The current boundary slot, `FIRST_SLOT..=SLOTS_PER_BLOCK` (the latter: past the end).
    pub(crate) slot: u64,
    /// Blocks left behind, oldest first.
    pub(crate) crossed: Vec<BlockNo>,
    /// Blocks the walk may still enter (bounds walks over damaged chains).
    budget: u64,
}

impl Walk {
    /// A walk at boundary `slot` of `block`, whose first entry has sequence number `base`.
    pub(crate) fn new(block: BlockNo, base: u64, slot: u64, blocks: u64) -> Walk {
        Walk {
            block,
            base,
            slot,
            crossed: Vec::new(),
            budget: blocks,
        }
    }

    /// The sequence number of the current slot.
    pub(crate) fn lsn(&self) -> u64 {
        self.base + (self.slot - FIRST_SLOT)
    }

    /// Whether the walk is past the last slot of its block.
    pub(crate) fn at_end(&self) -> bool {
        self.slot >= SLOTS_PER_BLOCK
    }

    /// At the end of a block, moves into the next one if it is linked (validating its header
    /// and sequence numbers). Returns whether it moved.
    pub(crate) fn step<M: Media + ?Sized>(&mut self, chain: &Chain<'_, M>) -> Result<bool> {
        debug_assert!(self.at_end());
        let Some(next) = chain.next(self.block)? else {
            return Ok(false);
        };
        self.enter(chain, next)?;
        Ok(true)
    }

    /// Moves into `next`, the block linked after the current one; returns its header.
    pub(crate) fn enter<M: Media + ?Sized>(
        &mut self,
        chain: &Chain<'_, M>,
        next: BlockNo,
    ) -> Result<BlockHeader> {
        let at = self.block.offset() + NEXT_OFF;
        if self.budget == 0 {
            return Err(Error::Corrupt {
                what: "log chain longer than the region",
                at,
            });
        }
        self.budget -= 1;
        let h = chain.check_block(next, at)?;
        if Some(h.base.get()) != self.base.checked_add(ENTRIES_PER_BLOCK) {
            return Err(Error::Corrupt {
                what: "log block sequence number",
                at: next.offset(),
            });
        }
        self.crossed.push(self.block);
        self.block = next;
        self.base = h.base.get();
        self.slot = FIRST_SLOT;
        Ok(h)
    }
}
