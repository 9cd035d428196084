//! Persistence primitives: cache-line write-back, store fence, non-temporal copy and fill;
//! and the copy and prefetch hints that reads out of the media use.
//!
//! # Dispatch
//! The instructions are chosen once per process, at the first use, from CPUID:
//!
//! - **flush**: `clwb` (writes the line back and may keep it cached) > `clflushopt` (writes it
//!   back and evicts it; flushes to different lines may overlap) > `clflush` (evicts, and is
//!   ordered with every other `clflush`, so it is the slowest).
//! - **non-temporal copy and fill**: AVX-512F (one 64-byte streaming store per line) > AVX2
//!   (two 32-byte ones) > SSE2 (four 16-byte ones, present on every x86-64 CPU).
//! - **fence**: `sfence`, which orders earlier flushes and streaming stores before later
//!   stores. It is the only ordering instruction needed on x86: flushes and streaming stores
//!   are weakly ordered, ordinary stores are not.
//!
//! [`detected_path`] tells what the CPU offers; [`active_path`] (with [`flush_kind`] and
//! [`copy_kind`]) tells what the calling thread uses, and [`with_path`] runs a closure on
//! another path that the CPU has, so tests and benches can cover every path present.
//!
//! A non-temporal copy ([`copy_nt`]) streams whole destination cache lines. The unaligned head
//! and tail of the destination (and any copy shorter than [`NT_THRESHOLD`]) use ordinary
//! cached stores followed by a flush of their lines, because a partial line cannot be streamed
//! in one store and a streaming store that only fills part of a line costs a read of the rest.
//! Either way the bytes are durable after the next [`fence`].
//!
//! Reads go the other way, through the cache: [`copy_cached`] moves whole lines with unrolled
//! AVX-512 loads and stores when the active path has AVX-512, and [`prefetch_range`] hints the
//! blocks a read copies next into the mid-level cache.
//!
//! On targets other than x86-64, and under Miri (`cfg(miri)`), a portable path is used: plain
//! copies, no cache-line instruction, a sequentially consistent fence. It keeps every caller
//! compiling and testable there, but gives no durability guarantee across power loss.
//!
//! # eADR
//! On platforms with *extended ADR* the CPU caches are inside the persistence domain: a store
//! is durable once it is globally visible, so flushes are pure overhead. [`set_eadr`] switches
//! the process into that mode: [`flush`] does nothing, copies below the non-temporal threshold
//! skip their flush, and only fences remain (still needed to order streaming stores). pmfs
//! cannot detect eADR itself; the platform's owner declares it (libpmem's
//! `pmem_has_auto_flush` reads it from the kernel where NVDIMM regions are exposed).

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86;

#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::error::{Error, Result};

/// Copies shorter than this many bytes use cached stores plus a flush instead of streaming
/// stores: for a few lines the flush is cheaper than the write-combining buffers' round trip.
/// libpmem uses the same default (`PMEM_MOVNT_THRESHOLD`).
pub const NT_THRESHOLD: usize = 256;

const LINE: usize = crate::layout::CACHE_LINE as usize;

/// The instruction that writes a cache line back towards memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlushKind {
    /// `clwb`: write back, the line may stay cached (Skylake-SP and later).
    Clwb,
    /// `clflushopt`: write back and invalidate, weakly ordered.
    Clflushopt,
    /// `clflush`: write back and invalidate, ordered with other `clflush`es.
    Clflush,
    /// No cache-line instruction (targets other than x86-64, and Miri): flushing only keeps
    /// the compiler from moving stores across it.
    Portable,
}

impl FlushKind {
    /// Every kind, best first.
    pub const ALL: [FlushKind; 4] = [
        FlushKind::Clwb,
        FlushKind::Clflushopt,
        FlushKind::Clflush,
        FlushKind::Portable,
    ];

    /// The instruction's name.
    pub fn name(self) -> &'static str {
        match self {
            FlushKind::Clwb => "clwb",
            FlushKind::Clflushopt => "clflushopt",
            FlushKind::Clflush => "clflush",
            FlushKind::Portable => "portable",
        }
    }

    /// Whether this CPU (and build) can use it. On x86-64 the portable kind is not offered:
    /// it would silently drop durability.
    pub fn is_available(self) -> bool {
        cpu().flushes.contains(&self)
    }
}

impl fmt::Display for FlushKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The instructions a non-temporal copy or fill streams whole lines with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyKind {
    /// AVX-512F `vmovntdq` of 64 bytes: one store per line.
    Avx512,
    /// AVX2 `vmovntdq` of 32 bytes.
    Avx2,
    /// SSE2 `movntdq` of 16 bytes (every x86-64 CPU).
    Sse2,
    /// Plain cached copy followed by a flush of the destination.
    Portable,
}

