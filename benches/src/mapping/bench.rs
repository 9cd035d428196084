//! Criterion glue shared by the mapping suites: the configuration, and one function that
//! benchmarks a [`Workload`] under `iter_custom`.

use std::fmt::Display;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput};
use pmfs_core::Result;

use super::ops::{Harness, Op, Workload};
use super::structures::Structure;
use super::volume::Fixture;

/// Criterion configured with the suite-wide times ([`WARM_UP`](crate::WARM_UP),
/// [`MEASUREMENT`](crate::MEASUREMENT), [`SAMPLE_SIZE`](crate::SAMPLE_SIZE)); command-line
/// options still override them.
pub fn criterion() -> Criterion {
    Criterion::default()
        .warm_up_time(crate::WARM_UP)
        .measurement_time(crate::MEASUREMENT)
        .sample_size(crate::SAMPLE_SIZE)
        .configure_from_args()
}

/// A benchmark group for one figure. Flat sampling: every sample runs the same number of
/// operations, which suits cold operations whose untimed eviction dominates wall time.
pub fn group<'c>(c: &'c mut Criterion, name: &str) -> BenchmarkGroup<'c, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sampling_mode(SamplingMode::Flat);
    g
}

/// Benchmarks `op` on file `file` of `fx` as function `S::NAME`, parameter `param`. With
/// `per_block`, the group reports throughput in blocks per second (it then stays set for the
/// group's later functions, as criterion cannot unset it).
#[allow(clippy::too_many_arguments)]
pub fn bench_op<S: Structure>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    h: &mut Harness,
    fx: &mut Fixture<S>,
    file: usize,
    op: Op,
    param: impl Display,
    per_block: bool,
    seed: u64,
) -> Result<()> {
    let mut w = Workload::new(fx, file, op, seed)?;
    if per_block {
        g.throughput(Throughput::Elements(op.io_blocks));
    }
    let id = BenchmarkId::new(S::NAME, param);
    g.bench_function(id, |b| {
        b.iter_custom(|iters| {
            w.run(h, fx, iters)
                .unwrap_or_else(|e| panic!("{} {op}: {e}", S::NAME))
        })
    });
    Ok(())
}
