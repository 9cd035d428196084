//! Little-endian field access for on-media records.
//!
//! This crate forbids `unsafe`, so its records are not `Pod` types: each record is encoded
//! into and decoded from a byte array at documented offsets, through pmfs-core's
//! little-endian layout types.

use pmfs_core::layout::{Le16, Le32, Le64, Pod};

/// Reads the little-endian `u64` at `off`.
pub(crate) fn get64(b: &[u8], off: usize) -> u64 {
    Le64::from_bytes(&b[off..off + 8]).map_or(0, Le64::get)
}

/// Reads the little-endian `u32` at `off`.
pub(crate) fn get32(b: &[u8], off: usize) -> u32 {
    Le32::from_bytes(&b[off..off + 4]).map_or(0, Le32::get)
}

/// Reads the little-endian `u16` at `off`.
pub(crate) fn get16(b: &[u8], off: usize) -> u16 {
    Le16::from_bytes(&b[off..off + 2]).map_or(0, Le16::get)
}

/// Writes `v` little-endian at `off`.
pub(crate) fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(Le64::new(v).as_bytes());
}

/// Writes `v` little-endian at `off`.
pub(crate) fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(Le32::new(v).as_bytes());
}

/// Writes `v` little-endian at `off`.
pub(crate) fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(Le16::new(v).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_little_endian() {
        let mut b = [0u8; 16];
        put64(&mut b, 0, 0x0102_0304_0506_0708);
        put32(&mut b, 8, 0x0a0b_0c0d);
        put16(&mut b, 12, 0xeeff);
        assert_eq!(b[0], 0x08);
        assert_eq!(b[8], 0x0d);
        assert_eq!(b[12], 0xff);
        assert_eq!(get64(&b, 0), 0x0102_0304_0506_0708);
        assert_eq!(get32(&b, 8), 0x0a0b_0c0d);
        assert_eq!(get16(&b, 12), 0xeeff);
    }
}
