//! The baseline allocator's persistent block bitmap, one bit per managed block.
//!
//! # On-media layout
//!
//! An area of [`bitmap_area_size`] bytes at a 64-byte aligned offset:
//! - line 0, the header: `magic`, `version`, `first` block, block `count` and the crc32c of
//!   those four words, all `Le64`;
//! - line 1, the intent record: `commit` word, `start`, `len` (8-byte atomic stores);
//! - lines 2..: `ceil(count / 64)` little-endian words; bit `i % 64` of word `i / 64` is set
//!   when block `first + i` is allocated.
//!
//! # Crash atomicity
//!
//! Every [`set_range`](PersistentBitmap::set_range) leaves, after a crash at any point and
//! [`open`](PersistentBitmap::open), the bitmap either as it was before the call or as it is
//! after it:
//! - a change inside one word is one 8-byte atomic store, flushed and fenced;
//! - a change spanning several words first records an *intent* (`start`, `len`, persisted, then
//!   the `commit` word holding the operation, persisted), then updates the words, persists
//!   them, and finally clears `commit`. [`open`](PersistentBitmap::open) replays a committed
//!   intent (setting or clearing bits is idempotent), so a crash after the commit point yields
//!   the new bitmap and a crash before it the old one.

use std::ops::Range;

use pmfs_core::layout::{CACHE_LINE, Le64, PmOff, crc32c};
use pmfs_core::pm::Media;
use pmfs_core::{Error, Result};

/// "PMFSBMAP" read as a little-endian word.
const MAGIC: u64 = u64::from_le_bytes(*b"PMFSBMAP");
/// Layout version written by [`PersistentBitmap::format`].
const VERSION: u64 = 1;
/// Offset of the intent record inside the area.
const INTENT: u64 = CACHE_LINE;
/// Offset of the first bitmap word inside the area.
const WORDS: u64 = 2 * CACHE_LINE;
/// `commit` values: the low two bits name the operation, the rest is a sequence number.
const OP_SET: u64 = 1;
const OP_CLEAR: u64 = 2;
const OP_MASK: u64 = 3;

/// The header line.
type Header = [Le64; 8];
const _: () = assert!(size_of::<Header>() == CACHE_LINE as usize);

/// Bytes of persistent memory a bitmap for `count` blocks occupies.
pub fn bitmap_area_size(count: u64) -> u64 {
    WORDS + count.div_ceil(64) * 8
}

fn header_crc(h: &Header) -> u64 {
    let mut bytes = [0u8; 32];
    for (i, w) in h[..4].iter().enumerate() {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&w.get().to_le_bytes());
    }
    u64::from(crc32c(&bytes))
}

/// A persistent bitmap of allocated blocks (see the module documentation).
///
/// Not synchronised: the owner serialises calls (the baseline allocator holds its mutex).
#[derive(Debug)]
pub struct PersistentBitmap<M> {
    media: M,
    area: PmOff,
    first: u64,
    count: u64,
    seq: u64,
    durability: Durability,
    /// The words stored since the last [`sync`](PersistentBitmap::sync) and not yet flushed
    /// (indices; empty unless [`Durability::AtSync`]).
    dirty: Range<u64>,
}

/// When a bitmap's changes reach the media.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// Every [`set_range`](PersistentBitmap::set_range) is crash-atomic and durable when it
    /// returns (see the module documentation).
    #[default]
    EachCall,
    /// Changes are stored and flushed only by [`sync`](PersistentBitmap::sync), with one
    /// fence. For an owner that trusts the bitmap only after a clean close, having synced it
    /// before, and rebuilds it after any other end: a crash in between may leave any mix of
    /// old and new words.
    AtSync,
}

impl<M: Media> PersistentBitmap<M> {
    fn check_area(media: &M, area: PmOff, count: u64) -> Result<()> {
        if !area.is_aligned(CACHE_LINE) {
            return Err(Error::InvalidArgument(
                "bitmap area must be cache-line aligned",
            ));
        }
        let end = area.0.checked_add(bitmap_area_size(count));
        if end.is_none_or(|e| e > media.size()) {
            return Err(Error::OutOfBounds {
                off: area,
                len: bitmap_area_size(count),
                size: media.size(),
            });
        }
        Ok(())
    }

