//! crc32c (Castagnoli) checksums for superblocks and journals.

/// The crc32c of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Extends the crc32c `crc` of earlier bytes with `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
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
}
