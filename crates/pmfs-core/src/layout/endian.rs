//! Little-endian integers with alignment 1, for on-media structures.

use std::fmt;

macro_rules! le_int {
    ($(#[$doc:meta])* $name:ident, $int:ty, $n:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
        #[repr(transparent)]
        pub struct $name([u8; $n]);

        impl $name {
            /// Encodes `v` as little-endian.
            pub const fn new(v: $int) -> Self {
                Self(v.to_le_bytes())
            }

            /// Decodes the stored value.
            pub const fn get(self) -> $int {
                <$int>::from_le_bytes(self.0)
            }

            /// Replaces the stored value.
            pub fn set(&mut self, v: $int) {
                self.0 = v.to_le_bytes();
            }
        }

        impl From<$int> for $name {
            fn from(v: $int) -> Self {
                Self::new(v)
            }
        }

        impl From<$name> for $int {
            fn from(v: $name) -> Self {
                v.get()
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.get(), f)
            }
        }
    };
}

le_int!(
    /// A little-endian `u16`.
    Le16, u16, 2
);
le_int!(
    /// A little-endian `u32`.
    Le32, u32, 4
);
le_int!(
    /// A little-endian `u64`.
    Le64, u64, 8
);

const _: () = assert!(size_of::<Le16>() == 2 && align_of::<Le16>() == 1);
const _: () = assert!(size_of::<Le32>() == 4 && align_of::<Le32>() == 1);
const _: () = assert!(size_of::<Le64>() == 8 && align_of::<Le64>() == 1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_order_is_little_endian() {
        assert_eq!(Le32::new(0x0102_0304).0, [4, 3, 2, 1]);
        assert_eq!(Le64::new(1).0, [1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Le16::new(0xabcd).get(), 0xabcd);
    }
}