    /// Writes an empty bitmap for blocks `[first, first + count)` at `area` and makes it
    /// durable.
    pub fn format(media: M, area: PmOff, first: u64, count: u64) -> Result<Self> {
        if first.checked_add(count).is_none() {
            return Err(Error::InvalidArgument("managed range overflows"));
        }
        Self::check_area(&media, area, count)?;
        let size = bitmap_area_size(count);
        media.fill_nt(area + INTENT, size - INTENT, 0)?;
        let mut h: Header = [Le64::new(0); 8];
        h[0] = Le64::new(MAGIC);
        h[1] = Le64::new(VERSION);
        h[2] = Le64::new(first);
        h[3] = Le64::new(count);
        h[4] = Le64::new(header_crc(&h));
        let mut bytes = [0u8; CACHE_LINE as usize];
        for (i, w) in h.iter().enumerate() {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&w.get().to_le_bytes());
        }
        media.write_nt(area, &bytes)?;
        media.fence();
        Ok(Self {
            media,
            area,
            first,
            count,
            seq: 0,
            durability: Durability::EachCall,
            dirty: 0..0,
        })
    }

    /// Opens the bitmap at `area`: validates the header, replays a committed intent left by a
    /// crash, and returns the bitmap with its words.
    ///
    /// Returns [`Error::Corrupt`] if the header or the intent record is damaged or a bit is set
    /// past the last block.
    pub fn open(media: M, area: PmOff) -> Result<(Self, Vec<u64>)> {
        if !area.is_aligned(CACHE_LINE) {
            return Err(Error::InvalidArgument(
                "bitmap area must be cache-line aligned",
            ));
        }
        let mut line = [0u8; CACHE_LINE as usize];
        media.read(area, &mut line)?;
        let mut h: Header = [Le64::new(0); 8];
        for (i, w) in h.iter_mut().enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(&line[i * 8..i * 8 + 8]);
            *w = Le64::new(u64::from_le_bytes(b));
        }
        let corrupt = |at: PmOff| Error::Corrupt {
            what: "block bitmap header",
            at,
        };
        if h[0].get() != MAGIC || h[1].get() != VERSION || h[4].get() != header_crc(&h) {
            return Err(corrupt(area));
        }
        let (first, count) = (h[2].get(), h[3].get());
        if first.checked_add(count).is_none() {
            return Err(corrupt(area));
        }
        Self::check_area(&media, area, count).map_err(|_| corrupt(area))?;
        let mut bm = Self {
            media,
            area,
            first,
            count,
            seq: 0,
            durability: Durability::EachCall,
            dirty: 0..0,
        };
        bm.recover()?;
        let words = bm.read_words()?;
        Ok((bm, words))
    }

    /// First managed block.
    pub fn first(&self) -> u64 {
        self.first
    }

    /// Number of managed blocks.
    pub fn count(&self) -> u64 {
        self.count
    }

    fn word_off(&self, w: u64) -> PmOff {
        self.area + WORDS + w * 8
    }

    fn read_words(&self) -> Result<Vec<u64>> {
        let n = self.count.div_ceil(64);
        let mut bytes = vec![0u8; (n * 8) as usize];
        self.media.read(self.word_off(0), &mut bytes)?;
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0u8; 8];
                b.copy_from_slice(c);
                Le64::new(u64::from_le_bytes(b)).get()
            })
            .collect();
        let tail = self.count % 64;
        if tail != 0
            && let Some(&last) = words.last()
            && last >> tail != 0
        {
            return Err(Error::Corrupt {
                what: "block bitmap (bit past the last block)",
                at: self.word_off(n - 1),
            });
        }
        Ok(words)
    }

    /// Replays a committed intent, if any, and clears it.
    fn recover(&mut self) -> Result<()> {
        let commit = self.media.load_u64(self.area + INTENT)?;
        if commit == 0 {
            return Ok(());
        }
        let start = self.media.load_u64(self.area + INTENT + 8)?;
        let len = self.media.load_u64(self.area + INTENT + 16)?;
        let op = commit & OP_MASK;
        let in_range = start >= self.first
            && len > 0
            && start
                .checked_add(len)
                .is_some_and(|e| e <= self.first + self.count);
        if !in_range || !(op == OP_SET || op == OP_CLEAR) {
            return Err(Error::Corrupt {
                what: "block bitmap intent record",
                at: self.area + INTENT,
            });
        }
        self.seq = commit >> 2;
        self.write_bits(start, len, op == OP_SET)?;
        self.media.store_u64_persist(self.area + INTENT, 0)
    }

    /// Stores the new values of the words covering `[start, start + len)` and persists them
    /// (flush of the range, one fence).
    fn write_bits(&self, start: u64, len: u64, value: bool) -> Result<()> {
        let words = self.store_bits(start, len, value)?;
        self.persist_words(words)
    }

    /// Flushes the words with indices `words` and fences.
    fn persist_words(&self, words: Range<u64>) -> Result<()> {
        self.media
            .flush(self.word_off(words.start), (words.end - words.start) * 8)?;
        self.media.fence();
        Ok(())
    }

    /// Stores the new values of the words covering `[start, start + len)`; returns their
    /// indices.
    fn store_bits(&self, start: u64, len: u64, value: bool) -> Result<Range<u64>> {
        let rel = start - self.first;
        let (w0, w1) = (rel / 64, (rel + len - 1) / 64);
        for w in w0..=w1 {
            let lo = if w == w0 { rel % 64 } else { 0 };
            let hi = if w == w1 { (rel + len - 1) % 64 } else { 63 };
            let mask = (u64::MAX >> (63 - hi)) & (u64::MAX << lo);
            let off = self.word_off(w);
            let old = self.media.load_u64(off)?;
            let new = if value { old | mask } else { old & !mask };
            if new != old {
                self.media.store_u64(off, new)?;
            }
        }
        Ok(w0..w1 + 1)
    }

    /// Chooses when changes reach the media; leaving [`Durability::AtSync`] syncs first.
    pub fn set_durability(&mut self, durability: Durability) -> Result<()> {
        if durability == Durability::EachCall {
            self.sync()?;
        }
        self.durability = durability;
        Ok(())
    }

    /// Makes every change so far durable: flushes the words stored since the last sync and
    /// fences. Nothing to do under [`Durability::EachCall`].
    pub fn sync(&mut self) -> Result<()> {
        let dirty = std::mem::replace(&mut self.dirty, 0..0);
        if dirty.is_empty() {
            return Ok(());
        }
        self.persist_words(dirty)
    }

    /// Sets (`value`) or clears the bits of blocks `[start, start + len)`, crash-atomically and
    /// durably (see the module documentation), or under [`Durability::AtSync`] stores them
    /// only. The range must lie in the managed range.
    pub fn set_range(&mut self, start: u64, len: u64, value: bool) -> Result<()> {
        if len == 0
            || start < self.first
            || start
                .checked_add(len)
                .is_none_or(|e| e > self.first + self.count)
        {
            return Err(Error::InvalidArgument(
                "bitmap range outside the managed range",
            ));
        }
        if self.durability == Durability::AtSync {
            let words = self.store_bits(start, len, value)?;
            self.dirty = if self.dirty.is_empty() {
                words
            } else {
                self.dirty.start.min(words.start)..self.dirty.end.max(words.end)
            };
            return Ok(());
        }
        let rel = start - self.first;
        if rel / 64 == (rel + len - 1) / 64 {
            return self.write_bits(start, len, value);
        }
        let intent = self.area + INTENT;
        self.media.store_u64(intent + 8, start)?;
        self.media.store_u64(intent + 16, len)?;
        self.media.persist(intent + 8, 16)?;
        self.seq = self.seq.wrapping_add(1) & (u64::MAX >> 2);
        let op = if value { OP_SET } else { OP_CLEAR };
        self.media.store_u64_persist(intent, self.seq << 2 | op)?;
        self.write_bits(start, len, value)?;
        self.media.store_u64_persist(intent, 0)
    }

    /// Replaces the whole bitmap with `words` (one bit per managed block, as in the layout) and
    /// makes it durable. Used by rebuild; not crash-atomic (a rebuild is simply run again).
    pub fn rewrite(&mut self, words: &[u64]) -> Result<()> {
        let n = self.count.div_ceil(64) as usize;
        if words.len() != n {
            return Err(Error::InvalidArgument("bitmap rewrite of the wrong length"));
        }
        self.media.store_u64_persist(self.area + INTENT, 0)?;
        let mut bytes = Vec::with_capacity(n * 8);
        for w in words {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        self.media.write_nt(self.word_off(0), &bytes)?;
        self.media.fence();
        self.dirty = 0..0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use pmfs_core::pm::HeapRegion;

    use super::*;

    fn bit(words: &[u64], i: u64) -> bool {
        words[(i / 64) as usize] >> (i % 64) & 1 == 1
    }

    #[test]
    fn set_and_clear_survive_reopen() {
        let region = HeapRegion::new(8192).unwrap();
        let mut bm = PersistentBitmap::format(&region, PmOff(128), 1000, 300).unwrap();
        bm.set_range(1010, 100, true).unwrap();
        bm.set_range(1003, 2, true).unwrap();
        bm.set_range(1050, 10, false).unwrap();
        let (bm2, words) = PersistentBitmap::open(&region, PmOff(128)).unwrap();
        assert_eq!((bm2.first(), bm2.count()), (1000, 300));
        for i in 0..300 {
            let b = 1000 + i;
            let want = (1003..1005).contains(&b)
                || ((1010..1110).contains(&b) && !(1050..1060).contains(&b));
            assert_eq!(bit(&words, i), want, "block {b}");
        }
    }

    #[test]
    fn damaged_header_and_intent_are_reported() {
        let region = HeapRegion::new(4096).unwrap();
        PersistentBitmap::format(&region, PmOff(0), 0, 100).unwrap();
        region.store_u64(PmOff(24), 101).unwrap();
        assert!(matches!(
            PersistentBitmap::open(&region, PmOff(0)),
            Err(Error::Corrupt { .. })
        ));
        let region = HeapRegion::new(4096).unwrap();
        PersistentBitmap::format(&region, PmOff(0), 0, 100).unwrap();
        region.store_u64(PmOff(INTENT), OP_SET).unwrap();
        region.store_u64(PmOff(INTENT + 8), 90).unwrap();
        region.store_u64(PmOff(INTENT + 16), 20).unwrap();
        assert!(matches!(
            PersistentBitmap::open(&region, PmOff(0)),
            Err(Error::Corrupt { .. })
        ));
        let region = HeapRegion::new(4096).unwrap();
        PersistentBitmap::format(&region, PmOff(0), 0, 100).unwrap();
        region.store_u64(PmOff(WORDS + 8), 1 << 40).unwrap();
        assert!(matches!(
            PersistentBitmap::open(&region, PmOff(0)),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn committed_intent_is_replayed() {
        let region = HeapRegion::new(4096).unwrap();
        PersistentBitmap::format(&region, PmOff(0), 0, 200).unwrap();
        region.store_u64(PmOff(INTENT + 8), 60).unwrap();
        region.store_u64(PmOff(INTENT + 16), 80).unwrap();
        region.store_u64(PmOff(INTENT), 7 << 2 | OP_SET).unwrap();
        let (_, words) = PersistentBitmap::open(&region, PmOff(0)).unwrap();
        for i in 0..200 {
            assert_eq!(bit(&words, i), (60..140).contains(&i), "block {i}");
        }
        assert_eq!(region.load_u64(PmOff(INTENT)).unwrap(), 0);
    }

    #[test]
    fn area_must_fit_and_be_aligned() {
        let region = HeapRegion::new(4096).unwrap();
        assert!(PersistentBitmap::format(&region, PmOff(8), 0, 10).is_err());
        assert!(PersistentBitmap::format(&region, PmOff(0), 0, 64 * 4096).is_err());
        assert!(PersistentBitmap::open(&region, PmOff(0)).is_err());
    }
}
