//! Crash recovery of a log and the enumeration of the blocks it owns (for allocator rebuild
//! and fsck). Both work on the media alone, without an open handle.

use std::collections::HashSet;

use super::chain::{Chain, Walk};
use super::check_root;
use super::format::{FIRST_SLOT, HeadWord, SLOT_BYTES, SLOTS_PER_BLOCK, Slot, slot_off};
use crate::error::{Error, Result};
use crate::layout::{BLOCK_SIZE, BlockNo, PmOff};
use crate::pm::Media;

/// What [`recover`] found and repaired, or [`inspect`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Blocks in the chain.
    pub blocks: u64,
    /// Committed entries (all decoded and validated).
    pub entries: u64,
    /// Non-zero slots after the tail that were zeroed ([`inspect`]: that [`recover`] would
    /// zero): stores of a commit or reservation that never became part of the durable prefix.
    pub discarded: u64,
    /// The LSN of the tail: every committed entry lies below it.
    pub tail: u64,
}

fn chain_at<M: Media + ?Sized>(media: &M, root: PmOff) -> Result<(Chain<'_, M>, Walk)> {
    check_root(media, root)?;
    let Some(head) = HeadWord(media.load_u64(root)?).head() else {
        return Err(Error::InvalidArgument("no log at this head word"));
    };
    let chain = Chain {
        media,
        owner: root.0,
        blocks: media.size() / BLOCK_SIZE,
    };
    let h = chain.check_block(head, root)?;
    let walk = Walk::new(head, h.base.get(), FIRST_SLOT, chain.blocks);
    Ok((chain, walk))
}

/// Validates the whole chain and every entry of the log at `root` and counts, without
/// writing, the slots beyond the tail that [`recover`] zeroes. Returns the walk at the tail.
fn survey<M: Media + ?Sized>(media: &M, root: PmOff) -> Result<(Recovery, Walk)> {
    let (chain, mut walk) = chain_at(media, root)?;
    let mut r = Recovery {
        blocks: 1,
        ..Recovery::default()
    };
    loop {
        let found_tail = chain.scan(&mut walk, |w, s| {
            chain.entry(s, slot_off(w.block, w.slot))?;
            r.entries += 1;
            Ok(())
        })?;
        if found_tail || !walk.step(&chain)? {
            break;
        }
        r.blocks += 1;
    }
    r.tail = walk.lsn();
    if !walk.at_end() {
        if chain.next(walk.block)?.is_some() {
            return Err(Error::Corrupt {
                what: "log hole before a linked block",
                at: slot_off(walk.block, walk.slot),
            });
        }
        for s in walk.slot + 1..SLOTS_PER_BLOCK {
            if media.load_u64(slot_off(walk.block, s))? != 0 {
                r.discarded += 1;
            }
        }
    }
    Ok((r, walk))
}

/// Checks the log whose head word is at `root` as [`recover`] would, without writing: for
/// checkers, on a volume nobody uses.
///
/// # Errors
/// As [`recover`].
pub fn inspect<M: Media + ?Sized>(media: &M, root: PmOff) -> Result<Recovery> {
    survey(media, root).map(|(r, _)| r)
}

/// Repairs the log whose head word is at `root` after a crash; run it once per log at mount,
/// before any handle opens it, with nobody else using the log.
///
/// It validates the whole chain and every entry, zeroes whatever follows the first empty slot
/// of the tail block (after a crash, cache lines written back early can leave committed-looking
/// words beyond a hole; they were never part of the durable prefix and would otherwise be
/// taken for entries once the hole is filled), persists that, and resets the head word's count
/// of open handles and its flags (the caller rebuilds the allocator, which frees the retired
/// blocks the orphans flag points to).
///
/// # Errors
/// [`Error::Corrupt`] for a damaged chain or entry, [`Error::InvalidArgument`] if the head word
/// holds no log.
pub fn recover<M: Media + ?Sized>(media: &M, root: PmOff) -> Result<Recovery> {
    let (r, walk) = survey(media, root)?;
    if r.discarded > 0 {
        for s in walk.slot + 1..SLOTS_PER_BLOCK {
            let at = slot_off(walk.block, s);
            if media.load_u64(at)? != 0 {
                media.store_u64(at, 0)?;
            }
        }
        let from = slot_off(walk.block, walk.slot);
        media.flush(from, (SLOTS_PER_BLOCK - walk.slot) * SLOT_BYTES)?;
    }
    // Retired blocks nobody freed are free once the caller rebuilds the allocator.
    let hw = HeadWord(media.load_u64(root)?);
    let none = hw.with_opens(0).with_map_pins(0).without_flags();
    media.store_u64(root, none.0)?;
    media.persist(root, 8)?;
    Ok(r)
}

/// Calls `visit` once for every block the log at `root` owns: the blocks of its chain, and
/// blocks outside it that still hold segments of its entries (kept by a compaction). Blocks a
/// compaction retired and nobody freed are not reported: they are free after a rebuild.
///
/// # Errors
/// As [`recover`]; the log must be consistent (recovered, or cleanly closed).
pub fn owned_blocks<M: Media + ?Sized>(
    media: &M,
    root: PmOff,
    visit: &mut dyn FnMut(BlockNo),
) -> Result<()> {
    let (chain, mut walk) = chain_at(media, root)?;
    let mut in_chain = HashSet::new();
    let mut segments = HashSet::new();
    loop {
        in_chain.insert(walk.block);
        visit(walk.block);
        chain.scan(&mut walk, |w, s| {
            if let Slot::Indirect(ind) = s {
                chain.segments(ind, slot_off(w.block, w.slot), |off, _| {
                    segments.insert(off.block());
                    Ok(())
                })?;
            }
            Ok(())
        })?;
        if !walk.at_end() || !walk.step(&chain)? {
            break;
        }
    }
    let mut extra: Vec<BlockNo> = segments.difference(&in_chain).copied().collect();
    extra.sort();
    for b in extra {
        visit(b);
    }
    Ok(())
}
