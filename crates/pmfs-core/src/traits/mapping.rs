//! The file-mapping contract: logical file blocks to physical blocks.

use crate::error::Result;
use crate::layout::{BlockNo, PmOff};
use crate::traits::Extent;

/// The four mapping structures of the HashFS paper (§3), chosen per volume at format time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MappingKind {
    /// Per-file B-tree of extents.
    Extent,
    /// Per-file radix tree of 4 KiB nodes, 9 bits per level.
    Radix,
    /// One global cuckoo hash table with ranged entries.
    Cuckoo,
    /// One global linear-probing table whose slot index is the physical block.
    HashFs,
}

/// A mapped run: logical blocks `[lblk, lblk + len)` of a file live at physical blocks
/// `[pblk, pblk + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Run {
    /// First logical block.
    pub lblk: u64,
    /// First physical block.
    pub pblk: BlockNo,
    /// Number of blocks (at least 1).
    pub len: u64,
}

/// The runs of one update, in order. Most updates have one or two: they are kept inline, so
/// that a write's log entry, and each entry a digest replays, allocates nothing.
pub type Runs = smallvec::SmallVec<[Run; 2]>;

impl Run {
    /// Logical blocks `[lblk, lblk + len)` at physical blocks `[pblk, pblk + len)`.
    pub const fn new(lblk: u64, pblk: BlockNo, len: u64) -> Self {
        Run { lblk, pblk, len }
    }

    /// The physical blocks of the run.
    pub fn extent(&self) -> Extent {
        Extent::new(self.pblk, self.len)
    }

    /// The part of the run inside logical blocks `[from, end)`, if any.
    pub fn within(&self, from: u64, end: u64) -> Option<Run> {
        let (s, e) = (self.lblk.max(from), (self.lblk + self.len).min(end));
        (s < e).then(|| Run::new(s, BlockNo(self.pblk.0 + (s - self.lblk)), e - s))
    }
}

/// Identifies a file to a mapping structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    /// The inode number (global tables key their entries by it).
    pub ino: u64,
    /// An 8-byte aligned PM word that the caller reserves for this file (in its inode). A
    /// per-file structure keeps its root there, updated with one atomic store; 0 means an
    /// empty file. Global tables ignore it.
    pub root: PmOff,
}

/// Maps logical blocks of files to physical blocks, on PM, without a page cache.
///
/// Contract (checked by the conformance suite against a `BTreeMap` model):
/// - [`lookup`](FileMapping::lookup) appends the mapped parts of a range as runs in ascending
///   logical order, non-overlapping, inside the range; holes are omitted.
///   [`first_mapped`](FileMapping::first_mapped) returns the first block of those runs.
/// - [`insert`](FileMapping::insert) allocates fresh physical blocks for a range none of whose
///   blocks is mapped, and maps them; if any block is mapped it returns
///   [`Error::InvalidArgument`](crate::Error::InvalidArgument) and changes nothing. Structures
///   that are not also allocators (all but HashFS) take data blocks and node blocks from the
///   [`BlockAllocator`](crate::traits::BlockAllocator) they were built with.
/// - [`remove`](FileMapping::remove) unmaps every mapped block of a range and frees it.
/// - [`replace`](FileMapping::replace) maps a range to given blocks over whatever it mapped,
///   freeing the blocks it replaces.
/// - Every mutating call is atomic across a crash: after [`recover`](FileMapping::recover),
///   the structure equals its state before or after the call.
/// - Calls on different files may run concurrently; on one file, lookups may run concurrently
///   with one another and with a mutation.
pub trait FileMapping: Send + Sync {
    /// DRAM state of one open file (cursor of the last path, translation cache). It is a
    /// cache: dropping it loses nothing.
    type File: Send + Sync;

    /// Which structure this is.
    fn kind(&self) -> MappingKind;

    /// Opens a file's mapping. A file whose root word is 0 (or, for global tables, that has no
    /// entries) is empty.
    fn open_file(&self, id: FileId) -> Result<Self::File>;

