//! Batched hashing of consecutive logical blocks: a scalar kernel and AVX2 / AVX-512 kernels
//! that compute bit-identical results, chosen at run time.
//!
//! # The hash
//!
//! A file's 64-bit `seed` is derived once from its inode number and the table's salt
//! ([`file_seed`]). The home slot of logical block `l` (a `u32`) in a table of `n < 2^32` slots
//! is computed with operations every kernel has in 64-bit lanes — 32×32→64 multiplies
//! (`vpmuludq`), shifts, xors and adds — so that AVX2 needs no 64-bit multiply:
//!
//! ```text
//! p = ((l ^ lo32(seed)) * K1) ^ seed        (32x32 -> 64 multiply)
//! p ^= p >> 29
//! q = p * K2 mod 2^64                       (two 32x32 multiplies and a shift)
//! q ^= q >> 32
//! home = (lo32(q) * n) >> 32                (multiply-shift range reduction)
//! ```
//!
//! # Clusters
//!
//! A HashFS table formatted since table format version 2 hashes *clusters*: the aligned
//! groups of `2^shift` consecutive logical blocks (`shift` is [`CLUSTER_SHIFT`], recorded in
//! the table's header; 0 in older tables and in tables of fewer than `2^shift` slots). A
//! cluster hashes as one key, `c = l >> shift`, onto one of the table's `n >> shift` aligned
//! groups of slots, and its blocks take consecutive home slots in that group:
//!
//! ```text
//! home = (hash(c, n >> shift) << shift) | (l & (2^shift - 1))
//! ```
//!
//! So blocks written together land in consecutive slots, which are consecutive data blocks:
//! a cluster is one physically contiguous run of the pool (one copy for a read, one piece of
//! a mapping), and its slot words share one cache line. With `shift` 0 this is the plain
//! hash of each block.
//!
//! # Dispatch
//!
//! [`HashKernel::detect`] picks the widest kernel the CPU has; a table can be forced onto any
//! supported kernel (tests force [`HashKernel::Scalar`] to compare paths). A batch is always
//! [`BATCH`] consecutive blocks — the size of the translation cache — computed as one 8-lane
//! AVX-512 vector, two 4-lane AVX2 vectors, or eight scalar rounds. The vector kernels are
//! `#[target_feature]` functions and are only called after [`pmfs_core::cpu::features`] has
//! confirmed their feature at the call site.

/// Number of consecutive blocks hashed per batch (and the translation cache's size).
pub const BATCH: usize = 8;

/// The cluster size of new tables, as a shift: eight blocks, one batch, one cache line of
/// slot words (see the module docs).
pub const CLUSTER_SHIFT: u32 = BATCH.trailing_zeros();

const K1: u64 = 0x9e37_79b1;
const K2: u64 = 0x85eb_ca77;

/// A hashing kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashKernel {
    /// Portable scalar code, always available.
    Scalar,
    /// AVX2: two 4-lane vectors per batch.
    Avx2,
    /// AVX-512F: one 8-lane vector per batch.
    Avx512,
}

impl HashKernel {
    /// The widest kernel this CPU supports.
    pub fn detect() -> Self {
        [HashKernel::Avx512, HashKernel::Avx2]
            .into_iter()
            .find(|k| k.is_supported())
            .unwrap_or(HashKernel::Scalar)
    }

    /// Whether this CPU can run the kernel.
    pub fn is_supported(self) -> bool {
        match self {
            HashKernel::Scalar => true,
            HashKernel::Avx2 => avx2_detected(),
            HashKernel::Avx512 => avx512_detected(),
        }
    }

