//! Reproduces **Fig. 13** of the CFFS paper (IEEE Access, §VI-D "Page allocation"): the
//! average latency of one allocation against the free-space fragmentation level.
//!
//! - Group `cffs_fig13a_4k`: 512 MiB of free space cut into `x` free chunks of `y` MiB each,
//!   then sequential 4 KiB allocations, each asking to continue the previous one (growing hint,
//!   goal = the block after the last allocation), until the free space is used up.
//! - Group `cffs_fig13b_2m`: the same with 1 GiB of free space and 2 MiB requests.
//! - Group `churn_4k` (not in the paper): the allocator under random 4 KiB copy-on-write
//!   overwrites of a full volume, what the data path asks of it in `data_fig6`'s random
//!   overwrites on the trees: every page split, one block in eight free at random, and each
//!   measured step allocates one block whose goal is taken (the block after the overwritten
//!   one's) and frees the block it replaces.
//!
//! Functions are the allocators (`baseline`: the free-extent allocator over a persistent
//! bitmap on a heap region, standing in for ext4-DAX; `cffs`), parameters the fragmentation
//! level `x frag (y MiB/frag)`. The managed range is 4 GiB; everything outside the free chunks
//! is in use (set up with [`rebuild`](BlockAllocator::rebuild) from
//! [`fragment_free_space`]). Each measured call is one `alloc`; when the free space is used
//! up, the state is rebuilt outside the timed region and the sequence starts again, so the
//! per-call time is the average over whole sequences, as in the paper.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use pmfs_alloc::aging::fragment_free_space;
use pmfs_alloc::baseline::bitmap_area_size;
use pmfs_alloc::{CffsAllocator, FreeExtentAllocator};
use pmfs_benches::{MEASUREMENT, SAMPLE_SIZE, WARM_UP};
use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::pm::HeapRegion;
use pmfs_core::traits::{AllocHint, AllocKind, BlockAllocator, Extent};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Blocks per MiB.
const MIB: u64 = 256;
/// The managed range: 4 GiB.
const RANGE: Extent = Extent {
    start: BlockNo(0),
    len: 4096 * MIB,
};
const SEED: u64 = 13;

/// A fragmentation level: `chunks` free chunks of `chunk_mib` MiB.
#[derive(Clone, Copy)]
struct Level {
    chunks: u64,
    chunk_mib: f64,
}

impl Level {
    fn blocks(&self) -> u64 {
        (self.chunk_mib * MIB as f64) as u64
    }

    fn label(&self) -> String {
        format!("{} frag ({} MiB/frag)", self.chunks, self.chunk_mib)
    }
}

/// One allocator in a fragmented state, re-fragmented whenever the free space runs out.
struct Subject {
    alloc: Box<dyn BlockAllocator>,
    used: Vec<Extent>,
    want: u64,
    goal: Option<BlockNo>,
}

impl Subject {
    fn new(alloc: Box<dyn BlockAllocator>, level: Level, want: u64, align: u64) -> Self {
        let used = fragment_free_space(RANGE, level.blocks(), level.chunks, align, SEED)
            .expect("the free chunks fit in the range");
        let s = Self {
            alloc,
            used,
            want,
            goal: None,
        };
        s.reset();
        s
    }

    fn reset(&self) {
        self.alloc
            .rebuild(&mut self.used.iter().copied())
            .expect("rebuild from the fragmentation pattern");
    }

    /// Runs `iters` allocations; returns the time spent in them.
    fn run(&mut self, iters: u64) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            if self.alloc.free_blocks() == 0 {
                self.reset();
                self.goal = None;
            }
            // Time a batch that cannot run out of space.
            let batch = left
                .min(self.alloc.free_blocks().div_ceil(self.want))
                .max(1);
            let hint_kind = AllocKind::Growing;
            let t = Instant::now();
            for _ in 0..batch {
                let hint = AllocHint {
                    kind: hint_kind,
                    goal: self.goal,
                };
                match self.alloc.alloc(self.want, hint) {
                    Ok(e) => self.goal = Some(black_box(e).end()),
                    Err(_) => break,
                }
            }
            total += t.elapsed();
            left -= batch;
        }
        total
    }
}

