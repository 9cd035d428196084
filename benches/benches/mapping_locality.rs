//! Reproduces **Fig. 5** of the HashFS paper (FAST'21, §4.1 "Locality"): the latency of one
//! file-mapping operation on a 1 GiB file (layout score 0.85), for single-block sequential
//! lookups, random lookups and appends (block allocation included), with cold caches (the
//! structure's and the allocator's persistent lines evicted before each operation, untimed;
//! `PMFS_BENCH_EVICT_MIB=llc` also evicts DRAM state) and hot caches (operations back to
//! back).
//!
//! Group `fig5_locality`: functions are the structures, parameters the operations.

use std::time::Instant;

use criterion::{Criterion, criterion_main};
use pmfs_benches::mapping::aging::{aged_file_fixture, volume_for_file};
use pmfs_benches::mapping::bench::{bench_op, criterion, group};
use pmfs_benches::mapping::stats::FixtureStats;
use pmfs_benches::mapping::{
    Cache, GIB_BLOCKS, Harness, Op, OpKind, Structure, Visitor, for_each_structure,
};
use pmfs_core::Result;

const GROUP: &str = "fig5_locality";
const LAYOUT_SCORE: f64 = 0.85;
const SEED: u64 = 5;

struct Fig5<'c> {
    c: &'c mut Criterion,
    h: Harness,
    stats: FixtureStats,
}

impl Visitor for Fig5<'_> {
    fn visit<S: Structure>(&mut self) -> Result<()> {
        let t = Instant::now();
        let spec = volume_for_file(GIB_BLOCKS);
        let mut fx = aged_file_fixture::<S>(spec, GIB_BLOCKS, LAYOUT_SCORE, SEED)?;
        self.stats.add(&fx, 0, "1 GiB file", t.elapsed())?;
        let mut g = group(self.c, GROUP);
        for cache in [Cache::Cold, Cache::Hot] {
            for kind in [OpKind::SeqLookup, OpKind::RandLookup, OpKind::Append] {
                let op = Op::new(cache, kind, 1);
                bench_op(&mut g, &mut self.h, &mut fx, 0, op, op, false, SEED)?;
            }
        }
        g.finish();
        Ok(())
    }
}

fn fig5() {
    let mut c = criterion();
    let mut fig = Fig5 {
        c: &mut c,
        h: Harness::from_env(),
        stats: FixtureStats::new(
            "Fig. 5 fixtures (locality)",
            "One 1 GiB file aged to layout score 0.85 on a volume about a quarter full.",
        ),
    };
    if let Err(e) = for_each_structure(&mut fig) {
        panic!("{GROUP}: {e}");
    }
    if let Err(e) = fig.stats.write("mapping-fig5") {
        panic!("{GROUP}: writing the fixture table: {e}");
    }
}

criterion_main!(fig5);
