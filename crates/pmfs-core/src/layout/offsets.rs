//! Typed positions in a region: byte offsets and block numbers.

use std::fmt;
use std::ops::Add;

use super::{BLOCK_SHIFT, BLOCK_SIZE};

/// A byte offset inside a PM region.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PmOff(pub u64);

/// The number of a [`BLOCK_SIZE`] block inside a PM region (block 0 starts at offset 0).
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockNo(pub u64);

impl PmOff {
    /// Returns the offset `n` bytes further, or `None` on overflow.
    pub fn checked_add(self, n: u64) -> Option<PmOff> {
        self.0.checked_add(n).map(PmOff)
    }

    /// The block this offset lies in.
    pub fn block(self) -> BlockNo {
        BlockNo(self.0 >> BLOCK_SHIFT)
    }

    /// Whether the offset is a multiple of `align` (a power of two).
    pub fn is_aligned(self, align: u64) -> bool {
        debug_assert!(align.is_power_of_two());
        self.0 & (align - 1) == 0
    }
}

impl BlockNo {
    /// The byte offset where the block starts, or `None` on overflow.
    pub fn checked_offset(self) -> Option<PmOff> {
        self.0.checked_mul(BLOCK_SIZE).map(PmOff)
    }

    /// The byte offset where the block starts.
    ///
    /// # Panics
    /// If the block number is so large that its offset overflows `u64`, which no region allows.
    pub fn offset(self) -> PmOff {
        self.checked_offset().expect("BlockNo offset overflow")
    }

    /// The block `n` blocks further, or `None` on overflow.
    pub fn checked_add(self, n: u64) -> Option<BlockNo> {
        self.0.checked_add(n).map(BlockNo)
    }
}

/// `off + n` is the offset `n` bytes further.
///
/// Panics on overflow, which only a caller bug can cause: offsets are bounded by the region
/// size. Use [`PmOff::checked_add`] for values read from media.
impl Add<u64> for PmOff {
    type Output = PmOff;
    fn add(self, n: u64) -> PmOff {
        PmOff(self.0.checked_add(n).expect("PmOff overflow"))
    }
}

/// `b + n` is the block `n` blocks further. Panics on overflow, like [`PmOff`]'s `+`.
impl Add<u64> for BlockNo {
    type Output = BlockNo;
    fn add(self, n: u64) -> BlockNo {
        BlockNo(self.0.checked_add(n).expect("BlockNo overflow"))
    }
}

impl fmt::Debug for PmOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PmOff({:#x})", self.0)
    }
}

impl fmt::Display for PmOff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::Debug for BlockNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockNo({})", self.0)
    }
}

impl fmt::Display for BlockNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}
