//! Reproduces **Fig. 8** of the HashFS paper (FAST'21, §4.4 "IO Size"): cold-cache latency of
//! mapping 1, 16 and 256 blocks at once (4 KiB, 64 KiB, 1 MiB IOs) — sequential lookups,
//! random lookups and appends — on a 1 GiB file at layout score 0.85. The paper reports the
//! share of the IO path; these benches measure the mapping operation alone, with throughput
//! in blocks per second so sizes compare.
//!
//! Group `fig8_io_size`: functions are the structures, parameters `<op> <blocks> blk`.

use std::time::Instant;

use criterion::{Criterion, criterion_main};
use pmfs_benches::mapping::aging::{aged_file_fixture, volume_for_file};
use pmfs_benches::mapping::bench::{bench_op, criterion, group};
use pmfs_benches::mapping::stats::FixtureStats;
use pmfs_benches::mapping::{
    Cache, GIB_BLOCKS, Harness, Op, OpKind, Structure, Visitor, for_each_structure,
};
use pmfs_core::Result;

const GROUP: &str = "fig8_io_size";
const IO_BLOCKS: [u64; 3] = [1, 16, 256];
const LAYOUT_SCORE: f64 = 0.85;
const SEED: u64 = 8;

struct Fig8<'c> {
    c: &'c mut Criterion,
    h: Harness,
    stats: FixtureStats,
}

impl Visitor for Fig8<'_> {
    fn visit<S: Structure>(&mut self) -> Result<()> {
        let t = Instant::now();
        let spec = volume_for_file(GIB_BLOCKS);
        let mut fx = aged_file_fixture::<S>(spec, GIB_BLOCKS, LAYOUT_SCORE, SEED)?;
        self.stats.add(&fx, 0, "1 GiB file", t.elapsed())?;
        let mut g = group(self.c, GROUP);
        for io in IO_BLOCKS {
            for kind in [OpKind::SeqLookup, OpKind::RandLookup, OpKind::Append] {
                let op = Op::new(Cache::Cold, kind, io);
                let param = format!("{op} {io} blk");
                bench_op(&mut g, &mut self.h, &mut fx, 0, op, param, true, SEED)?;
            }
        }
        g.finish();
        Ok(())
    }
}

fn fig8() {
    let mut c = criterion();
    let mut fig = Fig8 {
        c: &mut c,
        h: Harness::from_env(),
        stats: FixtureStats::new(
            "Fig. 8 fixtures (IO size)",
            "One 1 GiB file aged to layout score 0.85 on a volume about a quarter full.",
        ),
    };
    if let Err(e) = for_each_structure(&mut fig) {
        panic!("{GROUP}: {e}");
    }
    if let Err(e) = fig.stats.write("mapping-fig8") {
        panic!("{GROUP}: writing the fixture table: {e}");
    }
}

criterion_main!(fig8);
