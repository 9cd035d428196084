//! The 8-byte slot word of the HashFS table (and the key word of the cuckoo table).
//!
//! | bits    | field | meaning                                                            |
//! |---------|-------|--------------------------------------------------------------------|
//! | 0..32   | lblk  | logical block within the file                                      |
//! | 32..60  | ino   | inode number                                                       |
//! | 60      | version | version bit for the copy-on-write data path (always 0 today)       |
//! | 61..64  | tag   | 0 empty, 1 tombstone, 2 tentative, 3 committed; 4..7 are corrupt   |
//!
//! An empty slot is the all-zero word and a tombstone is exactly `1 << 61`: every other bit
//! pattern with those tags is corrupt. The hash of a key covers `ino` and `lblk` only, so both
//! versions of a key (version bit 0 and 1) lie on the same probe sequence.

/// Largest inode number a global table can key (28 bits).
pub const MAX_INO: u64 = (1 << 28) - 1;
/// Logical blocks of a file that a global table can key: `[0, LBLK_LIMIT)` (32 bits).
pub const LBLK_LIMIT: u64 = 1 << 32;

const INO_SHIFT: u32 = 32;
const GEN_BIT: u64 = 1 << 60;
const TAG_SHIFT: u32 = 61;
const TAG_TOMBSTONE: u64 = 1;
const TAG_TENTATIVE: u64 = 2;
const TAG_COMMITTED: u64 = 3;

/// The word of an empty slot.
pub const EMPTY: u64 = 0;
/// The word of a tombstone.
pub const TOMBSTONE: u64 = TAG_TOMBSTONE << TAG_SHIFT;

/// A table key: one logical block of one file, in one version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// Inode number, at most [`MAX_INO`].
    pub ino: u64,
    /// Logical block, below [`LBLK_LIMIT`].
    pub lblk: u64,
    /// Version bit (reserved for copy-on-write; 0 today).
    pub version: bool,
}

impl Key {
    /// The version-0 key of `(ino, lblk)`. Callers guarantee the bounds.
    pub fn new(ino: u64, lblk: u64) -> Self {
        debug_assert!(ino <= MAX_INO && lblk < LBLK_LIMIT);
        Self {
            ino,
            lblk,
            version: false,
        }
    }

    fn bits(self) -> u64 {
        self.lblk | (self.ino << INO_SHIFT) | if self.version { GEN_BIT } else { 0 }
    }

    /// The word of a tentative (claimed, not yet mapped) slot holding this key.
    pub fn tentative(self) -> u64 {
        self.bits() | (TAG_TENTATIVE << TAG_SHIFT)
    }

    /// The word of a committed (mapped) slot holding this key.
    pub fn committed(self) -> u64 {
        self.bits() | (TAG_COMMITTED << TAG_SHIFT)
    }
}

/// A decoded slot word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Never used since the last purge: ends every probe sequence.
    Empty,
    /// Freed: free for insertion, but probe sequences continue past it.
    Tombstone,
    /// Claimed by a multi-block insert that has not committed yet.
    Tentative(Key),
    /// Mapped.
    Committed(Key),
}

impl Slot {
    /// Decodes a word read from PM; `None` if no valid slot has this bit pattern.
    pub fn decode(word: u64) -> Option<Slot> {
        let key = Key {
            lblk: word & (LBLK_LIMIT - 1),
            ino: (word >> INO_SHIFT) & MAX_INO,
            version: word & GEN_BIT != 0,
        };
        match word >> TAG_SHIFT {
            0 if word == EMPTY => Some(Slot::Empty),
            TAG_TOMBSTONE if word == TOMBSTONE => Some(Slot::Tombstone),
            TAG_TENTATIVE => Some(Slot::Tentative(key)),
            TAG_COMMITTED => Some(Slot::Committed(key)),
            _ => None,
        }
    }

    /// Whether an insert may claim the slot.
    pub fn is_free(self) -> bool {
        matches!(self, Slot::Empty | Slot::Tombstone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_garbage_is_rejected() {
        let k = Key::new(MAX_INO, LBLK_LIMIT - 1);
        assert_eq!(Slot::decode(k.committed()), Some(Slot::Committed(k)));
        assert_eq!(Slot::decode(k.tentative()), Some(Slot::Tentative(k)));
        let z = Key::new(0, 0);
        assert_ne!(z.committed(), EMPTY);
        assert_eq!(Slot::decode(z.committed()), Some(Slot::Committed(z)));
        let g = Key { version: true, ..z };
        assert_eq!(Slot::decode(g.committed()), Some(Slot::Committed(g)));
        assert_eq!(Slot::decode(EMPTY), Some(Slot::Empty));
        assert_eq!(Slot::decode(TOMBSTONE), Some(Slot::Tombstone));
        assert_eq!(Slot::decode(1), None);
        assert_eq!(Slot::decode(TOMBSTONE | 5), None);
        assert_eq!(Slot::decode(4 << 61), None);
        assert_eq!(Slot::decode(u64::MAX), None);
    }
}
