//! Aged layouts on demand: files and free space with a chosen *layout score* (HashFS §4,
//! "Generating fragmentation"), and free space cut into a chosen number of chunks (CFFS
//! Fig. 13).
//!
//! # Layout score
//!
//! The layout score (Smith and Seltzer, "File System Aging", 1997) is the fraction of a file's
//! blocks that are allocated contiguously with the file's previous block. The first block of
//! a file has no previous block and is not counted, and one-block files are skipped. Over a
//! set of files, with `n` blocks and `k` fragments (maximal physically contiguous runs of
//! logically consecutive blocks) per file:
//!
//! ```text
//! score = Σ (n - k) / Σ (n - 1)
//! ```
//!
//! 1.0 means every file is one fragment; 0.0 means no block follows its predecessor. The HashFS
//! paper uses 0.85 as a typical aged file system and 0.7 as a heavily fragmented one.
//!
//! # Generating a layout
//!
//! [`age`] plans a layout for [`AgingSpec::file_blocks`] inside a managed range: each file of
//! `n` blocks is cut into `k = round(n - target · (n - 1))` fragments at random cut points
//! (random fragment sizes), and all fragments of all files, in random order, are placed at
//! random positions in the free space — so file data *and* free space end up fragmented and
//! scattered, as in the paper. A fragment is never placed right after its logical predecessor
//! or right before its successor (that would merge them and raise the score). The layout is
//! pure data: [`age_allocator`] also makes it the state of an allocator through
//! [`rebuild`](BlockAllocator::rebuild).
//!
//! ```
//! use pmfs_alloc::aging::{AgingSpec, age_allocator};
//! use pmfs_alloc::CffsAllocator;
//! use pmfs_core::layout::BlockNo;
//! use pmfs_core::traits::{BlockAllocator, Extent};
//!
//! let range = Extent::new(BlockNo(0), 1 << 16);               // 256 MiB of 4 KiB blocks
//! let alloc = CffsAllocator::new(range.start, range.len);
//! let spec = AgingSpec::uniform(8, 4096, 0.85, 42);           // 8 files of 16 MiB
//! let aged = age_allocator(&alloc, range, &spec).unwrap();
//! assert!((aged.score - 0.85).abs() < 0.01);
//! assert_eq!(alloc.free_blocks(), range.len - 8 * 4096);
//! // aged.files[i] lists file i's extents in logical order.
//! ```
//!
//! Placement needs room: with the files filling more than about 90 % of the range, a fragment
//! may find no free run large enough, and is then split, which lowers the score. The achieved
//! score is always measured on the result and returned in [`Aged::score`].

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use pmfs_core::layout::BlockNo;
use pmfs_core::traits::{BlockAllocator, Extent};
use pmfs_core::{Error, Result};

use crate::runs::RunSet;

/// The layout score of one file, given its extents in logical order; `None` for files of
/// fewer than two blocks.
pub fn file_layout_score(extents: &[Extent]) -> Option<f64> {
    let (n, k) = blocks_and_fragments(extents);
    (n >= 2).then(|| (n - k) as f64 / (n - 1) as f64)
}

/// The layout score of a set of files (see the module documentation); 1.0 if no file has two
/// blocks.
pub fn layout_score(files: &[Vec<Extent>]) -> f64 {
    let (mut num, mut den) = (0u64, 0u64);
    for f in files {
        let (n, k) = blocks_and_fragments(f);
        if n >= 2 {
            num += n - k;
            den += n - 1;
        }
    }
    if den == 0 {
        1.0
    } else {
        num as f64 / den as f64
    }
}