    /// Appends to `out` the runs of `[lblk, lblk + len)` that are mapped.
    fn lookup(&self, file: &Self::File, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()>;

    /// The first mapped block of `[lblk, lblk + len)`, if any (`SEEK_DATA`): the first block
    /// a [`lookup`](FileMapping::lookup) of the range returns. Beside concurrent mutations,
    /// as with a lookup, each block is seen as it was at some moment during the call. The
    /// default is [`first_mapped_by_lookups`]; the hashed structures, whose lookups probe
    /// every block of a range, override it for long ranges with one pass over their table.
    fn first_mapped(&self, file: &Self::File, lblk: u64, len: u64) -> Result<Option<u64>> {
        first_mapped_by_lookups(self, file, lblk, len)
    }

    /// Hints into the CPU cache the lines a [`lookup`](FileMapping::lookup) of `lblk` reads
    /// first, so that a caller with other work to do before the lookup overlaps their misses
    /// with it. Only a hint: it changes nothing and cannot fail. The default does nothing (a
    /// tree's upper levels stay cached; the hash tables' slots are where lookups miss).
    fn prefetch(&self, file: &Self::File, lblk: u64) {
        let _ = (file, lblk);
    }

    /// Allocates and maps `[lblk, lblk + len)`, appending the new runs to `out`.
    fn insert(&self, file: &Self::File, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()>;

    /// Maps `[run.lblk, run.lblk + run.len)` to the physical blocks `[run.pblk, ..)`, which
    /// the caller obtained for exactly this use: from the structure's allocator, or for HashFS
    /// by staging the slots of these keys. If any block of the range is mapped it returns
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) and changes nothing. This is
    /// how a copy-on-write commit is applied: the caller removes the old blocks, then maps the
    /// new ones.
    fn insert_at(&self, file: &Self::File, run: Run) -> Result<()>;

    /// Unmaps and frees every mapped block of `[lblk, lblk + len)`; returns how many blocks
    /// were freed. A structure that must split a node to cut a range out of the middle of an
    /// extent may fail with [`Error::NoSpace`](crate::Error::NoSpace) when no block is free;
    /// it then changes nothing.
    fn remove(&self, file: &Self::File, lblk: u64, len: u64) -> Result<u64>;

    /// Maps `[run.lblk, run.lblk + run.len)` to `[run.pblk, ..)` whatever was mapped there
    /// before, and frees the blocks it replaces; returns how many it freed. The run's blocks
    /// come from where [`insert_at`](FileMapping::insert_at)'s do. This is the apply step of a
    /// copy-on-write commit.
    ///
    /// The default is [`remove`](FileMapping::remove), then `insert_at`: two calls, each
    /// atomic, so a crash or an error between them leaves the range unmapped (the engine's
    /// apply is idempotent and redoes it). Structures that can do both in one atomic call
    /// override it; then a failed call changes nothing. Either way, on error the run's blocks
    /// are not mapped and stay the caller's.
    fn replace(&self, file: &Self::File, run: Run) -> Result<u64> {
        let freed = self.remove(file, run.lblk, run.len)?;
        self.insert_at(file, run)?;
        Ok(freed)
    }

    /// [`replace`](FileMapping::replace) of each of `runs`, which must not overlap, skipping
    /// those the file maps exactly already (so a batch can be applied again); returns how
    /// many blocks it freed. Durable when it returns. A crash before that can leave any subset
    /// of the runs' blocks replaced, not only a prefix, and a block of a run that had a hole
    /// unmapped (a replace may be a remove and then an insert): the caller applies the batch
    /// again after one. The blocks a run replaces are freed only once its new mapping is
    /// durable. On error, the runs before the failing one are replaced, durably.
    ///
    /// The default replaces the runs one at a time; the structures override it to overwrite
    /// mapped runs in place with one fence for the whole batch.
    fn replace_many(&self, file: &Self::File, runs: &[Run]) -> Result<u64> {
        let mut freed = 0;
        let mut got = Vec::new();
        for r in runs {
            got.clear();
            self.lookup(file, r.lblk, r.len, &mut got)?;
            if !maps_exactly(r, &mut got) {
                freed += self.replace(file, *r)?;
            }
        }
        Ok(freed)
    }

    /// Unmaps and frees all of a file's blocks, including the structure's own nodes, and
    /// resets its root word.
    fn remove_file(&self, file: &Self::File) -> Result<()>;

    /// Calls `visit` for every physical block the file owns: data and structure nodes (for
    /// allocator rebuild and fsck).
    fn owned_blocks(&self, file: &Self::File, visit: &mut dyn FnMut(Extent)) -> Result<()>;

    /// Calls `visit(ino, run)` for every mapped run of every file and returns `true`, if the
    /// structure keeps all files in one table (the hashed ones): one pass over the table
    /// serves every file, where [`owned_blocks`](FileMapping::owned_blocks) of each file would
    /// be a pass per file. A file's runs come in no particular order and may be split
    /// anywhere; merged, they are what a lookup of its whole logical range returns, and their
    /// blocks are exactly the blocks the file owns. The default, for structures kept per file,
    /// visits nothing and returns `false`: their callers walk each file instead. Meant for
    /// exclusive use (mount, fsck): beside concurrent mutations a block may be missed or seen
    /// twice.
    fn visit_all(&self, visit: &mut dyn FnMut(u64, Run)) -> Result<bool> {
        let _ = visit;
        Ok(false)
    }

    /// Repairs the structure after a crash (rolls back undo logs, finishes or undoes
    /// half-done operations). Must be called once after opening a region that was not
    /// closed cleanly, before any other call.
    fn recover(&self) -> Result<()>;

    /// Whether a failed store (the media refused it) left work that only
    /// [`recover`](FileMapping::recover) does: a lock not released, an undo record not
    /// rolled back. The volume must not be closed as clean then: the next mount would skip
    /// the recovery.
    fn recovery_owed(&self) -> bool {
        false
    }
}

/// Blocks the first lookup of [`first_mapped_by_lookups`] covers.
const FIRST_PIECE: u64 = 16;

/// Blocks a lookup of [`first_mapped_by_lookups`] covers at most, which bounds the runs it
/// gathers (a piece that maps a block is looked up whole).
const LARGEST_PIECE: u64 = 1 << 18;

/// The first mapped block of `[lblk, lblk + len)` of `file`, found by lookups of pieces of
/// the range in order, each twice as long as the one before (from 16 blocks up to 2^18, 1 GiB)
/// until one maps a block: an answer near `lblk` costs short lookups, and on the trees, whose
/// lookups cost what they find rather than what they cover, a hole costs a lookup of the
/// empty range per GiB.
pub fn first_mapped_by_lookups<F: FileMapping + ?Sized>(
    mapping: &F,
    file: &F::File,
    lblk: u64,
    len: u64,
) -> Result<Option<u64>> {
    let end = lblk.saturating_add(len);
    let (mut at, mut piece) = (lblk, FIRST_PIECE);
    let mut runs = Vec::new();
    while at < end {
        let n = piece.min(end - at);
        runs.clear();
        mapping.lookup(file, at, n, &mut runs)?;
        if let Some(first) = runs.iter().map(|r| r.lblk).min() {
            return Ok(Some(first));
        }
        at += n;
        piece = (piece * 2).min(LARGEST_PIECE);
    }
    Ok(None)
}

/// Whether the runs a lookup of `r`'s range returned in `got` (in any order) map exactly
/// `r`: every block of the range, each to its block of `r`.
pub fn maps_exactly(r: &Run, got: &mut [Run]) -> bool {
    got.sort_unstable_by_key(|g| g.lblk);
    let mut at = r.lblk;
    for g in got.iter() {
        if g.lblk != at || g.pblk.0 != r.pblk.0 + (g.lblk - r.lblk) {
            return false;
        }
        at += g.len;
    }
    at == r.lblk + r.len
}

/// Merges the runs of `runs` (in order) that continue each other logically and physically.
pub fn merge_runs(runs: &[Run]) -> Vec<Run> {
    let mut out: Vec<Run> = Vec::with_capacity(runs.len());
    for r in runs {
        match out.last_mut() {
            Some(last) if last.lblk + last.len == r.lblk && last.pblk.0 + last.len == r.pblk.0 => {
                last.len += r.len;
            }
            _ => out.push(*r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(lblk: u64, pblk: u64, len: u64) -> Run {
        Run::new(lblk, BlockNo(pblk), len)
    }

    #[test]
    fn within_keeps_the_blocks_of_a_range() {
        let r = run(10, 100, 8);
        assert_eq!(r.within(0, u64::MAX), Some(r));
        assert_eq!(r.within(12, 15), Some(run(12, 102, 3)));
        assert_eq!(r.within(0, 11), Some(run(10, 100, 1)));
        assert_eq!(r.within(17, 30), Some(run(17, 107, 1)));
        assert_eq!(r.within(18, 30), None);
        assert_eq!(r.within(0, 10), None);
        assert_eq!(r.within(14, 12), None);
    }
}
