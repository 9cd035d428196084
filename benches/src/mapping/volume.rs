//! A bench volume: one region holding the files' root words, a structure's metadata area and
//! its data area, with the structure formatted on it and the files it maps.

use std::fmt;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pmfs_alloc::FreeExtentAllocator;
use pmfs_alloc::baseline::bitmap_area_size;
use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::PmRegion;
use pmfs_core::traits::{Extent, FileId, FileMapping, Run};
use pmfs_core::{Error, Result};

use super::scripted::Scripted;
use super::structures::Structure;

/// The media the benches run on: a pool file mapped shared, as pmfs runs on PM.
pub type Region = PmRegion;

/// Environment variable naming the directory of the benches' pool files (default
/// `/dev/shm`, else the system's temporary directory).
pub const POOL_DIR_VAR: &str = "PMFS_BENCH_POOL_DIR";

/// The allocator the per-file structures and the cuckoo table draw blocks from: pmfs-alloc's
/// baseline free-extent allocator over a persistent bitmap. The paper compares HashFS with
/// such a conventional allocator (§4: "All other evaluated file mapping structures use the
/// block allocator already present in Strata", a persistent bitmap plus a volatile free list).
/// It is wrapped in [`Scripted`] so that aging can dictate the files' layout.
pub type BaselineAlloc = Scripted<FreeExtentAllocator<Arc<Region>>>;

/// Maps a zeroed region of `bytes` bytes.
///
/// The pool file is sparse (only the pages the structures touch use memory: data blocks are
/// never touched) and is unlinked as soon as it is mapped, so nothing is left behind even if
/// the bench dies.
fn new_region(bytes: u64) -> Result<Region> {
    static POOLS: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::var_os(POOL_DIR_VAR)
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(|| {
            let shm = PathBuf::from("/dev/shm");
            if shm.is_dir() {
                shm
            } else {
                std::env::temp_dir()
            }
        });
    let n = POOLS.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("pmfs-bench-{}-{n}.pool", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    let opened = file
        .set_len(bytes)
        .map_err(Error::from)
        .and_then(|()| PmRegion::open(&path));
    let removed = std::fs::remove_file(&path);
    let region = opened?;
    removed?;
    Ok(region)
}

/// Data areas start on a 2 MiB boundary.
const DATA_ALIGN_BLOCKS: u64 = 512;

/// How big a volume is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeSpec {
    /// Blocks of the data area (the file system's capacity).
    pub data_blocks: u64,
    /// How many files the volume can hold (root words reserved).
    pub max_files: u64,
}

/// Where the parts of a volume live, in blocks of the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeLayout {
    /// Root words of the files, 8 bytes each ("the inode table").
    pub roots: Extent,
    /// The baseline allocator's persistent bitmap.
    pub alloc_bitmap: Extent,
    /// The structure's static metadata area.
    pub meta: Extent,
    /// The data area.
    pub data: Extent,
}

impl VolumeLayout {
    /// Lays out a volume whose structure needs `meta_blocks` metadata blocks.
    pub fn new(spec: VolumeSpec, meta_blocks: u64) -> Self {
        let root_blocks = (spec.max_files * 8).div_ceil(BLOCK_SIZE).max(1);
        let roots = Extent::new(BlockNo(0), root_blocks);
        let bitmap_blocks = bitmap_area_size(spec.data_blocks).div_ceil(BLOCK_SIZE);
        let alloc_bitmap = Extent::new(roots.end(), bitmap_blocks);
        let meta = Extent::new(alloc_bitmap.end(), meta_blocks);
        let data_start = meta.end().0.next_multiple_of(DATA_ALIGN_BLOCKS);
        let data = Extent::new(BlockNo(data_start), spec.data_blocks);
        Self {
            roots,
            alloc_bitmap,
            meta,
            data,
        }
    }

    /// Size of the region in bytes.
    pub fn region_bytes(&self) -> u64 {
        self.data.end().0 * BLOCK_SIZE
    }
}

/// A file of a bench volume.
pub struct BenchFile<F: FileMapping> {
    /// Its identity.
    pub id: FileId,
    /// Its open handle (the DRAM state: cursor, translation cache).
    pub handle: F::File,
    /// Its size in blocks: blocks `[0, blocks)` are mapped.
    pub blocks: u64,
}

impl<F: FileMapping> fmt::Debug for BenchFile<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BenchFile")
            .field("id", &self.id)
            .field("blocks", &self.blocks)
            .finish_non_exhaustive()
    }
}