impl CopyKind {
    /// Every kind, best first.
    pub const ALL: [CopyKind; 4] = [
        CopyKind::Avx512,
        CopyKind::Avx2,
        CopyKind::Sse2,
        CopyKind::Portable,
    ];

    /// A short name.
    pub fn name(self) -> &'static str {
        match self {
            CopyKind::Avx512 => "avx512",
            CopyKind::Avx2 => "avx2",
            CopyKind::Sse2 => "sse2",
            CopyKind::Portable => "portable",
        }
    }

    /// Whether this CPU (and build) can use it.
    pub fn is_available(self) -> bool {
        cpu().copies.contains(&self)
    }
}

impl fmt::Display for CopyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A complete choice of persistence instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DispatchPath {
    /// How lines are written back.
    pub flush: FlushKind,
    /// How whole lines are streamed by [`copy_nt`] and [`fill_nt`].
    pub copy: CopyKind,
}

impl DispatchPath {
    /// Whether this CPU (and build) has both instructions.
    pub fn is_available(self) -> bool {
        self.flush.is_available() && self.copy.is_available()
    }

    /// Every path this CPU has, the detected (best) one first.
    pub fn available() -> Vec<DispatchPath> {
        let c = cpu();
        let mut all: Vec<_> = c
            .flushes
            .iter()
            .flat_map(|&flush| {
                c.copies
                    .iter()
                    .map(move |&copy| DispatchPath { flush, copy })
            })
            .collect();
        all.sort_by_key(|p| *p != c.best);
        all
    }
}

impl fmt::Display for DispatchPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{}", self.flush, self.copy)
    }
}

/// What the CPU offers, detected once.
#[derive(Debug)]
struct Cpu {
    flushes: Vec<FlushKind>,
    copies: Vec<CopyKind>,
    best: DispatchPath,
}

fn cpu() -> &'static Cpu {
    static CPU: OnceLock<Cpu> = OnceLock::new();
    CPU.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
fn detect() -> Cpu {
    let cpu = crate::cpu::features();
    let mut flushes = Vec::new();
    if cpu.clwb {
        flushes.push(FlushKind::Clwb);
    }
    if cpu.clflushopt {
        flushes.push(FlushKind::Clflushopt);
    }
    // CLFLUSH is part of SSE2, hence of every x86-64 CPU.
    flushes.push(FlushKind::Clflush);
    let mut copies = Vec::new();
    if cpu.avx512f {
        copies.push(CopyKind::Avx512);
    }
    if cpu.avx2 {
        copies.push(CopyKind::Avx2);
    }
    copies.extend([CopyKind::Sse2, CopyKind::Portable]);
    let best = DispatchPath {
        flush: flushes[0],
        copy: copies[0],
    };
    Cpu {
        flushes,
        copies,
        best,
    }
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
fn detect() -> Cpu {
    let best = DispatchPath {
        flush: FlushKind::Portable,
        copy: CopyKind::Portable,
    };
    Cpu {
        flushes: vec![FlushKind::Portable],
        copies: vec![CopyKind::Portable],
        best,
    }
}

/// The best path this CPU offers (what every thread uses unless [`with_path`] says otherwise).
pub fn detected_path() -> DispatchPath {
    cpu().best
}

/// Number of threads currently inside [`with_path`]; while zero, nobody reads the
/// thread-local override (which costs a TLS lookup in a shared library).
static FORCING: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static FORCED: Cell<Option<DispatchPath>> = const { Cell::new(None) };
}

/// The path the calling thread uses now.
#[inline]
pub fn active_path() -> DispatchPath {
    if FORCING.load(Ordering::Relaxed) != 0
        && let Some(p) = FORCED.with(Cell::get)
    {
        return p;
    }
    cpu().best
}

/// The flush instruction the calling thread uses (see [`needs_flush`] for eADR).
pub fn flush_kind() -> FlushKind {
    active_path().flush
}

/// The streaming-store kind the calling thread's non-temporal copies use.
pub fn copy_kind() -> CopyKind {
    active_path().copy
}

/// Runs `f` with the calling thread's primitives forced onto `path` (other threads, including
/// any that `f` spawns, keep theirs). For tests and benches that cover every path.
///
/// Fails with [`Error::Unsupported`] if the CPU lacks one of the path's instructions.
pub fn with_path<R>(path: DispatchPath, f: impl FnOnce() -> R) -> Result<R> {
    if !path.is_available() {
        return Err(Error::Unsupported(
            "persistence dispatch path not available on this CPU",
        ));
    }
    struct Restore(Option<DispatchPath>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORCED.with(|c| c.set(self.0));
            FORCING.fetch_sub(1, Ordering::Relaxed);
        }
    }
    FORCING.fetch_add(1, Ordering::Relaxed);
    let _restore = Restore(FORCED.with(|c| c.replace(Some(path))));
    Ok(f())
}

