//! On-media format of the log: block geometry, the block and segment headers, the head word and
//! the encodings of a slot. See the [module docs](super) for the tables.

use crate::error::{Error, Result};
use crate::layout::{BLOCK_SIZE, BlockNo, Le16, Le32, Le64, PmOff, Pod, crc32c_append};

/// Version of the log format written by this code.
pub const LOG_VERSION: u16 = 1;
/// Magic number at the start of every log block ("PLOG" in little-endian bytes).
pub const LOG_MAGIC: u32 = u32::from_le_bytes(*b"PLOG");
/// Magic number at the start of every segment of an extended entry.
pub const SEGMENT_MAGIC: u16 = 0x5E6D;
/// Version of the segment format.
pub const SEGMENT_VERSION: u8 = 1;

/// Bytes per slot.
pub const SLOT_BYTES: u64 = 8;
/// Slots a log block uses, header included. Loom builds use a tiny geometry (one header line
/// and eight entry slots) so that models chain blocks after a handful of entries; the format is
/// otherwise the same.
pub const SLOTS_PER_BLOCK: u64 = if cfg!(loom) {
    16
} else {
    BLOCK_SIZE / SLOT_BYTES
};
/// Slots taken by the block header (one cache line).
pub const HEADER_SLOTS: u64 = 8;
/// Index of the first entry slot of a block.
pub const FIRST_SLOT: u64 = HEADER_SLOTS;
/// Entry slots per block (504 with 4 KiB blocks).
pub const ENTRIES_PER_BLOCK: u64 = SLOTS_PER_BLOCK - HEADER_SLOTS;

const _: () = assert!(SLOTS_PER_BLOCK * SLOT_BYTES <= BLOCK_SIZE);
const _: () = assert!(
    SLOTS_PER_BLOCK <= 1 << 10,
    "slot indices are packed in 10 bits"
);

/// Words of a segment header.
pub const SEGMENT_HEADER_WORDS: u64 = 3;
/// The smallest span worth reserving for a segment: its header and one payload word.
pub const MIN_SEGMENT_SPAN: u64 = SEGMENT_HEADER_WORDS + 1;
/// The largest span a reservation may cover: every entry slot of a block but its own.
pub const MAX_SPAN: u64 = ENTRIES_PER_BLOCK - 1;
/// Most payload words of an extended entry: 65535 full segments (the first segment may be
/// shorter, so this keeps the count within the 16-bit segment index).
pub const MAX_RECORD_WORDS: u64 = u16::MAX as u64 * (MAX_SPAN - SEGMENT_HEADER_WORDS);

/// Byte offset of a slot.
pub fn slot_off(block: BlockNo, slot: u64) -> PmOff {
    block.offset() + slot * SLOT_BYTES
}

/// The header of a log block: the first cache line.
///
/// `next` is the only mutable field; it is written once, by compare-and-swap from 0, when the
/// block is full and the log grows. Everything else is written before the block is published
/// and never changes; `crc` covers `magic`, `version`, `flags`, `base` and `owner`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockHeader {
    /// [`LOG_MAGIC`].
    pub magic: Le32,
    /// [`LOG_VERSION`].
    pub version: Le16,
    /// Bit 0: [`FLAG_COMPACTED`]; the other bits are reserved, 0.
    pub flags: Le16,
    /// The next block of the chain, 0 for none.
    pub next: Le64,
    /// Log sequence number of the block's first entry slot.
    pub base: Le64,
    /// Identity of the log the block belongs to: the offset of its head word.
    pub owner: Le64,
    /// crc32c of the immutable fields.
    pub crc: Le32,
    /// Reserved, 0.
    pub pad: [u8; 28],
}

const _: () = assert!(size_of::<BlockHeader>() == (HEADER_SLOTS * SLOT_BYTES) as usize);

