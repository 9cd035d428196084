//! Construction of the pluggable parts chosen at mkfs: the file-mapping structure and the
//! block allocator, dispatched at run time.

use std::sync::Arc;

use pmfs_alloc::baseline::{Durability, bitmap_area_size};
use pmfs_alloc::{CffsAllocator, FreeExtentAllocator};
use pmfs_core::layout::BLOCK_SIZE;
use pmfs_core::pm::Media;
use pmfs_core::traits::{BlockAllocator, MappingKind, SimpleAllocator};
use pmfs_mapping::cuckoo::CuckooMapping;
use pmfs_mapping::extent::ExtentTree;
use pmfs_mapping::hashfs::HashFs;
use pmfs_mapping::radix::RadixTree;

use crate::error::Result;
use crate::format::{AllocatorKind, Geometry};
use crate::mapping::Mapper;

/// The media type the parts are built over.
pub(crate) type Pm = Arc<dyn Media>;

/// Counts free data blocks (the allocator's count, or HashFS's count of its free slots, a scan
/// of the table kept until a slot changes between free and taken).
pub(crate) type FreeCount = Box<dyn Fn() -> Result<u64> + Send + Sync>;

/// The mapping structure, the allocator (absent for HashFS, which allocates by claiming
/// slots), the source of copy-on-write blocks and a free-block counter.
pub(crate) struct Parts {
    pub map: Arc<dyn Mapper>,
    pub alloc: Option<Arc<dyn BlockAllocator>>,
    pub stage: Stager,
    pub free: FreeCount,
}

/// Where the data path gets the fresh blocks of a copy-on-write update and the blocks of a
/// file's log.
#[derive(Clone)]
pub(crate) enum Stager {
    /// Extent, radix and cuckoo: the volume's allocator (log blocks too).
    Alloc(Arc<dyn BlockAllocator>),
    /// HashFS: new versions staged in the global table, log blocks claimed there by CAS.
    Hash(Arc<HashFs<Pm>>),
}

/// How [`build`] comes to the parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Opening {
    /// Formats them.
    Format,
    /// Opens them for use (recovering them after a crash is the caller's step).
    Open,
    /// Opens them for the checker and read-only mounts, which only read: state a dead
    /// process left behind that recovery would discard (cuckoo bucket locks and move gate) is
    /// ignored, and HashFS free slots are counted without the tokens that keep a count.
    Inspect,
}

/// Blocks of the allocator region for a data region of `data_blocks`.
pub(crate) fn alloc_meta_blocks(
    mapping: MappingKind,
    kind: AllocatorKind,
    data_blocks: u64,
) -> u64 {
    if mapping == MappingKind::HashFs {
        return 0;
    }
    match kind {
        AllocatorKind::Simple | AllocatorKind::Cffs => 0,
        AllocatorKind::Baseline => bitmap_area_size(data_blocks).div_ceil(BLOCK_SIZE),
    }
}

/// Blocks of the mapping region for a data region of `data_blocks`.
pub(crate) fn map_meta_blocks(kind: MappingKind, data_blocks: u64) -> u64 {
    match kind {
        MappingKind::HashFs => HashFs::<Pm>::meta_blocks(data_blocks),
        MappingKind::Cuckoo => CuckooMapping::<Pm, DynAlloc>::meta_blocks(data_blocks),
        MappingKind::Extent => ExtentTree::<Pm, DynAlloc>::meta_blocks(),
        MappingKind::Radix => RadixTree::<Pm, DynAlloc>::meta_blocks(),
    }
}

/// Whether the allocator keeps its state on media (so a clean mount need not rebuild it).
pub(crate) fn alloc_is_persistent(kind: AllocatorKind) -> bool {
    match kind {
        AllocatorKind::Simple | AllocatorKind::Cffs => false,
        AllocatorKind::Baseline => true,
    }
}

fn build_alloc(media: &Pm, g: &Geometry, how: Opening) -> Result<Arc<dyn BlockAllocator>> {
    Ok(match g.allocator {
        AllocatorKind::Simple => Arc::new(SimpleAllocator::new(g.data_start, g.data_blocks)),
        AllocatorKind::Cffs => Arc::new(CffsAllocator::new(g.data_start, g.data_blocks)),
        AllocatorKind::Baseline => {
            let area = g.alloc_start.offset();
            let a = if how == Opening::Format {
                FreeExtentAllocator::format(media.clone(), area, g.data_extent())?
            } else {
                FreeExtentAllocator::open(media.clone(), area)?
            };
            // The bitmap is trusted only after a clean close, which syncs it first
            // (`Fs::shutdown`); any other mount rebuilds it from the volume's structures,
            // as it rebuilds the allocators that keep nothing on media. Per-call flushes
            // and fences would buy nothing.
            Arc::new(a.with_durability(Durability::AtSync)?)
        }
    })
}

/// The allocator as the sized type the mapping constructors take.
type DynAlloc = Arc<dyn BlockAllocator>;

fn with_alloc(map: Arc<dyn Mapper>, alloc: DynAlloc) -> Parts {
    let counter = alloc.clone();
    Parts {
        map,
        stage: Stager::Alloc(alloc.clone()),
        alloc: Some(alloc),
        free: Box::new(move || Ok(counter.free_blocks())),
    }
}

/// Builds the parts of volume `g`.
pub(crate) fn build(media: &Pm, g: &Geometry, how: Opening) -> Result<Parts> {
    let fresh = how == Opening::Format;
    match g.mapping {
        MappingKind::HashFs => {
            let t = Arc::new(if fresh {
                HashFs::format(media.clone(), g.map_extent(), g.data_extent())?
            } else {
                HashFs::open(media.clone(), g.map_extent(), g.data_extent())?
            });
            let counter = t.clone();
            let free: FreeCount = if how == Opening::Inspect {
                // Nothing changes the table of a volume opened this way: one scan counts it.
                let counted = std::sync::OnceLock::new();
                Box::new(move || {
                    if let Some(&n) = counted.get() {
                        return Ok(n);
                    }
                    let n = counter.count_free()?;
                    Ok(*counted.get_or_init(|| n))
                })
            } else {
                Box::new(move || Ok(counter.free_blocks()?))
            };
            Ok(Parts {
                map: t.clone(),
                stage: Stager::Hash(t),
                alloc: None,
                free,
            })
        }
        MappingKind::Cuckoo => {
            let alloc = build_alloc(media, g, how)?;
            let shared = Arc::new(alloc.clone());
            let (media, meta) = (media.clone(), g.map_extent());
            let map = match how {
                Opening::Format => CuckooMapping::format(media, meta, shared)?,
                Opening::Open => CuckooMapping::open(media, meta, shared)?,
                Opening::Inspect => CuckooMapping::open_read_only(media, meta, shared)?,
            };
            Ok(with_alloc(Arc::new(map), alloc))
        }
        MappingKind::Extent => {
            let alloc = build_alloc(media, g, how)?;
            let shared = Arc::new(alloc.clone());
            let map = if fresh {
                ExtentTree::format(media.clone(), g.map_extent(), shared)?
            } else {
                ExtentTree::open(media.clone(), g.map_extent(), shared)?
            };
            Ok(with_alloc(Arc::new(map), alloc))
        }
        MappingKind::Radix => {
            let alloc = build_alloc(media, g, how)?;
            let shared = Arc::new(alloc.clone());
            let map = if fresh {
                RadixTree::format(media.clone(), g.map_extent(), shared)?
            } else {
                RadixTree::open(media.clone(), g.map_extent(), shared)?
            };
            Ok(with_alloc(Arc::new(map), alloc))
        }
    }
}
