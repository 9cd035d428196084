//! On-media encoding of extent-tree nodes and root words, and the per-node binary search.
//!
//! Everything here reads PM through [`Media`] one entry at a time; nothing caches a node.

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::Media;
use pmfs_core::{Error, Result};

/// Magic in the low 16 bits of every node header word ("EX").
pub(crate) const NODE_MAGIC: u64 = 0x5845;
/// Version of the node format.
pub(crate) const NODE_VERSION: u64 = 1;
/// Bytes of the node header (one cache line; only the first word is used).
pub(crate) const HEADER_BYTES: u64 = 64;
/// Bytes of one entry.
pub(crate) const ENTRY_BYTES: u64 = 16;
/// Most entries a 4 KiB node holds.
pub const MAX_FANOUT: usize = 252;
const _: () = assert!(HEADER_BYTES + ENTRY_BYTES * MAX_FANOUT as u64 == BLOCK_SIZE);
/// Longest extent one leaf entry maps (15-bit length field).
pub const MAX_EXTENT_LEN: u64 = (1 << 15) - 1;
/// Most levels a tree may have (the root word has room for 255; this bounds every descent).
pub const MAX_HEIGHT: u8 = 10;

const VALID: u64 = 1 << 63;
const BLOCK_MASK: u64 = (1 << 48) - 1;
const LEN_SHIFT: u32 = 48;
const ROOT_TAG: u64 = 0xE7;

/// One node entry. In a leaf it maps `[key, key + len)` to `[block, block + len)`; in an index
/// node `len` is 0 and `block` is the child whose subtree starts at `key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// First logical block (leaf) or separator key (index).
    pub key: u64,
    /// First physical block (leaf) or child node (index).
    pub block: u64,
    /// Number of blocks (leaf), 0 (index).
    pub len: u64,
}

impl Entry {
    /// A leaf entry.
    pub fn extent(key: u64, block: u64, len: u64) -> Self {
        Self { key, block, len }
    }

    /// An index entry.
    pub fn child(key: u64, block: u64) -> Self {
        Self { key, block, len: 0 }
    }

    /// One past the last logical block of a leaf entry.
    pub fn end(&self) -> u64 {
        self.key + self.len
    }

    /// The two little-endian words: key, then valid | len | block.
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.key.to_le_bytes());
        b[8..].copy_from_slice(&self.word1().to_le_bytes());
        b
    }

    /// The entry's second word: block, length and the valid bit.
    pub fn word1(&self) -> u64 {
        debug_assert!(self.block <= BLOCK_MASK && self.len <= MAX_EXTENT_LEN);
        VALID | (self.len << LEN_SHIFT) | self.block
    }

    /// Decodes and validates an entry read at `at`.
    pub fn decode(bytes: [u8; 16], leaf: bool, at: PmOff) -> Result<Self> {
        let corrupt = |what| Error::Corrupt { what, at };
        let key = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default());
        let w1 = u64::from_le_bytes(bytes[8..].try_into().unwrap_or_default());
        if w1 & VALID == 0 {
            return Err(corrupt("extent entry without valid bit"));
        }
        let len = (w1 >> LEN_SHIFT) & MAX_EXTENT_LEN;
        let block = w1 & BLOCK_MASK;
        if leaf {
            if len == 0 || key.checked_add(len).is_none() {
                return Err(corrupt("extent entry length"));
            }
        } else if len != 0 {
            return Err(corrupt("extent index entry length"));
        }
        Ok(Self { key, block, len })
    }
}

/// The header word: magic | version << 16 | level << 24 | nr << 32.
pub(crate) fn header_word(level: u8, nr: usize) -> u64 {
    NODE_MAGIC | (NODE_VERSION << 16) | (u64::from(level) << 24) | ((nr as u64) << 32)
}

/// Parses a header word into (level, nr).
pub(crate) fn parse_header(word: u64, at: PmOff) -> Result<(u8, usize)> {
    if word & 0xffff != NODE_MAGIC {
        return Err(Error::Corrupt {
            what: "extent node magic",
            at,
        });
    }
    if (word >> 16) & 0xff != NODE_VERSION || word >> 48 != 0 {
        return Err(Error::Corrupt {
            what: "extent node version",
            at,
        });
    }
    Ok((
        ((word >> 24) & 0xff) as u8,
        ((word >> 32) & 0xffff) as usize,
    ))
}