// SAFETY: `repr(C)`, fields of alignment 1 without padding (4+2+2+8+8+8+4+28 = 64 bytes, as
// asserted above), all byte-array based so every bit pattern is valid.
unsafe impl Pod for BlockHeader {}

/// Header flag of blocks written by a compaction (they precede the retained suffix).
pub const FLAG_COMPACTED: u16 = 1;

/// Byte offset of `next` inside a block header.
pub const NEXT_OFF: u64 = 8;
/// Byte offset of `base` inside a block header.
pub const BASE_OFF: u64 = 16;

impl BlockHeader {
    /// A fresh header for a block of log `owner` whose first entry has sequence number `base`,
    /// with header flags `flags`.
    pub fn new(owner: u64, base: u64, flags: u16) -> BlockHeader {
        let mut h = BlockHeader {
            magic: Le32::new(LOG_MAGIC),
            version: Le16::new(LOG_VERSION),
            flags: Le16::new(flags),
            next: Le64::new(0),
            base: Le64::new(base),
            owner: Le64::new(owner),
            crc: Le32::new(0),
            pad: [0; 28],
        };
        h.crc = Le32::new(h.checksum());
        h
    }

    fn checksum(&self) -> u32 {
        let b = self.as_bytes();
        crc32c_append(crc32c_append(0, &b[0..8]), &b[16..32])
    }

    /// The header as eight slot words, `next` set to `next`.
    pub fn words(&self, next: u64) -> [u64; HEADER_SLOTS as usize] {
        let mut h = *self;
        h.next = Le64::new(next);
        let mut w = [0u64; HEADER_SLOTS as usize];
        for (i, c) in h.as_bytes().chunks_exact(8).enumerate() {
            w[i] = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
        }
        w
    }

    /// Rebuilds a header from its eight words.
    pub fn from_words(w: &[u64; HEADER_SLOTS as usize]) -> BlockHeader {
        let mut b = [0u8; (HEADER_SLOTS * SLOT_BYTES) as usize];
        for (i, x) in w.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&x.to_le_bytes());
        }
        BlockHeader::from_bytes(&b).expect("64 bytes")
    }

    /// Whether a compaction wrote the block.
    pub fn compacted(&self) -> bool {
        self.flags.get() & FLAG_COMPACTED != 0
    }

    /// Checks magic, version, reserved fields, checksum and owner.
    pub fn validate(&self, owner: u64, at: PmOff) -> Result<()> {
        let corrupt = |what| Err(Error::Corrupt { what, at });
        if self.magic.get() != LOG_MAGIC {
            return corrupt("log block magic");
        }
        if self.version.get() != LOG_VERSION {
            return corrupt("log block version");
        }
        if self.flags.get() & !FLAG_COMPACTED != 0 || self.pad != [0; 28] {
            return corrupt("log block reserved field");
        }
        if self.crc.get() != self.checksum() {
            return corrupt("log block header checksum");
        }
        if self.owner.get() != owner {
            return corrupt("log block of another log");
        }
        Ok(())
    }
}

/// The header of one segment of an extended entry (three words, right after the `RESERVE`
/// slot of its span).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentHeader {
    /// [`SEGMENT_MAGIC`].
    pub magic: Le16,
    /// [`SEGMENT_VERSION`].
    pub version: u8,
    /// Reserved, 0.
    pub flags: u8,
    /// Payload words in this segment (at least 1).
    pub words: Le16,
    /// Index of the segment in its record, from 0.
    pub index: Le16,
    /// Offset of the next segment's header, 0 for the last segment.
    pub next: Le64,
    /// crc32c of the log's owner, this header with `crc` = 0, and the payload.
    pub crc: Le32,
    /// Payload words of the whole record.
    pub total: Le32,
}

const _: () = assert!(size_of::<SegmentHeader>() == (SEGMENT_HEADER_WORDS * SLOT_BYTES) as usize);

