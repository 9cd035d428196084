//! A fast keyed hasher for the DRAM indexes (directory name indexes, the directory cache, the
//! open-file table).
//!
//! SipHash, std's default, costs more than the rest of a name lookup. This hasher folds eight
//! bytes at a time with a 64x64->128-bit multiply (the "mum" step of wyhash) under a seed
//! drawn once per process from std's random source, so names chosen to collide on one machine
//! do not collide on another.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::OnceLock;

const P0: u64 = 0xa076_1d64_78bd_642f;
const P1: u64 = 0xe703_7ed1_a0b4_28db;
const P2: u64 = 0x8ebc_6af0_9c88_c6e3;

fn mum(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

fn process_seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| RandomState::new().hash_one(0x706d_6673_u64))
}

/// Builds [`FastHasher`]s with the process seed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastState {
    seed: u64,
}

impl Default for FastState {
    fn default() -> Self {
        FastState {
            seed: process_seed(),
        }
    }
}

impl BuildHasher for FastState {
    type Hasher = FastHasher;

    fn build_hasher(&self) -> FastHasher {
        FastHasher { h: self.seed }
    }
}

/// See the module documentation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastHasher {
    h: u64,
}

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.h = mum(self.h ^ u64::from_le_bytes(w) ^ P0, P1);
        }
        let rest = chunks.remainder();
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        self.h = mum(self.h ^ u64::from_le_bytes(w) ^ P1, P0 ^ rest.len() as u64);
    }

    fn write_u32(&mut self, v: u32) {
        self.h = mum(self.h ^ u64::from(v) ^ P0, P1);
    }

    fn write_u64(&mut self, v: u64) {
        self.h = mum(self.h ^ v ^ P0, P1);
    }

    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }

    fn finish(&self) -> u64 {
        mum(self.h, P2)
    }
}

/// A `HashMap` with the fast hasher.
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, FastState>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_keys_hash_equal_and_neighbours_differ() {
        let s = FastState::default();
        assert_eq!(
            s.hash_one(b"name".as_slice()),
            s.hash_one(b"name".as_slice())
        );
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000u32 {
            assert!(seen.insert(s.hash_one(format!("f{i}").as_bytes())));
            assert!(seen.insert(s.hash_one(i)));
        }
        // The length is part of the hash: a name and its zero-padded form differ.
        assert_ne!(s.hash_one(b"ab".as_slice()), s.hash_one(b"ab\0".as_slice()));
    }
}
