//! Every crash image of a sequence of appends recovers to a prefix of the appended entries
//! that contains every append that returned: inline entries, extended entries (reservation,
//! segments, indirect commit), entries that chain a new block, padding, and extended entries
//! whose segments span blocks. A reader that returns an entry a dead committer left
//! unflushed has made it durable first, and what recovery discards past a hole stays
//! discarded through the appends after it and another crash.

#![cfg(not(loom))]

mod log_common;

use std::cell::Cell;
use std::sync::Arc;

use log_common::{ROOT, extended, inline, mixed, recover_and_replay, scattered};
use pmfs_core::layout::{BLOCK_SIZE, BlockNo};
use pmfs_core::log::{ENTRIES_PER_BLOCK, Entry, Log, recover};
use pmfs_core::pm::Media;
use pmfs_core::sim::{Explorer, ImageRegion, SimRegion};
use pmfs_core::traits::SimpleAllocator;

const BLOCKS: u64 = 8;

/// Appends `work` after `prefill` under the explorer and checks every crash image.
fn explore(explorer: Explorer, prefill: &[Entry], work: &[Entry]) {
    let region = SimRegion::new(BLOCKS * BLOCK_SIZE).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    let log = Log::create(&region, ROOT, alloc).unwrap();
    for e in prefill {
        log.append(e).unwrap();
    }
    region.persist_all();
    let returned = Cell::new(0usize);
    let stats = explorer
        .run(
            &region,
            |_| {
                for e in work {
                    log.append(e).unwrap();
                    returned.set(returned.get() + 1);
                }
            },
            |cp| {
                let got = recover_and_replay(ImageRegion::new(cp.image).unwrap())?;
                if got.len() < prefill.len() || got[..prefill.len()] != prefill[..] {
                    return Err("entries durable before the run were lost".into());
                }
                let n = got.len() - prefill.len();
                let r = returned.get();
                if n < r {
                    return Err(format!("{r} appends returned but only {n} survived"));
                }
                if n > r + 1 {
                    return Err(format!("{n} entries survived but only {r} returned"));
                }
                if got[prefill.len()..] != work[..n] {
                    return Err("the recovered log is not a prefix of the appends".into());
                }
                Ok(())
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
    assert!(stats.fences >= work.len() as u64);
}

#[test]
fn inline_appends() {
    let work: Vec<Entry> = (0..6).map(inline).collect();
    explore(Explorer::new(1), &[], &work);
}

#[test]
fn inline_appends_with_store_prefixes() {
    let work: Vec<Entry> = (0..4).map(inline).collect();
    explore(Explorer::new(2).store_prefixes(true), &[], &work);
}

#[test]
fn extended_and_mixed_appends() {
    let work: Vec<Entry> = (0..6).map(mixed).collect();
    explore(Explorer::new(3), &[], &work);
}

#[test]
fn appends_that_chain_new_blocks() {
    // Two slots left: an inline entry fills the block, the next links a block, then an
    // extended entry that no longer fits pads the rest and links another.
    let prefill: Vec<Entry> = (0..ENTRIES_PER_BLOCK - 2).map(inline).collect();
    let mut work: Vec<Entry> = (100..103).map(inline).collect();
    let fill = ENTRIES_PER_BLOCK - 4 - 4;
    work.extend((200..200 + fill).map(inline));
    work.push(extended(7));
    work.push(inline(300));
    explore(Explorer::new(4).samples(24), &prefill, &work);
}

#[test]
fn chaining_with_store_prefixes() {
    let prefill: Vec<Entry> = (0..ENTRIES_PER_BLOCK - 1).map(inline).collect();
    let work = vec![inline(100), inline(101), extended(5)];
    explore(Explorer::new(5).store_prefixes(true), &prefill, &work);
}

#[test]
fn extended_entry_whose_segments_span_blocks() {
    let prefill: Vec<Entry> = (0..ENTRIES_PER_BLOCK - 100).map(inline).collect();
    let work = vec![scattered(400), inline(9)];
    explore(Explorer::new(6), &prefill, &work);
}

/// The inline word of `lblk -> pblk` for one block, built from the documented bit layout.
fn documented_inline_word(lblk: u64, pblk: u64) -> u64 {
    0b10 << 62 | lblk << 32 | pblk
}

#[test]
fn a_reader_persists_what_a_dead_committer_left_unflushed() {
    let region = SimRegion::new(BLOCKS * BLOCK_SIZE).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    let log = Log::create(&region, ROOT, alloc).unwrap();
    log.append(&inline(0)).unwrap();
    region.persist_all();
    let orphan = Entry::write(42, BlockNo(5), 1, 0);
    let acted = Cell::new(false);
    Explorer::new(7)
        .run(
            &region,
            |pm| {
                // A committer in another process: its CAS lands, then it dies before flushing.
                let tail = log.tail().unwrap();
                let slot = tail.block().offset() + tail.slot() * 8;
                pm.cas_u64(slot, 0, documented_inline_word(42, 5))
                    .unwrap()
                    .unwrap();
                // A reader returns the entry to its caller.
                let seen: Vec<Entry> = log.iter().unwrap().map(|r| r.unwrap().1).collect();
                assert_eq!(seen, vec![inline(0), orphan.clone()]);
                acted.set(true);
            },
            |cp| {
                let got = recover_and_replay(ImageRegion::new(cp.image).unwrap())?;
                match got.len() {
                    2 if got[1] == orphan => Ok(()),
                    1 if !acted.get() => Ok(()),
                    _ => Err(format!("after the reader acted the log is {got:?}")),
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn a_link_persists_the_full_block_it_follows() {
    let region = SimRegion::new(BLOCKS * BLOCK_SIZE).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    let log = Log::create(&region, ROOT, alloc).unwrap();
    for i in 0..ENTRIES_PER_BLOCK - 1 {
        log.append(&inline(i)).unwrap();
    }
    region.persist_all();
    let orphan = Entry::write(42, BlockNo(5), 1, 0);
    let returned = Cell::new(false);
    Explorer::new(8)
        .run(
            &region,
            |pm| {
                // A dead committer takes the block's last slot without flushing it ...
                let tail = log.tail().unwrap();
                let slot = tail.block().offset() + tail.slot() * 8;
                pm.cas_u64(slot, 0, documented_inline_word(42, 5))
                    .unwrap()
                    .unwrap();
                // ... and the next append links a new block after it.
                log.append(&inline(500)).unwrap();
                returned.set(true);
            },
            |cp| {
                let got = recover_and_replay(ImageRegion::new(cp.image).unwrap())?;
                let n = ENTRIES_PER_BLOCK as usize - 1;
                let ok = match got.len() - n {
                    0 | 1 => !returned.get(),
                    2 => got[n] == orphan && got[n + 1] == inline(500),
                    _ => false,
                };
                if ok && (got.len() == n || got[n] == orphan) {
                    Ok(())
                } else {
                    Err(format!(
                        "returned: {}, recovered tail {:?}",
                        returned.get(),
                        &got[n..]
                    ))
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn recovery_discards_what_follows_a_hole() {
    let region = SimRegion::new(BLOCKS * BLOCK_SIZE).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    let log = Log::create(&region, ROOT, alloc).unwrap();
    log.append(&inline(0)).unwrap();
    region.persist_all();
    let orphans: Vec<Entry> = (0..12).map(|i| Entry::write(i, BlockNo(5), 1, 0)).collect();
    Explorer::new(9)
        .run(
            &region,
            |pm| {
                // Dead committers fill slots over two cache lines and never flush: a crash may
                // write back the later line and not the earlier one.
                let tail = log.tail().unwrap();
                for i in 0..12 {
                    let slot = tail.block().offset() + (tail.slot() + i) * 8;
                    pm.cas_u64(slot, 0, documented_inline_word(i, 5))
                        .unwrap()
                        .unwrap();
                }
            },
            |cp| {
                let got = recover_and_replay(ImageRegion::new(cp.image).unwrap())?;
                if got.first() == Some(&inline(0)) && got[1..] == orphans[..got.len() - 1] {
                    Ok(())
                } else {
                    Err(format!("recovered {got:?}"))
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn what_recovery_discards_stays_discarded_after_another_crash() {
    let region = SimRegion::new(BLOCKS * BLOCK_SIZE).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    let log = Log::create(&region, ROOT, alloc).unwrap();
    log.append(&inline(0)).unwrap();
    // A crash left a committed-looking word past a hole: the first slot of the cache line
    // after the tail's, written back early by a committer that died.
    let tail = log.tail().unwrap();
    let stray = (tail.slot() + 1).next_multiple_of(8);
    let at = tail.block().offset() + stray * 8;
    region.store_u64(at, documented_inline_word(42, 5)).unwrap();
    drop(log);
    region.persist_all();
    // Appends that fill the hole up to the stray word's slot, after recovery discarded it.
    let work: Vec<Entry> = (100..100 + stray - tail.slot()).map(inline).collect();
    let returned = Cell::new(0usize);
    Explorer::new(11)
        .run(
            &region,
            |pm| {
                recover(pm, ROOT).unwrap();
                let theirs = Arc::new(SimpleAllocator::new(BlockNo(4), BLOCKS - 4));
                let log = Log::open(pm, ROOT, theirs).unwrap();
                for e in &work {
                    log.append(e).unwrap();
                    returned.set(returned.get() + 1);
                }
            },
            |cp| {
                let got = recover_and_replay(ImageRegion::new(cp.image).unwrap())?;
                let n = got.len().saturating_sub(1);
                let ok = got.first() == Some(&inline(0))
                    && n >= returned.get()
                    && n <= work.len()
                    && got[1..] == work[..n];
                if ok {
                    Ok(())
                } else {
                    Err(format!(
                        "{} appends returned, recovered {got:?}",
                        returned.get()
                    ))
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn a_new_handle_persists_the_tail_it_starts_from() {
    let region = SimRegion::new(BLOCKS * BLOCK_SIZE).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), 3));
    let log = Log::create(&region, ROOT, alloc).unwrap();
    log.append(&inline(0)).unwrap();
    region.persist_all();
    let returned = Cell::new(false);
    let orphans = Cell::new(0u64);
    Explorer::new(10)
        .run(
            &region,
            |pm| {
                // Dead committers fill the rest of the tail's cache line without flushing it,
                // so the next entry lands in the next line.
                let tail = log.tail().unwrap();
                for s in tail.slot()..tail.slot().next_multiple_of(8) {
                    let slot = tail.block().offset() + s * 8;
                    pm.cas_u64(slot, 0, documented_inline_word(40 + s, 5))
                        .unwrap()
                        .unwrap();
                    orphans.set(orphans.get() + 1);
                }
                // Another process opens the log after the committer died, and appends.
                let theirs = Arc::new(SimpleAllocator::new(BlockNo(4), BLOCKS - 4));
                let other = Log::open(pm, ROOT, theirs).unwrap();
                other.append(&inline(1)).unwrap();
                returned.set(true);
            },
            |cp| {
                let got = recover_and_replay(ImageRegion::new(cp.image).unwrap())?;
                let n = orphans.get() as usize;
                let ok = if returned.get() {
                    got.len() == n + 2 && got[n + 1] == inline(1)
                } else {
                    got.len() <= n + 2
                };
                if ok {
                    Ok(())
                } else {
                    Err(format!("returned: {}, recovered {got:?}", returned.get()))
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
}