// SAFETY: `repr(C)`, fields of alignment 1 without padding (2+1+1+2+2+8+4+4 = 24 bytes, as
// asserted above); integers and byte arrays are valid for every bit pattern.
unsafe impl Pod for SegmentHeader {}

impl SegmentHeader {
    /// The checksum of a segment of log `owner` with this header and `payload`.
    pub fn checksum(&self, owner: u64, payload: &[u64]) -> u32 {
        let mut h = *self;
        h.crc = Le32::new(0);
        let mut c = crc32c_append(0, &owner.to_le_bytes());
        c = crc32c_append(c, h.as_bytes());
        for w in payload {
            c = crc32c_append(c, &w.to_le_bytes());
        }
        c
    }

    /// The header as three words.
    pub fn words(&self) -> [u64; SEGMENT_HEADER_WORDS as usize] {
        let mut w = [0u64; SEGMENT_HEADER_WORDS as usize];
        for (i, c) in self.as_bytes().chunks_exact(8).enumerate() {
            w[i] = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
        }
        w
    }

    /// Rebuilds a header from its three words.
    pub fn from_words(w: &[u64]) -> SegmentHeader {
        let mut b = [0u8; (SEGMENT_HEADER_WORDS * SLOT_BYTES) as usize];
        for (i, x) in w.iter().take(SEGMENT_HEADER_WORDS as usize).enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&x.to_le_bytes());
        }
        SegmentHeader::from_bytes(&b).expect("24 bytes")
    }
}

/// Builds the words of a segment (header then payload).
pub fn segment_words(owner: u64, index: u16, next: PmOff, total: u32, payload: &[u64]) -> Vec<u64> {
    let mut h = SegmentHeader {
        magic: Le16::new(SEGMENT_MAGIC),
        version: SEGMENT_VERSION,
        flags: 0,
        words: Le16::new(payload.len() as u16),
        index: Le16::new(index),
        next: Le64::new(next.0),
        crc: Le32::new(0),
        total: Le32::new(total),
    };
    h.crc = Le32::new(h.checksum(owner, payload));
    let mut out = Vec::with_capacity(SEGMENT_HEADER_WORDS as usize + payload.len());
    out.extend_from_slice(&h.words());
    out.extend_from_slice(payload);
    out
}

/// The head word, kept by the caller at an 8-byte aligned offset (e.g. in the inode).
///
/// | bits | field | |
/// |---|---|---|
/// | 0..39 | head | the head block (0: no log) |
/// | 39..46 | mapping pins | holders that never read the log (mappings), up to [`MAX_MAP_PINS`] |
/// | 46 | sweeping | set by a sweep, cleared by every change of the head or of a pin count |
/// | 47 | orphans | a handle closed with retired blocks it could not free |
/// | 48..64 | opens | handles open across all processes |
///
/// The opens gate the reclamation of compacted blocks; mapping pins do not, since their
/// holders never read the log (one that finds the field full counts as an open instead). A
/// handle that closes while another is open with retired blocks sets *orphans*, and the next
/// handle to find itself alone sweeps them; the sweep's closing CAS fails if anybody opened
/// or compacted the log meanwhile, which *sweeping* tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadWord(pub u64);

/// Bits of the head word below the count of open handles.
pub const HEAD_BLOCK_BITS: u32 = 48;
/// The most handles that may have one log open at once.
pub const MAX_PINS: u64 = (1 << (64 - HEAD_BLOCK_BITS)) - 1;
/// The most mapping pins the head word counts apart from the open handles.
pub const MAX_MAP_PINS: u64 = (1 << MAP_PINS_BITS) - 1;
/// Bits of the head block number: a region of at most [`MAX_REGION`](super::MAX_REGION)
/// bytes has no more blocks than that.
const HEAD_NUMBER_BITS: u32 = 39;
const HEAD_NUMBER: u64 = (1 << HEAD_NUMBER_BITS) - 1;
const MAP_PINS_BITS: u32 = 7;
const MAP_PINS: u64 = MAX_MAP_PINS << HEAD_NUMBER_BITS;
const SWEEPING: u64 = 1 << 46;
const ORPHANS: u64 = 1 << 47;
const OPENS: u64 = MAX_PINS << HEAD_BLOCK_BITS;

