//! Aging: files with a chosen layout score (HashFS paper §4, "Generating fragmentation").
//!
//! The paper modifies Strata's allocator so that files are allocated "in fragmented chunks
//! such that the resulting files have an average layout score that is specified", the chunks
//! "randomly distributed throughout the device", which "fragments both allocated file data and
//! free space". pmfs-alloc's [aging generator](pmfs_alloc::aging) plans such a layout; here it
//! becomes the layout of real files: the volume's allocator is [loaded](super::scripted) with
//! the plan, and the files are then written through the structure's own
//! [`insert`](pmfs_core::traits::FileMapping::insert), so every node, entry and undo record is
//! the structure's own. HashFS places blocks by hashing and ignores the plan; its files get the
//! layout its hash gives them (reported, not targeted).

use pmfs_alloc::aging::{AgingSpec, age};
use pmfs_core::traits::Extent;
use pmfs_core::{Error, Result};

use super::structures::Structure;
use super::volume::{Fixture, VolumeSpec};

/// A volume for one measured file of `file_blocks` blocks, about a quarter full once the file
/// exists: the paper's experiments before §4.5 run on a mostly empty file system.
pub fn volume_for_file(file_blocks: u64) -> VolumeSpec {
    VolumeSpec {
        data_blocks: (file_blocks * 4).max(1 << 16).next_multiple_of(512),
        max_files: 8,
    }
}

/// Formats `S` on `spec` and writes file 0, `file_blocks` blocks at layout score `score`.
pub fn aged_file_fixture<S: Structure>(
    spec: VolumeSpec,
    file_blocks: u64,
    score: f64,
    seed: u64,
) -> Result<Fixture<S>> {
    let mut fx = Fixture::<S>::new(spec)?;
    build_aged_files(&mut fx, &[file_blocks], score, seed)?;
    Ok(fx)
}

/// Largest number of blocks one insert call maps while building files (2 MiB, a typical
/// append preallocation step).
pub const MAX_INSERT_BLOCKS: u64 = 512;

/// Appends `len` blocks to file `f` in insert calls of at most [`MAX_INSERT_BLOCKS`].
pub fn append_blocks<S: Structure>(fx: &mut Fixture<S>, f: usize, len: u64) -> Result<()> {
    let mut out = Vec::new();
    let mut left = len;
    while left > 0 {
        let step = left.min(MAX_INSERT_BLOCKS);
        out.clear();
        fx.append(f, step, &mut out)?;
        left -= step;
    }
    Ok(())
}

/// Creates one file per entry of `sizes` on the fresh fixture `fx` and writes them, in order,
/// with the layout pmfs-alloc's generator plans for `score` (for structures that use the
/// allocator). Returns the files.
///
/// Fails with [`Error::InvalidArgument`] if `fx` already has files.
pub fn build_aged_files<S: Structure>(
    fx: &mut Fixture<S>,
    sizes: &[u64],
    score: f64,
    seed: u64,
) -> Result<Vec<usize>> {
    if fx.file_count() > 0 {
        return Err(Error::InvalidArgument("aging needs a fresh volume"));
    }
    let files = sizes
        .iter()
        .map(|_| fx.create_file())
        .collect::<Result<Vec<_>>>()?;
    if S::USES_ALLOCATOR {
        let spec = AgingSpec {
            file_blocks: sizes.to_vec(),
            target_score: score,
            seed,
        };
        let plan: Vec<Extent> = age(fx.layout().data, &spec)?
            .files
            .into_iter()
            .flatten()
            .collect();
        fx.alloc().load(&plan, &[])?;
    }
    for (&f, &n) in files.iter().zip(sizes) {
        append_blocks(fx, f, n)?;
    }
    if S::USES_ALLOCATOR {
        fx.alloc().finish()?;
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::structures::{Cuckoo, Extents, HashFsTable, Radix, Simple};
    use pmfs_core::traits::BlockAllocator;

    fn spec(data_blocks: u64) -> VolumeSpec {
        VolumeSpec {
            data_blocks,
            max_files: 64,
        }
    }

    fn reaches_size_and_layout_score<S: Structure>() {
        for score in [1.0, 0.85, 0.7] {
            let fx = aged_file_fixture::<S>(spec(40_000), 10_000, score, 7).unwrap();
            assert_eq!(fx.file(0).blocks, 10_000);
            let got = fx.layout_score(0).unwrap();
            assert!((got - score).abs() < 0.01, "{} {score}: got {got}", S::NAME);
        }
    }

    #[test]
    fn allocator_backed_files_reach_the_planned_layout_score() {
        reaches_size_and_layout_score::<Simple>();
        reaches_size_and_layout_score::<Extents>();
        reaches_size_and_layout_score::<Radix>();
        reaches_size_and_layout_score::<Cuckoo>();
    }

    #[test]
    fn many_files_are_built_in_order_and_hashfs_ignores_the_plan() {
        let mut fx = Fixture::<Extents>::new(spec(10_000)).unwrap();
        let files = build_aged_files(&mut fx, &[300; 27], 0.85, 3).unwrap();
        assert_eq!(files.len(), 27);
        assert!(files.iter().all(|&f| fx.file(f).blocks == 300));
        // Data plus at most one leaf per file.
        let free = fx.alloc().free_blocks();
        assert!(
            (10_000 - 27 * 301..=10_000 - 27 * 300).contains(&free),
            "{free}"
        );
        assert!(build_aged_files(&mut fx, &[1], 0.85, 3).is_err());

        // HashFS ignores a plan of 0.5: its hash places clusters of eight blocks apart, each
        // one contiguous, for a score of about 7/8.
        let mut fx = Fixture::<HashFsTable>::new(spec(10_000)).unwrap();
        build_aged_files(&mut fx, &[300, 200], 0.5, 3).unwrap();
        assert_eq!(fx.file(1).blocks, 200);
        let score = fx.layout_score(0).unwrap();
        assert!((0.8..0.95).contains(&score), "{score}");
    }
}
