//! Reproduces **Fig. 7** of the HashFS paper (FAST'21, §4.3 "File Size"): cold-cache latency
//! of single-block sequential lookups, random lookups and appends on files of 4 KiB (1 block),
//! 4 MiB (1024 blocks) and 4 GiB (2^20 blocks), aged to layout score 0.85. Per-file trees grow
//! with the file; global tables should not care.
//!
//! Group `fig7_file_size`: functions are the structures, parameters `<op> <blocks> blk`.
//! Every file size runs on the same 16 GiB volume (sparse pool files: the 4 GiB file costs
//! only its metadata in memory), so the global tables are the same size throughout and only
//! the file changes, as in the paper.

use std::time::Instant;

use criterion::{Criterion, criterion_main};
use pmfs_benches::mapping::aging::{aged_file_fixture, volume_for_file};
use pmfs_benches::mapping::bench::{bench_op, criterion, group};
use pmfs_benches::mapping::stats::FixtureStats;
use pmfs_benches::mapping::{
    Cache, GIB_BLOCKS, Harness, MIB_BLOCKS, Op, OpKind, Structure, Visitor, for_each_structure,
};
use pmfs_core::Result;

const GROUP: &str = "fig7_file_size";
const FILE_BLOCKS: [(u64, &str); 3] = [
    (1, "4 KiB"),
    (4 * MIB_BLOCKS, "4 MiB"),
    (4 * GIB_BLOCKS, "4 GiB"),
];
const LAYOUT_SCORE: f64 = 0.85;
const SEED: u64 = 7;

struct Fig7<'c> {
    c: &'c mut Criterion,
    h: Harness,
    stats: FixtureStats,
}

impl Visitor for Fig7<'_> {
    fn visit<S: Structure>(&mut self) -> Result<()> {
        let spec = volume_for_file(4 * GIB_BLOCKS);
        for (blocks, label) in FILE_BLOCKS {
            let t = Instant::now();
            let mut fx = aged_file_fixture::<S>(spec, blocks, LAYOUT_SCORE, SEED)?;
            self.stats
                .add(&fx, 0, &format!("{label} file"), t.elapsed())?;
            let mut g = group(self.c, GROUP);
            for kind in [OpKind::SeqLookup, OpKind::RandLookup, OpKind::Append] {
                let op = Op::new(Cache::Cold, kind, 1);
                let param = format!("{op} {blocks} blk");
                bench_op(&mut g, &mut self.h, &mut fx, 0, op, param, false, SEED)?;
            }
            g.finish();
        }
        Ok(())
    }
}

fn fig7() {
    let mut c = criterion();
    let mut fig = Fig7 {
        c: &mut c,
        h: Harness::from_env(),
        stats: FixtureStats::new(
            "Fig. 7 fixtures (file size)",
            "One file per size, layout score 0.85, each on a 16 GiB volume.",
        ),
    };
    if let Err(e) = for_each_structure(&mut fig) {
        panic!("{GROUP}: {e}");
    }
    if let Err(e) = fig.stats.write("mapping-fig7") {
        panic!("{GROUP}: writing the fixture table: {e}");
    }
}

criterion_main!(fig7);