const _: () = assert!(super::MAX_REGION / crate::layout::BLOCK_SIZE <= HEAD_NUMBER + 1);
const _: () = assert!(HEAD_NUMBER_BITS + MAP_PINS_BITS == 46);

impl HeadWord {
    /// A head word for `head` with `opens` open handles, no mapping pin and no flag.
    pub fn new(head: BlockNo, opens: u64) -> HeadWord {
        debug_assert!(head.0 <= HEAD_NUMBER && opens <= MAX_PINS);
        HeadWord(head.0 | opens << HEAD_BLOCK_BITS)
    }

    /// The head block; `None` if the word holds no log.
    pub fn head(self) -> Option<BlockNo> {
        let b = self.0 & HEAD_NUMBER;
        (b != 0).then_some(BlockNo(b))
    }

    /// Everybody who keeps the log from being freed: open handles and mapping pins.
    pub fn pins(self) -> u64 {
        self.opens() + self.map_pins()
    }

    /// Open handles.
    pub fn opens(self) -> u64 {
        self.0 >> HEAD_BLOCK_BITS
    }

    /// Mapping pins counted apart from the handles.
    pub fn map_pins(self) -> u64 {
        (self.0 & MAP_PINS) >> HEAD_NUMBER_BITS
    }

    /// Whether retired blocks wait for a sweep.
    pub fn orphans(self) -> bool {
        self.0 & ORPHANS != 0
    }

    /// Whether a sweep is under way (or was given up without clearing the flag).
    pub fn sweeping(self) -> bool {
        self.0 & SWEEPING != 0
    }

    /// The same word with `opens` handles, not sweeping.
    pub fn with_opens(self, opens: u64) -> HeadWord {
        debug_assert!(opens <= MAX_PINS);
        HeadWord(self.0 & !(OPENS | SWEEPING) | opens << HEAD_BLOCK_BITS)
    }

    /// The same word with `pins` mapping pins, not sweeping.
    pub fn with_map_pins(self, pins: u64) -> HeadWord {
        debug_assert!(pins <= MAX_MAP_PINS);
        HeadWord(self.0 & !(MAP_PINS | SWEEPING) | pins << HEAD_NUMBER_BITS)
    }

    /// The same word with head `head`, not sweeping.
    pub fn with_head(self, head: BlockNo) -> HeadWord {
        debug_assert!(head.0 <= HEAD_NUMBER);
        HeadWord(self.0 & !(HEAD_NUMBER | SWEEPING) | head.0)
    }

    /// The same word with the orphans flag set.
    pub fn with_orphans(self) -> HeadWord {
        HeadWord(self.0 | ORPHANS)
    }

    /// The same word, sweeping.
    pub fn with_sweeping(self) -> HeadWord {
        HeadWord(self.0 | SWEEPING)
    }

    /// The same word without either flag.
    pub fn without_flags(self) -> HeadWord {
        HeadWord(self.0 & !(ORPHANS | SWEEPING))
    }
}

/// Top two bits of a slot word: its kind.
const TAG_SHIFT: u32 = 62;
const TAG_CONTROL: u64 = 0b00;
const TAG_INDIRECT: u64 = 0b01;
/// Inline entry, file size unchanged.
const TAG_INLINE: u64 = 0b10;
/// Inline entry that extends the file size to the end of its run.
const TAG_INLINE_EXTEND: u64 = 0b11;

/// Bits of an inline entry's physical block.
pub const INLINE_PBLK_BITS: u32 = 32;
/// Bits of an inline entry's logical block.
pub const INLINE_LBLK_BITS: u32 = 24;
/// Longest run an inline entry holds (6 bits store `len - 1`).
pub const INLINE_MAX_LEN: u64 = 64;

