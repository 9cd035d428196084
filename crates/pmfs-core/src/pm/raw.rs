//! [`Media`](super::Media) over a raw, process-mapped byte range: the shared implementation of
//! every backend whose bytes the CPU addresses directly (a mapped pool file, a heap buffer).

use std::sync::atomic::{AtomicU64, Ordering};

use super::persist;
use crate::error::{Error, Result};
use crate::layout::PmOff;

/// A byte range the process may read and write for as long as the value lives.
///
/// Invariant: `base` points to `len` bytes that stay mapped, readable and writable, and are
/// 8-byte aligned at `base`, until the owner of this value unmaps them (after dropping it).
#[derive(Debug)]
pub(crate) struct RawRegion {
    base: *mut u8,
    len: u64,
}

// SAFETY: `RawRegion` only hands out accesses through `Media`, whose contract leaves
// coordination of overlapping concurrent accesses to the caller's protocol; the pointer itself
// may be used from any thread.
unsafe impl Send for RawRegion {}
// SAFETY: as above.
unsafe impl Sync for RawRegion {}

impl RawRegion {
    /// # Safety
    /// `base` must be 8-byte aligned and point to `len` bytes that stay mapped, readable and
    /// writable for the lifetime of the returned value.
    pub(crate) unsafe fn new(base: *mut u8, len: u64) -> Self {
        debug_assert!((base as usize).is_multiple_of(8));
        Self { base, len }
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Bounds-checks `[off, off + len)` and returns its address.
    #[inline]
    pub(crate) fn ptr(&self, off: PmOff, len: u64) -> Result<*mut u8> {
        match off.0.checked_add(len) {
            Some(end) if end <= self.len => {
                // SAFETY: `off + len <= self.len`, so the offset stays inside the mapping.
                Ok(unsafe { self.base.add(off.0 as usize) })
            }
            _ => Err(Error::OutOfBounds {
                off,
                len,
                size: self.len,
            }),
        }
    }

    #[inline]
    pub(crate) fn atomic(&self, off: PmOff) -> Result<&AtomicU64> {
        if !off.is_aligned(8) {
            return Err(Error::Unaligned(off));
        }
        let p = self.ptr(off, 8)?;
        // SAFETY: `p` is in bounds, 8-byte aligned (base is 8-aligned and so is `off`) and
        // stays mapped while `self` lives; all concurrent word accesses go through atomics.
        Ok(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    pub(crate) fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
        let p = self.ptr(off, buf.len() as u64)?;
        // SAFETY: `p..p+len` is in bounds and mapped; `buf` is a distinct DRAM buffer.
        unsafe { persist::copy_cached(buf.as_mut_ptr(), p, buf.len()) };
        Ok(())
    }

    pub(crate) fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
        let p = self.ptr(off, src.len() as u64)?;
        // SAFETY: `p..p+len` is in bounds, mapped writable; `src` does not overlap PM we map
        // (callers pass DRAM buffers; an overlapping source would still be handled by the
        // byte copy semantics of `copy`).
        unsafe { std::ptr::copy(src.as_ptr(), p, src.len()) };
        Ok(())
    }

    pub(crate) fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
        let p = self.ptr(off, src.len() as u64)?;
        // SAFETY: `p..p+len` is in bounds and writable for `src.len()` bytes.
        unsafe { persist::copy_nt(p, src) };
        Ok(())
    }

    pub(crate) fn copy_within_nt(&self, from: PmOff, to: PmOff, len: u64) -> Result<()> {
        let src = self.ptr(from, len)?;
        let dst = self.ptr(to, len)?;
        super::media::disjoint(from, to, len)?;
        // SAFETY: both ranges are in bounds and mapped, and they do not overlap.
        unsafe { persist::copy_nt_from(dst, src, len as usize) };
        Ok(())
    }

    pub(crate) fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
        let p = self.ptr(off, len)?;
        // SAFETY: `p..p+len` is in bounds and writable.
        unsafe { persist::fill_nt(p, len as usize, byte) };
        Ok(())
    }

    /// Bounds-checks, then flushes (nothing in eADR mode).
    pub(crate) fn flush(&self, off: PmOff, len: u64) -> Result<()> {
        let p = self.ptr(off, len)?;
        // SAFETY: `p..p+len` is in bounds and mapped.
        unsafe { persist::flush(p, len as usize) };
        Ok(())
    }

    /// The `count` words at `off` as atomics; `None` out of bounds or unaligned.
    pub(crate) fn words(&self, off: PmOff, count: u64) -> Option<&[AtomicU64]> {
        if !off.is_aligned(8) {
            return None;
        }
        let p = self.ptr(off, count.checked_mul(8)?).ok()?;
        // SAFETY: the `count` words at `p` are in bounds, 8-byte aligned (base and `off` are)
        // and stay mapped while `self` lives; `AtomicU64` has the layout of `u64`, and all
        // concurrent word accesses go through atomics, as with `atomic`.
        Some(unsafe { std::slice::from_raw_parts(p.cast::<AtomicU64>(), count as usize) })
    }

    pub(crate) fn load_u64(&self, off: PmOff) -> Result<u64> {
        Ok(u64::from_le(self.atomic(off)?.load(Ordering::Acquire)))
    }

    pub(crate) fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
        self.atomic(off)?.store(val.to_le(), Ordering::Release);
        Ok(())
    }

    pub(crate) fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
        Ok(self
            .atomic(off)?
            .compare_exchange(
                current.to_le(),
                new.to_le(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(u64::from_le)
            .map_err(u64::from_le))
    }

    pub(crate) fn prefetch(&self, off: PmOff) {
        if let Ok(p) = self.ptr(off, 1) {
            persist::prefetch(p);
        }
    }

    pub(crate) fn prefetch_range(&self, off: PmOff, len: u64) {
        if let Ok(p) = self.ptr(off, len) {
            persist::prefetch_range(p, len as usize);
        }
    }
}

/// Implements [`Media`](crate::pm::Media) for a type with a `raw()` accessor returning its
/// [`RawRegion`].
macro_rules! media_via_raw {
    ($ty:ty) => {
        impl $crate::pm::Media for $ty {
            fn size(&self) -> u64 {
                self.raw().len()
            }
            fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
                self.raw().read(off, buf)
            }
            fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
                self.raw().write(off, src)
            }
            fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
                self.raw().write_nt(off, src)
            }
            fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
                self.raw().fill_nt(off, len, byte)
            }
            fn copy_within_nt(&self, from: PmOff, to: PmOff, len: u64) -> Result<()> {
                self.raw().copy_within_nt(from, to, len)
            }
            fn flush(&self, off: PmOff, len: u64) -> Result<()> {
                self.raw().flush(off, len)
            }
            fn fence(&self) {
                $crate::pm::persist::fence()
            }
            fn load_u64(&self, off: PmOff) -> Result<u64> {
                self.raw().load_u64(off)
            }
            fn words(&self, off: PmOff, count: u64) -> Option<&[std::sync::atomic::AtomicU64]> {
                self.raw().words(off, count)
            }
            fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
                self.raw().store_u64(off, val)
            }
            fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
                self.raw().cas_u64(off, current, new)
            }
            fn prefetch(&self, off: PmOff) {
                self.raw().prefetch(off)
            }
            fn prefetch_range(&self, off: PmOff, len: u64) {
                self.raw().prefetch_range(off, len)
            }
            fn needs_flush(&self) -> bool {
                $crate::pm::persist::needs_flush()
            }
        }
    };
}
pub(crate) use media_via_raw;
