//! The blocks found in use while an allocator is rebuilt (at mount, and around fsck's release
//! of dead inodes' blocks): a bitmap over the data region, one bit per block, so that the
//! blocks of a volume-wide table visited in table order (one block at a time on the cuckoo
//! hash) cost a bit each rather than an extent each, and blocks named twice (by a log entry
//! and by the mapping it was being applied to) are simply marked twice. And sets of inode
//! numbers, a bit each, for the mount's passes over the HashFS table: the inodes found owning
//! blocks, the files without a log.

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::traits::Extent;

use crate::error::{Error, Result};

/// A set of blocks of the data region.
#[derive(Clone)]
pub(crate) struct UsedBlocks {
    data: Extent,
    words: Vec<u64>,
}

impl UsedBlocks {
    /// An empty set over `data`.
    pub(crate) fn new(data: Extent) -> Self {
        UsedBlocks {
            data,
            words: vec![0; data.len.div_ceil(64) as usize],
        }
    }

    /// Adds the blocks of `e`; [`Error::Corrupt`] if it reaches outside the data region.
    pub(crate) fn mark(&mut self, e: Extent) -> Result<()> {
        let from = e.start.0.wrapping_sub(self.data.start.0);
        if e.start < self.data.start || e.len > self.data.len - from.min(self.data.len) {
            return Err(Error::Corrupt {
                what: "block in use outside the data region",
                at: PmOff(e.start.0.saturating_mul(BLOCK_SIZE)),
            });
        }
        let (mut b, end) = (from, from + e.len);
        while b < end {
            let (w, bit) = ((b / 64) as usize, b % 64);
            let n = (64 - bit).min(end - b);
            let mask = if n == 64 {
                u64::MAX
            } else {
                ((1 << n) - 1) << bit
            };
            self.words[w] |= mask;
            b += n;
        }
        Ok(())
    }

    /// The set as extents in ascending order, each as long as the blocks in use allow.
    pub(crate) fn extents(&self) -> impl Iterator<Item = Extent> + '_ {
        let len = self.data.len;
        let mut b = 0;
        std::iter::from_fn(move || {
            let start = self.next(b, true)?;
            let end = self.next(start, false).unwrap_or(len);
            b = end;
            Some(Extent::new(BlockNo(self.data.start.0 + start), end - start))
        })
    }

    /// The first block from `b` on that is in the set (`used`) or not, if any.
    fn next(&self, b: u64, used: bool) -> Option<u64> {
        let len = self.data.len;
        let mut w = (b / 64) as usize;
        let flip = if used { 0 } else { u64::MAX };
        let mut word = (self.words.get(w)? ^ flip) & (u64::MAX << (b % 64));
        loop {
            if word != 0 {
                let at = w as u64 * 64 + u64::from(word.trailing_zeros());
                return (at < len).then_some(at);
            }
            w += 1;
            word = self.words.get(w)? ^ flip;
        }
    }
}

/// A set of inode numbers below a bound, one bit each: the table's entries name an owner per
/// block, so an insertion is a bit set, whatever the number of files.
pub(crate) struct InodeSet {
    words: Vec<u64>,
    count: u64,
}

impl InodeSet {
    /// An empty set of numbers below `count`.
    pub(crate) fn new(count: u64) -> Self {
        InodeSet {
            words: vec![0; count.div_ceil(64) as usize],
            count,
        }
    }

    /// Adds `ino`; numbers at or past the bound are not inodes and are left out.
    pub(crate) fn insert(&mut self, ino: u64) {
        if ino < self.count {
            self.words[(ino / 64) as usize] |= 1 << (ino % 64);
        }
    }

    /// Whether `ino` is in the set.
    pub(crate) fn contains(&self, ino: u64) -> bool {
        ino < self.count && self.words[(ino / 64) as usize] & (1 << (ino % 64)) != 0
    }

    /// Removes `ino`, if present.
    pub(crate) fn remove(&mut self, ino: u64) {
        if ino < self.count {
            self.words[(ino / 64) as usize] &= !(1 << (ino % 64));
        }
    }

    /// The numbers in the set, in ascending order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(w, &word)| {
            let mut word = word;
            std::iter::from_fn(move || {
                (word != 0).then(|| {
                    let bit = word.trailing_zeros();
                    word &= word - 1;
                    w as u32 * 64 + bit
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extents(set: &UsedBlocks) -> Vec<(u64, u64)> {
        set.extents().map(|e| (e.start.0, e.len)).collect()
    }

    #[test]
    fn marked_blocks_come_back_as_maximal_extents() {
        let mut set = UsedBlocks::new(Extent::new(BlockNo(100), 200));
        assert!(extents(&set).is_empty());
        for (s, l) in [
            (100, 1),
            (101, 63),
            (190, 20),
            (205, 10),
            (299, 1),
            (180, 1),
        ] {
            set.mark(Extent::new(BlockNo(s), l)).unwrap();
        }
        assert_eq!(extents(&set), [(100, 64), (180, 1), (190, 25), (299, 1)]);
    }

    #[test]
    fn a_full_region_is_one_extent() {
        let mut set = UsedBlocks::new(Extent::new(BlockNo(7), 130));
        set.mark(Extent::new(BlockNo(7), 130)).unwrap();
        assert_eq!(extents(&set), [(7, 130)]);
    }

    #[test]
    fn blocks_outside_the_data_region_are_corruption() {
        let mut set = UsedBlocks::new(Extent::new(BlockNo(100), 200));
        for (s, l) in [
            (99, 1),
            (99, 5),
            (299, 2),
            (300, 1),
            (u64::MAX, 1),
            (150, u64::MAX),
        ] {
            let e = set.mark(Extent::new(BlockNo(s), l));
            assert!(matches!(e, Err(Error::Corrupt { .. })), "{s}+{l}: {e:?}");
        }
        assert!(extents(&set).is_empty());
    }

    #[test]
    fn inode_sets_keep_numbers_below_their_bound() {
        let mut set = InodeSet::new(130);
        for ino in [0, 1, 63, 64, 65, 127, 129, 130, 191, u64::MAX] {
            set.insert(ino);
        }
        set.remove(1);
        set.remove(200);
        assert_eq!(set.iter().collect::<Vec<_>>(), [0, 63, 64, 65, 127, 129]);
        assert!(set.contains(64) && !set.contains(1) && !set.contains(130));
    }
}