static EADR: AtomicBool = AtomicBool::new(false);

/// Declares whether CPU caches are inside the persistence domain (eADR), for the whole
/// process. In eADR mode flushes are skipped and only fences order stores.
pub fn set_eadr(on: bool) {
    EADR.store(on, Ordering::Relaxed);
}

/// Whether flushes are issued (false in eADR mode).
#[inline]
pub fn needs_flush() -> bool {
    !EADR.load(Ordering::Relaxed)
}

/// Writes back every cache line overlapping `[addr, addr + len)`; the write-back is complete
/// (durable) after the next [`fence`]. Does nothing in eADR mode.
///
/// # Safety
/// The range must be mapped in this process.
#[inline]
pub unsafe fn flush(addr: *const u8, len: usize) {
    if len == 0 || !needs_flush() {
        return;
    }
    // SAFETY: the caller guarantees the range is mapped; the active path is available.
    unsafe { flush_lines(active_path().flush, addr, len) }
}

/// # Safety
/// The range must be mapped and `kind` available on this CPU.
#[inline]
unsafe fn flush_lines(kind: FlushKind, addr: *const u8, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: forwarded from the caller.
    unsafe {
        x86::flush(kind, addr, len)
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = (kind, addr, len);
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
    }
}

/// Orders all earlier flushes and non-temporal stores before any later store (`sfence`).
/// It is also a compiler barrier for memory accesses.
#[inline]
pub fn fence() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    x86::sfence();
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// Copies `src` to `dst` so that it is durable after the next [`fence`], streaming whole
/// destination lines past the cache (see the module docs).
///
/// Streaming stores are weakly ordered: another thread may observe them after later ordinary
/// stores of this thread unless a [`fence`] comes between.
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes and must not overlap `src`.
#[inline]
pub unsafe fn copy_nt(dst: *mut u8, src: &[u8]) {
    // SAFETY: forwarded from the caller; the active path is available.
    unsafe { copy_nt_on(active_path(), needs_flush(), dst, src.as_ptr(), src.len()) }
}

/// [`copy_nt`] from `len` bytes at `src`, which may lie in the media too: a block copied from
/// one place of the media to another without a stop in a DRAM buffer.
///
/// # Safety
/// `dst` must be valid for writes and `src` for reads of `len` bytes, and they must not
/// overlap.
#[inline]
pub unsafe fn copy_nt_from(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded from the caller; the active path is available.
    unsafe { copy_nt_on(active_path(), needs_flush(), dst, src, len) }
}

/// Copies `len` bytes from `src` (the media) to `dst` (a DRAM buffer) through the cache: a
/// read. With AVX-512 on the active path, whole lines move in 64-byte vectors, four lines at a
/// time; that keeps more loads in flight than `memcpy` does for a block whose lines are not
/// cached yet, and together with [`prefetch_range`] on the blocks that come next it reads
/// blocks scattered over the media at close to the bandwidth of one contiguous copy. Copies
/// of 16 KiB or more take `rep movsb` instead, where the CPU has ERMS.
///
/// # Safety
/// `dst` valid for `len` bytes of writes, `src` for `len` bytes of reads, no overlap.
#[inline]
pub unsafe fn copy_cached(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded from the caller; the vector copy moves `body` bytes, a multiple of the
    // line, and the rest follows it inside the same ranges.
    unsafe {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if len >= CACHED_VECTOR_MIN && active_path().copy == CopyKind::Avx512 {
            if len >= CACHED_STRING_MIN && crate::cpu::features().erms {
                x86::copy_rep_movsb(dst, src, len);
                return;
            }
            let body = len & !(LINE - 1);
            x86::copy_cached_avx512(dst, src, body);
            std::ptr::copy_nonoverlapping(src.add(body), dst.add(body), len - body);
            return;
        }
        std::ptr::copy_nonoverlapping(src, dst, len);
    }
}

/// Reads shorter than this take `memcpy` in [`copy_cached`].
const CACHED_VECTOR_MIN: usize = 1024;

/// Reads of at least this many bytes take `rep movsb` in [`copy_cached`] where the CPU has
/// ERMS. Copies of 32 KiB pieces from random places of a 256 MiB `/dev/shm` mapping (a HashFS
/// file's clusters) ran at 42-44 µs per MiB with it or glibc's `memcpy` and 51-62 µs with
/// the vector loop; 64 KiB pieces 37 against 45 µs, one 1 MiB copy 29 against 33 µs. Below
/// 16 KiB the vector loop with the read's prefetches was as fast or faster (4 KiB pieces: 57
/// against 72 µs per MiB).
const CACHED_STRING_MIN: usize = 16 << 10;

