//! The media contract: the only way pmfs code reads, writes, flushes and orders bytes on
//! persistent memory.
//!
//! Every backend — a mapped pool file ([`PmRegion`](super::PmRegion)), a heap buffer
//! ([`HeapRegion`](super::HeapRegion)) and the crash simulator
//! ([`SimRegion`](crate::sim::SimRegion)) — implements [`Media`], so faults and crashes can be
//! injected underneath every persistent structure.
//!
//! # Persistence model (x86, ADR)
//! - [`Media::write`] performs ordinary (cached) stores. They are visible to other threads
//!   at once but durable only after a [`Media::flush`] of their lines followed by a
//!   [`Media::fence`]. Unflushed lines may also reach media at any moment on their own.
//! - [`Media::write_nt`] performs non-temporal stores: durable after the next fence.
//! - `load_u64`/`store_u64`/`cas_u64` are 8-byte atomic accesses (an 8-byte aligned store never
//!   tears on a crash). The `*_persist` helpers add flush and fence.
//! - A flush takes the line's content *at flush time*; stores to the line after the flush need
//!   another flush.

use std::sync::atomic::AtomicU64;

use crate::error::Result;
use crate::layout::{BLOCK_SIZE, BlockNo, PmOff, Pod};
use crate::pm::procs::DevIno;

/// A byte-addressable persistent-memory region.
///
/// All offsets are relative to the start of the region and bounds-checked: an access outside
/// `[0, size())` returns [`Error::OutOfBounds`](crate::Error::OutOfBounds), atomic accesses at
/// offsets that are not 8-byte aligned return [`Error::Unaligned`](crate::Error::Unaligned).
///
/// Concurrent accesses from several threads (and, for shared mappings, several processes) are
/// allowed; byte ranges written concurrently by two parties, or read while written, must be
/// coordinated by the caller's protocol (atomics, CAS commit, optimistic validation).
pub trait Media: Send + Sync {
    /// Size of the region in bytes.
    fn size(&self) -> u64;

    /// Copies `buf.len()` bytes at `off` into `buf`.
    fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()>;

    /// Stores `src` at `off` with ordinary cached stores (durable after flush + fence).
    fn write(&self, off: PmOff, src: &[u8]) -> Result<()>;

    /// Stores `src` at `off` with non-temporal stores (durable after the next fence).
    fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()>;

    /// Sets `len` bytes at `off` to `byte` with non-temporal stores (durable after the next
    /// fence).
    fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()>;

    /// Copies `len` bytes at `from` to `to` with non-temporal stores (durable after the next
    /// fence), as [`read`](Media::read) then [`write_nt`](Media::write_nt) would; the ranges
    /// must not overlap ([`Error::InvalidArgument`](crate::Error::InvalidArgument)). Regions
    /// that map their media copy it directly, without a DRAM buffer between.
    fn copy_within_nt(&self, from: PmOff, to: PmOff, len: u64) -> Result<()> {
        copy_through_buffer(self, from, to, len)
    }

    /// Writes back the cache lines covering `[off, off + len)`; durable after the next fence.
    fn flush(&self, off: PmOff, len: u64) -> Result<()>;

    /// Orders all earlier flushes and non-temporal stores before any later store (sfence).
    fn fence(&self);

    /// Atomically loads the 8-byte little-endian word at `off` (acquire).
    fn load_u64(&self, off: PmOff) -> Result<u64>;

    /// The `count` 8-byte words at `off`, for loads without a call each (a long walk over a
    /// table of words), where the media map their bytes: `None` where they do not (the crash
    /// simulator, which must see every access) and for a range out of bounds or an unaligned
    /// `off`. The words hold little-endian values; an `Acquire` load of one (then
    /// `u64::from_le`) is what [`load_u64`](Media::load_u64) does.
    fn words(&self, _off: PmOff, _count: u64) -> Option<&[AtomicU64]> {
        None
    }

    /// Atomically stores the 8-byte little-endian word at `off` (release). Not yet durable.
    fn store_u64(&self, off: PmOff, val: u64) -> Result<()>;

    /// Compare-and-swap of the 8-byte word at `off` (acquire-release).
    ///
    /// Returns `Ok(Ok(current))` when the word held `current` and now holds `new`, and
    /// `Ok(Err(actual))` with the word's value when it did not hold `current`. Not yet durable.
    fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>>;

    /// Hints that the line at `off` will be read soon. Out-of-bounds hints are ignored.
    fn prefetch(&self, _off: PmOff) {}

    /// Hints that `[off, off + len)` will be copied out soon (into the mid-level cache: a
    /// block or two ahead of a copy). Out-of-bounds hints are ignored.
    fn prefetch_range(&self, _off: PmOff, _len: u64) {}

    /// Whether flushes are needed at all: `false` on platforms whose caches are inside the
    /// persistence domain (eADR), where only fences order stores.
    fn needs_flush(&self) -> bool {
        true
    }

    /// The file this region maps, if it maps one: what tells whether another process maps the
    /// same pool ([`procs::maps_file`](crate::pm::procs::maps_file)).
    fn file_id(&self) -> Option<DevIno> {
        None
    }

    /// Whether an open file description of the pool file other than this region's holds a
    /// client lock ([`PmRegion::lock_as_client`](crate::pm::PmRegion::lock_as_client)): some
    /// data-only client may be attached. `None` where that cannot be told (no file, or the
    /// query failed).
    fn client_locks_elsewhere(&self) -> Option<bool> {
        None
    }