/// A whole node image (header and entries) for a fresh block.
pub(crate) fn encode_node(level: u8, entries: &[Entry]) -> Vec<u8> {
    let mut v = Vec::with_capacity((HEADER_BYTES + ENTRY_BYTES * entries.len() as u64) as usize);
    v.extend_from_slice(&header_word(level, entries.len()).to_le_bytes());
    v.resize(HEADER_BYTES as usize, 0);
    for e in entries {
        v.extend_from_slice(&e.encode());
    }
    v
}

/// The encoded bytes of consecutive entries.
pub(crate) fn encode_entries(entries: &[Entry]) -> Vec<u8> {
    let mut v = Vec::with_capacity(ENTRY_BYTES as usize * entries.len());
    for e in entries {
        v.extend_from_slice(&e.encode());
    }
    v
}

/// A file's root: the root node and the number of levels. Stored in the file's root word as
/// `block | height << 48 | 0xE7 << 56`; 0 is an empty file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Root {
    /// The root node.
    pub block: BlockNo,
    /// Number of levels (1: the root is a leaf).
    pub height: u8,
}

impl Root {
    /// The root word.
    pub fn pack(&self) -> u64 {
        debug_assert!(self.block.0 <= BLOCK_MASK && self.height >= 1);
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
                what: "extent tree root word",
                at,
            });
        }
        Ok(Some(Root {
            block: BlockNo(word & BLOCK_MASK),
            height,
        }))
    }
}

/// A node as found on PM: its block, level and number of live entries.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    /// Where the node lives.
    pub block: BlockNo,
    /// 0 for leaves.
    pub level: u8,
    /// Live entries: `[0, nr)`. Entries at or past `nr` are dead, whatever they hold.
    pub nr: usize,
}

impl Node {
    /// Reads and validates the header of `block`, expected at `level`, with at most `fanout`
    /// entries.
    pub fn read<M: Media + ?Sized>(
        media: &M,
        block: BlockNo,
        level: u8,
        fanout: usize,
    ) -> Result<Node> {
        let at = block.checked_offset().ok_or(Error::Corrupt {
            what: "extent node pointer",
            at: PmOff(0),
        })?;
        let (l, nr) = parse_header(media.load_u64(at)?, at)?;
        if l != level {
            return Err(Error::Corrupt {
                what: "extent node level",
                at,
            });
        }
        if nr > fanout {
            return Err(Error::Corrupt {
                what: "extent node entry count",
                at,
            });
        }
        Ok(Node { block, level, nr })
    }

    /// Offset of the header word.
    pub fn header_off(&self) -> PmOff {
        self.block.offset()
    }

    /// Offset of entry `i`.
    pub fn entry_off(&self, i: usize) -> PmOff {
        self.block.offset() + HEADER_BYTES + ENTRY_BYTES * i as u64
    }

    /// Reads live entry `i`.
    pub fn entry<M: Media + ?Sized>(&self, media: &M, i: usize) -> Result<Entry> {
        debug_assert!(i < self.nr);
        let at = self.entry_off(i);
        let mut b = [0u8; 16];
        media.read(at, &mut b)?;
        Entry::decode(b, self.level == 0, at)
    }

    /// Reads live entries `[from, to)` with one read of the media.
    pub fn entries<M: Media + ?Sized>(
        &self,
        media: &M,
        from: usize,
        to: usize,
    ) -> Result<Vec<Entry>> {
        debug_assert!(from <= to && to <= self.nr);
        let mut raw = [0u8; (BLOCK_SIZE - HEADER_BYTES) as usize];
        let raw = &mut raw[..(to - from) * ENTRY_BYTES as usize];
        media.read(self.entry_off(from), raw)?;
        let leaf = self.level == 0;
        let mut out = Vec::with_capacity(to - from);
        for (k, b) in raw.chunks_exact(ENTRY_BYTES as usize).enumerate() {
            let bytes = b.try_into().unwrap_or_default();
            out.push(Entry::decode(bytes, leaf, self.entry_off(from + k))?);
        }
        Ok(out)
    }

