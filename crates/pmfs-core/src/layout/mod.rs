//! On-media types: little-endian integers, typed offsets and block numbers, checksums and the
//! plain-old-data contract that lets a type be copied to and from persistent memory.
//!
//! Everything pmfs writes to PM is little-endian and goes through these types; nothing uses
//! native-endian byte conversions for on-media data.

mod checksum;
mod endian;
mod offsets;

pub use checksum::{crc32c, crc32c_append};
pub use endian::{Le16, Le32, Le64};
pub use offsets::{BlockNo, PmOff};

/// Size of a file-system block, in bytes.
pub const BLOCK_SIZE: u64 = 4096;
/// log2 of [`BLOCK_SIZE`].
pub const BLOCK_SHIFT: u32 = 12;
/// Size of a CPU cache line, the unit of flushing and of the crash simulator.
pub const CACHE_LINE: u64 = 64;
/// Size of a huge page; data regions and fragments are aligned to it where possible.
pub const HUGE_PAGE: u64 = 2 << 20;

/// Plain old data: a type that may be copied bytewise to and from persistent memory.
///
/// # Safety
///
/// An implementor guarantees that the type
/// - is `#[repr(C)]` or `#[repr(transparent)]` (a fixed layout),
/// - has no padding bytes,
/// - is valid for every bit pattern of its size (no `bool`, `char`, enums, references or
///   pointers), and
/// - has an alignment of at most 8.
///
/// Reading such a type from damaged media therefore never produces an invalid value; a reader
/// still has to validate the *meaning* of what it read.
pub unsafe trait Pod: Copy + Send + Sync + 'static {
    /// Views the value as its bytes.
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `Pod` guarantees a fixed layout without padding, so every byte of the value is
        // initialised, and the slice covers exactly `size_of::<Self>()` bytes of `self`.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast::<u8>(), size_of::<Self>()) }
    }

    /// Builds a value from exactly `size_of::<Self>()` bytes.
    ///
    /// Returns `None` if `bytes` has another length.
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != size_of::<Self>() {
            return None;
        }
        // SAFETY: the length matches, `Pod` types are valid for every bit pattern, and
        // `read_unaligned` has no alignment requirement.
        Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Self>()) })
    }

    /// The all-zero value.
    fn zeroed() -> Self {
        // SAFETY: `Pod` types are valid for every bit pattern, including all zeroes.
        unsafe { std::mem::zeroed() }
    }
}

// SAFETY: unsigned integers have no padding and every bit pattern is valid.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for Le16 {}
// SAFETY: as above; `Le32` is a transparent wrapper of a byte array.
unsafe impl Pod for Le32 {}
// SAFETY: as above; `Le64` is a transparent wrapper of a byte array.
unsafe impl Pod for Le64 {}
// SAFETY: an array of `Pod` values has no padding between elements and inherits validity.
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}
