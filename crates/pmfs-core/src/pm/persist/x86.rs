//! x86-64 kernels: cache-line write-back loops, `sfence`, and the streaming
//! copy/fill loops for AVX-512F, AVX2 and SSE2.
//!
//! The write-back instructions are issued through inline assembly without `nomem`, so the
//! compiler treats them as reading and writing memory and keeps earlier stores before them.

use std::arch::asm;
use std::arch::x86_64::{
    __m128i, __m256i, __m512i, _mm_loadu_si128, _mm_set1_epi8, _mm_stream_si128,
    _mm256_loadu_si256, _mm256_set1_epi8, _mm256_stream_si256, _mm512_loadu_si512,
    _mm512_set1_epi8, _mm512_storeu_si512, _mm512_stream_si512,
};

use super::{CopyKind, FlushKind, LINE};

/// Writes back every line overlapping `[addr, addr + len)` with `kind`.
///
/// # Safety
/// The range must be mapped, `len > 0`, and `kind` available on this CPU (not `Portable`).
#[inline]
pub(super) unsafe fn flush(kind: FlushKind, addr: *const u8, len: usize) {
    let mut line = addr as usize & !(LINE - 1);
    let end = addr as usize + len;
    // Each line overlaps the caller's mapped range, so a write-back cannot fault, and the
    // caller guarantees the CPU has the instruction: that is the safety argument of every
    // `asm!` below.
    match kind {
        FlushKind::Clwb => {
            while line < end {
                // SAFETY: see above.
                unsafe { asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags)) };
                line += LINE;
            }
        }
        FlushKind::Clflushopt => {
            while line < end {
                // SAFETY: see above.
                unsafe {
                    asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags))
                };
                line += LINE;
            }
        }
        FlushKind::Clflush => {
            while line < end {
                // SAFETY: see above.
                unsafe { asm!("clflush [{0}]", in(reg) line, options(nostack, preserves_flags)) };
                line += LINE;
            }
        }
        FlushKind::Portable => unreachable!("the portable flush is never offered on x86-64"),
    }
}

/// `sfence`, also a compiler barrier for memory accesses.
#[inline]
pub(super) fn sfence() {
    // SAFETY: sfence has no preconditions (SSE is part of x86-64).
    unsafe { asm!("sfence", options(nostack, preserves_flags)) };
}

/// Streams `len` bytes from `src` to `dst`.
///
/// # Safety
/// `dst` 64-byte aligned and valid for `len` bytes of writes, `src` valid for `len` bytes of
/// reads, no overlap, `len` a multiple of 64, and `kind` available on this CPU (not
/// `Portable`).
#[inline]
pub(super) unsafe fn stream_copy(kind: CopyKind, dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: forwarded from the caller, who checked the CPU has `kind`.
    unsafe {
        match kind {
            CopyKind::Avx512 => copy_avx512(dst, src, len),
            CopyKind::Avx2 => copy_avx2(dst, src, len),
            CopyKind::Sse2 => copy_sse2(dst, src, len),
            CopyKind::Portable => unreachable!("the portable copy does not stream"),
        }
    }
}

/// Streams `len` bytes of `byte` to `dst`.
///
/// # Safety
/// As [`stream_copy`] without the source.
#[inline]
pub(super) unsafe fn stream_fill(kind: CopyKind, dst: *mut u8, len: usize, byte: u8) {
    // SAFETY: forwarded from the caller, who checked the CPU has `kind`.
    unsafe {
        match kind {
            CopyKind::Avx512 => fill_avx512(dst, len, byte),
            CopyKind::Avx2 => fill_avx2(dst, len, byte),
            CopyKind::Sse2 => fill_sse2(dst, len, byte),
            CopyKind::Portable => unreachable!("the portable fill does not stream"),
        }
    }
}

/// Lines moved per loop iteration: enough independent loads in flight to cover DRAM latency.
const UNROLL: usize = 4;

#[target_feature(enable = "avx512f")]
unsafe fn copy_avx512(dst: *mut u8, src: *const u8, len: usize) {
    let (mut d, mut s, mut n) = (dst.cast::<__m512i>(), src.cast::<__m512i>(), len / LINE);
    // SAFETY: `n` counts the lines left, so every access stays inside the
    // caller's ranges; `d` is 64-byte aligned as streaming stores require; loads are unaligned.
    unsafe {
        while n >= UNROLL {
            let v: [__m512i; UNROLL] = std::array::from_fn(|i| _mm512_loadu_si512(s.add(i)));
            for (i, v) in v.into_iter().enumerate() {
                _mm512_stream_si512(d.add(i), v);
            }
            (d, s, n) = (d.add(UNROLL), s.add(UNROLL), n - UNROLL);
        }
        while n > 0 {
            _mm512_stream_si512(d, _mm512_loadu_si512(s));
            (d, s, n) = (d.add(1), s.add(1), n - 1);
        }
    }
}

