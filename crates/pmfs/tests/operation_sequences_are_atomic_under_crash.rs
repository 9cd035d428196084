//! Seeded random sequences of namespace and data operations, cut by a crash at every fence.
//! Each operation meets what the ones before it left on the media (the fragments of removed
//! entries, renamed inodes, reused inode numbers and blocks, files held open after unlink),
//! which the crash tests of single operations on a fixed tree never show it. At each crash
//! image it explores, the harness checks what theirs does: fsck of the image names the
//! crash alone, recovery succeeds, fsck is clean after it, and the namespace is the one
//! before or after the operation the crash cut (after, once it returned).
//!
//! Two sequences of 12 operations per mapping; `PMFS_CRASH_SEQUENCES` runs more. Images
//! sampled per crash point: 8, or `PMFS_CRASH_SAMPLES`.

mod common;
#[path = "data_common/rng.rs"]
mod rng;

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use pmfs::{File, MappingKind, OpenOptions, RenameFlags, Volume};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::SimRegion;

use common::crash::{SIM_SIZE, light_explorer, recover_and_check, sim_options};
use common::crash_image::check_crashed;
use common::{Snapshot, snapshot};
use rng::Rng;

const DIRS: [&str; 3] = ["", "/d", "/d/e"];
/// Names of a few lengths, so that new entries fit the fragments removed ones leave.
const NAMES: [&str; 5] = ["a", "b", "xy", "name-of-twenty-bytes", "c"];
const OPS: usize = 12;

#[derive(Clone, Debug)]
enum Op {
    Create(String),
    Write(String, u64, usize),
    Append(String, usize),
    Truncate(String, u64),
    Unlink(String),
    UnlinkHeld(String),
    Rename(String, String),
    Exchange(String, String),
    Link(String, String),
    Mkdir(String),
    Rmdir(String),
    Symlink(String, String),
}

fn path(rng: &mut Rng) -> String {
    let d = DIRS[rng.range(0, DIRS.len() as u64 - 1) as usize];
    let n = NAMES[rng.range(0, NAMES.len() as u64 - 1) as usize];
    format!("{d}/{n}")
}

fn random_op(rng: &mut Rng) -> Op {
    let (a, b) = (path(rng), path(rng));
    match rng.range(0, 12) {
        0 => Op::Create(a),
        1 => Op::Write(a, rng.range(0, 6000), rng.range(1, 3 * 4096) as usize),
        2 => Op::Append(a, rng.range(1, 5000) as usize),
        3 => Op::Truncate(a, rng.range(0, 9000)),
        4 => Op::Unlink(a),
        5 => Op::UnlinkHeld(a),
        6 | 7 => Op::Rename(a, b),
        8 => Op::Link(a, b),
        9 => Op::Mkdir(a),
        10 => Op::Rmdir(a),
        11 => Op::Exchange(a, b),
        _ => Op::Symlink(b, a),
    }
}

/// Bytes of a write: they tell the operation that wrote them.
fn content(tag: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (tag * 31 + i % 251) as u8).collect()
}

/// Runs `op` (the `tag`th of its sequence); files unlinked while open stay in `held`.
fn apply(v: &Volume, tag: usize, op: &Op, held: &mut Vec<File>) -> pmfs::Result<()> {
    match op {
        Op::Create(p) => OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(v, p)
            .map(drop),
        Op::Write(p, at, len) => {
            let f = OpenOptions::new().write(true).open(v, p)?;
            f.write_at(&content(tag, *len), *at).map(drop)
        }
        Op::Append(p, len) => {
            let f = OpenOptions::new().append(true).open(v, p)?;
            f.write_at(&content(tag, *len), 0).map(drop)
        }
        Op::Truncate(p, len) => OpenOptions::new().write(true).open(v, p)?.set_len(*len),
        Op::Unlink(p) => v.remove_file(p),
        Op::UnlinkHeld(p) => {
            let f = OpenOptions::new().read(true).open(v, p)?;
            v.remove_file(p)?;
            held.push(f);
            Ok(())
        }
        Op::Rename(from, to) => v.rename(from, to),
        Op::Exchange(a, b) => v.rename_with(
            a,
            b,
            RenameFlags {
                exchange: true,
                ..RenameFlags::default()
            },
        ),
        Op::Link(from, to) => v.hard_link(from, to),
        Op::Mkdir(p) => v.create_dir(p),
        Op::Rmdir(p) => v.remove_dir(p),
        Op::Symlink(target, p) => v.symlink(target, p),
    }
}

fn tree(v: &Volume) {
    v.create_dir("/d").unwrap();
    v.create_dir("/d/e").unwrap();
    v.write("/a", b"root file").unwrap();
    v.write("/d/b", &content(99, 5000)).unwrap();
}

/// A sequence of `OPS` operations that succeed one after the other from [`tree`], and the
/// namespace before the first and after each.
fn sequence(kind: MappingKind, seed: u64) -> (Vec<Op>, Vec<Snapshot>) {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
    let v = Volume::format(media, &sim_options(kind)).unwrap();
    tree(&v);
    let mut rng = Rng::new(seed);
    let mut held = Vec::new();
    let (mut ops, mut snaps) = (Vec::new(), vec![snapshot(&v)]);
    while ops.len() < OPS {
        let op = random_op(&mut rng);
        if apply(&v, ops.len(), &op, &mut held).is_ok() {
            ops.push(op);
            snaps.push(snapshot(&v));
        }
    }
    (ops, snaps)
}

fn check_sequence(kind: MappingKind, seed: u64) {
    let (ops, snaps) = sequence(kind, seed);
    let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
    let v = Volume::format(region.clone(), &sim_options(kind)).unwrap();
    tree(&v);
    region.persist_all();
    let held = RefCell::new(Vec::new());
    let (at, done) = (Cell::new(0), Cell::new(false));
    light_explorer(seed)
        .run(
            &region,
            |_| {
                for (i, op) in ops.iter().enumerate() {
                    at.set(i);
                    done.set(false);
                    apply(&v, i, op, &mut held.borrow_mut()).unwrap();
                    done.set(true);
                }
            },
            |cp| {
                check_crashed(cp.image)?;
                let got = recover_and_check(cp.image)?;
                let i = at.get();
                if got == snaps[i + 1] || (got == snaps[i] && !done.get()) {
                    Ok(())
                } else {
                    Err(format!(
                        "{kind:?}, sequence {seed}: after a crash in operation {i} ({:?}, \
                         returned: {}) the namespace is neither the one before nor after it:\n\
                         got {got:#?}\nbefore {:#?}\nafter {:#?}\nthe sequence: {ops:#?}",
                        ops[i],
                        done.get(),
                        snaps[i],
                        snaps[i + 1]
                    ))
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
    drop(held);
}

fn sequences() -> u64 {
    std::env::var("PMFS_CRASH_SEQUENCES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(2)
}

/// The sequences of one mapping, seeded from `first_seed` (a test per mapping: they run in
/// parallel).
fn sequences_are_atomic(kind: MappingKind, first_seed: u64) {
    for s in 0..sequences() {
        check_sequence(kind, first_seed + s);
    }
}

#[test]
fn on_the_extent_tree() {
    sequences_are_atomic(MappingKind::Extent, 0);
}

#[test]
fn on_the_radix_tree() {
    sequences_are_atomic(MappingKind::Radix, 1000);
}

#[test]
fn on_the_cuckoo_hash() {
    sequences_are_atomic(MappingKind::Cuckoo, 2000);
}

#[test]
fn on_hashfs() {
    sequences_are_atomic(MappingKind::HashFs, 3000);
}
