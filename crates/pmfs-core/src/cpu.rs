//! The instruction-set extensions pmfs uses, found once per process.
//!
//! In a virtual machine every `CPUID` instruction traps to the hypervisor (about 4 µs each on
//! the test host), and every process that opens or attaches to a pool needs these answers:
//! the preload library attaches in each program it serves. std's `is_x86_feature_detected!`
//! runs about ten `CPUID`s on its first use. glibc ran them already when the program started
//! and keeps what it found (`__x86_get_cpuid_feature_leaf`, glibc 2.33), including whether
//! the kernel saves the vector registers an extension needs: where glibc offers that, it is
//! read from there, with no `CPUID` at all; elsewhere std answers, and leaf 7 is read once
//! for the cache-line write-back instructions and `rep movsb`, which std does not name.

use std::sync::OnceLock;

/// What the CPU offers (and, for the vector extensions, the kernel lets programs use).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// SSE4.2: the `crc32` instruction ([`crate::layout::crc32c`]).
    pub sse42: bool,
    /// AVX2.
    pub avx2: bool,
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// `clwb`.
    pub clwb: bool,
    /// `clflushopt`.
    pub clflushopt: bool,
    /// Enhanced `rep movsb` (ERMS): the string copy is the fast way to move large blocks.
    pub erms: bool,
}

/// This CPU's [`Features`], found on the first call.
pub fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
fn detect() -> Features {
    x86::from_glibc().unwrap_or_else(x86::from_cpuid)
}

#[cfg(not(all(target_arch = "x86_64", not(miri))))]
fn detect() -> Features {
    Features::default()
}

#[cfg(all(target_arch = "x86_64", not(miri)))]
mod x86 {
    use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};

    use super::Features;

    /// CPUID.1:ECX bit 20.
    const SSE42: u32 = 1 << 20;
    /// CPUID.(7,0):EBX bits 5, 9, 16, 23 and 24.
    const AVX2: u32 = 1 << 5;
    const ERMS: u32 = 1 << 9;
    const AVX512F: u32 = 1 << 16;
    const CLFLUSHOPT: u32 = 1 << 23;
    const CLWB: u32 = 1 << 24;

    /// What glibc found at startup, if this is a glibc that tells.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    pub(super) fn from_glibc() -> Option<Features> {
        /// `struct cpuid_feature` (`<bits/platform/x86.h>`): the registers `CPUID` gave
        /// (EAX, EBX, ECX, EDX), then the bits of those the program may use.
        #[repr(C)]
        struct Leaf {
            cpuid: [u32; 4],
            active: [u32; 4],
        }
        /// Its indices of leaf 1 and of leaf 7, subleaf 0 (`CPUID_INDEX_1`, `CPUID_INDEX_7`).
        const LEAF_1: u32 = 0;
        const LEAF_7: u32 = 1;
        const EBX: usize = 1;
        const ECX: usize = 2;

        // SAFETY: a NUL-terminated symbol name; `dlsym` has no other precondition.
        let f =
            unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__x86_get_cpuid_feature_leaf".as_ptr()) };
        if f.is_null() {
            return None;
        }
        // SAFETY: glibc's function of this name takes an index and returns a pointer to a
        // `struct cpuid_feature` of its static table (one of zeros for an index it does not
        // know), valid for the life of the process.
        let (l1, l7) = unsafe {
            let get: unsafe extern "C" fn(u32) -> *const Leaf = std::mem::transmute(f);
            (get(LEAF_1).as_ref()?, get(LEAF_7).as_ref()?)
        };
        Some(Features {
            sse42: l1.active[ECX] & SSE42 != 0,
            avx2: l7.active[EBX] & AVX2 != 0,
            avx512f: l7.active[EBX] & AVX512F != 0,
            clwb: l7.cpuid[EBX] & CLWB != 0,
            clflushopt: l7.cpuid[EBX] & CLFLUSHOPT != 0,
            erms: l7.cpuid[EBX] & ERMS != 0,
        })
    }

    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    pub(super) fn from_glibc() -> Option<Features> {
        None
    }

    /// The answers of std's detection, and leaf 7 read once.
    pub(super) fn from_cpuid() -> Features {
        let leaf7 = if __get_cpuid_max(0).0 >= 7 {
            __cpuid_count(7, 0).ebx
        } else {
            0
        };
        Features {
            sse42: std::arch::is_x86_feature_detected!("sse4.2"),
            avx2: std::arch::is_x86_feature_detected!("avx2"),
            avx512f: std::arch::is_x86_feature_detected!("avx512f"),
            clwb: leaf7 & CLWB != 0,
            clflushopt: leaf7 & CLFLUSHOPT != 0,
            erms: leaf7 & ERMS != 0,
        }
    }

    #[cfg(all(test, target_os = "linux", target_env = "gnu"))]
    mod tests {
        use super::*;

        #[test]
        fn glibc_tells_what_cpuid_and_std_find() {
            let glibc = from_glibc().expect("glibc 2.33 or later");
            assert_eq!(glibc, from_cpuid());
        }
    }
}
