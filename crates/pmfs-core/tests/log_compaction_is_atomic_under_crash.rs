//! Every crash image taken while a compaction writes and publishes its new chain, and while
//! appends continue after it, recovers either to the old log or to the compacted one (the live
//! entries followed by the retained suffix), with every append that returned; and the
//! reclaimed blocks are not owned by the recovered log.

#![cfg(not(loom))]

mod log_common;

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::Arc;

use log_common::{ROOT, extended, inline, mixed, recover_and_replay, replay};
use pmfs_core::layout::{BLOCK_SIZE, BlockNo};
use pmfs_core::log::{Compaction, ENTRIES_PER_BLOCK, Entry, Log, owned_blocks};
use pmfs_core::sim::{Explorer, ImageRegion, SimRegion};
use pmfs_core::traits::{BlockAllocator, SimpleAllocator};

const BLOCKS: u64 = 16;

fn explore(explorer: Explorer, history: &[Entry], live: &[Entry], after: &[Entry]) {
    let region = SimRegion::new(BLOCKS * BLOCK_SIZE).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    let log = Log::create(&region, ROOT, alloc.clone()).unwrap();
    for e in history {
        log.append(e).unwrap();
    }
    region.persist_all();
    let point = log.compaction_point().unwrap().unwrap();
    let entries: Vec<_> = log.iter().unwrap().map(|r| r.unwrap()).collect();
    let cut = entries.iter().position(|(p, _)| *p >= point).unwrap();
    let suffix: Vec<Entry> = entries[cut..].iter().map(|(_, e)| e.clone()).collect();
    let mut compacted = live.to_vec();
    compacted.extend_from_slice(&suffix);

    let published = Cell::new(false);
    let returned = Cell::new(0usize);
    let reclaimed = std::cell::RefCell::new(HashSet::new());
    explorer
        .run(
            &region,
            |_| {
                let before: HashSet<BlockNo> = {
                    let mut s = HashSet::new();
                    owned_blocks(&region, ROOT, &mut |b| {
                        s.insert(b);
                    })
                    .unwrap();
                    s
                };
                let free = alloc.free_blocks();
                let c = log.compact(point, live).unwrap();
                assert!(matches!(c, Compaction::Compacted { .. }), "{c:?}");
                published.set(true);
                assert!(alloc.free_blocks() > free, "old blocks reclaimed at once");
                let mut now = HashSet::new();
                owned_blocks(&region, ROOT, &mut |b| {
                    now.insert(b);
                })
                .unwrap();
                *reclaimed.borrow_mut() = before.difference(&now).copied().collect();
                for e in after {
                    log.append(e).unwrap();
                    returned.set(returned.get() + 1);
                }
            },
            |cp| {
                let img = ImageRegion::new(cp.image).unwrap();
                let got = recover_and_replay(&img)?;
                let base =
                    if got.len() >= compacted.len() && got[..compacted.len()] == compacted[..] {
                        compacted.len()
                    } else if !published.get()
                        && got.len() >= history.len()
                        && got[..history.len()] == history[..]
                    {
                        history.len()
                    } else {
                        return Err(format!(
                            "neither the old nor the compacted log (published: {})",
                            published.get()
                        ));
                    };
                let n = got.len() - base;
                let r = returned.get();
                if n < r || n > r + 1 || got[base..] != after[..n] {
                    return Err(format!(
                        "{n} appends after compaction survived, {r} returned"
                    ));
                }
                let mut owned = HashSet::new();
                owned_blocks(&img, ROOT, &mut |b| {
                    owned.insert(b);
                })
                .map_err(|e| e.to_string())?;
                if base == compacted.len() && owned.iter().any(|b| reclaimed.borrow().contains(b)) {
                    return Err("the compacted log still owns a reclaimed block".into());
                }
                Ok(())
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(replay(&log).unwrap(), {
        let mut w = compacted.clone();
        w.extend_from_slice(after);
        w
    });
}

#[test]
fn compaction_of_inline_blocks_to_one_entry() {
    let history: Vec<Entry> = (0..2 * ENTRIES_PER_BLOCK + 3).map(inline).collect();
    let live = vec![extended(1)];
    explore(
        Explorer::new(11),
        &history,
        &live,
        &[inline(7), extended(8)],
    );
}

#[test]
fn compaction_with_extended_entries_on_both_sides() {
    let history: Vec<Entry> = (0..ENTRIES_PER_BLOCK).map(mixed).collect();
    let live: Vec<Entry> = (0..40).map(mixed).collect();
    explore(Explorer::new(12), &history, &live, &[mixed(3)]);
}

#[test]
fn compaction_with_store_prefixes() {
    let history: Vec<Entry> = (0..2 * ENTRIES_PER_BLOCK + 1).map(inline).collect();
    explore(
        Explorer::new(13).store_prefixes(true).samples(16),
        &history,
        &[inline(3)],
        &[inline(4)],
    );
}
