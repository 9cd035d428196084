//! The 8-byte slot word of the HashFS table (and the key word of the cuckoo table).
//!
//! | bits    | field | meaning                                                            |
//! |---------|-------|--------------------------------------------------------------------|
//! | 0..32   | lblk  | logical block within the file                                      |
//! | 32..60  | ino   | inode number                                                       |
//! | 60      | staged | with tag 3: a staged (not yet current) version of the key          |
//! | 61..64  | tag   | 0 empty, 1 tombstone, 2 tentative, 3 committed; 4..7 are corrupt   |
//!
//! An empty slot is the all-zero word, a tombstone is exactly `1 << 61` and a tombstone being
//! emptied (*purging*, see the [HashFS module docs](super)) is `1 << 61 | 1`: every other
//! bit pattern with those tags is corrupt, and so is a tentative word with bit 60 set. A committed
//! word with bit 60 set is *staged*: a block claimed for a new version of `(ino, lblk)` by the
//! copy-on-write data path, which lookups do not see (they look for the exact committed word,
//! bit 60 clear). The hash of a key covers `ino` and `lblk` only, so the current version and
//! any staged versions of a key lie on the same probe sequence.

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
/// The word of a tombstone that a removal is turning back into an empty slot.
pub const PURGING: u64 = TOMBSTONE | 1;

/// A table key: one logical block of one file, in one version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// Inode number, at most [`MAX_INO`].
    pub ino: u64,
    /// Logical block, below [`LBLK_LIMIT`].
    pub lblk: u64,
    /// The staged bit: a key with it set builds the *staged* word in
    /// [`committed`](Key::committed) (the same word as [`staged`](Key::staged) of the key
    /// without it). Keys decoded by [`Slot::decode`] never have it set: a staged word decodes
    /// to [`Slot::Staged`].
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

    /// The word of a staged slot: a new version of this key, claimed but not current.
    pub fn staged(self) -> u64 {
        self.committed() | GEN_BIT
    }
}

/// A decoded slot word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Never used since the last purge: ends every probe sequence.
    Empty,
    /// Freed: free for insertion, but probe sequences continue past it.
    Tombstone,
    /// A tombstone on its way to empty: free for insertion, probe sequences continue past it.
    Purging,
    /// Claimed by a multi-block insert that has not committed yet.
    Tentative(Key),
    /// Mapped: the current version of its key.
    Committed(Key),
    /// Claimed for a new version of its key by the copy-on-write data path: not mapped, not
    /// free, kept by recovery.
    Staged(Key),
}

impl Slot {
    /// Decodes a word read from PM; `None` if no valid slot has this bit pattern.
    pub fn decode(word: u64) -> Option<Slot> {
        let key = Key::new((word >> INO_SHIFT) & MAX_INO, word & (LBLK_LIMIT - 1));
        let staged = word & GEN_BIT != 0;
        match word >> TAG_SHIFT {
            0 if word == EMPTY => Some(Slot::Empty),
            TAG_TOMBSTONE if word == TOMBSTONE => Some(Slot::Tombstone),
            TAG_TOMBSTONE if word == PURGING => Some(Slot::Purging),
            TAG_TENTATIVE if !staged => Some(Slot::Tentative(key)),
            TAG_COMMITTED if staged => Some(Slot::Staged(key)),
            TAG_COMMITTED => Some(Slot::Committed(key)),
            _ => None,
        }
    }

    /// Whether an insert may claim the slot.
    pub fn is_free(self) -> bool {
        matches!(self, Slot::Empty | Slot::Tombstone | Slot::Purging)
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
        assert_eq!(g.committed(), z.staged());
        assert_eq!(Slot::decode(z.staged()), Some(Slot::Staged(z)));
        assert_eq!(Slot::decode(k.staged()), Some(Slot::Staged(k)));
        assert_ne!(k.staged(), k.committed());
        assert_eq!(Slot::decode(g.tentative()), None);
        assert_eq!(Slot::decode(EMPTY), Some(Slot::Empty));
        assert_eq!(Slot::decode(TOMBSTONE), Some(Slot::Tombstone));
        assert_eq!(Slot::decode(PURGING), Some(Slot::Purging));
        assert_eq!(Slot::decode(1), None);
        assert_eq!(Slot::decode(TOMBSTONE | 2), None);
        assert_eq!(Slot::decode(TOMBSTONE | 5), None);
        assert_eq!(Slot::decode(4 << 61), None);
        assert_eq!(Slot::decode(u64::MAX), None);
    }
}