/// Copies `len` bytes (whole lines) from `src` to `dst` with cached 64-byte loads and
/// stores, four lines ([`UNROLL`]) at a time.
///
/// # Safety
/// `dst` valid for `len` bytes of writes, `src` for `len` bytes of reads, no overlap, `len` a
/// multiple of 64, and the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn copy_cached_avx512(dst: *mut u8, src: *const u8, len: usize) {
    let (mut d, mut s, mut n) = (dst.cast::<__m512i>(), src.cast::<__m512i>(), len / LINE);
    // SAFETY: `n` counts the lines left, so every access stays inside the caller's ranges;
    // loads and stores are unaligned.
    unsafe {
        while n >= UNROLL {
            // Named loads: an array of vectors here is spilled to the stack.
            let (a, b) = (_mm512_loadu_si512(s), _mm512_loadu_si512(s.add(1)));
            let (c, e) = (_mm512_loadu_si512(s.add(2)), _mm512_loadu_si512(s.add(3)));
            _mm512_storeu_si512(d, a);
            _mm512_storeu_si512(d.add(1), b);
            _mm512_storeu_si512(d.add(2), c);
            _mm512_storeu_si512(d.add(3), e);
            (d, s, n) = (d.add(UNROLL), s.add(UNROLL), n - UNROLL);
        }
        while n > 0 {
            _mm512_storeu_si512(d, _mm512_loadu_si512(s));
            (d, s, n) = (d.add(1), s.add(1), n - 1);
        }
    }
}

/// Copies `len` bytes from `src` to `dst` with `rep movsb`, through the cache.
///
/// # Safety
/// `dst` valid for `len` bytes of writes, `src` for `len` bytes of reads, no overlap.
#[inline]
pub(super) unsafe fn copy_rep_movsb(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the string copy moves `len` bytes from `src` to `dst`, ranges the caller
    // vouches for; the direction flag is clear on function entry (the ABI) and the asm
    // block leaves it so.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rdi") dst => _,
            inout("rsi") src => _,
            inout("rcx") len => _,
            options(nostack, preserves_flags),
        );
    }
}

#[target_feature(enable = "avx2")]
unsafe fn copy_avx2(dst: *mut u8, src: *const u8, len: usize) {
    const W: usize = LINE / 32;
    let (mut d, mut s, mut n) = (dst.cast::<__m256i>(), src.cast::<__m256i>(), len / LINE);
    // SAFETY: as in `copy_avx512`, with two 32-byte vectors per line (32-byte aligned `d`).
    unsafe {
        while n >= UNROLL {
            let v: [__m256i; UNROLL * W] = std::array::from_fn(|i| _mm256_loadu_si256(s.add(i)));
            for (i, v) in v.into_iter().enumerate() {
                _mm256_stream_si256(d.add(i), v);
            }
            (d, s, n) = (d.add(UNROLL * W), s.add(UNROLL * W), n - UNROLL);
        }
        while n > 0 {
            let v: [__m256i; W] = std::array::from_fn(|i| _mm256_loadu_si256(s.add(i)));
            for (i, v) in v.into_iter().enumerate() {
                _mm256_stream_si256(d.add(i), v);
            }
            (d, s, n) = (d.add(W), s.add(W), n - 1);
        }
    }
}

#[target_feature(enable = "sse2")]
unsafe fn copy_sse2(dst: *mut u8, src: *const u8, len: usize) {
    const W: usize = LINE / 16;
    let (mut d, mut s, mut n) = (dst.cast::<__m128i>(), src.cast::<__m128i>(), len / LINE);
    // SAFETY: as in `copy_avx512`, with four 16-byte vectors per line (16-byte aligned `d`).
    unsafe {
        while n >= UNROLL {
            let v: [__m128i; UNROLL * W] = std::array::from_fn(|i| _mm_loadu_si128(s.add(i)));
            for (i, v) in v.into_iter().enumerate() {
                _mm_stream_si128(d.add(i), v);
            }
            (d, s, n) = (d.add(UNROLL * W), s.add(UNROLL * W), n - UNROLL);
        }
        while n > 0 {
            let v: [__m128i; W] = std::array::from_fn(|i| _mm_loadu_si128(s.add(i)));
            for (i, v) in v.into_iter().enumerate() {
                _mm_stream_si128(d.add(i), v);
            }
            (d, s, n) = (d.add(W), s.add(W), n - 1);
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn fill_avx512(dst: *mut u8, len: usize, byte: u8) {
    let v = _mm512_set1_epi8(byte as i8);
    let d = dst.cast::<__m512i>();
    for i in 0..len / LINE {
        // SAFETY: line `i` is inside the caller's range and 64-byte aligned.
        unsafe { _mm512_stream_si512(d.add(i), v) };
    }
}

#[target_feature(enable = "avx2")]
unsafe fn fill_avx2(dst: *mut u8, len: usize, byte: u8) {
    let v = _mm256_set1_epi8(byte as i8);
    let d = dst.cast::<__m256i>();
    for i in 0..len / 32 {
        // SAFETY: vector `i` is inside the caller's range and 32-byte aligned.
        unsafe { _mm256_stream_si256(d.add(i), v) };
    }
}

#[target_feature(enable = "sse2")]
unsafe fn fill_sse2(dst: *mut u8, len: usize, byte: u8) {
    let v = _mm_set1_epi8(byte as i8);
    let d = dst.cast::<__m128i>();
    for i in 0..len / 16 {
        // SAFETY: vector `i` is inside the caller's range and 16-byte aligned.
        unsafe { _mm_stream_si128(d.add(i), v) };
    }
}