/// Sets `len` bytes at `dst` to `byte` so that they are durable after the next [`fence`].
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
#[inline]
pub unsafe fn fill_nt(dst: *mut u8, len: usize, byte: u8) {
    // SAFETY: forwarded from the caller; the active path is available.
    unsafe { fill_nt_on(active_path(), needs_flush(), dst, len, byte) }
}

/// Splits `len` bytes at `dst` into an unaligned head, a run of whole lines and a tail.
#[inline]
fn split(dst: *mut u8, len: usize) -> (usize, usize, usize) {
    let head = ((dst as usize).wrapping_neg() & (LINE - 1)).min(len);
    let body = (len - head) & !(LINE - 1);
    (head, body, len - head - body)
}

/// # Safety
/// `dst` valid for `len` bytes of writes, `src` for `len` bytes of reads, no overlap; `path`
/// available on this CPU.
unsafe fn copy_nt_on(path: DispatchPath, flush: bool, dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: every pointer below stays within `[dst, dst + len)` or
    // `[src, src + len)` because `head + body + tail == len`; the ranges do not overlap.
    unsafe {
        if len < NT_THRESHOLD || path.copy == CopyKind::Portable {
            std::ptr::copy_nonoverlapping(src, dst, len);
            if flush && len != 0 {
                flush_lines(path.flush, dst, len);
            }
            return;
        }
        let (head, body, tail) = split(dst, len);
        if head != 0 {
            std::ptr::copy_nonoverlapping(src, dst, head);
            if flush {
                flush_lines(path.flush, dst, head);
            }
        }
        stream_copy(path.copy, dst.add(head), src.add(head), body);
        if tail != 0 {
            let (d, s) = (dst.add(head + body), src.add(head + body));
            std::ptr::copy_nonoverlapping(s, d, tail);
            if flush {
                flush_lines(path.flush, d, tail);
            }
        }
    }
}

/// # Safety
/// `dst` valid for `len` bytes of writes; `path` available on this CPU.
unsafe fn fill_nt_on(path: DispatchPath, flush: bool, dst: *mut u8, len: usize, byte: u8) {
    // SAFETY: every pointer stays within `[dst, dst + len)`.
    unsafe {
        if len < NT_THRESHOLD || path.copy == CopyKind::Portable {
            std::ptr::write_bytes(dst, byte, len);
            if flush && len != 0 {
                flush_lines(path.flush, dst, len);
            }
            return;
        }
        let (head, body, tail) = split(dst, len);
        if head != 0 {
            std::ptr::write_bytes(dst, byte, head);
            if flush {
                flush_lines(path.flush, dst, head);
            }
        }
        stream_fill(path.copy, dst.add(head), body, byte);
        if tail != 0 {
            let d = dst.add(head + body);
            std::ptr::write_bytes(d, byte, tail);
            if flush {
                flush_lines(path.flush, d, tail);
            }
        }
    }
}

/// Streams `len` bytes (whole lines) from `src` to the line-aligned `dst`.
///
/// # Safety
/// As [`copy_nt_on`], plus `dst` 64-byte aligned, `len` a multiple of 64, and `kind` not
/// [`CopyKind::Portable`].
#[inline]
unsafe fn stream_copy(kind: CopyKind, dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: forwarded from the caller.
    unsafe {
        x86::stream_copy(kind, dst, src, len)
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = (kind, dst, src, len);
        unreachable!("only the portable copy kind exists on this target");
    }
}

/// Streams `len` bytes (whole lines) of `byte` to the line-aligned `dst`.
///
/// # Safety
/// As [`stream_copy`] without the source.
#[inline]
unsafe fn stream_fill(kind: CopyKind, dst: *mut u8, len: usize, byte: u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: forwarded from the caller.
    unsafe {
        x86::stream_fill(kind, dst, len, byte)
    };
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    {
        let _ = (kind, dst, len, byte);
        unreachable!("only the portable copy kind exists on this target");
    }
}

/// Prefetches the lines of `[addr, addr + len)` into the mid-level cache (a hint; never
/// faults): for a copy that reaches them soon, such as the next block of a read whose blocks
/// lie apart, where the hardware prefetcher does not follow.
#[inline]
pub fn prefetch_range(addr: *const u8, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let first = addr as usize & !(LINE - 1);
        let end = (addr as usize).saturating_add(len);
        for line in (first..end).step_by(LINE) {
            // SAFETY: prefetch is a hint that does not fault on any address.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    line as *const i8,
                )
            };
        }
    }
    let _ = (addr, len);
}

/// Prefetches the line at `addr` into the cache (a hint; never faults).
#[inline]
pub fn prefetch(addr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: prefetch is a hint that does not fault on any address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr.cast::<i8>())
    };
    let _ = addr;
}
