//! Aging: files with a chosen layout score, and volumes filled to a chosen utilisation.
//!
//! The paper (§4, "Generating fragmentation") modifies Strata's allocator so that files are
//! allocated "in fragmented chunks such that the resulting files have an average layout score
//! that is specified". This module gets the same effect through the [`FileMapping`] contract
//! alone, so it works for every structure and allocator: the file grows in fragments whose
//! lengths follow a geometric distribution with mean `1 / (1 - score)`, and after each fragment
//! one block is given to another file, so the next fragment cannot continue the previous one.
//! The fraction of blocks that continue their predecessor is then `score` on average.
//! Structures that place blocks themselves (HashFS) ignore the interleaving; they get the same
//! amount of foreign blocks in their table.
//!
//! [`FileMapping`]: pmfs_core::traits::FileMapping

use pmfs_core::Result;
use rand::Rng;
use rand::rngs::SmallRng;

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

/// Formats `S` on `spec` and grows file 0 to `file_blocks` blocks at layout score `score`
/// (file 1 takes the blocks between its fragments).
pub fn aged_file_fixture<S: Structure>(
    spec: VolumeSpec,
    file_blocks: u64,
    score: f64,
    seed: u64,
) -> Result<Fixture<S>> {
    let mut fx = Fixture::<S>::new(spec)?;
    let f = fx.create_file()?;
    let filler = fx.create_file()?;
    let mut rng = <SmallRng as rand::SeedableRng>::seed_from_u64(seed);
    grow_aged(&mut fx, f, filler, file_blocks, score, &mut rng)?;
    Ok(fx)
}

/// Largest number of blocks one insert call maps while aging (2 MiB, a typical append
/// preallocation step).
pub const MAX_INSERT_BLOCKS: u64 = 512;

/// A fragment length: geometric with mean `1 / (1 - score)`, unbounded for `score >= 1`.
pub fn fragment_len(score: f64, rng: &mut SmallRng) -> u64 {
    if score >= 1.0 {
        return u64::MAX;
    }
    if score <= 0.0 {
        return 1;
    }
    let u: f64 = rng.r#gen::<f64>().max(f64::MIN_POSITIVE);
    1 + (u.ln() / score.ln()).floor() as u64
}

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

/// Grows file `f` to `blocks` blocks with a layout score close to `score`, giving one block to
/// file `filler` after every fragment.
pub fn grow_aged<S: Structure>(
    fx: &mut Fixture<S>,
    f: usize,
    filler: usize,
    blocks: u64,
    score: f64,
    rng: &mut SmallRng,
) -> Result<()> {
    while fx.file(f).blocks < blocks {
        let want = fragment_len(score, rng).min(blocks - fx.file(f).blocks);
        append_blocks(fx, f, want)?;
        if fx.file(f).blocks < blocks {
            append_blocks(fx, filler, 1)?;
        }
    }
    Ok(())
}

/// Creates files of `file_blocks` blocks until at least `used_blocks` blocks of data are
/// mapped in total. The files grow round-robin in fragments of layout score `score`, so they
/// interleave on the device like files written at the same time. Returns the new files.
pub fn fill<S: Structure>(
    fx: &mut Fixture<S>,
    used_blocks: u64,
    file_blocks: u64,
    score: f64,
    rng: &mut SmallRng,
) -> Result<Vec<usize>> {
    let count = used_blocks.div_ceil(file_blocks);
    let files = (0..count)
        .map(|_| fx.create_file())
        .collect::<Result<Vec<_>>>()?;
    let mut growing = files.clone();
    while !growing.is_empty() {
        let mut i = 0;
        while i < growing.len() {
            let f = growing[i];
            let want = fragment_len(score, rng).min(file_blocks - fx.file(f).blocks);
            append_blocks(fx, f, want)?;
            if fx.file(f).blocks == file_blocks {
                growing.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::structures::Simple;
    use crate::mapping::volume::VolumeSpec;
    use pmfs_core::traits::BlockAllocator;
    use rand::SeedableRng;

    #[test]
    fn fragment_lengths_have_the_mean_of_the_score() {
        let mut rng = SmallRng::seed_from_u64(1);
        let n = 20_000;
        let mean = (0..n).map(|_| fragment_len(0.85, &mut rng)).sum::<u64>() as f64 / n as f64;
        assert!((mean - 1.0 / 0.15).abs() < 0.3, "mean {mean}");
        assert_eq!(fragment_len(1.0, &mut rng), u64::MAX);
        assert_eq!(fragment_len(0.0, &mut rng), 1);
    }

    #[test]
    fn aged_file_reaches_its_size_and_layout_score() {
        let spec = VolumeSpec {
            data_blocks: 20_000,
            max_files: 2,
        };
        let mut rng = SmallRng::seed_from_u64(7);
        for score in [1.0, 0.85, 0.7] {
            let mut fx = Fixture::<Simple>::new(spec).unwrap();
            let f = fx.create_file().unwrap();
            let filler = fx.create_file().unwrap();
            grow_aged(&mut fx, f, filler, 10_000, score, &mut rng).unwrap();
            assert_eq!(fx.file(f).blocks, 10_000);
            let got = fx.layout_score(f).unwrap();
            assert!((got - score).abs() < 0.02, "score {score}: got {got}");
        }
    }

    #[test]
    fn fill_maps_the_requested_amount_in_whole_files() {
        let spec = VolumeSpec {
            data_blocks: 10_000,
            max_files: 64,
        };
        let mut fx = Fixture::<Simple>::new(spec).unwrap();
        let mut rng = SmallRng::seed_from_u64(3);
        let files = fill(&mut fx, 8_000, 300, 0.85, &mut rng).unwrap();
        assert_eq!(files.len(), 27);
        assert!(files.iter().all(|&f| fx.file(f).blocks == 300));
        assert_eq!(fx.alloc().free_blocks(), 10_000 - 27 * 300);
        let score = fx.layout_score(files[0]).unwrap();
        assert!(score < 0.95, "interleaved files are fragmented: {score}");
    }
}
