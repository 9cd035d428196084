//! The structures under test, built uniformly so one bench body runs against each of them.

use std::sync::Arc;

use pmfs_core::Result;
use pmfs_core::traits::{Extent, FileMapping, SimpleMapping};
use pmfs_mapping::cuckoo::CuckooMapping;
use pmfs_mapping::extent::ExtentTree;
use pmfs_mapping::hashfs::HashFs;
use pmfs_mapping::radix::RadixTree;

use super::volume::{BaselineAlloc, Region};

/// A file-mapping structure the benches can format on a fresh volume.
pub trait Structure {
    /// The mapping type.
    type Mapping: FileMapping;

    /// Name used in benchmark ids and reports (`extent`, `radix`, `cuckoo`, `hashfs`).
    const NAME: &'static str;

    /// Whether the structure takes its blocks from the volume's [`BaselineAlloc`] (all but
    /// HashFS, which allocates by claiming table slots).
    const USES_ALLOCATOR: bool;

    /// Whether the structure is one global table for all files (§3.2) rather than a
    /// structure per file.
    const GLOBAL: bool;

    /// Blocks of the static metadata area (undo log, global table) the structure needs to map a
    /// data area of `data_blocks` blocks.
    fn meta_blocks(data_blocks: u64) -> u64;

    /// Formats an empty structure. `meta` is the area sized by
    /// [`meta_blocks`](Structure::meta_blocks); `data` the data area, which `alloc` manages for
    /// structures that draw blocks from an allocator.
    fn format(
        region: Arc<Region>,
        meta: Extent,
        data: Extent,
        alloc: Arc<BaselineAlloc>,
    ) -> Result<Self::Mapping>;
}

/// pmfs-core's DRAM reference mapping: a `BTreeMap` behind a mutex. Not one of the paper's
/// structures; it exercises the harness in unit tests.
#[derive(Debug)]
pub struct Simple;

impl Structure for Simple {
    type Mapping = SimpleMapping<BaselineAlloc>;
    const NAME: &'static str = "simple";
    const USES_ALLOCATOR: bool = true;
    const GLOBAL: bool = false;

    fn meta_blocks(_data_blocks: u64) -> u64 {
        0
    }

    fn format(
        _region: Arc<Region>,
        _meta: Extent,
        _data: Extent,
        alloc: Arc<BaselineAlloc>,
    ) -> Result<Self::Mapping> {
        Ok(SimpleMapping::new(alloc))
    }
}

/// The extent tree (§3.1.1): a per-file B-tree of extents, blocks from the baseline allocator.
#[derive(Debug)]
pub struct Extents;

impl Structure for Extents {
    type Mapping = ExtentTree<Arc<Region>, BaselineAlloc>;
    const NAME: &'static str = "extent";
    const USES_ALLOCATOR: bool = true;
    const GLOBAL: bool = false;

    fn meta_blocks(_data_blocks: u64) -> u64 {
        Self::Mapping::meta_blocks()
    }

    fn format(
        region: Arc<Region>,
        meta: Extent,
        _data: Extent,
        alloc: Arc<BaselineAlloc>,
    ) -> Result<Self::Mapping> {
        ExtentTree::format(region, meta, alloc)
    }
}

/// The radix tree (§3.1.2): a per-file 512-way tree, blocks from the baseline allocator.
#[derive(Debug)]
pub struct Radix;

impl Structure for Radix {
    type Mapping = RadixTree<Arc<Region>, BaselineAlloc>;
    const NAME: &'static str = "radix";
    const USES_ALLOCATOR: bool = true;
    const GLOBAL: bool = false;

    fn meta_blocks(_data_blocks: u64) -> u64 {
        Self::Mapping::meta_blocks()
    }

    fn format(
        region: Arc<Region>,
        meta: Extent,
        _data: Extent,
        alloc: Arc<BaselineAlloc>,
    ) -> Result<Self::Mapping> {
        RadixTree::format(region, meta, alloc)
    }
}

/// The global cuckoo hash table with ranged entries (§3.2.1), blocks from the baseline
/// allocator. Sized for the whole data area.
#[derive(Debug)]
pub struct Cuckoo;

impl Structure for Cuckoo {
    type Mapping = CuckooMapping<Arc<Region>, BaselineAlloc>;
    const NAME: &'static str = "cuckoo";
    const USES_ALLOCATOR: bool = true;
    const GLOBAL: bool = true;

    fn meta_blocks(data_blocks: u64) -> u64 {
        Self::Mapping::meta_blocks(data_blocks)
    }

    fn format(
        region: Arc<Region>,
        meta: Extent,
        _data: Extent,
        alloc: Arc<BaselineAlloc>,
    ) -> Result<Self::Mapping> {
        CuckooMapping::format_with_salt(region, meta, alloc, HASH_SALT)
    }
}

/// HashFS (§3.2.2): the global linear-probing table whose slot index is the data block.
#[derive(Debug)]
pub struct HashFsTable;

impl Structure for HashFsTable {
    type Mapping = HashFs<Arc<Region>>;
    const NAME: &'static str = "hashfs";
    const USES_ALLOCATOR: bool = false;
    const GLOBAL: bool = true;

    fn meta_blocks(data_blocks: u64) -> u64 {
        HashFs::<Arc<Region>>::meta_blocks(data_blocks)
    }

    fn format(
        region: Arc<Region>,
        meta: Extent,
        data: Extent,
        _alloc: Arc<BaselineAlloc>,
    ) -> Result<Self::Mapping> {
        HashFs::format_with_salt(region, meta, data, HASH_SALT)
    }
}

/// The hash salt of the benches' hash tables, fixed so runs are reproducible.
const HASH_SALT: u64 = 0x5eed_4a54_f5b3_0001;

/// Code run once per structure, with the structure as a type parameter.
pub trait Visitor {
    /// Runs for structure `S`.
    fn visit<S: Structure>(&mut self) -> Result<()>;
}

/// Names of the structures [`for_each_structure`] runs, in order.
pub const STRUCTURES: &[&str] = &[Extents::NAME, Radix::NAME, Cuckoo::NAME, HashFsTable::NAME];

/// Calls `v` for every structure of the paper that exists, in the order of
/// [`STRUCTURES`], skipping those not named in `PMFS_BENCH_STRUCTURES` (a comma-separated
/// list) when that variable is set.
pub fn for_each_structure(v: &mut impl Visitor) -> Result<()> {
    if selected(Extents::NAME) {
        v.visit::<Extents>()?;
    }
    if selected(Radix::NAME) {
        v.visit::<Radix>()?;
    }
    if selected(Cuckoo::NAME) {
        v.visit::<Cuckoo>()?;
    }
    if selected(HashFsTable::NAME) {
        v.visit::<HashFsTable>()?;
    }
    Ok(())
}

/// Whether `PMFS_BENCH_STRUCTURES` (if set) names `name`.
pub fn selected(name: &str) -> bool {
    match std::env::var("PMFS_BENCH_STRUCTURES") {
        Ok(list) => list.split(',').any(|s| s.trim() == name),
        Err(_) => true,
    }
}