fn make(name: &str) -> Box<dyn BlockAllocator> {
    match name {
        "baseline" => {
            let region = HeapRegion::new(bitmap_area_size(RANGE.len)).expect("bitmap region");
            Box::new(FreeExtentAllocator::format(region, PmOff(0), RANGE).expect("format"))
        }
        _ => Box::new(CffsAllocator::new(RANGE.start, RANGE.len)),
    }
}

fn fig13(c: &mut Criterion, group: &str, want: u64, align: u64, levels: &[Level]) {
    let mut g = c.benchmark_group(group);
    g.sampling_mode(SamplingMode::Flat);
    for name in ["baseline", "cffs"] {
        for &level in levels {
            let mut s = Subject::new(make(name), level, want, align);
            g.bench_function(BenchmarkId::new(name, level.label()), |b| {
                b.iter_custom(|iters| s.run(iters))
            });
        }
    }
    g.finish();
}

fn fig13a(c: &mut Criterion) {
    let levels = [1, 16, 256, 4096].map(|chunks| Level {
        chunks,
        chunk_mib: 512.0 / chunks as f64,
    });
    fig13(c, "cffs_fig13a_4k", 1, 1, &levels);
}

fn fig13b(c: &mut Criterion) {
    let levels = [1, 16, 128, 512].map(|chunks| Level {
        chunks,
        chunk_mib: 1024.0 / chunks as f64,
    });
    fig13(c, "cffs_fig13b_2m", 512, 1, &levels);
}

/// The random-overwrite steady state of [`churn`]: the blocks in use, to pick from.
struct Churn {
    alloc: Box<dyn BlockAllocator>,
    used: Vec<BlockNo>,
    rng: SmallRng,
}

impl Churn {
    /// One block in `1 / free_one_in` free, at random positions of the range.
    fn new(alloc: Box<dyn BlockAllocator>, free_one_in: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(SEED);
        let free: Vec<bool> = (0..RANGE.len)
            .map(|_| rng.gen_range(0..free_one_in) == 0)
            .collect();
        let mut runs = Vec::new();
        let mut b = 0;
        while b < RANGE.len {
            let e = (b..RANGE.len)
                .find(|&i| free[i as usize])
                .unwrap_or(RANGE.len);
            if e > b {
                runs.push(Extent::new(BlockNo(RANGE.start.0 + b), e - b));
            }
            b = e + 1;
        }
        alloc
            .rebuild(&mut runs.iter().copied())
            .expect("rebuild from the random free blocks");
        let used = (0..RANGE.len)
            .filter(|&i| !free[i as usize])
            .map(|i| BlockNo(RANGE.start.0 + i))
            .collect();
        Self { alloc, used, rng }
    }

    /// Runs `iters` overwrites (an allocation and a free each); returns their time.
    fn run(&mut self, iters: u64) -> Duration {
        let t = Instant::now();
        for _ in 0..iters {
            let i = self.rng.gen_range(0..self.used.len());
            let old = self.used[i];
            let hint = AllocHint {
                kind: AllocKind::Growing,
                goal: Some(BlockNo(old.0 + 1)),
            };
            let new = self.alloc.alloc(1, hint).expect("a block is free");
            self.alloc
                .free(Extent::new(old, 1))
                .expect("free of the replaced block");
            self.used[i] = black_box(new.start);
        }
        t.elapsed()
    }
}

fn churn(c: &mut Criterion) {
    let mut g = c.benchmark_group("churn_4k");
    for name in ["baseline", "cffs"] {
        let mut s = Churn::new(make(name), 8);
        g.bench_function(BenchmarkId::new(name, "1 in 8 free"), |b| {
            b.iter_custom(|iters| s.run(iters))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(WARM_UP)
        .measurement_time(MEASUREMENT)
        .sample_size(SAMPLE_SIZE);
    targets = fig13a, fig13b, churn
}
criterion_main!(benches);
