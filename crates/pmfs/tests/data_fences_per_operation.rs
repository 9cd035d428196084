//! How many fences each data-path operation issues. A fence on persistent memory waits for
//! every store and flush before it to reach the media, so the count is a cost the design
//! fixes, whatever the machine: a copy-on-write write fences its data, then its commit (the
//! `durable-copy` floor of `data_fig6` does the same two), and a digest, batched over many
//! writes, adds a few of its own. Reads only load: they issue none. The crash simulator's
//! explorer sees every fence on a [`SimRegion`]; each case counts them over many operations
//! on a warmed-up 2 MiB file, on every mapping kind.
//!
//! Every write must fence at least twice (its data, then its commit): fewer, and it is not
//! durable on return. HashFS, whose blocks come from slot claims that the commit's fence
//! makes durable, must stay within a tenth of a fence of those two for block writes. The
//! other structures take blocks from the allocator and digest into a tree, and their counts
//! depend on its shape (3.6 to 6.2 per 4 KiB overwrite, 12 per 1 MiB write, when this test
//! was written); their ceilings are loose, a guard against a fence per block.

mod data_common;

use std::cell::RefCell;
use std::sync::Arc;

use pmfs::{File, MappingKind, OpenOptions, Options, Volume};
use pmfs_core::pm::Media;
use pmfs_core::sim::{Explorer, SimRegion};

use data_common::{BS, KINDS, pattern};

/// Operations counted per case.
const OPS: u64 = 200;
/// Blocks of the file the overwrites and reads work on.
const FILE_BLOCKS: u64 = 512;

/// A volume of `kind` on a simulated region, with `/f` of [`FILE_BLOCKS`] blocks open for
/// reading and writing, every block overwritten once (the file's log and the mapping have
/// reached their steady state).
fn setup(kind: MappingKind) -> (Arc<SimRegion>, Volume, File) {
    let region = Arc::new(SimRegion::new(64 << 20).unwrap());
    let media: Arc<dyn Media> = region.clone();
    let vol = Volume::format(media, &Options::with_mapping(kind)).unwrap();
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

/// Counts `ops` calls of `op` on every kind and checks each count against `bounds(kind)`.
fn check(
    what: &str,
    ops: u64,
    op: impl Fn(&File, u64),
    bounds: impl Fn(MappingKind) -> (f64, f64),
) {
    for kind in KINDS {
        let (region, _vol, f) = setup(kind);
        let n = fences_per_op(&region, ops, |i| op(&f, i));
        let (lo, hi) = bounds(kind);
        eprintln!("{kind:?} {what}: {n:.2} fences per operation");
        assert!(
            (lo..=hi).contains(&n),
            "{kind:?} {what}: {n:.2} fences per operation, expected {lo}..={hi}"
        );
    }
}

/// `others` for the structures that take their blocks from the allocator, `hashfs` for
/// HashFS.
fn with_allocator(kind: MappingKind, others: (f64, f64), hashfs: (f64, f64)) -> (f64, f64) {
    match kind {
        MappingKind::HashFs => hashfs,
        _ => others,
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
fn a_hashfs_overwrite_fences_as_often_as_the_floor() {
    let data = pattern(3, BS as usize);
    let bounds = |kind| with_allocator(kind, (2.0, 8.0), (2.0, 2.1));
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
        |kind| with_allocator(kind, (2.0, 3.2), (2.0, 2.1)),
    );
    check(
        "100 B append",
        OPS,
        |f, i| {
            f.write_all_at(&data[..100], FILE_BLOCKS * BS + i * 100)
                .unwrap()
        },
        |_| (2.0, 2.25),
    );
}

#[test]
fn a_large_write_fences_a_few_times_not_per_block() {
    let data = pattern(5, 256 * BS as usize);
    check(
        "1 MiB overwrite",
        16,
        |f, i| f.write_all_at(&data, (i % 2) * 256 * BS).unwrap(),
        |kind| with_allocator(kind, (2.0, 16.0), (2.0, 6.0)),
    );
}