/// Bits of the segment-offset field of an indirect entry (offset / 8).
const INDIRECT_OFF_BITS: u32 = 48;
/// Bits of an indirect entry's check field (low bits of the first segment's crc).
pub const INDIRECT_CHECK_BITS: u32 = 14;

/// Constant in bits 16..62 of a `RESERVE` control word.
const RESERVE_MAGIC: u64 = 0x2E5E_7F0A_D5A1;
const _: () = assert!(RESERVE_MAGIC < 1 << 46);
/// Constant in bits 48..62 of a `GROW` control word (an inline entry that only grows the
/// size); bits 0..48 hold the size. Not the top bits of [`RESERVE_MAGIC`].
const GROW_MAGIC: u64 = 0x1A7C;
const _: () = assert!(GROW_MAGIC < 1 << 14 && GROW_MAGIC != RESERVE_MAGIC >> 32);
/// Sizes below this fit a `GROW` word.
pub const GROW_MAX_SIZE: u64 = 1 << 48;

/// An inline entry: logical blocks `[lblk, lblk + len)` now live at physical blocks
/// `[pblk, pblk + len)`; `extend` sets the file size to at least the end of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inline {
    /// First logical block (< 2^24).
    pub lblk: u64,
    /// First physical block (< 2^32).
    pub pblk: u64,
    /// Blocks, 1..=64.
    pub len: u64,
    /// Whether the size grows to `(lblk + len) * BLOCK_SIZE`.
    pub extend: bool,
}

impl Inline {
    /// Whether the fields fit the inline encoding.
    pub fn fits(lblk: u64, pblk: u64, len: u64) -> bool {
        lblk < 1 << INLINE_LBLK_BITS
            && pblk < 1 << INLINE_PBLK_BITS
            && (1..=INLINE_MAX_LEN).contains(&len)
    }

    /// The slot word; the fields must [fit](Inline::fits).
    pub fn encode(self) -> u64 {
        debug_assert!(Inline::fits(self.lblk, self.pblk, self.len));
        let tag = if self.extend {
            TAG_INLINE_EXTEND
        } else {
            TAG_INLINE
        };
        tag << TAG_SHIFT | (self.len - 1) << 56 | self.lblk << INLINE_PBLK_BITS | self.pblk
    }
}

/// A pointer from a slot to an extended entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Indirect {
    /// Offset of the first segment's header.
    pub off: PmOff,
    /// The low [`INDIRECT_CHECK_BITS`] bits of the first segment's crc.
    pub check: u16,
}

impl Indirect {
    /// The slot word. `off` must be 8-byte aligned and below 2^51.
    pub fn encode(self) -> u64 {
        debug_assert!(self.off.is_aligned(8) && self.off.0 >> 3 < 1 << INDIRECT_OFF_BITS);
        TAG_INDIRECT << TAG_SHIFT
            | u64::from(self.check & ((1 << INDIRECT_CHECK_BITS) - 1)) << INDIRECT_OFF_BITS
            | self.off.0 >> 3
    }

    /// The check value of a segment crc.
    pub fn check_of(crc: u32) -> u16 {
        (crc & ((1 << INDIRECT_CHECK_BITS) - 1)) as u16
    }
}

/// The `GROW` control word: an entry setting the file size to at least `size`, which must be
/// nonzero and below [`GROW_MAX_SIZE`].
pub fn grow_word(size: u64) -> u64 {
    debug_assert!(size > 0 && size < GROW_MAX_SIZE);
    GROW_MAGIC << 48 | size
}

/// The `RESERVE` control word claiming the `n` slots after it (a segment's span, or padding).
pub fn reserve_word(n: u64) -> u64 {
    debug_assert!(n <= MAX_SPAN);
    RESERVE_MAGIC << 16 | n
}