    /// Flushes `[off, off + len)` and fences: everything stored there before is durable on
    /// return.
    fn persist(&self, off: PmOff, len: u64) -> Result<()> {
        self.flush(off, len)?;
        self.fence();
        Ok(())
    }

    /// [`store_u64`](Media::store_u64) followed by flush and fence of its line.
    fn store_u64_persist(&self, off: PmOff, val: u64) -> Result<()> {
        self.store_u64(off, val)?;
        self.persist(off, 8)
    }

    /// [`cas_u64`](Media::cas_u64); on success the new value is flushed and fenced.
    fn cas_u64_persist(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
        let r = self.cas_u64(off, current, new)?;
        if r.is_ok() {
            self.persist(off, 8)?;
        }
        Ok(r)
    }

    /// Copies `src` to `off` with non-temporal stores and fences: durable on return.
    fn write_persist(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.write_nt(off, src)?;
        self.fence();
        Ok(())
    }
}

/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `[from, from + len)` and
/// `[to, to + len)` overlap (the check of [`Media::copy_within_nt`]).
pub(crate) fn disjoint(from: PmOff, to: PmOff, len: u64) -> Result<()> {
    if len > 0 && from.0 < to.0.saturating_add(len) && to.0 < from.0.saturating_add(len) {
        return Err(crate::Error::InvalidArgument(
            "overlapping copy within the media",
        ));
    }
    Ok(())
}

/// [`Media::copy_within_nt`] through a buffer on the stack: [`read`](Media::read) and
/// [`write_nt`](Media::write_nt) a piece at a time.
pub(crate) fn copy_through_buffer<M: Media + ?Sized>(
    m: &M,
    from: PmOff,
    to: PmOff,
    len: u64,
) -> Result<()> {
    disjoint(from, to, len)?;
    let mut buf = [0u8; 512];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(buf.len() as u64);
        let piece = &mut buf[..n as usize];
        m.read(from + done, piece)?;
        m.write_nt(to + done, piece)?;
        done += n;
    }
    Ok(())
}

/// Typed helpers over any [`Media`], kept apart so `Media` stays object safe.
pub trait MediaExt: Media {
    /// Reads a [`Pod`] value at `off`.
    fn read_pod<T: Pod>(&self, off: PmOff) -> Result<T> {
        let mut v = T::zeroed();
        // SAFETY: `Pod` values have no padding and are valid for every bit pattern, so writing
        // arbitrary bytes over `v` leaves a valid value; the slice covers exactly `v`.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut((&mut v as *mut T).cast::<u8>(), size_of::<T>())
        };
        self.read(off, bytes)?;
        Ok(v)
    }

    /// Reads `words.len()` little-endian 8-byte words at `off` in one bulk copy, straight into
    /// `words`. Each word is a plain load, not an atomic one: for scans that read many words
    /// and load again, atomically, any they act on.
    fn read_words(&self, off: PmOff, words: &mut [u64]) -> Result<()> {
        // SAFETY: `u64` has no padding and is valid for every bit pattern, so writing
        // arbitrary bytes over the words leaves valid values; the slice covers exactly them.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), size_of_val(words))
        };
        self.read(off, bytes)?;
        for w in words.iter_mut() {
            *w = u64::from_le(*w);
        }
        Ok(())
    }

    /// Writes a [`Pod`] value at `off` with cached stores (not yet durable).
    fn write_pod<T: Pod>(&self, off: PmOff, v: &T) -> Result<()> {
        self.write(off, v.as_bytes())
    }

    /// Reads a whole block.
    fn read_block(&self, b: BlockNo, buf: &mut [u8; BLOCK_SIZE as usize]) -> Result<()> {
        self.read(b.offset(), buf)
    }

    /// Number of whole blocks in the region.
    fn blocks(&self) -> u64 {
        self.size() / BLOCK_SIZE
    }
}

impl<M: Media + ?Sized> MediaExt for M {}

macro_rules! forward_media {
    ($($ty:ty),*) => {$(
        impl<M: Media + ?Sized> Media for $ty {
            fn size(&self) -> u64 {
                (**self).size()
            }
            fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
                (**self).read(off, buf)
            }
            fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
                (**self).write(off, src)
            }
            fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
                (**self).write_nt(off, src)
            }
            fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
                (**self).fill_nt(off, len, byte)
            }
            fn copy_within_nt(&self, from: PmOff, to: PmOff, len: u64) -> Result<()> {
                (**self).copy_within_nt(from, to, len)
            }
            fn flush(&self, off: PmOff, len: u64) -> Result<()> {
                (**self).flush(off, len)
            }
            fn fence(&self) {
                (**self).fence()
            }
            fn load_u64(&self, off: PmOff) -> Result<u64> {
                (**self).load_u64(off)
            }
            fn words(&self, off: PmOff, count: u64) -> Option<&[AtomicU64]> {
                (**self).words(off, count)
            }
            fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
                (**self).store_u64(off, val)
            }
            fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
                (**self).cas_u64(off, current, new)
            }
            fn prefetch(&self, off: PmOff) {
                (**self).prefetch(off)
            }
            fn prefetch_range(&self, off: PmOff, len: u64) {
                (**self).prefetch_range(off, len)
            }
            fn needs_flush(&self) -> bool {
                (**self).needs_flush()
            }
            fn file_id(&self) -> Option<DevIno> {
                (**self).file_id()
            }
            fn client_locks_elsewhere(&self) -> Option<bool> {
                (**self).client_locks_elsewhere()
            }
        }
    )*};
}

forward_media!(&M, std::sync::Arc<M>, Box<M>);
