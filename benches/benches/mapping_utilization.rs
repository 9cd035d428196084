//! Reproduces **Fig. 9** of the HashFS paper (FAST'21, §4.5 "Space Utilization") for the
//! global tables: cold-cache latency of single-block sequential lookups, random lookups and
//! appends when the file system is 80 % and 95 % full. Hash tables sized by the capacity get
//! longer collision chains as they fill; per-file trees do not (the paper shows them flat), so
//! only the global structures run here.
//!
//! The volume holds 8 GiB (2^21 blocks; the paper used 128 GiB). The measured file (64 MiB)
//! and then 4 MiB files up to the target utilisation are written with the layout
//! pmfs-alloc's aging generator plans for layout score 0.85.
//!
//! Beyond the paper, a 64 KiB append (16 blocks, two HashFS clusters) at each utilisation:
//! parameter `cold-append-16 <percent>%`. A table filled close to its size makes every claim
//! walk far, and the blocks of a cluster walk past the same slots.
//!
//! Group `fig9_utilization`: functions are the structures, parameters `<op> <percent>%`.

use std::time::Instant;

use criterion::{Criterion, criterion_main};
use pmfs_benches::mapping::aging::build_aged_files;
use pmfs_benches::mapping::bench::{bench_op, criterion, group};
use pmfs_benches::mapping::stats::FixtureStats;
use pmfs_benches::mapping::{
    Cache, Fixture, GIB_BLOCKS, Harness, MIB_BLOCKS, Op, OpKind, Structure, Visitor, VolumeSpec,
    for_each_structure,
};
use pmfs_core::Result;

const GROUP: &str = "fig9_utilization";
const CAPACITY_BLOCKS: u64 = 8 * GIB_BLOCKS;
const UTILISATION_PERCENT: [u64; 2] = [80, 95];
const MEASURED_FILE_BLOCKS: u64 = 64 * MIB_BLOCKS;
const FILL_FILE_BLOCKS: u64 = 4 * MIB_BLOCKS;
const LAYOUT_SCORE: f64 = 0.85;
const SEED: u64 = 9;
/// Blocks of the extra append row (64 KiB).
const APPEND_BLOCKS: u64 = 16;

struct Fig9<'c> {
    c: &'c mut Criterion,
    h: Harness,
    stats: FixtureStats,
}

/// A volume `percent` % full whose file 0 is the measured file.
fn filled<S: Structure>(percent: u64) -> Result<Fixture<S>> {
    let spec = VolumeSpec {
        data_blocks: CAPACITY_BLOCKS,
        max_files: 2 + CAPACITY_BLOCKS / FILL_FILE_BLOCKS,
    };
    let mut fx = Fixture::<S>::new(spec)?;
    let target = CAPACITY_BLOCKS * percent / 100;
    let fill_files = (target - MEASURED_FILE_BLOCKS).div_ceil(FILL_FILE_BLOCKS);
    let mut sizes = vec![MEASURED_FILE_BLOCKS];
    sizes.extend(std::iter::repeat_n(FILL_FILE_BLOCKS, fill_files as usize));
    build_aged_files(&mut fx, &sizes, LAYOUT_SCORE, SEED)?;
    Ok(fx)
}

impl Visitor for Fig9<'_> {
    fn visit<S: Structure>(&mut self) -> Result<()> {
        if !S::GLOBAL {
            return Ok(());
        }
        for percent in UTILISATION_PERCENT {
            let t = Instant::now();
            let mut fx = filled::<S>(percent)?;
            self.stats
                .add(&fx, 0, &format!("{percent}% full"), t.elapsed())?;
            let mut g = group(self.c, GROUP);
            for kind in [OpKind::SeqLookup, OpKind::RandLookup, OpKind::Append] {
                let op = Op::new(Cache::Cold, kind, 1);
                let param = format!("{op} {percent}%");
                bench_op(&mut g, &mut self.h, &mut fx, 0, op, param, false, SEED)?;
            }
            let op = Op::new(Cache::Cold, OpKind::Append, APPEND_BLOCKS);
            let param = format!("{op}-{APPEND_BLOCKS} {percent}%");
            bench_op(&mut g, &mut self.h, &mut fx, 0, op, param, false, SEED)?;
            g.finish();
        }
        Ok(())
    }
}

fn fig9() {
    let mut c = criterion();
    let mut fig = Fig9 {
        c: &mut c,
        h: Harness::from_env(),
        stats: FixtureStats::new(
            "Fig. 9 fixtures (space utilisation)",
            "8 GiB volumes filled to 80 % and 95 %; the measured file is 64 MiB at layout \
             score 0.85; utilisation counts every file.",
        ),
    };
    if let Err(e) = for_each_structure(&mut fig) {
        panic!("{GROUP}: {e}");
    }
    if let Err(e) = fig.stats.write("mapping-fig9") {
        panic!("{GROUP}: writing the fixture table: {e}");
    }
}

criterion_main!(fig9);
