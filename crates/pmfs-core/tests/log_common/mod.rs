//! Helpers shared by the log's scenario tests: entry generators and the post-crash check
//! (recover, rebuild the allocator from the log's owned blocks, open, replay, append).

#![allow(dead_code)]

use std::sync::Arc;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::log::{Entry, Log, owned_blocks, recover};
use pmfs_core::pm::Media;
use pmfs_core::traits::{BlockAllocator, Extent, Run, SimpleAllocator};

/// Where the tests keep the head word.
pub const ROOT: PmOff = PmOff(64);

/// An inline entry (one short run, no size change or an extension to the run's end).
pub fn inline(i: u64) -> Entry {
    let len = 1 + i % 4;
    let extend = if i.is_multiple_of(2) {
        (i + len) * BLOCK_SIZE
    } else {
        0
    };
    Entry::write(i, BlockNo(1 + i % 3), len, extend)
}

/// An extended entry: an unaligned size change over two runs.
pub fn extended(i: u64) -> Entry {
    Entry::Write {
        runs: smallvec::smallvec![
            Run {
                lblk: i,
                pblk: BlockNo(2),
                len: 1,
            },
            Run {
                lblk: i + 10,
                pblk: BlockNo(3),
                len: 2,
            },
        ],
        extend_to: i * BLOCK_SIZE + 100,
    }
}

/// A write of `runs` scattered single-block runs (one extended entry of `2 + 2 * runs` words).
pub fn scattered(runs: u64) -> Entry {
    Entry::Write {
        runs: (0..runs)
            .map(|i| Run {
                lblk: 3 * i,
                pblk: BlockNo(1 + i % 5),
                len: 1,
            })
            .collect(),
        extend_to: 0,
    }
}

/// The `i`-th entry of a varied sequence.
pub fn mixed(i: u64) -> Entry {
    match i % 5 {
        0 => extended(i),
        1 => Entry::Truncate { size: i * 1000 },
        2 => Entry::Punch { lblk: i, len: 3 },
        _ => inline(i),
    }
}

fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

/// Replays the whole log at `ROOT` on `media`.
pub fn replay<M: Media, A: BlockAllocator + ?Sized>(log: &Log<M, A>) -> Result<Vec<Entry>, String> {
    log.iter()
        .map_err(err("replay"))?
        .map(|r| r.map(|(_, e)| e).map_err(err("replay")))
        .collect()
}

/// Recovers the log of a crash image the way a mount does (recover, rebuild the allocator
/// of blocks 1.. from the log's owned blocks) and opens it.
pub fn recover_open<M: Media>(media: M) -> Result<Log<M, SimpleAllocator>, String> {
    recover(&media, ROOT).map_err(err("recover"))?;
    let blocks = media.size() / BLOCK_SIZE;
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), blocks - 1));
    let mut used = Vec::new();
    owned_blocks(&media, ROOT, &mut |b| used.push(Extent::new(b, 1))).map_err(err("owned"))?;
    alloc
        .rebuild(&mut used.into_iter())
        .map_err(err("allocator rebuild"))?;
    Log::open(media, ROOT, alloc).map_err(err("open"))
}

/// Recovers the log of a crash image the way a mount does, then replays it; also checks that
/// the recovered log takes a new append right after what it replayed.
pub fn recover_and_replay<M: Media>(media: M) -> Result<Vec<Entry>, String> {
    let log = recover_open(media)?;
    let got = replay(&log)?;
    // Enough appends to walk over two cache lines of slots: leftovers of a crash beyond the
    // recovered tail would show up among them.
    let markers: Vec<Entry> = (0..20)
        .map(|i| Entry::Truncate { size: 0xdead + i })
        .collect();
    for m in &markers {
        log.append(m).map_err(err("append after recovery"))?;
    }
    let again = replay(&log)?;
    if again.len() != got.len() + markers.len()
        || again[..got.len()] != got[..]
        || again[got.len()..] != markers[..]
    {
        return Err("appends after recovery do not extend the recovered log".into());
    }
    Ok(got)
}
