//! Parsing of per-file log blocks (`pmfs_core::log`): a log built through the public API
//! (inline and extended entries, truncations, punches, one or more blocks) gets
//! fuzzer-chosen byte damage in one of its blocks — header, slots, segments of extended
//! entries. Recovery, the owned-block enumeration, opening, replaying and appending then
//! return `Ok` or an error, never a panic, a hang or an out-of-bounds access; every entry a
//! replay hands out is valid for the region, and every block reported as owned lies in it.
//! The header checksum is recomputed on request so that damage reaches the slots behind it.
#![no_main]

use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::log::{self, Entry, Log};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::traits::{Run, SimpleAllocator};

/// Blocks of the region: block 0 holds the head word, the log grows in the others.
const BLOCKS: u64 = 64;
/// Where the head word lives.
const ROOT: PmOff = PmOff(64);
/// Bits of the head block in the head word.
const HEAD_BITS: u32 = 48;
/// Most entries replayed (a damaged chain must not make the target itself run long).
const MAX_REPLAY: usize = 4096;

#[derive(Arbitrary, Clone, Debug)]
enum Ent {
    /// One run (inline when it fits).
    Write {
        lblk: u16,
        pblk: u8,
        len: u8,
        extend: bool,
    },
    /// Several runs (always extended).
    Scattered {
        runs: Vec<(u16, u8, u8)>,
        extend_to: u32,
    },
    Truncate {
        size: u32,
    },
    Resize {
        size: u32,
    },
    Punch {
        lblk: u16,
        len: u8,
    },
}

impl Ent {
    fn entry(&self) -> Entry {
        let pblk = |p: u8| BlockNo(1 + u64::from(p) % (BLOCKS - 1));
        match *self {
            Ent::Write {
                lblk,
                pblk: p,
                len,
                extend,
            } => {
                let len = u64::from(len % 64) + 1;
                let end = (u64::from(lblk) + len) * BLOCK_SIZE;
                Entry::write(u64::from(lblk), pblk(p), len, if extend { end } else { 0 })
            }
            Ent::Scattered {
                ref runs,
                extend_to,
            } => Entry::Write {
                runs: runs
                    .iter()
                    .take(16)
                    .map(|&(l, p, n)| Run {
                        lblk: u64::from(l),
                        pblk: pblk(p),
                        len: u64::from(n % 8) + 1,
                    })
                    .collect(),
                extend_to: u64::from(extend_to),
            },
            Ent::Truncate { size } => Entry::Truncate {
                size: u64::from(size),
            },
            Ent::Resize { size } => Entry::Resize {
                size: u64::from(size),
            },
            Ent::Punch { lblk, len } => Entry::Punch {
                lblk: u64::from(lblk),
                len: u64::from(len) + 1,
            },
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    entries: Vec<Ent>,
    /// Appends the first entry this many extra times (to fill the first block and link more).
    repeat_first: u16,
    /// Which block of the chain to damage (counted from the head).
    block: u8,
    /// Byte offset in the block and the bits to flip there.
    damage: Vec<(u16, u8)>,
    reseal_header: bool,
}

fn load(media: &HeapRegion, off: u64) -> u64 {
    media.load_u64(PmOff(off)).expect("in bounds")
}

fuzz_target!(|input: Input| {
    let media = Arc::new(HeapRegion::new(BLOCKS * BLOCK_SIZE).expect("heap region"));
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    {
        let log = Log::create(media.clone(), ROOT, alloc.clone()).expect("a new log");
        let first = input.entries.first().cloned();
        let repeats = first
            .iter()
            .flat_map(|e| std::iter::repeat_n(e.clone(), usize::from(input.repeat_first % 1200)));
        for e in input.entries.iter().take(64).cloned().chain(repeats) {
            // Entries the encodings cannot hold are refused; the log stays usable.
            if log.append(&e.entry()).is_err() {
                break;
            }
        }
        log.close().expect("close");
    }

    // Walk the chain to the block to damage: head word, then each header's `next`.
    let mut block = load(&media, ROOT.0) & ((1 << HEAD_BITS) - 1);
    for _ in 0..input.block % 4 {
        let next = load(&media, block * BLOCK_SIZE + 8);
        if next == 0 {
            break;
        }
        block = next;
    }
    let base = (block * BLOCK_SIZE) as usize;
    let mut img = vec![0u8; (BLOCKS * BLOCK_SIZE) as usize];
    media.read(PmOff(0), &mut img).expect("in bounds");
    for &(at, mask) in input.damage.iter().take(64) {
        img[base + usize::from(at) % BLOCK_SIZE as usize] ^= mask;
    }
    if input.reseal_header {
        // The header checksum: crc32c of bytes 0..8 and 16..32, at 32.
        let h = &img[base..base + 32];
        let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..8]), &h[16..32]);
        img[base + 32..base + 36].copy_from_slice(&crc.to_le_bytes());
    }

    let media = Arc::new(HeapRegion::from_image(&img).expect("heap region"));
    let recovered = log::recover(&*media, ROOT);
    let mut owned = Vec::new();
    if log::owned_blocks(&*media, ROOT, &mut |b| owned.push(b)).is_ok() {
        assert!(owned.iter().all(|b| b.0 > 0 && b.0 < BLOCKS), "{owned:?}");
    }
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    if let Ok(log) = Log::open(media.clone(), ROOT, alloc) {
        if let Ok(replay) = log.iter() {
            for item in replay.take(MAX_REPLAY) {
                match item {
                    Ok((_, e)) => assert!(e.validate(BLOCKS).is_ok(), "replayed {e:?}"),
                    Err(_) => break,
                }
            }
        }
        if recovered.is_ok() {
            let _ = log.append(&Entry::Truncate { size: 0 });
        }
        let _ = log.close();
    }
});
