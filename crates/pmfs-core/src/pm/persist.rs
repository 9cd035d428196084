//! Persistence primitives: cache-line flush, store fence, non-temporal copy.
//!
//! This is the portable baseline (clflush + sfence on x86-64, plain copies followed by a
//! flush); run-time dispatch to clwb/clflushopt and streaming stores replaces it.

use std::sync::atomic::{AtomicBool, Ordering, fence as atomic_fence};

use crate::layout::CACHE_LINE;

static EADR: AtomicBool = AtomicBool::new(false);

/// Declares whether CPU caches are inside the persistence domain (eADR). In eADR mode flushes
/// are skipped and only fences order stores.
pub fn set_eadr(on: bool) {
    EADR.store(on, Ordering::Relaxed);
}

/// Whether flushes are issued (false in eADR mode).
pub fn needs_flush() -> bool {
    !EADR.load(Ordering::Relaxed)
}

/// Writes back every cache line overlapping `[addr, addr + len)`.
///
/// # Safety
/// The range must be mapped.
pub unsafe fn flush(addr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let start = addr as usize & !(CACHE_LINE as usize - 1);
    let end = addr as usize + len;
    let mut line = start;
    while line < end {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: the line overlaps the caller's mapped range, so it is mapped.
        unsafe {
            std::arch::x86_64::_mm_clflush(line as *const u8)
        };
        line += CACHE_LINE as usize;
    }
}

/// Orders earlier flushes and non-temporal stores before later stores.
pub fn fence() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: sfence has no memory-safety preconditions; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    atomic_fence(Ordering::SeqCst);
}

/// Copies `src` to `dst` so that it is durable after the next [`fence`].
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes.
pub unsafe fn copy_nt(dst: *mut u8, src: &[u8]) {
    // SAFETY: the caller guarantees `dst` is writable for `src.len()` bytes.
    unsafe {
        std::ptr::copy(src.as_ptr(), dst, src.len());
        if needs_flush() {
            flush(dst, src.len());
        }
    }
}

/// Sets `len` bytes at `dst` to `byte` so that they are durable after the next [`fence`].
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
pub unsafe fn fill_nt(dst: *mut u8, len: usize, byte: u8) {
    // SAFETY: the caller guarantees `dst` is writable for `len` bytes.
    unsafe {
        std::ptr::write_bytes(dst, byte, len);
        if needs_flush() {
            flush(dst, len);
        }
    }
}

/// Prefetches the line at `addr` into the cache (a hint; never faults).
pub fn prefetch(addr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: prefetch is a hint that does not fault on any address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr.cast::<i8>())
    };
    let _ = addr;
}
