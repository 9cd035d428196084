//! Seeded random sequences of namespace and data operations, cut by a crash at every fence.
//! Each operation meets what the ones before it left on the media (the fragments of removed
//! entries, renamed inodes, reused inode numbers and blocks, files held open after unlink,
//! holes, blocks allocated past the end of file, extended attributes beside the data, logs
//! that the engine compacts), which the crash tests of single operations on a fixed tree
//! never show it. At each crash image it explores, the harness checks what theirs does: fsck
//! of the image names the crash alone, recovery succeeds, fsck is clean after it, and the
//! volume is the one before or after the operation the crash cut (after, once it returned):
//! its namespace, every file's contents, and every object's permission bits and extended
//! attributes.
//!
//! Two sequences of 12 operations per mapping; `PMFS_CRASH_SEQUENCES=N` runs `N` (the first
//! `N` seeds of each mapping), `PMFS_CRASH_SEQUENCES=A..B` the seeds `A..B` of each mapping
//! (to go on from seeds already explored), and `PMFS_CRASH_SEQUENCE` the one of that seed
//! alone. Images sampled per crash point: 8, or `PMFS_CRASH_SAMPLES`.

mod common;
#[path = "data_common/rng.rs"]
mod rng;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::Arc;

use pmfs::{
    File, Ino, MappingKind, OpenMode, OpenNode, OpenOptions, Permissions, RenameFlags, Volume,
    XattrSet,
};
use pmfs_core::log::ENTRIES_PER_BLOCK;
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::SimRegion;

use common::crash::{SIM_SIZE, light_explorer, recover_and_check_with, sim_options};
use common::crash_image::check_crashed;
use common::{Snapshot, snapshot};
use rng::Rng;

const DIRS: [&str; 3] = ["", "/d", "/d/e"];
/// Names of a few lengths, so that new entries fit the fragments removed ones leave.
const NAMES: [&str; 5] = ["a", "b", "xy", "name-of-twenty-bytes", "c"];
/// Names of extended attributes.
const XATTRS: [&str; 3] = ["user.a", "user.bb", "trusted.long-attribute-name"];
const OPS: usize = 12;

#[derive(Clone, Debug)]
enum Op {
    Create(String),
    Write(String, u64, usize),
    Append(String, usize),
    Truncate(String, u64),
    /// `fallocate`: offset, length, keep the size.
    Allocate(String, u64, u64, bool),
    /// `FALLOC_FL_ZERO_RANGE`: offset, length, keep the size.
    ZeroRange(String, u64, u64, bool),
    PunchHole(String, u64, u64),
    /// `copy_file_range` from the first file to the second: offset, offset, length.
    Copy(String, String, u64, u64, u64),
    /// A write to the file held open longest after its unlink: offset, length.
    WriteHeld(u64, usize),
    SetXattr(String, usize, usize),
    RemoveXattr(String, usize),
    Chmod(String, u32),
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
    let (at, len) = (rng.range(0, 6 * 4096), rng.range(1, 3 * 4096));
    match rng.range(0, 21) {
        0 => Op::Create(a),
        1 | 2 => Op::Write(a, rng.range(0, 6000), len as usize),
        3 => Op::Append(a, rng.range(1, 5000) as usize),
        4 => Op::Truncate(a, rng.range(0, 9000)),
        5 => Op::Allocate(a, at, len, rng.range(0, 1) == 1),
        6 => Op::ZeroRange(a, at, len, rng.range(0, 1) == 1),
        7 => Op::PunchHole(a, at, len),
        8 => Op::Copy(a, b, rng.range(0, 6000), at, len),
        9 => Op::WriteHeld(at, len as usize),
        10 => Op::SetXattr(a, rng.range(0, 2) as usize, rng.range(0, 600) as usize),
        11 => Op::RemoveXattr(a, rng.range(0, 2) as usize),
        12 => Op::Chmod(a, [0o600, 0o755, 0o4711][rng.range(0, 2) as usize]),
        13 => Op::Unlink(a),
        14 => Op::UnlinkHeld(a),
        15 | 16 => Op::Rename(a, b),
        17 => Op::Link(a, b),
        18 => Op::Mkdir(a),
        19 => Op::Rmdir(a),
        20 => Op::Exchange(a, b),
        _ => Op::Symlink(b, a),
    }
}

/// Bytes of a write: they tell the operation that wrote them.
fn content(tag: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (tag * 31 + i % 251) as u8).collect()
}

/// The object at `p`, without following a final symbolic link.
fn ino(v: &Volume, p: &str) -> pmfs::Result<Ino> {
    let md = v.symlink_metadata(p)?;
    Ok(Ino::from_raw(u64::from(md.generation()) << 32 | md.ino()))
}

