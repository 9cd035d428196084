//! Reproduces **Fig. 6** of the HashFS paper (FAST'21, §4.2 "Fragmentation"): cold-cache
//! latency of single-block sequential lookups, random lookups and appends (allocation
//! included) on a 1 GiB file aged to layout score 1.0 (contiguous), 0.85 (typical) and 0.7
//! (heavily fragmented).
//!
//! Group `fig6_fragmentation`: functions are the structures, parameters `<op> ls=<score>`.

use std::time::Instant;

use criterion::{Criterion, criterion_main};
use pmfs_benches::mapping::aging::{aged_file_fixture, volume_for_file};
use pmfs_benches::mapping::bench::{bench_op, criterion, group};
use pmfs_benches::mapping::stats::FixtureStats;
use pmfs_benches::mapping::{
    Cache, GIB_BLOCKS, Harness, Op, OpKind, Structure, Visitor, for_each_structure,
};
use pmfs_core::Result;

const GROUP: &str = "fig6_fragmentation";
const LAYOUT_SCORES: [f64; 3] = [1.0, 0.85, 0.7];
const SEED: u64 = 6;

struct Fig6<'c> {
    c: &'c mut Criterion,
    h: Harness,
    stats: FixtureStats,
}

impl Visitor for Fig6<'_> {
    fn visit<S: Structure>(&mut self) -> Result<()> {
        for score in LAYOUT_SCORES {
            let t = Instant::now();
            let spec = volume_for_file(GIB_BLOCKS);
            let mut fx = aged_file_fixture::<S>(spec, GIB_BLOCKS, score, SEED)?;
            self.stats
                .add(&fx, 0, &format!("1 GiB file, ls={score}"), t.elapsed())?;
            let mut g = group(self.c, GROUP);
            for kind in [OpKind::SeqLookup, OpKind::RandLookup, OpKind::Append] {
                let op = Op::new(Cache::Cold, kind, 1);
                let param = format!("{op} ls={score}");
                bench_op(&mut g, &mut self.h, &mut fx, 0, op, param, false, SEED)?;
            }
            g.finish();
        }
        Ok(())
    }
}

fn fig6() {
    let mut c = criterion();
    let mut fig = Fig6 {
        c: &mut c,
        h: Harness::from_env(),
        stats: FixtureStats::new(
            "Fig. 6 fixtures (fragmentation)",
            "One 1 GiB file per layout score, on a volume about a quarter full.",
        ),
    };
    if let Err(e) = for_each_structure(&mut fig) {
        panic!("{GROUP}: {e}");
    }
    if let Err(e) = fig.stats.write("mapping-fig6") {
        panic!("{GROUP}: writing the fixture table: {e}");
    }
}

criterion_main!(fig6);
