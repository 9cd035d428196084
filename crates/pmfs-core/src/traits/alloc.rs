//! The block-allocator contract.

use crate::error::Result;
use crate::layout::BlockNo;

/// A run of physically contiguous blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Extent {
    /// First block.
    pub start: BlockNo,
    /// Number of blocks (at least 1 in every extent an allocator hands out).
    pub len: u64,
}

impl Extent {
    /// Builds an extent.
    pub fn new(start: BlockNo, len: u64) -> Self {
        Self { start, len }
    }

    /// One past the last block.
    pub fn end(&self) -> BlockNo {
        self.start + self.len
    }

    /// Whether `b` lies inside the extent.
    pub fn contains(&self, b: BlockNo) -> bool {
        b >= self.start && b < self.end()
    }
}

/// What an allocation is for, so contiguity-first allocators can place it (CFFS §IV).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AllocKind {
    /// File data that is likely to keep growing (appends): place it where it can be extended.
    #[default]
    Growing,
    /// File data whose extent is known and will not grow: a preallocation, or a
    /// copy-on-write replacement of blocks inside a file.
    Fixed,
    /// Metadata blocks (directory pages, log blocks, mapping nodes): small and scattered use.
    Metadata,
}

/// A caller's hint for one allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllocHint {
    /// What the blocks are for.
    pub kind: AllocKind,
    /// The block right after the file's last fragment: if it is free, extending the fragment
    /// there keeps the file contiguous.
    pub goal: Option<BlockNo>,
}

impl AllocHint {
    /// A hint for metadata blocks.
    pub fn metadata() -> Self {
        Self {
            kind: AllocKind::Metadata,
            goal: None,
        }
    }
}

/// Hands out and takes back blocks of one managed range.
///
/// Contract (checked by the conformance suite):
/// - [`alloc`](BlockAllocator::alloc) returns between 1 and `want` contiguous blocks, never a
///   block that is already allocated; with no free block it returns
///   [`Error::NoSpace`](crate::Error::NoSpace) and changes nothing.
/// - [`free`](BlockAllocator::free) of blocks that are not all allocated returns
///   [`Error::InvalidArgument`](crate::Error::InvalidArgument) and changes nothing;
///   [`free_many`](BlockAllocator::free_many) frees all the others of its batch.
/// - `free_blocks() + allocated == total_blocks()` at every quiescent point (after
///   [`flush_caches`](BlockAllocator::flush_caches) for caching allocators).
/// - [`rebuild`](BlockAllocator::rebuild) makes exactly the given extents allocated and every
///   other managed block free (recovery after a crash).
pub trait BlockAllocator: Send + Sync {
    /// Allocates between 1 and `want` (`want >= 1`) contiguous blocks.
    fn alloc(&self, want: u64, hint: AllocHint) -> Result<Extent>;

    /// Returns blocks to the free pool.
    fn free(&self, ext: Extent) -> Result<()>;

    /// Returns several extents (not overlapping) to the free pool: each as
    /// [`free`](BlockAllocator::free) would, including those after one that is refused; the
    /// first refusal is the result. The default frees them one at a time; an allocator that
    /// can take a batch for less overrides it.
    fn free_many(&self, extents: &[Extent]) -> Result<()> {
        let mut first = Ok(());
        for &e in extents {
            if let Err(err) = self.free(e)
                && first.is_ok()
            {
                first = Err(err);
            }
        }
        first
    }

    /// Number of blocks currently free (including blocks held in caches).
    fn free_blocks(&self) -> u64;

    /// Number of blocks this allocator manages.
    fn total_blocks(&self) -> u64;

    /// Resets the state so that exactly `used` is allocated. Extents must lie in the managed
    /// range and not overlap, else [`Error::Corrupt`](crate::Error::Corrupt) is returned.
    fn rebuild(&self, used: &mut dyn Iterator<Item = Extent>) -> Result<()>;

    /// Returns blocks held in per-thread or per-file caches to the shared pool.
    fn flush_caches(&self) {}

    /// Makes every allocation and free so far durable, for allocators whose persistent state
    /// may lag their calls (an owner that rebuilds the state after a crash anyway can defer
    /// it to a clean close). A no-op, the default, for those whose calls are durable on
    /// return or that keep nothing on media.
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    /// Every block handed out and not taken back, if this allocator serves one owner alone
    /// (such as the allocator of one file's log blocks), so that the owner can find and free
    /// blocks it lost track of; `None`, the default, if it cannot tell or serves several.
    fn outstanding(&self) -> Result<Option<Vec<BlockNo>>> {
        Ok(None)
    }
}

impl<A: BlockAllocator + ?Sized> BlockAllocator for std::sync::Arc<A> {
    fn alloc(&self, want: u64, hint: AllocHint) -> Result<Extent> {
        (**self).alloc(want, hint)
    }
    fn free(&self, ext: Extent) -> Result<()> {
        (**self).free(ext)
    }
    fn free_many(&self, extents: &[Extent]) -> Result<()> {
        (**self).free_many(extents)
    }
    fn free_blocks(&self) -> u64 {
        (**self).free_blocks()
    }
    fn total_blocks(&self) -> u64 {
        (**self).total_blocks()
    }
    fn rebuild(&self, used: &mut dyn Iterator<Item = Extent>) -> Result<()> {
        (**self).rebuild(used)
    }
    fn flush_caches(&self) {
        (**self).flush_caches()
    }
    fn sync(&self) -> Result<()> {
        (**self).sync()
    }
    fn outstanding(&self) -> Result<Option<Vec<BlockNo>>> {
        (**self).outstanding()
    }
}
