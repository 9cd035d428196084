//! One cuckoo bucket: a cache line holding a seqlock word and three ranged entries.
//!
//! | word | field                                                   |
//! |------|---------------------------------------------------------|
//! | 0    | seqlock: bit 0 locked, bits 1..32 version, 32..64 epoch |
//! | 1, 2 | entry 0: key word, value word                           |
//! | 3, 4 | entry 1                                                 |
//! | 5, 6 | entry 2                                                 |
//! | 7    | reserved, zero                                          |
//!
//! The key word has the HashFS slot format (tag committed, or the zero word for a free
//! entry). The value word of a ranged entry (HashFS paper §3.2.1):
//!
//! | bits   | field | meaning                                                         |
//! |--------|-------|-----------------------------------------------------------------|
//! | 0..40  | pblk  | physical block of this logical block                            |
//! | 40..52 | size  | blocks of the run from this one to its end (at least 1)         |
//! | 52..64 | rev   | blocks of the run before this one (the reverse index)           |

use pmfs_core::layout::{CACHE_LINE, PmOff};

use crate::hashfs::slot::{Key, Slot};

/// Entries per bucket.
pub const WAYS: usize = 3;
/// Longest run one group of ranged entries describes (2 MiB of 4 KiB blocks).
pub const RUN_MAX: u64 = 512;
/// Physical blocks a value word can address.
pub const PBLK_LIMIT: u64 = 1 << 40;

const PBLK_MASK: u64 = PBLK_LIMIT - 1;
const FIELD_MASK: u64 = 0xfff;

/// Byte offset of entry `way`'s key word inside a bucket.
pub fn key_off(bucket: PmOff, way: usize) -> PmOff {
    bucket + 8 + 16 * way as u64
}

/// Byte offset of entry `way`'s value word inside a bucket.
pub fn value_off(bucket: PmOff, way: usize) -> PmOff {
    key_off(bucket, way) + 8
}

const _: () = assert!(8 + 16 * WAYS as u64 + 8 == CACHE_LINE);

/// The mapping of one logical block inside a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Value {
    /// Physical block of this logical block.
    pub pblk: u64,
    /// Blocks from this one to the end of the run (>= 1).
    pub size: u64,
    /// Blocks of the run before this one.
    pub rev: u64,
}

impl Value {
    /// Encodes the value word.
    pub fn encode(self) -> u64 {
        debug_assert!(self.pblk < PBLK_LIMIT && self.size >= 1 && self.size + self.rev <= RUN_MAX);
        self.pblk | (self.size << 40) | (self.rev << 52)
    }

    /// Decodes a value word read from PM; `None` if it breaks the run invariants.
    pub fn decode(w: u64) -> Option<Value> {
        let v = Value {
            pblk: w & PBLK_MASK,
            size: (w >> 40) & FIELD_MASK,
            rev: w >> 52,
        };
        (v.size >= 1
            && v.size + v.rev <= RUN_MAX
            && v.rev <= v.pblk
            && v.pblk + v.size <= PBLK_LIMIT)
            .then_some(v)
    }
}

/// A decoded bucket: its seqlock word and entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// The seqlock word when the bucket was read.
    pub lock: u64,
    /// The entries (`None` = free).
    pub entries: [Option<(Key, Value)>; WAYS],
}

impl Bucket {
    /// Decodes the 64 bytes of a bucket line; `None` if an entry is corrupt (or the slice is
    /// not one line long).
    pub fn decode(line: &[u8]) -> Option<Bucket> {
        if line.len() != CACHE_LINE as usize {
            return None;
        }
        let mut words = [0u64; 8];
        for (w, b) in words.iter_mut().zip(line.chunks_exact(8)) {
            *w = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        }
        let mut entries = [None; WAYS];
        for (way, e) in entries.iter_mut().enumerate() {
            let (k, v) = (words[1 + 2 * way], words[2 + 2 * way]);
            if k == 0 {
                continue;
            }
            *e = match Slot::decode(k)? {
                Slot::Committed(key) if !key.version => Some((key, Value::decode(v)?)),
                _ => return None,
            };
        }
        Some(Bucket {
            lock: words[0],
            entries,
        })
    }

    /// The way holding `key`, if any.
    pub fn find(&self, key: Key) -> Option<(usize, Value)> {
        self.entries
            .iter()
            .enumerate()
            .find_map(|(w, e)| e.filter(|(k, _)| *k == key).map(|(_, v)| (w, v)))
    }

    /// The first free way.
    pub fn free_way(&self) -> Option<usize> {
        self.entries.iter().position(Option::is_none)
    }
}

/// The seqlock protocol on the bucket's word 0. A lock taken in an older epoch (by a process
/// that crashed or died) counts as released: recovery starts a new epoch.
#[derive(Clone, Copy, Debug)]
pub struct SeqLock {
    /// The current epoch (low 32 bits used).
    pub epoch: u64,
}

const VERSION_MASK: u64 = (1 << 31) - 1;

impl SeqLock {
    /// Whether `w` is a lock held in the current epoch.
    pub fn is_locked(self, w: u64) -> bool {
        w & 1 == 1 && (w >> 32) == self.epoch & 0xffff_ffff
    }

    fn next(self, w: u64, locked: bool) -> u64 {
        let version = ((w >> 1) + 1) & VERSION_MASK;
        ((self.epoch & 0xffff_ffff) << 32) | (version << 1) | u64::from(locked)
    }

    /// The word that locks a bucket whose unlocked word is `w`.
    pub fn locked(self, w: u64) -> u64 {
        self.next(w, true)
    }

    /// The word that unlocks a bucket whose locked word is `w`.
    pub fn unlocked(self, w: u64) -> u64 {
        self.next(w, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_broken_runs_are_rejected() {
        let v = Value {
            pblk: PBLK_LIMIT - 10,
            size: 3,
            rev: 7,
        };
        assert_eq!(Value::decode(v.encode()), Some(v));
        assert_eq!(Value::decode(0), None);
        assert_eq!(Value::decode(5 | (1 << 40) | (RUN_MAX << 52)), None);
        assert_eq!(Value::decode(2 | (1 << 40) | (3 << 52)), None);
    }

    #[test]
    fn stale_epoch_locks_are_released() {
        let old = SeqLock { epoch: 1 };
        let new = SeqLock { epoch: 2 };
        let w = old.locked(0);
        assert!(old.is_locked(w));
        assert!(!new.is_locked(w));
        let w2 = new.locked(w);
        assert!(new.is_locked(w2) && w2 != w);
        let w3 = new.unlocked(w2);
        assert!(!new.is_locked(w3) && w3 != w2 && w3 != w);
    }

    #[test]
    fn bucket_lines_decode_and_reject_garbage() {
        let mut line = [0u8; 64];
        let k = Key::new(3, 9);
        let v = Value {
            pblk: 100,
            size: 2,
            rev: 0,
        };
        line[24..32].copy_from_slice(&k.committed().to_le_bytes());
        line[32..40].copy_from_slice(&v.encode().to_le_bytes());
        let b = Bucket::decode(&line).unwrap();
        assert_eq!(b.find(k), Some((1, v)));
        assert_eq!(b.free_way(), Some(0));
        line[8..16].copy_from_slice(&k.tentative().to_le_bytes());
        assert_eq!(Bucket::decode(&line), None);
    }
}
