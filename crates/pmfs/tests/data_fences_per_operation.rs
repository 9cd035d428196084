//! How many fences each data-path operation issues. A fence on persistent memory waits for
//! every store and flush before it to reach the media, so the count is a cost the design
//! fixes, whatever the machine: a copy-on-write write fences its data, then its commit (the
//! `durable-copy` floor of `data_fig6` does the same two), and a digest, batched over many
//! writes, adds a few of its own. Reads only load: they issue none. The crash simulator's
//! explorer sees every fence on a [`SimRegion`]; each case counts them over many operations
//! on a warmed-up 2 MiB file, on every mapping kind and allocator.
//!
//! Every write must fence at least twice (its data, then its commit): fewer, and it is not
//! durable on return. Block allocation adds none (HashFS's slot claims are made durable by
//! the data's fence, the baseline allocator's bitmap at a clean close), so appends stay
//! within a tenth of a fence of those two on every structure, and so do overwrites on HashFS
//! and the radix tree, whose digests change a word per block. The ceilings of the extent
//! tree and cuckoo, whose digests write more, are near their counts (2.7 and 3.9 per 4 KiB
//! overwrite; the extent tree's was 4.6 before its digests put the runs that split extents
//! several to an undo transaction).

mod data_common;

use std::cell::RefCell;
use std::sync::Arc;

use pmfs::{File, MappingKind, OpenOptions, Options, Volume};
use pmfs_core::pm::Media;
use pmfs_core::sim::{Explorer, SimRegion};

use data_common::{BS, Config, configs, pattern};

/// Operations counted per case.
const OPS: u64 = 200;
/// Blocks of the file the overwrites and reads work on.
const FILE_BLOCKS: u64 = 512;

/// A volume of `kind` on a simulated region, with `/f` of [`FILE_BLOCKS`] blocks open for
/// reading and writing, every block overwritten once (the file's log and the mapping have
/// reached their steady state).
fn setup(cfg: Config) -> (Arc<SimRegion>, Volume, File) {
    let region = Arc::new(SimRegion::new(64 << 20).unwrap());
    let media: Arc<dyn Media> = region.clone();
    let opts = Options {
        allocator: cfg.alloc,
        ..Options::with_mapping(cfg.kind)
    };
    let vol = Volume::format(media, &opts).unwrap();
    vol.write("/f", &pattern(1, (FILE_BLOCKS * BS) as usize))
        .unwrap();
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&vol, "/f")
        .unwrap();
    let block = pattern(2, BS as usize);
    for b in 0..FILE_BLOCKS {
        f.write_at(&block, b * BS).unwrap();
    }
    (region, vol, f)
}

/// The block operation `i` works on: spread over the file, every block in turn.
fn block(i: u64) -> u64 {
    i * 13 % FILE_BLOCKS
}

/// Fences per operation of `op`, called with `0..ops`, on `region`.
fn fences_per_op(region: &SimRegion, ops: u64, op: impl Fn(u64)) -> f64 {
    let explorer = Explorer::new(0).samples(2).exhaustive_limit(1);
    let stats = explorer
        .run(region, |_| (0..ops).for_each(&op), |_| Ok(()))
        .unwrap();
    stats.fences as f64 / ops as f64
}

/// Counts `ops` calls of `op` on every kind and allocator ([`configs`]) and checks each
/// count against `bounds(kind)`.
fn check(
    what: &str,
    ops: u64,
    op: impl Fn(&File, u64),
    bounds: impl Fn(MappingKind) -> (f64, f64),
) {
    for cfg in configs() {
        let (region, _vol, f) = setup(cfg);
        let n = fences_per_op(&region, ops, |i| op(&f, i));
        let (lo, hi) = bounds(cfg.kind);
        eprintln!("{cfg:?} {what}: {n:.2} fences per operation");
        assert!(
            (lo..=hi).contains(&n),
            "{cfg:?} {what}: {n:.2} fences per operation, expected {lo}..={hi}"
        );
    }
}

#[test]
fn reads_issue_no_fence() {
    let buf = RefCell::new(vec![0; BS as usize]);
    check(
        "4 KiB read",
        OPS,
        |f, i| {
            f.read_at(&mut buf.borrow_mut(), block(i) * BS).unwrap();
        },
        |_| (0.0, 0.0),
    );
}

#[test]
fn overwrites_on_hashfs_and_radix_fence_as_often_as_the_floor() {
    let data = pattern(3, BS as usize);
    // The digests of the extent tree and cuckoo fence per replaced run (an undo record for
    // each extent split, whose batch's transaction commits with two more; a `REPLACE` intent
    // for each block inside a longer cuckoo piece): about 0.7 and 1.9 fences more per
    // overwrite.
    let bounds = |kind| match kind {
        MappingKind::HashFs | MappingKind::Radix => (2.0, 2.1),
        MappingKind::Cuckoo => (2.0, 4.5),
        MappingKind::Extent => (2.0, 3.0),
    };
    check(
        "4 KiB overwrite",
        OPS,
        |f, i| f.write_all_at(&data, block(i) * BS).unwrap(),
        bounds,
    );
    check(
        "100 B overwrite",
        OPS,
        |f, i| f.write_all_at(&data[..100], block(i) * BS + 1000).unwrap(),
        bounds,
    );
}

#[test]
fn appends_fence_their_data_and_their_commit() {
    let data = pattern(4, BS as usize);
    check(
        "4 KiB append",
        OPS,
        |f, i| f.write_all_at(&data, (FILE_BLOCKS + i) * BS).unwrap(),
        |_| (2.0, 2.1),
    );
    check(
        "100 B append",
        OPS,
        |f, i| {
            f.write_all_at(&data[..100], FILE_BLOCKS * BS + i * 100)
                .unwrap()
        },
        |_| (2.0, 2.15),
    );
}

#[test]
fn a_large_write_fences_a_few_times_not_per_block() {
    let data = pattern(5, 256 * BS as usize);
    check(
        "1 MiB overwrite",
        16,
        |f, i| f.write_all_at(&data, (i % 2) * 256 * BS).unwrap(),
        |_| (2.0, 8.0),
    );
}
