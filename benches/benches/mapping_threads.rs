//! Reproduces **Fig. 10** of the HashFS paper (FAST'21, §4.6 "Concurrency"): the average
//! latency of lookups and appends when 1 or 2 threads each read a random block of the same
//! 1 GiB file (layout score 0.85) and then append a block to it. Appends to the one file are
//! serialised by a per-file lock, as in Strata; lookups take no lock and run concurrently with
//! each other and with the append. (The paper goes to 8 threads; this machine has 2 cores.)
//!
//! Group `fig10_threads`: functions are the structures, parameters `<op> <n> thr`. Both
//! functions of a thread count run the same mixed loop and report one side of it.

use std::time::Instant;

use criterion::{BenchmarkId, Criterion, criterion_main};
use pmfs_benches::mapping::aging::{aged_file_fixture, volume_for_file};
use pmfs_benches::mapping::bench::{criterion, group};
use pmfs_benches::mapping::ops::read_then_append;
use pmfs_benches::mapping::stats::FixtureStats;
use pmfs_benches::mapping::{GIB_BLOCKS, Structure, Visitor, for_each_structure};
use pmfs_core::Result;

const GROUP: &str = "fig10_threads";
const THREADS: [usize; 2] = [1, 2];
const LAYOUT_SCORE: f64 = 0.85;
const SEED: u64 = 10;

struct Fig10<'c> {
    c: &'c mut Criterion,
    stats: FixtureStats,
}

impl Visitor for Fig10<'_> {
    fn visit<S: Structure>(&mut self) -> Result<()> {
        let t = Instant::now();
        let spec = volume_for_file(GIB_BLOCKS);
        let mut fx = aged_file_fixture::<S>(spec, GIB_BLOCKS, LAYOUT_SCORE, SEED)?;
        self.stats.add(&fx, 0, "1 GiB file", t.elapsed())?;
        let mut g = group(self.c, GROUP);
        for threads in THREADS {
            for side in ["lookup", "append"] {
                let id = BenchmarkId::new(S::NAME, format!("{side} {threads} thr"));
                let mut seed = SEED;
                g.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        seed += threads as u64;
                        let times = read_then_append(&mut fx, 0, threads, iters, seed)
                            .unwrap_or_else(|e| panic!("{} {side}: {e}", S::NAME));
                        if side == "lookup" {
                            times.lookup
                        } else {
                            times.append
                        }
                    })
                });
            }
        }
        g.finish();
        Ok(())
    }
}

fn fig10() {
    let mut c = criterion();
    let mut fig = Fig10 {
        c: &mut c,
        stats: FixtureStats::new(
            "Fig. 10 fixtures (threads)",
            "One 1 GiB file aged to layout score 0.85 on a volume about a quarter full.",
        ),
    };
    if let Err(e) = for_each_structure(&mut fig) {
        panic!("{GROUP}: {e}");
    }
    if let Err(e) = fig.stats.write("mapping-fig10") {
        panic!("{GROUP}: writing the fixture table: {e}");
    }
}

criterion_main!(fig10);