/// What a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Zero: not yet written. The first empty boundary slot is the log tail.
    Empty,
    /// An inline entry.
    Inline(Inline),
    /// A pointer to an extended entry.
    Indirect(Indirect),
    /// An inline entry that sets the file size to at least this (a `GROW` control word).
    Grow(u64),
    /// A reservation of the next `n` slots (not an entry).
    Reserve(u64),
}

impl Slot {
    /// Decodes the word of boundary slot `slot` (read at `at`), checking that a reservation
    /// stays inside the block.
    pub fn decode(w: u64, slot: u64, at: PmOff) -> Result<Slot> {
        if w == 0 {
            return Ok(Slot::Empty);
        }
        match w >> TAG_SHIFT {
            TAG_CONTROL => {
                if w >> 48 == GROW_MAGIC && w & (GROW_MAX_SIZE - 1) != 0 {
                    return Ok(Slot::Grow(w & (GROW_MAX_SIZE - 1)));
                }
                let n = w & 0xffff;
                if w >> 16 != RESERVE_MAGIC {
                    return Err(Error::Corrupt {
                        what: "log control word",
                        at,
                    });
                }
                if slot + 1 + n > SLOTS_PER_BLOCK {
                    return Err(Error::Corrupt {
                        what: "log reservation beyond its block",
                        at,
                    });
                }
                Ok(Slot::Reserve(n))
            }
            TAG_INDIRECT => Ok(Slot::Indirect(Indirect {
                off: PmOff((w & ((1 << INDIRECT_OFF_BITS) - 1)) << 3),
                check: ((w >> INDIRECT_OFF_BITS) & ((1 << INDIRECT_CHECK_BITS) - 1)) as u16,
            })),
            tag => Ok(Slot::Inline(Inline {
                lblk: (w >> INLINE_PBLK_BITS) & ((1 << INLINE_LBLK_BITS) - 1),
                pblk: w & ((1 << INLINE_PBLK_BITS) - 1),
                len: ((w >> 56) & 0x3f) + 1,
                extend: tag == TAG_INLINE_EXTEND,
            })),
        }
    }

    /// Slots this word occupies, itself included.
    pub fn width(self) -> u64 {
        match self {
            Slot::Reserve(n) => 1 + n,
            _ => 1,
        }
    }

    /// Whether the slot holds an entry (inline, grow or indirect).
    pub fn is_entry(self) -> bool {
        matches!(self, Slot::Inline(_) | Slot::Grow(_) | Slot::Indirect(_))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Each change of a head word changes only what it names: the head, both pin counts
        /// and the orphans flag survive the others, and every change but setting a flag ends
        /// a sweep.
        #[test]
        fn head_word_fields_are_independent(
            head in 1u64..=HEAD_NUMBER,
            other in 1u64..=HEAD_NUMBER,
            opens in 0..=MAX_PINS,
            more in 0..=MAX_PINS,
            maps in 0..=MAX_MAP_PINS,
            more_maps in 0..=MAX_MAP_PINS,
            orphans: bool,
            sweeping: bool,
        ) {
            let mut w = HeadWord::new(BlockNo(head), opens).with_map_pins(maps);
            if orphans {
                w = w.with_orphans();
            }
            if sweeping {
                w = w.with_sweeping();
            }
            let fields = |w: HeadWord| (w.head(), w.opens(), w.map_pins(), w.orphans());
            prop_assert_eq!(fields(w), (Some(BlockNo(head)), opens, maps, orphans));
            prop_assert_eq!((w.pins(), w.sweeping()), (opens + maps, sweeping));
            let o = w.with_opens(more);
            prop_assert_eq!(fields(o), (Some(BlockNo(head)), more, maps, orphans));
            let m = w.with_map_pins(more_maps);
            prop_assert_eq!(fields(m), (Some(BlockNo(head)), opens, more_maps, orphans));
            let h = w.with_head(BlockNo(other));
            prop_assert_eq!(fields(h), (Some(BlockNo(other)), opens, maps, orphans));
            prop_assert!(!o.sweeping() && !m.sweeping() && !h.sweeping());
            prop_assert_eq!(
                w.without_flags(),
                HeadWord::new(BlockNo(head), opens).with_map_pins(maps)
            );
        }
    }