/// A structure formatted on a fresh volume, with its files.
pub struct Fixture<S: Structure> {
    region: Arc<Region>,
    layout: VolumeLayout,
    max_files: u64,
    alloc: Arc<BaselineAlloc>,
    mapping: S::Mapping,
    files: Vec<BenchFile<S::Mapping>>,
}

impl<S: Structure> fmt::Debug for Fixture<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fixture")
            .field("structure", &S::NAME)
            .field("layout", &self.layout)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl<S: Structure> Fixture<S> {
    /// Formats structure `S` on a fresh volume of the given size.
    pub fn new(spec: VolumeSpec) -> Result<Self> {
        let layout = VolumeLayout::new(spec, S::meta_blocks(spec.data_blocks));
        let region = Arc::new(new_region(layout.region_bytes())?);
        let alloc = Arc::new(Scripted::new(FreeExtentAllocator::format(
            region.clone(),
            layout.alloc_bitmap.start.offset(),
            layout.data,
        )?));
        let mapping = S::format(region.clone(), layout.meta, layout.data, alloc.clone())?;
        Ok(Self {
            region,
            layout,
            max_files: spec.max_files,
            alloc,
            mapping,
            files: Vec::new(),
        })
    }

    /// The region.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Where the volume's parts live.
    pub fn layout(&self) -> VolumeLayout {
        self.layout
    }

    /// The allocator of the data area (unused by structures that allocate for themselves).
    pub fn alloc(&self) -> &BaselineAlloc {
        &self.alloc
    }

    /// The structure.
    pub fn mapping(&self) -> &S::Mapping {
        &self.mapping
    }

    /// File number `f` (in creation order).
    pub fn file(&self, f: usize) -> &BenchFile<S::Mapping> {
        &self.files[f]
    }

    /// How many files exist.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Creates an empty file and returns its number. Inode numbers start at 1.
    pub fn create_file(&mut self) -> Result<usize> {
        let n = self.files.len() as u64;
        if n >= self.max_files {
            return Err(Error::NoSpace);
        }
        let id = FileId {
            ino: n + 1,
            root: PmOff(self.layout.roots.start.offset().0 + n * 8),
        };
        let handle = self.mapping.open_file(id)?;
        self.files.push(BenchFile {
            id,
            handle,
            blocks: 0,
        });
        Ok(self.files.len() - 1)
    }

    /// Drops file `f`'s DRAM state and opens it again (a cold open).
    pub fn reopen(&mut self, f: usize) -> Result<()> {
        let file = &mut self.files[f];
        file.handle = self.mapping.open_file(file.id)?;
        Ok(())
    }

    /// Appends `len` blocks to file `f` (allocation included); the new runs go to `out`.
    pub fn append(&mut self, f: usize, len: u64, out: &mut Vec<Run>) -> Result<()> {
        let file = &mut self.files[f];
        self.mapping.insert(&file.handle, file.blocks, len, out)?;
        file.blocks += len;
        Ok(())
    }

    /// Looks up `[lblk, lblk + len)` of file `f`, appending runs to `out`.
    pub fn lookup(&self, f: usize, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        self.mapping.lookup(&self.files[f].handle, lblk, len, out)
    }

    /// Shrinks file `f` to `blocks` blocks, freeing the rest.
    pub fn truncate(&mut self, f: usize, blocks: u64) -> Result<()> {
        let file = &mut self.files[f];
        if blocks < file.blocks {
            self.mapping
                .remove(&file.handle, blocks, file.blocks - blocks)?;
            file.blocks = blocks;
        }
        Ok(())
    }

    /// The areas of the region holding metadata that an operation on file `f` may touch: the
    /// structure's static area, the file's own node blocks (blocks it owns that hold no data)
    /// and, for structures that use it, the allocator's bitmap.
    pub fn metadata_areas(&self, f: usize) -> Result<Vec<Extent>> {
        let file = &self.files[f];
        let mut owned = Vec::new();
        self.mapping
            .owned_blocks(&file.handle, &mut |e| owned.push(e))?;
        let mut runs = Vec::new();
        self.mapping
            .lookup(&file.handle, 0, file.blocks, &mut runs)?;
        let mut data: Vec<Extent> = runs.iter().map(Run::extent).collect();
        let mut areas = subtract(&mut owned, &mut data);
        if self.layout.meta.len > 0 {
            areas.push(self.layout.meta);
        }
        if S::USES_ALLOCATOR {
            areas.push(self.layout.alloc_bitmap);
        }
        Ok(areas)
    }

    /// The layout score of file `f`: the fraction of its blocks (after the first) that
    /// physically follow their logical predecessor (Smith & Seltzer).
    pub fn layout_score(&self, f: usize) -> Result<f64> {
        let file = &self.files[f];
        let mut runs = Vec::new();
        self.lookup(f, 0, file.blocks, &mut runs)?;
        Ok(layout_score(&runs))
    }
}

