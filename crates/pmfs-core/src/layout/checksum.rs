//! crc32c (Castagnoli) checksums for superblocks and journals.
//!
//! With SSE4.2 (told by [`crate::cpu`], which runs no `CPUID` where glibc already did), a
//! loop of `crc32` instructions over 8-byte words: everything checksummed here is short
//! (headers, records, names). Elsewhere the `crc32c` crate, which would run std's feature
//! detection first.

/// The crc32c of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// Extends the crc32c `crc` of earlier bytes with `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if crate::cpu::features().sse42 {
        // SAFETY: the CPU has SSE4.2.
        return unsafe { sse42::append(crc, data) };
    }
    crc32c::crc32c_append(crc, data)
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod sse42 {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u64};

    /// [`crc32c_append`](super::crc32c_append) with the `crc32` instruction.
    ///
    /// # Safety
    /// The CPU must have SSE4.2.
    #[target_feature(enable = "sse4.2")]
    pub(super) unsafe fn append(crc: u32, data: &[u8]) -> u32 {
        let mut words = data.chunks_exact(8);
        let mut c = u64::from(!crc);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            c = _mm_crc32_u64(c, u64::from_le_bytes(b));
        }
        let mut c = c as u32;
        for &b in words.remainder() {
            c = _mm_crc32_u8(c, b);
        }
        !c
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_vector_and_append() {
        // The standard check value of CRC-32C.
        assert_eq!(super::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(
            super::crc32c_append(super::crc32c(b"1234"), b"56789"),
            0xe306_9283
        );
    }

    #[test]
    fn every_length_and_start_agrees_with_the_crate() {
        let data: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for start in [0, 1, 0xe306_9283, u32::MAX] {
            for len in 0..data.len() {
                let (a, b) = data[..len].split_at(len / 3);
                let want = crc32c::crc32c_append(crc32c::crc32c_append(start, a), b);
                assert_eq!(
                    super::crc32c_append(super::crc32c_append(start, a), b),
                    want,
                    "start {start:#x}, length {len}"
                );
            }
        }
    }
}