    #[test]
    fn inline_round_trip_at_the_limits() {
        for e in [
            Inline {
                lblk: 0,
                pblk: 0,
                len: 1,
                extend: false,
            },
            Inline {
                lblk: (1 << 24) - 1,
                pblk: (1 << 32) - 1,
                len: 64,
                extend: true,
            },
        ] {
            let w = e.encode();
            assert_ne!(w, 0);
            assert_eq!(
                Slot::decode(w, FIRST_SLOT, PmOff(0)).unwrap(),
                Slot::Inline(e)
            );
        }
        assert!(!Inline::fits(1 << 24, 0, 1));
        assert!(!Inline::fits(0, 1 << 32, 1));
        assert!(!Inline::fits(0, 0, 0));
        assert!(!Inline::fits(0, 0, 65));
    }

    #[test]
    fn indirect_and_reserve_round_trip() {
        let i = Indirect {
            off: PmOff(0x1234_5678_9ab8),
            check: 0x3fff,
        };
        assert_eq!(
            Slot::decode(i.encode(), FIRST_SLOT, PmOff(0)).unwrap(),
            Slot::Indirect(i)
        );
        let r = reserve_word(MAX_SPAN);
        assert_eq!(
            Slot::decode(r, FIRST_SLOT, PmOff(0)).unwrap(),
            Slot::Reserve(MAX_SPAN)
        );
        // The same reservation one slot later would leave the block.
        assert!(Slot::decode(r, FIRST_SLOT + 1, PmOff(0)).is_err());
        // A control word without the magic is garbage.
        assert!(Slot::decode(5, FIRST_SLOT, PmOff(0)).is_err());
        for size in [1, 4097, GROW_MAX_SIZE - 1] {
            let g = grow_word(size);
            assert_eq!(g >> TAG_SHIFT, TAG_CONTROL);
            assert_eq!(
                Slot::decode(g, SLOTS_PER_BLOCK - 1, PmOff(0)).unwrap(),
                Slot::Grow(size)
            );
        }
        // A grow word of size 0 is garbage too.
        assert!(Slot::decode(GROW_MAGIC << 48, FIRST_SLOT, PmOff(0)).is_err());
    }

    #[test]
    fn headers_round_trip_and_validate() {
        let h = BlockHeader::new(4096, 504, FLAG_COMPACTED);
        let w = h.words(77);
        let back = BlockHeader::from_words(&w);
        assert_eq!(back.next.get(), 77);
        back.validate(4096, PmOff(0)).unwrap();
        assert!(back.validate(8, PmOff(0)).is_err());
        let mut bad = w;
        bad[2] ^= 1;
        assert!(
            BlockHeader::from_words(&bad)
                .validate(4096, PmOff(0))
                .is_err()
        );

        let s = segment_words(9, 1, PmOff(64), 3, &[1, 2, 3]);
        let sh = SegmentHeader::from_words(&s);
        assert_eq!(sh.words.get(), 3);
        assert_eq!(sh.crc.get(), sh.checksum(9, &s[3..]));
        assert_ne!(sh.crc.get(), sh.checksum(10, &s[3..]));
    }

    #[test]
    fn head_word_packs_block_and_pins() {
        let h = HeadWord::new(BlockNo(12345), 7);
        assert_eq!(h.head(), Some(BlockNo(12345)));
        assert_eq!(h.pins(), 7);
        assert_eq!(h.with_opens(MAX_PINS).opens(), MAX_PINS);
        assert_eq!(HeadWord(0).head(), None);
    }
}