    /// Binary search: the last live entry whose key is `<= key`, or `None` if every key is
    /// greater (or the node is empty). Reads only key words: callers read and validate the
    /// entry they go on with.
    pub fn search<M: Media + ?Sized>(&self, media: &M, key: u64) -> Result<Option<usize>> {
        let (mut lo, mut hi) = (0usize, self.nr);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if media.load_u64(self.entry_off(mid))? <= key {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo.checked_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmfs_core::pm::HeapRegion;

    #[test]
    fn entry_round_trip_and_validation() {
        let e = Entry::extent(1 << 40, 123_456, MAX_EXTENT_LEN);
        let b = e.encode();
        assert_eq!(Entry::decode(b, true, PmOff(0)).unwrap(), e);
        assert_eq!(&b[..8], &(1u64 << 40).to_le_bytes());
        // Without the valid bit the entry is rejected.
        let mut bad = b;
        bad[15] &= 0x7f;
        assert!(Entry::decode(bad, true, PmOff(0)).is_err());
        // A leaf entry of length 0, or an index entry with a length, is corrupt.
        assert!(Entry::decode(Entry::child(5, 9).encode(), true, PmOff(0)).is_err());
        assert!(Entry::decode(e.encode(), false, PmOff(0)).is_err());
        // An extent that would overflow the logical space is corrupt.
        let over = Entry::extent(u64::MAX - 2, 1, 5).encode();
        assert!(Entry::decode(over, true, PmOff(0)).is_err());
    }

    #[test]
    fn root_word_round_trip_and_validation() {
        let r = Root {
            block: BlockNo(77),
            height: 3,
        };
        assert_eq!(Root::unpack(r.pack(), PmOff(0)).unwrap(), Some(r));
        assert_eq!(Root::unpack(0, PmOff(0)).unwrap(), None);
        assert!(Root::unpack(77 | (3 << 48), PmOff(0)).is_err());
        assert!(Root::unpack(77 | (0xE7 << 56), PmOff(0)).is_err());
        let too_high = 77 | (u64::from(MAX_HEIGHT + 1) << 48) | (0xE7 << 56);
        assert!(Root::unpack(too_high, PmOff(0)).is_err());
    }

    #[test]
    fn binary_search_finds_the_last_key_not_above() {
        let r = HeapRegion::new(4 * BLOCK_SIZE).unwrap();
        let entries: Vec<Entry> = (0..100)
            .map(|i| Entry::extent(i * 10, 1000 + i, 5))
            .collect();
        r.write(BlockNo(1).offset(), &encode_node(0, &entries))
            .unwrap();
        let n = Node::read(&r, BlockNo(1), 0, MAX_FANOUT).unwrap();
        assert_eq!(n.nr, 100);
        assert_eq!(n.search(&r, 0).unwrap(), Some(0));
        assert_eq!(n.search(&r, 9).unwrap(), Some(0));
        assert_eq!(n.search(&r, 10).unwrap(), Some(1));
        assert_eq!(n.search(&r, 555).unwrap(), Some(55));
        assert_eq!(n.search(&r, u64::MAX).unwrap(), Some(99));
        let empty = Node {
            block: BlockNo(2),
            level: 0,
            nr: 0,
        };
        assert_eq!(empty.search(&r, 5).unwrap(), None);
        let high = Entry::extent(50, 1, 1);
        r.write(BlockNo(2).offset(), &encode_node(0, &[high]))
            .unwrap();
        let one = Node::read(&r, BlockNo(2), 0, MAX_FANOUT).unwrap();
        assert_eq!(one.search(&r, 49).unwrap(), None);
    }

    #[test]
    fn corrupt_headers_are_rejected() {
        let r = HeapRegion::new(4 * BLOCK_SIZE).unwrap();
        // Zeroed block: bad magic.
        assert!(matches!(
            Node::read(&r, BlockNo(1), 0, MAX_FANOUT),
            Err(Error::Corrupt {
                what: "extent node magic",
                ..
            })
        ));
        // Wrong level.
        r.write(BlockNo(1).offset(), &encode_node(2, &[])).unwrap();
        assert!(matches!(
            Node::read(&r, BlockNo(1), 0, MAX_FANOUT),
            Err(Error::Corrupt {
                what: "extent node level",
                ..
            })
        ));
        // Count above the fanout.
        r.store_u64(BlockNo(1).offset(), header_word(0, 253))
            .unwrap();
        assert!(matches!(
            Node::read(&r, BlockNo(1), 0, MAX_FANOUT),
            Err(Error::Corrupt {
                what: "extent node entry count",
                ..
            })
        ));
        // A block past the end of the region.
        assert!(Node::read(&r, BlockNo(9), 0, MAX_FANOUT).is_err());
    }
}
