//! The per-inode translation cache (HashFS paper §3.2): eight recent translations of logical
//! block to slot, kept in the open file's DRAM handle.
//!
//! Entry `lblk % 8` holds the translation of `lblk`, so eight consecutive blocks — one hashing
//! batch — never evict each other (the paper indexes the cache with the table's hash; indexing
//! by block number keeps a read-ahead batch whole). The cache is a hint: entries are filled by
//! lookups (including, in sequential streams, the spare lanes of a batch, which translate the
//! blocks right after the requested range) and by inserts, and dropped by this handle's
//! removes. Every hit is validated against the slot word in PM before it is used, so
//! mutations through other handles or processes can never make it return a stale
//! translation. The two words of an entry are separate atomics; a torn pair written by racing
//! threads fails validation like any other stale entry.

use std::sync::atomic::{AtomicU64, Ordering};

use super::simd::BATCH;

#[derive(Debug, Default)]
struct Entry {
    /// `lblk + 1`, or 0 when unused.
    tag: AtomicU64,
    slot: AtomicU64,
}

/// Eight cached translations of one file.
#[derive(Debug, Default)]
pub struct TranslationCache {
    entries: [Entry; BATCH],
}

impl TranslationCache {
    fn entry(&self, lblk: u64) -> &Entry {
        &self.entries[(lblk % BATCH as u64) as usize]
    }

    /// The cached slot of `lblk`, unvalidated.
    pub fn get(&self, lblk: u64) -> Option<u64> {
        let e = self.entry(lblk);
        let tag = e.tag.load(Ordering::Acquire);
        let slot = e.slot.load(Ordering::Acquire);
        (tag == lblk + 1 && e.tag.load(Ordering::Acquire) == tag).then_some(slot)
    }

    /// Remembers that `lblk` lives in `slot`.
    pub fn put(&self, lblk: u64, slot: u64) {
        let e = self.entry(lblk);
        e.tag.store(0, Ordering::Release);
        e.slot.store(slot, Ordering::Release);
        e.tag.store(lblk + 1, Ordering::Release);
    }

    /// Forgets every cached block in `[lblk, end)`.
    pub fn invalidate(&self, lblk: u64, end: u64) {
        for e in &self.entries {
            let tag = e.tag.load(Ordering::Acquire);
            if tag != 0 && (lblk..end).contains(&(tag - 1)) {
                let _ = e
                    .tag
                    .compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Acquire);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_blocks_do_not_collide_and_invalidation_is_ranged() {
        let c = TranslationCache::default();
        for l in 16..24 {
            c.put(l, 1000 + l);
        }
        for l in 16..24 {
            assert_eq!(c.get(l), Some(1000 + l));
        }
        assert_eq!(c.get(8), None);
        c.put(24, 5);
        assert_eq!(c.get(16), None);
        assert_eq!(c.get(24), Some(5));
        c.invalidate(18, 20);
        assert_eq!(c.get(18), None);
        assert_eq!(c.get(19), None);
        assert_eq!(c.get(20), Some(1020));
    }
}
