//! Every crash image taken while a log is digested, its applied prefix compacted away
//! (`compact_applied`) and appends go on, recovers to a log and a cursor word such that:
//! every entry below the cursor was applied by a durable step of `apply`; the log holds every
//! entry at or after the cursor (and, below it, only entries of the history, from the head's
//! LSN on); and, after the mount resets the holder, one digest applies exactly the entries at
//! or after the cursor, in order, and leaves the cursor free at the tail.

#![cfg(not(loom))]

mod log_common;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

use log_common::{ROOT, inline, mixed, recover_open};
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::log::{Compaction, Digest, ENTRIES_PER_BLOCK, Entry, Log, reset_holder};
use pmfs_core::pm::Media;
use pmfs_core::sim::{Explorer, ImageRegion, SimRegion};
use pmfs_core::traits::SimpleAllocator;

const BLOCKS: u64 = 16;
/// The cursor word, next to the head word.
const CURSOR: PmOff = PmOff(72);
/// The state `apply` keeps: one more than the LSN of the last entry applied, made durable
/// before `apply` returns.
const DONE: PmOff = PmOff(80);
const HOLDER: u32 = 7;

fn alive(_: u32) -> bool {
    true
}

/// The applier of the workload: records the entry's LSN in `DONE`, durably.
fn apply_durably(region: &SimRegion) -> impl FnMut(u64, &Entry) -> pmfs_core::Result<()> + '_ {
    move |lsn, _| region.store_u64_persist(DONE, lsn + 1)
}

/// The checks of one crash image. `history` holds every entry whose append returned, by LSN;
/// `next` is the entry being appended, if any (it may or may not have survived).
fn check(image: &[u8], history: &BTreeMap<u64, Entry>, next: Option<&Entry>) -> Result<(), String> {
    let media = ImageRegion::new(image).map_err(|e| e.to_string())?;
    reset_holder(&media, CURSOR).map_err(|e| format!("reset holder: {e}"))?;
    let done = media.load_u64(DONE).map_err(|e| e.to_string())?;
    let log = recover_open(media)?;
    let cursor = log.digested(CURSOR).map_err(|e| e.to_string())?;
    let start = log.start().map_err(|e| e.to_string())?.lsn();
    let tail = log.tail().map_err(|e| e.to_string())?.lsn();
    if !(start <= cursor && cursor <= tail) {
        return Err(format!("cursor {cursor} outside the log [{start}, {tail})"));
    }
    if let Some((lsn, _)) = history.range(done.min(cursor)..cursor).next() {
        return Err(format!(
            "entry {lsn} is below the cursor {cursor} but was never applied (done: {done})"
        ));
    }
    let got: Vec<(u64, Entry)> = log
        .iter()
        .map_err(|e| e.to_string())?
        .map(|r| r.map(|(p, e)| (p.lsn(), e)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let want: Vec<(u64, Entry)> = history
        .range(start..)
        .map(|(l, e)| (*l, e.clone()))
        .collect();
    let extra = &got[want.len().min(got.len())..];
    if got[..want.len().min(got.len())] != want[..]
        || got.len() < want.len()
        || extra.len() > 1
        || extra.first().is_some_and(|(_, e)| Some(e) != next)
    {
        return Err(format!(
            "the log from {start} is not the history: got {} entries, want {}",
            got.len(),
            want.len()
        ));
    }
    let mut applied = Vec::new();
    let d = log
        .digest(CURSOR, HOLDER, &alive, &mut |lsn, e| {
            applied.push((lsn, e.clone()));
            Ok(())
        })
        .map_err(|e| format!("digest after recovery: {e}"))?;
    if d != (Digest::Done { applied: tail }) {
        return Err(format!("digest after recovery: {d:?}, tail {tail}"));
    }
    let unapplied: Vec<(u64, Entry)> = got.into_iter().filter(|(l, _)| *l >= cursor).collect();
    if applied != unapplied {
        return Err(format!(
            "digest after recovery applied {} entries, {} are at or after the cursor",
            applied.len(),
            unapplied.len()
        ));
    }
    Ok(())
}

/// Appends `prefill` and digests all but its last `undigested` entries before the run; then,
/// under the explorer: digests, compacts the applied prefix, appends `after` (digesting after
/// each) and compacts again.
fn explore(explorer: Explorer, prefill: &[Entry], undigested: usize, after: &[Entry]) {
    let region = SimRegion::new(BLOCKS * BLOCK_SIZE).unwrap();
    let alloc = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    let log = Log::create(&region, ROOT, alloc).unwrap();
    let history = RefCell::new(BTreeMap::new());
    for e in prefill {
        let at = log.append(e).unwrap();
        history.borrow_mut().insert(at.lsn(), e.clone());
    }
    let stop = history
        .borrow()
        .keys()
        .nth(prefill.len() - undigested)
        .copied();
    let mut apply = apply_durably(&region);
    let _ = log.digest(CURSOR, HOLDER, &alive, &mut |lsn, e| {
        if Some(lsn) == stop {
            return Err(pmfs_core::Error::NoSpace);
        }
        apply(lsn, e)
    });
    region.persist_all();
    let next = RefCell::new(None);
    let compacted = RefCell::new(Vec::new());
    let stats = explorer
        .run(
            &region,
            |region| {
                let mut apply = apply_durably(region);
                log.digest(CURSOR, HOLDER, &alive, &mut apply).unwrap();
                compacted
                    .borrow_mut()
                    .push(log.compact_applied(CURSOR).unwrap());
                for e in after {
                    *next.borrow_mut() = Some(e.clone());
                    let at = log.append(e).unwrap();
                    history.borrow_mut().insert(at.lsn(), e.clone());
                    *next.borrow_mut() = None;
                    log.digest(CURSOR, HOLDER, &alive, &mut apply).unwrap();
                }
                compacted
                    .borrow_mut()
                    .push(log.compact_applied(CURSOR).unwrap());
            },
            |cp| check(cp.image, &history.borrow(), next.borrow().as_ref()),
        )
        .unwrap_or_else(|f| panic!("{f}"));
    // A crash point at least before every applied entry's cursor move.
    assert!(
        stats.points as usize > undigested + after.len(),
        "{stats:?}"
    );
    let c = compacted.borrow();
    assert!(
        matches!(c[0], Compaction::Compacted { written: 0, .. }),
        "the applied full blocks were dropped: {c:?}"
    );
    assert_eq!(log.digested(CURSOR).unwrap(), log.tail().unwrap().lsn());
}

#[test]
fn digest_and_compaction_of_inline_entries() {
    let prefill: Vec<Entry> = (0..2 * ENTRIES_PER_BLOCK + 3).map(inline).collect();
    let after: Vec<Entry> = (0..3).map(inline).collect();
    explore(Explorer::new(21), &prefill, 6, &after);
}

#[test]
fn digest_and_compaction_of_mixed_entries() {
    // Extended entries: reservations between entries, segments in earlier blocks.
    let prefill: Vec<Entry> = (0..ENTRIES_PER_BLOCK).map(mixed).collect();
    let after: Vec<Entry> = (0..3).map(mixed).collect();
    explore(Explorer::new(22), &prefill, 4, &after);
}

#[test]
fn digest_with_store_prefixes() {
    let prefill: Vec<Entry> = (0..ENTRIES_PER_BLOCK + 2).map(inline).collect();
    let after = vec![mixed(0), inline(1)];
    explore(
        Explorer::new(23).store_prefixes(true).samples(16),
        &prefill,
        3,
        &after,
    );
}