/// The regular file at `p`, open for reading and writing.
fn node(v: &Volume, p: &str) -> pmfs::Result<OpenNode> {
    let mode = OpenMode {
        read: true,
        write: true,
        truncate: false,
    };
    v.open_ino(ino(v, p)?, mode)
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
        Op::Allocate(p, at, len, keep) => node(v, p)?.allocate(*at, *len, *keep),
        Op::ZeroRange(p, at, len, keep) => node(v, p)?.zero_range(*at, *len, *keep),
        Op::PunchHole(p, at, len) => node(v, p)?.punch_hole(*at, *len),
        Op::Copy(from, to, at, to_at, len) => {
            let (from, to) = (node(v, from)?, node(v, to)?);
            from.copy_range(*at, &to, *to_at, *len).map(drop)
        }
        Op::WriteHeld(at, len) => match held.first() {
            Some(f) => f.write_at(&content(tag, *len), *at).map(drop),
            None => Err(pmfs::Error::InvalidArgument("no file is held")),
        },
        Op::SetXattr(p, name, len) => v
            .set_xattr(
                ino(v, p)?,
                XATTRS[*name].as_bytes(),
                &content(tag, *len),
                XattrSet::Any,
            )
            .map(drop),
        Op::RemoveXattr(p, name) => v
            .remove_xattr(ino(v, p)?, XATTRS[*name].as_bytes())
            .map(drop),
        Op::Chmod(p, perm) => v.set_permissions(p, Permissions::from_mode(*perm)),
        Op::Unlink(p) => v.remove_file(p),
        Op::UnlinkHeld(p) => {
            let f = OpenOptions::new().read(true).write(true).open(v, p)?;
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

/// An object's extended attributes, by name.
type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// What a crash must keep whole: the namespace with every file's contents, and each object's
/// permission bits and extended attributes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    tree: Snapshot,
    attrs: BTreeMap<String, (u32, Xattrs)>,
}

fn state(v: &Volume) -> State {
    let tree = snapshot(v);
    let attrs = tree
        .objects
        .keys()
        .map(|p| {
            let perm = v.symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
            let ino = ino(v, p).unwrap();
            let mut xattrs: Vec<_> = v
                .list_xattr(ino)
                .unwrap()
                .into_iter()
                .map(|n| {
                    let value = v.get_xattr(ino, &n).unwrap().unwrap();
                    (n, value)
                })
                .collect();
            xattrs.sort();
            (p.clone(), (perm, xattrs))
        })
        .collect();
    State { tree, attrs }
}

/// The tree every sequence of `seed` starts from. `/a` and `/d/b` were each written a log
/// block's worth of times less two to four (as `seed` says), so that their first few updates
/// make the engine compact their logs: the sequence's operations meet a compaction, on the
/// file at its name, renamed, linked or held open after its unlink.
fn tree(v: &Volume, seed: u64) {
    v.create_dir("/d").unwrap();
    v.create_dir("/d/e").unwrap();
    v.write("/a", b"root file").unwrap();
    v.write("/d/b", &content(99, 5000)).unwrap();
    let mut rng = Rng::new(!seed);
    for p in ["/a", "/d/b"] {
        let f = OpenOptions::new().write(true).open(v, p).unwrap();
        let size = f.metadata().unwrap().len();
        for i in 0..ENTRIES_PER_BLOCK - rng.range(2, 4) {
            f.write_at(&[i as u8], rng.range(0, size - 1)).unwrap();
        }
    }
}

/// A sequence of `OPS` operations that succeed one after the other from [`tree`], and the
/// state of the volume before the first and after each.
fn sequence(kind: MappingKind, seed: u64) -> (Vec<Op>, Vec<State>) {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
    let v = Volume::format(media, &sim_options(kind)).unwrap();
    tree(&v, seed);
    let mut rng = Rng::new(seed);
    let mut held = Vec::new();
    let (mut ops, mut snaps) = (Vec::new(), vec![state(&v)]);
    while ops.len() < OPS {
        let op = random_op(&mut rng);
        if apply(&v, ops.len(), &op, &mut held).is_ok() {
            ops.push(op);
            snaps.push(state(&v));
        }
    }
    (ops, snaps)
}

fn check_sequence(kind: MappingKind, seed: u64) {
    let (ops, snaps) = sequence(kind, seed);
    let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
    let v = Volume::format(region.clone(), &sim_options(kind)).unwrap();
    tree(&v, seed);
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
                let (i, returned) = (at.get(), done.get());
                let fail = |e: String| {
                    format!(
                        "{kind:?}, sequence {seed}, a crash in operation {i} ({:?}, returned: \
                         {returned}): {e}\nthe sequence: {ops:#?}",
                        ops[i]
                    )
                };
                check_crashed(cp.image).map_err(fail)?;
                let got = recover_and_check_with(cp.image, state).map_err(fail)?;
                if got == snaps[i + 1] || (got == snaps[i] && !returned) {
                    Ok(())
                } else {
                    Err(fail(format!(
                        "the volume is neither the one before nor after it:\n\
                         got {got:#?}\nbefore {:#?}\nafter {:#?}",
                        snaps[i],
                        snaps[i + 1]
                    )))
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
    drop(held);
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The seeds `PMFS_CRASH_SEQUENCES` asks for, relative to a mapping's first seed: `N` or
/// `A..B` (at most 1000, the seeds of one mapping).
fn seed_offsets() -> std::ops::Range<u64> {
    let Ok(v) = std::env::var("PMFS_CRASH_SEQUENCES") else {
        return 0..2;
    };
    let bad = || panic!("PMFS_CRASH_SEQUENCES is N or A..B with A <= B <= 1000, not {v:?}");
    let range = match v.trim().split_once("..") {
        Some((a, b)) => {
            a.trim().parse().unwrap_or_else(|_| bad())..b.trim().parse().unwrap_or_else(|_| bad())
        }
        None => 0..v.trim().parse().unwrap_or_else(|_| bad()),
    };
    if range.start > range.end || range.end > 1000 {
        bad();
    }
    range
}

/// The sequences of one mapping, seeded from `first_seed` on (a test per mapping: they run in
/// parallel), or the one `PMFS_CRASH_SEQUENCE` names if it is one of them (what a failure
/// reports, to run it again alone).
fn sequences_are_atomic(kind: MappingKind, first_seed: u64) {
    let offsets = seed_offsets();
    let seeds = first_seed + offsets.start..first_seed + offsets.end;
    match env("PMFS_CRASH_SEQUENCE") {
        Some(seed) if (first_seed..first_seed + 1000).contains(&seed) => check_sequence(kind, seed),
        Some(_) => {}
        None => seeds.for_each(|seed| check_sequence(kind, seed)),
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