/// The layout score of a file given its runs in logical order (1.0 for files of at most one
/// block).
pub fn layout_score(runs: &[Run]) -> f64 {
    let blocks: u64 = runs.iter().map(|r| r.len).sum();
    if blocks <= 1 {
        return 1.0;
    }
    let breaks = runs
        .windows(2)
        .filter(|w| w[0].lblk + w[0].len != w[1].lblk || w[0].pblk.0 + w[0].len != w[1].pblk.0)
        .count() as u64;
    (blocks - 1 - breaks) as f64 / (blocks - 1) as f64
}

/// The blocks of `from` not in `minus` (both are sorted in place), as extents.
pub fn subtract(from: &mut [Extent], minus: &mut [Extent]) -> Vec<Extent> {
    from.sort();
    minus.sort();
    let mut out = Vec::new();
    let mut m = 0;
    for e in from.iter() {
        let mut start = e.start.0;
        let end = e.end().0;
        while m < minus.len() && minus[m].end().0 <= start {
            m += 1;
        }
        let mut k = m;
        while start < end && k < minus.len() && minus[k].start.0 < end {
            if minus[k].start.0 > start {
                out.push(Extent::new(BlockNo(start), minus[k].start.0 - start));
            }
            start = start.max(minus[k].end().0);
            k += 1;
        }
        if start < end {
            out.push(Extent::new(BlockNo(start), end - start));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::structures::Simple;
    use pmfs_core::traits::BlockAllocator;

    fn ext(s: u64, l: u64) -> Extent {
        Extent::new(BlockNo(s), l)
    }

    #[test]
    fn subtract_keeps_only_uncovered_blocks() {
        let mut from = vec![ext(20, 10), ext(0, 10)];
        let mut minus = vec![ext(22, 2), ext(0, 3), ext(8, 14), ext(26, 1)];
        assert_eq!(
            subtract(&mut from, &mut minus),
            vec![ext(3, 5), ext(24, 2), ext(27, 3)]
        );
        assert_eq!(subtract(&mut [ext(5, 1)], &mut []), vec![ext(5, 1)]);
    }

    #[test]
    fn layout_score_counts_breaks_between_runs() {
        let run = |lblk, pblk, len| Run {
            lblk,
            pblk: BlockNo(pblk),
            len,
        };
        assert_eq!(layout_score(&[run(0, 100, 11)]), 1.0);
        // Two runs that are physically contiguous count as one.
        assert_eq!(layout_score(&[run(0, 100, 5), run(5, 105, 6)]), 1.0);
        assert_eq!(layout_score(&[run(0, 100, 5), run(5, 200, 6)]), 0.9);
        assert_eq!(layout_score(&[]), 1.0);
    }

    #[test]
    fn fixture_appends_truncates_and_reports_node_areas() {
        let spec = VolumeSpec {
            data_blocks: 1000,
            max_files: 4,
        };
        let mut fx = Fixture::<Simple>::new(spec).unwrap();
        let a = fx.create_file().unwrap();
        let b = fx.create_file().unwrap();
        assert_eq!(fx.file(b).id.ino, 2);
        let mut out = Vec::new();
        fx.append(a, 10, &mut out).unwrap();
        fx.append(b, 1, &mut out).unwrap();
        fx.append(a, 10, &mut out).unwrap();
        assert_eq!(fx.file(a).blocks, 20);
        assert_eq!(fx.layout_score(a).unwrap(), 18.0 / 19.0);
        // The DRAM mapping has no node blocks and no static area, only the allocator's bitmap.
        assert_eq!(
            fx.metadata_areas(a).unwrap(),
            vec![fx.layout().alloc_bitmap]
        );
        fx.truncate(a, 5).unwrap();
        assert_eq!(fx.alloc().free_blocks(), 1000 - 6);
        out.clear();
        fx.lookup(a, 0, 100, &mut out).unwrap();
        assert_eq!(out.iter().map(|r| r.len).sum::<u64>(), 5);
        fx.reopen(a).unwrap();
        assert!(fx.create_file().is_ok());
        assert!(fx.create_file().is_ok());
        assert!(matches!(fx.create_file(), Err(Error::NoSpace)));
    }
}