    /// Vector lanes of the kernel (1 for the scalar kernel).
    pub fn lanes(self) -> usize {
        match self {
            HashKernel::Scalar => 1,
            HashKernel::Avx2 => 4,
            HashKernel::Avx512 => 8,
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    pmfs_core::cpu::features().avx2
}

#[cfg(target_arch = "x86_64")]
fn avx512_detected() -> bool {
    pmfs_core::cpu::features().avx512f
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_detected() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_detected() -> bool {
    false
}

/// splitmix64's finaliser: a bijective 64-bit mix.
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The per-file hash seed of inode `ino` in a table salted with `salt`.
pub fn file_seed(ino: u64, salt: u64) -> u64 {
    mix64(ino ^ mix64(salt))
}

/// The home slot of logical block `lblk` (only its low 32 bits count) in a table of `n` slots.
pub fn home_slot(seed: u64, lblk: u64, n: u32) -> u64 {
    let x = (lblk as u32 ^ seed as u32) as u64;
    let mut p = (x * K1) ^ seed;
    p ^= p >> 29;
    let mut q = p.wrapping_mul(K2);
    q ^= q >> 32;
    ((q & 0xffff_ffff) * n as u64) >> 32
}

/// The home slot of logical block `lblk` (only its low 32 bits count) in a table of `n`
/// slots whose clusters are `2^shift` blocks (see the module docs); `n >> shift` must be at
/// least 1. With `shift` 0 it is [`home_slot`].
pub fn cluster_home(seed: u64, lblk: u64, n: u32, shift: u32) -> u64 {
    let l = lblk as u32 as u64;
    (home_slot(seed, l >> shift, n >> shift) << shift) | (l & ((1 << shift) - 1))
}

/// Home slots of blocks `first, first + 1, ..., first + 7` (low 32 bits, wrapping) with
/// `kernel`; every kernel returns the same values as [`cluster_home`]. A kernel the CPU does
/// not support falls back to the scalar code.
pub fn home_slots(kernel: HashKernel, seed: u64, first: u64, n: u32, shift: u32) -> [u64; BATCH] {
    #[cfg(target_arch = "x86_64")]
    match kernel {
        HashKernel::Avx512 if avx512_detected() => {
            // SAFETY: `avx512_detected()` just returned true, so the CPU
            // supports every instruction the avx512f-enabled kernel uses.
            return unsafe { x86::home_slots_avx512(seed, first as u32, n, shift) };
        }
        HashKernel::Avx2 if avx2_detected() => {
            // SAFETY: `avx2_detected()` just returned true, so the CPU supports
            // every instruction the avx2-enabled kernel uses.
            return unsafe { x86::home_slots_avx2(seed, first as u32, n, shift) };
        }
        _ => {}
    }
    let _ = kernel;
    std::array::from_fn(|i| cluster_home(seed, first.wrapping_add(i as u64), n, shift))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{BATCH, K1, K2};

    /// The AVX2 kernel: two 4-lane vectors of 64-bit lanes.
    #[target_feature(enable = "avx2")]
    pub(super) fn home_slots_avx2(seed: u64, first: u32, n: u32, shift: u32) -> [u64; BATCH] {
        let mut out = [0u64; BATCH];
        let seed_v = _mm256_set1_epi64x(seed as i64);
        let seed_lo = _mm256_set1_epi64x(seed as u32 as i64);
        let k1 = _mm256_set1_epi64x(K1 as i64);
        let k2 = _mm256_set1_epi64x(K2 as i64);
        let nv = _mm256_set1_epi64x((n >> shift) as i64);
        let count = _mm_cvtsi32_si128(shift as i32);
        let low = _mm256_set1_epi64x((1i64 << shift) - 1);
        for (half, chunk) in out.chunks_exact_mut(4).enumerate() {
            let base = first.wrapping_add(4 * half as u32);
            let l = _mm256_set_epi64x(
                base.wrapping_add(3) as i64,
                base.wrapping_add(2) as i64,
                base.wrapping_add(1) as i64,
                base as i64,
            );
            let x = _mm256_xor_si256(_mm256_srl_epi64(l, count), seed_lo);
            let mut p = _mm256_xor_si256(_mm256_mul_epu32(x, k1), seed_v);
            p = _mm256_xor_si256(p, _mm256_srli_epi64::<29>(p));
            let lo = _mm256_mul_epu32(p, k2);
            let hi = _mm256_mul_epu32(_mm256_srli_epi64::<32>(p), k2);
            let mut q = _mm256_add_epi64(lo, _mm256_slli_epi64::<32>(hi));
            q = _mm256_xor_si256(q, _mm256_srli_epi64::<32>(q));
            let group = _mm256_srli_epi64::<32>(_mm256_mul_epu32(q, nv));
            let home = _mm256_or_si256(_mm256_sll_epi64(group, count), _mm256_and_si256(l, low));
            // SAFETY: `chunk` is 4 u64 = 32 writable bytes; the unaligned store has no
            // alignment requirement. AVX2 is enabled on this function and was detected by the
            // caller before calling it.
            unsafe { _mm256_storeu_si256(chunk.as_mut_ptr().cast::<__m256i>(), home) };
        }
        out
    }

    /// The AVX-512F kernel: one 8-lane vector of 64-bit lanes.
    #[target_feature(enable = "avx512f")]
    pub(super) fn home_slots_avx512(seed: u64, first: u32, n: u32, shift: u32) -> [u64; BATCH] {
        let mut out = [0u64; BATCH];
        // 32-bit wrapping block numbers in 64-bit lanes, as the scalar code has them.
        let l = _mm512_and_si512(
            _mm512_add_epi64(
                _mm512_set1_epi64(first as i64),
                _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
            ),
            _mm512_set1_epi64(u32::MAX as i64),
        );
        let count = _mm_cvtsi32_si128(shift as i32);
        let x = _mm512_xor_si512(
            _mm512_srl_epi64(l, count),
            _mm512_set1_epi64(seed as u32 as i64),
        );
        let mut p = _mm512_xor_si512(
            _mm512_mul_epu32(x, _mm512_set1_epi64(K1 as i64)),
            _mm512_set1_epi64(seed as i64),
        );
        p = _mm512_xor_si512(p, _mm512_srli_epi64::<29>(p));
        let k2 = _mm512_set1_epi64(K2 as i64);
        let lo = _mm512_mul_epu32(p, k2);
        let hi = _mm512_mul_epu32(_mm512_srli_epi64::<32>(p), k2);
        let mut q = _mm512_add_epi64(lo, _mm512_slli_epi64::<32>(hi));
        q = _mm512_xor_si512(q, _mm512_srli_epi64::<32>(q));
        let nv = _mm512_set1_epi64((n >> shift) as i64);
        let group = _mm512_srli_epi64::<32>(_mm512_mul_epu32(q, nv));
        let home = _mm512_or_si512(
            _mm512_sll_epi64(group, count),
            _mm512_and_si512(l, _mm512_set1_epi64((1i64 << shift) - 1)),
        );
        // SAFETY: `out` is 8 u64 = 64 writable bytes; the unaligned store has no alignment
        // requirement. AVX-512F is enabled on this function and was detected by the caller.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast::<__m512i>(), home) };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kernels() -> Vec<HashKernel> {
        [HashKernel::Scalar, HashKernel::Avx2, HashKernel::Avx512]
            .into_iter()
            .filter(|k| k.is_supported())
            .collect()
    }

    #[test]
    fn kernels_agree_with_the_scalar_hash() {
        let firsts = [0u64, 1, 7, 1000, u32::MAX as u64 - 3, u32::MAX as u64];
        for kernel in all_kernels() {
            for shift in [0, CLUSTER_SHIFT] {
                for &n in &[1u32, 2, 3, 8, 13, 1000, 4096, u32::MAX] {
                    if n >> shift == 0 {
                        continue;
                    }
                    for &first in &firsts {
                        for ino in [0u64, 1, 77, (1 << 28) - 1] {
                            let seed = file_seed(ino, 0x1234_5678);
                            let got = home_slots(kernel, seed, first, n, shift);
                            for (i, &h) in got.iter().enumerate() {
                                let l = first.wrapping_add(i as u64);
                                assert_eq!(h, cluster_home(seed, l, n, shift), "{kernel:?}");
                                assert!(h < n as u64);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_cluster_takes_consecutive_home_slots_of_one_group() {
        let n = 8192u32;
        let seed = file_seed(5, 99);
        let size = 1u64 << CLUSTER_SHIFT;
        let mut groups = std::collections::HashSet::new();
        for c in 0..512u64 {
            let first = cluster_home(seed, c * size, n, CLUSTER_SHIFT);
            assert_eq!(first % size, 0);
            for k in 1..size {
                assert_eq!(
                    cluster_home(seed, c * size + k, n, CLUSTER_SHIFT),
                    first + k
                );
            }
            groups.insert(first / size);
        }
        // 512 clusters over 1024 groups: a uniform hash hits about 400 distinct ones.
        assert!(groups.len() > 350, "only {} distinct groups", groups.len());
        for l in 0..100 {
            assert_eq!(cluster_home(seed, l, n, 0), home_slot(seed, l, n));
        }
    }

    #[test]
    fn consecutive_blocks_spread_over_the_table() {
        // 4096 consecutive blocks of one file into 8192 slots: a decent hash leaves no home
        // slot with more than a handful of keys (a uniform hash gives a maximum around 6).
        let n = 8192u32;
        let mut hits = vec![0u32; n as usize];
        let seed = file_seed(5, 99);
        for l in 0..4096 {
            hits[home_slot(seed, l, n) as usize] += 1;
        }
        assert!(hits.iter().copied().max().unwrap() <= 8);
        let used = hits.iter().filter(|&&h| h > 0).count();
        assert!(used > 2800, "only {used} distinct home slots");
    }
}
