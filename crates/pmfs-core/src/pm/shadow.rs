//! A copy-on-write view of another region whose changes stay in memory: what a volume would
//! become (after crash recovery, say) without writing to it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{HeapRegion, Media};
use crate::error::{Error, Result};
use crate::layout::{BLOCK_SIZE, PmOff};

/// A view of `base` that reads its bytes until the view writes them, and never writes to it.
///
/// The view is divided into blocks. A block the view has not written yet is read from the
/// base; the first write to a block (any store, fill, copy or CAS) copies it into a heap
/// region of the base's size and every later access goes there, so the view costs memory
/// only for the blocks it changes. Flushes and fences do nothing: nothing the view holds is
/// durable.
///
/// The base must not change while the view is in use (a block copied before a change of the
/// base and one copied after would show two different times). Atomic accesses of the view are
/// atomic among its users only.
pub struct ShadowRegion<M> {
    base: M,
    copy: HeapRegion,
    /// One bit per block: set once the block is in `copy`.
    copied: Vec<AtomicU64>,
    /// Serialises the copying of blocks (so that no write to a block is lost to its copy).
    copying: Mutex<()>,
}

impl<M: Media> ShadowRegion<M> {
    /// A view of `base` that has changed nothing yet.
    pub fn new(base: M) -> Result<Self> {
        let copy = HeapRegion::new(base.size())?;
        let words = base.size().div_ceil(BLOCK_SIZE).div_ceil(64);
        Ok(Self {
            base,
            copy,
            copied: (0..words).map(|_| AtomicU64::new(0)).collect(),
            copying: Mutex::new(()),
        })
    }

    /// How many blocks the view has written (and holds in memory).
    pub fn blocks_written(&self) -> u64 {
        self.copied
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    fn is_copied(&self, block: u64) -> bool {
        self.copied[(block / 64) as usize].load(Ordering::Acquire) & (1 << (block % 64)) != 0
    }

    /// The blocks of `[off, off + len)`, checked against the bounds; none if `len` is 0.
    fn blocks(&self, off: PmOff, len: u64) -> Result<std::ops::Range<u64>> {
        let end =
            off.0
                .checked_add(len)
                .filter(|&e| e <= self.size())
                .ok_or(Error::OutOfBounds {
                    off,
                    len,
                    size: self.size(),
                })?;
        Ok(if len == 0 {
            0..0
        } else {
            off.0 / BLOCK_SIZE..end.div_ceil(BLOCK_SIZE)
        })
    }

    /// Copies the blocks of `[off, off + len)` that are not in the copy yet into it: every
    /// change goes through this first.
    fn own(&self, off: PmOff, len: u64) -> Result<()> {
        let blocks = self.blocks(off, len)?;
        if blocks.clone().all(|b| self.is_copied(b)) {
            return Ok(());
        }
        let _one = self.copying.lock().unwrap_or_else(|e| e.into_inner());
        let mut buf = vec![0u8; BLOCK_SIZE as usize];
        for b in blocks.filter(|&b| !self.is_copied(b)) {
            let at = PmOff(b * BLOCK_SIZE);
            let n = BLOCK_SIZE.min(self.size() - at.0) as usize;
            self.base.read(at, &mut buf[..n])?;
            self.copy.write(at, &buf[..n])?;
            self.copied[(b / 64) as usize].fetch_or(1 << (b % 64), Ordering::Release);
        }
        Ok(())
    }
}

impl<M: Media> std::fmt::Debug for ShadowRegion<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShadowRegion")
            .field("size", &self.copy.size())
            .field("blocks_written", &self.blocks_written())
            .finish_non_exhaustive()
    }
}

impl<M: Media> Media for ShadowRegion<M> {
    fn size(&self) -> u64 {
        self.base.size()
    }

    fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
        let mut done = 0usize;
        for b in self.blocks(off, buf.len() as u64)? {
            let from = (off.0 + done as u64).max(b * BLOCK_SIZE);
            let n = ((b + 1) * BLOCK_SIZE).min(off.0 + buf.len() as u64) - from;
            let piece = &mut buf[done..done + n as usize];
            if self.is_copied(b) {
                self.copy.read(PmOff(from), piece)?;
            } else {
                self.base.read(PmOff(from), piece)?;
            }
            done += n as usize;
        }
        Ok(())
    }

    fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.own(off, src.len() as u64)?;
        self.copy.write(off, src)
    }

    fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.write(off, src)
    }

    fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
        self.own(off, len)?;
        self.copy.fill_nt(off, len, byte)
    }

    fn flush(&self, off: PmOff, len: u64) -> Result<()> {
        self.blocks(off, len).map(drop)
    }

    fn fence(&self) {}

    fn load_u64(&self, off: PmOff) -> Result<u64> {
        if self
            .blocks(off, 8)
            .is_ok_and(|mut b| b.all(|b| self.is_copied(b)))
        {
            self.copy.load_u64(off)
        } else {
            self.base.load_u64(off)
        }
    }

    fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
        self.own(off, 8)?;
        self.copy.store_u64(off, val)
    }

    fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
        self.own(off, 8)?;
        self.copy.cas_u64(off, current, new)
    }

    fn needs_flush(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn base() -> HeapRegion {
        let image: Vec<u8> = (0..4 * BLOCK_SIZE + 100).map(|i| (i % 251) as u8).collect();
        HeapRegion::from_image(&image).unwrap()
    }

    fn all(m: &impl Media) -> Vec<u8> {
        let mut v = vec![0u8; m.size() as usize];
        m.read(PmOff(0), &mut v).unwrap();
        v
    }

    /// Every kind of change shows in the view, block by block, and none reaches the base.
    #[test]
    fn changes_stay_in_the_view() {
        let base = base();
        let before = all(&base);
        let v = ShadowRegion::new(&base).unwrap();
        assert_eq!(all(&v), before);
        let mut want = before.clone();

        let at = BLOCK_SIZE - 3;
        v.write(PmOff(at), b"across two").unwrap();
        want[at as usize..at as usize + 10].copy_from_slice(b"across two");
        v.fill_nt(PmOff(3 * BLOCK_SIZE + 50), 100, 0xee).unwrap();
        want[3 * BLOCK_SIZE as usize + 50..3 * BLOCK_SIZE as usize + 150].fill(0xee);
        v.store_u64(PmOff(2 * BLOCK_SIZE), 7).unwrap();
        want[2 * BLOCK_SIZE as usize..2 * BLOCK_SIZE as usize + 8]
            .copy_from_slice(&7u64.to_le_bytes());
        assert_eq!(v.cas_u64(PmOff(2 * BLOCK_SIZE), 7, 9).unwrap(), Ok(7));
        assert_eq!(v.cas_u64(PmOff(2 * BLOCK_SIZE), 7, 11).unwrap(), Err(9));
        want[2 * BLOCK_SIZE as usize..2 * BLOCK_SIZE as usize + 8]
            .copy_from_slice(&9u64.to_le_bytes());
        v.copy_within_nt(PmOff(0), PmOff(4 * BLOCK_SIZE), 100)
            .unwrap();
        want.copy_within(0..100, 4 * BLOCK_SIZE as usize);

        assert_eq!(all(&v), want);
        assert_eq!(v.load_u64(PmOff(2 * BLOCK_SIZE)).unwrap(), 9);
        assert_eq!(
            v.load_u64(PmOff(BLOCK_SIZE + 8)).unwrap(),
            base.load_u64(PmOff(BLOCK_SIZE + 8)).unwrap()
        );
        assert_eq!(v.blocks_written(), 5);
        assert_eq!(all(&base), before, "the base changed");
    }

    #[test]
    fn bounds_are_the_bases() {
        let base = base();
        let v = ShadowRegion::new(&base).unwrap();
        let size = v.size();
        let mut b = [0u8; 8];
        for r in [
            v.read(PmOff(size - 4), &mut b),
            v.write(PmOff(size - 4), &b),
            v.store_u64(PmOff(size), 1),
            v.flush(PmOff(u64::MAX), 2),
        ] {
            assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{r:?}");
        }
        assert!(matches!(
            v.load_u64(PmOff(size.next_multiple_of(8))),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(v.store_u64(PmOff(4), 1), Err(Error::Unaligned(_))));
        v.read(PmOff(size), &mut []).unwrap();
        v.read(PmOff(size - 8), &mut b).unwrap();
        assert_eq!(b, all(&base)[size as usize - 8..]);
        assert_eq!(
            v.blocks_written(),
            1,
            "the unaligned store copied its block"
        );
    }
}
