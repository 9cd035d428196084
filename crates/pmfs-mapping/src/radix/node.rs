//! On-media encoding of radix-tree entries and root words, and the index arithmetic.

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::{Error, Result};

/// Logical-block bits one level resolves: 4 KiB / 8-byte entries = 512 = 2^9.
pub const BITS_PER_LEVEL: u32 = 9;
/// Entries per node.
pub const ENTRIES: u64 = 1 << BITS_PER_LEVEL;
const _: () = assert!(ENTRIES * 8 == BLOCK_SIZE);
/// Most levels a tree has: 8 levels resolve 72 bits, enough for every 64-bit logical block.
pub const MAX_HEIGHT: u8 = 8;

const PRESENT: u64 = 1 << 63;
const BLOCK_MASK: u64 = (1 << 48) - 1;
const ROOT_TAG: u64 = 0x52;

/// The entry word pointing at `block` (a child node or a data block).
pub(crate) fn entry_word(block: BlockNo) -> u64 {
    debug_assert!(block.0 <= BLOCK_MASK);
    PRESENT | block.0
}

/// Decodes an entry word read at `at`: `None` for an empty entry.
pub(crate) fn decode_entry(word: u64, at: PmOff) -> Result<Option<BlockNo>> {
    if word == 0 {
        return Ok(None);
    }
    if word & !(PRESENT | BLOCK_MASK) != 0 || word & PRESENT == 0 {
        return Err(Error::Corrupt {
            what: "radix entry",
            at,
        });
    }
    Ok(Some(BlockNo(word & BLOCK_MASK)))
}

/// Offset of entry `i` of the node in `block`.
pub(crate) fn entry_off(block: BlockNo, i: u64) -> PmOff {
    block.offset() + 8 * i
}

/// Number of logical blocks a node at `level` spans (level 0: a leaf spans 512).
pub(crate) fn span(level: u8) -> u128 {
    1u128 << (BITS_PER_LEVEL * (u32::from(level) + 1))
}

/// Number of logical blocks one entry of a node at `level` stands for.
pub(crate) fn entry_span(level: u8) -> u128 {
    1u128 << (BITS_PER_LEVEL * u32::from(level))
}

/// Whether a tree of `height` levels reaches logical block `lblk`.
pub(crate) fn covers(height: u8, lblk: u64) -> bool {
    u128::from(lblk) < span(height - 1)
}

/// The fewest levels that reach `lblk`.
pub(crate) fn height_for(lblk: u64) -> u8 {
    (1..=MAX_HEIGHT)
        .find(|&h| covers(h, lblk))
        .unwrap_or(MAX_HEIGHT)
}

/// A file's root: the top node and the number of levels. Stored in the file's root word as
/// `block | height << 48 | 0x52 << 56`; 0 is an empty file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Root {
    /// The top node.
    pub block: BlockNo,
    /// Number of levels (1: the root is a leaf).
    pub height: u8,
}

impl Root {
    /// The root word.
    pub fn pack(&self) -> u64 {
        debug_assert!(self.block.0 <= BLOCK_MASK && (1..=MAX_HEIGHT).contains(&self.height));
        self.block.0 | (u64::from(self.height) << 48) | (ROOT_TAG << 56)
    }

    /// Decodes a root word read at `at`; `None` for an empty file.
    pub fn unpack(word: u64, at: PmOff) -> Result<Option<Root>> {
        if word == 0 {
            return Ok(None);
        }
        let height = ((word >> 48) & 0xff) as u8;
        if word >> 56 != ROOT_TAG || height == 0 || height > MAX_HEIGHT {
            return Err(Error::Corrupt {
                what: "radix tree root word",
                at,
            });
        }
        Ok(Some(Root {
            block: BlockNo(word & BLOCK_MASK),
            height,
        }))
    }

    /// The level of the root node.
    pub fn level(&self) -> u8 {
        self.height - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_reject_garbage() {
        let w = entry_word(BlockNo(0xabc_def));
        assert_eq!(decode_entry(w, PmOff(0)).unwrap(), Some(BlockNo(0xabc_def)));
        assert_eq!(decode_entry(0, PmOff(0)).unwrap(), None);
        // Missing present bit, or bits between the block and the flag.
        assert!(decode_entry(5, PmOff(0)).is_err());
        assert!(decode_entry(w | (1 << 50), PmOff(0)).is_err());
    }

    #[test]
    fn heights_cover_nine_bits_per_level() {
        assert_eq!(height_for(0), 1);
        assert_eq!(height_for(511), 1);
        assert_eq!(height_for(512), 2);
        assert_eq!(height_for((1 << 18) - 1), 2);
        assert_eq!(height_for(1 << 18), 3);
        assert_eq!(height_for(1 << 62), 7);
        assert_eq!(height_for(u64::MAX), 8);
        assert!(covers(8, u64::MAX));
        assert!(!covers(1, 512));
        assert_eq!(entry_span(0), 1);
        assert_eq!(entry_span(2), 1 << 18);
        assert_eq!(span(7), 1 << 72);
    }

    #[test]
    fn root_words_round_trip_and_reject_garbage() {
        let r = Root {
            block: BlockNo(42),
            height: 8,
        };
        assert_eq!(Root::unpack(r.pack(), PmOff(0)).unwrap(), Some(r));
        assert_eq!(Root::unpack(0, PmOff(0)).unwrap(), None);
        assert!(Root::unpack(42 | (3 << 48), PmOff(0)).is_err());
        assert!(Root::unpack(42 | (9 << 48) | (0x52 << 56), PmOff(0)).is_err());
        assert!(Root::unpack(42 | (0x52 << 56), PmOff(0)).is_err());
    }
}