/// Blocks and fragments of a file: extents that continue the previous one physically count
/// as the same fragment.
pub fn blocks_and_fragments(extents: &[Extent]) -> (u64, u64) {
    let mut n = 0;
    let mut k = 0;
    let mut prev_end: Option<BlockNo> = None;
    for e in extents.iter().filter(|e| e.len > 0) {
        n += e.len;
        if prev_end != Some(e.start) {
            k += 1;
        }
        prev_end = Some(e.end());
    }
    (n, k)
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct AgingSpec {
    /// Size of each file to create, in blocks.
    pub file_blocks: Vec<u64>,
    /// The layout score to reach, in `[0, 1]`.
    pub target_score: f64,
    /// Seed of the random cut points and positions; equal seeds give equal layouts.
    pub seed: u64,
}

impl AgingSpec {
    /// `files` files of `blocks` blocks each.
    pub fn uniform(files: usize, blocks: u64, target_score: f64, seed: u64) -> Self {
        Self {
            file_blocks: vec![blocks; files],
            target_score,
            seed,
        }
    }

    /// One file of `blocks` blocks (HashFS §4.2 uses a single 1 GiB file).
    pub fn single_file(blocks: u64, target_score: f64, seed: u64) -> Self {
        Self::uniform(1, blocks, target_score, seed)
    }
}

/// A generated layout.
#[derive(Clone, Debug)]
pub struct Aged {
    /// Each file's extents in logical order (file `i` of the spec is `files[i]`); consecutive
    /// extents are never physically contiguous, so each extent is one fragment.
    pub files: Vec<Vec<Extent>>,
    /// The layout score achieved.
    pub score: f64,
    /// Number of free runs left in the range.
    pub free_runs: usize,
}

impl Aged {
    /// Every allocated extent, sorted by start (the `used` set for a rebuild).
    pub fn used_extents(&self) -> Vec<Extent> {
        let mut v: Vec<Extent> = self.files.iter().flatten().copied().collect();
        v.sort();
        v
    }

    /// Total blocks of all files.
    pub fn used_blocks(&self) -> u64 {
        self.files.iter().flatten().map(|e| e.len).sum()
    }
}

/// Cuts `n` blocks into `k` fragments at random cut points.
fn cut(rng: &mut SmallRng, n: u64, k: u64) -> Vec<u64> {
    if k <= 1 {
        return vec![n];
    }
    let mut cuts: Vec<u64> = rand::seq::index::sample(rng, (n - 1) as usize, (k - 1) as usize)
        .into_iter()
        .map(|c| c as u64 + 1)
        .collect();
    cuts.sort_unstable();
    let mut sizes = Vec::with_capacity(k as usize);
    let mut prev = 0;
    for c in cuts {
        sizes.push(c - prev);
        prev = c;
    }
    sizes.push(n - prev);
    sizes
}

/// Plans the layout of `spec` inside `range` (see the module documentation).
///
/// # Errors
/// [`Error::InvalidArgument`] if the target is outside `[0, 1]` or a file is empty;
/// [`Error::NoSpace`] if the files do not fit in the range.
pub fn age(range: Extent, spec: &AgingSpec) -> Result<Aged> {
    if !(0.0..=1.0).contains(&spec.target_score) {
        return Err(Error::InvalidArgument("layout score outside [0, 1]"));
    }
    if spec.file_blocks.contains(&0) {
        return Err(Error::InvalidArgument("empty file in an aging spec"));
    }
    let total: u64 = spec.file_blocks.iter().sum();
    if total > range.len {
        return Err(Error::NoSpace);
    }
    let mut rng = SmallRng::seed_from_u64(spec.seed);
    // Fragment sizes per file, then all fragments in random order.
    let mut sizes: Vec<Vec<u64>> = Vec::with_capacity(spec.file_blocks.len());
    let mut order: Vec<(usize, usize)> = Vec::new();
    for (f, &n) in spec.file_blocks.iter().enumerate() {
        let k = ((n as f64) - spec.target_score * (n - 1) as f64).round() as u64;
        let s = cut(&mut rng, n, k.clamp(1, n));
        order.extend((0..s.len()).map(|i| (f, i)));
        sizes.push(s);
    }
    order.shuffle(&mut rng);
    let mut placed: Vec<Vec<Vec<Extent>>> =
        sizes.iter().map(|s| vec![Vec::new(); s.len()]).collect();
    let mut free = RunSet::new();
    if range.len > 0 {
        free.insert(range.start.0, range.len);
    }
    for (f, i) in order {
        let mut left = sizes[f][i];
        while left > 0 {
            let e = place(&mut rng, &mut free, range, left, &placed[f], i);
            left -= e.len;
            placed[f][i].push(e);
        }
    }
    let files: Vec<Vec<Extent>> = placed
        .into_iter()
        .map(|frags| frags.into_iter().flatten().collect())
        .collect();
    Ok(Aged {
        score: layout_score(&files),
        files,
        free_runs: free.count(),
    })
}

/// Places (up to) `len` blocks of fragment `i` of a file whose fragments placed so far are
/// `frags`, at a random free position that does not continue its logical neighbours.
fn place(
    rng: &mut SmallRng,
    free: &mut RunSet,
    range: Extent,
    len: u64,
    frags: &[Vec<Extent>],
    i: usize,
) -> Extent {
    // The physical block the fragment must not start at, and the one it must not end at.
    // (A neighbour not placed yet checks against this fragment when its turn comes.)
    let prev_end = i
        .checked_sub(1)
        .and_then(|p| frags[p].last())
        .map(|e| e.end().0);
    let next_start = frags.get(i + 1).and_then(|f| f.first()).map(|e| e.start.0);
    let ok = |s: u64, l: u64| Some(s) != prev_end && Some(s + l) != next_start;
    let mut fallback = None;
    for _ in 0..16 {
        let r = range.start.0 + rng.gen_range(0..range.len);
        let Some((s, l)) = free.next_fit(r, len) else {
            break;
        };
        let at = s + rng.gen_range(0..=l - len);
        if ok(at, len) {
            free.remove(at, len);
            return Extent::new(BlockNo(at), len);
        }
        fallback.get_or_insert((s, l));
    }
    if let Some((s, l)) = fallback {
        // Slide inside the run away from the forbidden positions.
        if let Some(at) = (s..=s + l - len).find(|&a| ok(a, len)) {
            free.remove(at, len);
            return Extent::new(BlockNo(at), len);
        }
    }
    // No free run holds the whole fragment: take the largest piece (splits the fragment).
    let (s, l) = free.largest().expect("the files fit in the range");
    let take = l.min(len);
    free.remove(s, take);
    Extent::new(BlockNo(s), take)
}

/// [`age`], then makes the layout the state of `alloc` (which manages exactly `range`) with
/// [`rebuild`](BlockAllocator::rebuild): the files' blocks become allocated, everything else
/// free.
///
/// # Errors
/// As [`age`], and whatever the rebuild returns.
pub fn age_allocator<A: BlockAllocator + ?Sized>(
    alloc: &A,
    range: Extent,
    spec: &AgingSpec,
) -> Result<Aged> {
    let aged = age(range, spec)?;
    alloc.rebuild(&mut aged.used_extents().into_iter())?;
    Ok(aged)
}

/// Free space cut into `chunks` free chunks of `chunk_blocks` blocks each, everything else in
/// use (CFFS Fig. 13: "x frag (y MB/frag)"). The range is divided into `chunks` equal slots
/// and each chunk is placed at a random offset inside its slot, a multiple of `align` blocks
/// from the range start, never touching the next chunk. Returns the used extents (for a
/// rebuild) in address order.
///
/// # Errors
/// [`Error::NoSpace`] if the chunks (with their alignment and one separating block each) do not
/// fit in the range; [`Error::InvalidArgument`] for zero sizes.
pub fn fragment_free_space(
    range: Extent,
    chunk_blocks: u64,
    chunks: u64,
    align: u64,
    seed: u64,
) -> Result<Vec<Extent>> {
    if chunk_blocks == 0 || chunks == 0 || align == 0 {
        return Err(Error::InvalidArgument("empty free-space pattern"));
    }
    let slot = range.len / chunks;
    let need = chunk_blocks.div_ceil(align) * align + align;
    if slot < need {
        return Err(Error::NoSpace);
    }
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut used = Vec::new();
    let mut cursor = range.start.0;
    for c in 0..chunks {
        let slot_start = range.start.0 + c * slot;
        let room = (slot - need) / align;
        let at = slot_start + rng.gen_range(0..=room) * align;
        if at > cursor {
            used.push(Extent::new(BlockNo(cursor), at - cursor));
        }
        cursor = at + chunk_blocks;
    }
    if cursor < range.end().0 {
        used.push(Extent::new(BlockNo(cursor), range.end().0 - cursor));
    }
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_layout(range: Extent, spec: &AgingSpec, aged: &Aged) {
        for (f, ext) in aged.files.iter().enumerate() {
            let n: u64 = ext.iter().map(|e| e.len).sum();
            assert_eq!(n, spec.file_blocks[f], "file {f} size");
            for w in ext.windows(2) {
                assert_ne!(w[0].end(), w[1].start, "consecutive extents merge");
            }
        }
        let used = aged.used_extents();
        for w in used.windows(2) {
            assert!(w[0].end() <= w[1].start, "overlap {w:?}");
        }
        assert!(
            used.iter()
                .all(|e| e.start >= range.start && e.end() <= range.end())
        );
    }

    #[test]
    fn scores_hit_their_targets() {
        let range = Extent::new(BlockNo(1000), 150_000);
        for target in [1.0, 0.85, 0.7, 0.3] {
            for spec in [
                AgingSpec::single_file(40_000, target, 1),
                AgingSpec::uniform(20, 2000, target, 2),
                AgingSpec {
                    file_blocks: (1..200).map(|i| i * 7).collect(),
                    target_score: target,
                    seed: 3,
                },
            ] {
                let aged = age(range, &spec).unwrap();
                check_layout(range, &spec, &aged);
                assert!(
                    (aged.score - target).abs() < 0.01,
                    "target {target}: achieved {}",
                    aged.score
                );
            }
        }
    }

    #[test]
    fn layout_score_counts_contiguous_extents_as_one_fragment() {
        let e = |s, l| Extent::new(BlockNo(s), l);
        assert_eq!(file_layout_score(&[e(0, 1)]), None);
        assert_eq!(file_layout_score(&[e(0, 5), e(5, 5)]), Some(1.0));
        assert_eq!(file_layout_score(&[e(0, 5), e(10, 5)]), Some(8.0 / 9.0));
        assert_eq!(
            layout_score(&[vec![e(0, 3)], vec![e(9, 1), e(20, 1)]]),
            2.0 / 3.0
        );
    }

    #[test]
    fn same_seed_same_layout_and_no_space_is_reported() {
        let range = Extent::new(BlockNo(0), 10_000);
        let spec = AgingSpec::uniform(3, 2000, 0.85, 9);
        assert_eq!(
            age(range, &spec).unwrap().files,
            age(range, &spec).unwrap().files
        );
        assert!(matches!(
            age(range, &AgingSpec::uniform(3, 4000, 0.85, 9)),
            Err(Error::NoSpace)
        ));
        assert!(age(range, &AgingSpec::uniform(1, 10, 1.5, 9)).is_err());
    }

    #[test]
    fn free_space_is_cut_into_the_requested_chunks() {
        let range = Extent::new(BlockNo(512), 1 << 16);
        let used = fragment_free_space(range, 256, 64, 512, 5).unwrap();
        let used_total: u64 = used.iter().map(|e| e.len).sum();
        assert_eq!(range.len - used_total, 256 * 64);
        let mut free = RunSet::new();
        free.insert(range.start.0, range.len);
        for e in &used {
            assert!(free.remove(e.start.0, e.len));
        }
        assert_eq!(free.count(), 64);
        assert!(free.iter().all(|(s, l)| l == 256 && (s - 512) % 512 == 0));
        assert!(fragment_free_space(range, 2000, 64, 1, 5).is_err());
    }
}
