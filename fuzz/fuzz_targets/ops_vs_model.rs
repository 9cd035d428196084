//! Operation sequences through the path API against the in-memory model
//! ([`pmfs_fuzz::model`]): every result (success, error, data read, metadata, listings) must
//! match the model's prediction. The volume then closes, mounts again, checks clean with fsck
//! and holds exactly the model's tree.
//!
//! With `crash` set, the sequence runs on the crash simulator: at a fuzzer-chosen fence (and
//! image of that fence) the post-crash image is kept; after the run it is recovered, must
//! check clean, and must hold the model's tree from just before or just after the operation
//! that was running when the crash hit.
#![no_main]

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use pmfs::{RenameFlags, Volume, fsck};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion};
use pmfs_fuzz::common::{self, Allocator, Mapping};
use pmfs_fuzz::model::{
    self, Errno, Expect, Model, Path, RenameMode, SYMLINK_TARGET, Stat, path_str,
};

/// A path of up to three components over a three-letter alphabet, so that operations often
/// meet each other's objects.
#[derive(Arbitrary, Clone, Copy, Debug)]
struct P {
    depth: u8,
    names: [u8; 3],
}

impl P {
    fn path(self) -> Path {
        let depth = usize::from(self.depth % 4);
        self.names[..depth]
            .iter()
            .map(|n| ["a", "b", "c"][usize::from(n % 3)].to_owned())
            .collect()
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Mode {
    Replace,
    NoReplace,
    Exchange,
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum Op {
    CreateDir(P),
    /// Open for writing (creating), write `len` bytes of `byte` at `off`.
    Write {
        p: P,
        off: u16,
        len: u16,
        byte: u8,
    },
    SetLen {
        p: P,
        size: u16,
    },
    RemoveFile(P),
    RemoveDir(P),
    Rename {
        from: P,
        to: P,
        mode: Mode,
    },
    HardLink {
        orig: P,
        link: P,
    },
    Symlink(P),
    Read(P),
    Stat {
        p: P,
        follow: bool,
    },
    ReadDir(P),
    /// Close the volume and mount it again.
    Remount,
}

/// Where the crash hits.
#[derive(Arbitrary, Clone, Copy, Debug)]
struct Crash {
    /// The fence (counted over the whole run); past the last one, the end of the run.
    fence: u16,
    /// Which image of that fence (0 is the durable state).
    image: u8,
    /// Let lines stop after any prefix of their stores, not only all or nothing.
    store_prefixes: bool,
}

#[derive(Arbitrary, Debug)]
struct Input {
    mapping: Mapping,
    allocator: Allocator,
    crash: Option<Crash>,
    ops: Vec<Op>,
}

/// Operations beyond this count are ignored.
const MAX_OPS: usize = 48;

/// Largest write offset and length, and largest size: files stay within a few blocks, so
/// the volume (one 2 MiB data group) never fills.
const MAX_OFF: u64 = 12 << 10;
const MAX_LEN: usize = 4 << 10;

fn errno_set<T: std::fmt::Debug>(got: &pmfs::Result<T>) -> Result<(), Errno> {
    match got {
        Ok(_) => Ok(()),
        Err(e) => Err(Errno::of(e).unwrap_or_else(|| panic!("unexpected engine error: {e}"))),
    }
}

/// Compares an engine result with the model's prediction.
fn agree<T: std::fmt::Debug, U: std::fmt::Debug>(
    what: &str,
    got: &pmfs::Result<T>,
    want: &Expect<U>,
) {
    match (errno_set(got), want) {
        (Ok(()), Ok(_)) => {}
        (Err(e), Err(allowed)) if allowed.contains(&e) => {}
        _ => panic!("{what}: engine {got:?}, model {want:?}"),
    }
}

fn stat_of(md: &pmfs::Metadata) -> Stat {
    if md.is_dir() {
        Stat::Dir { nlink: md.nlink() }
    } else if md.is_symlink() {
        Stat::Symlink { len: md.len() }
    } else {
        Stat::File {
            len: md.len(),
            nlink: md.nlink(),
        }
    }
}

/// Runs one operation on the volume and the model and compares; returns the volume (a new
/// mount after `Remount`).
fn step(vol: Volume, media: &Arc<dyn Media>, m: &mut Model, op: Op) -> Volume {
    let vol = match op {
        Op::Remount => {
            vol.close().expect("clean close");
            return Volume::mount(media.clone()).expect("mount after a clean close");
        }
        _ => vol,
    };
    let vol = &vol;
    match op {
        Op::CreateDir(p) => {
            let p = p.path();
            agree(
                "create_dir",
                &vol.create_dir(&path_str(&p)),
                &m.create_dir(&p),
            );
        }
        Op::Write { p, off, len, byte } => {
            let p = p.path();
            let off = u64::from(off) % MAX_OFF;
            let data = vec![byte; usize::from(len) % MAX_LEN];
            let got = pmfs::OpenOptions::new()
                .write(true)
                .create(true)
                .open(vol, &path_str(&p))
                .and_then(|f| f.write_all_at(&data, off));
            agree("write", &got, &m.write(&p, off, &data));
        }
        Op::SetLen { p, size } => {
            let p = p.path();
            let size = u64::from(size) % MAX_OFF;
            let got = pmfs::OpenOptions::new()
                .write(true)
                .open(vol, &path_str(&p))
                .and_then(|f| f.set_len(size));
            agree("set_len", &got, &m.set_len(&p, size));
        }
        Op::RemoveFile(p) => {
            let p = p.path();
            agree(
                "remove_file",
                &vol.remove_file(&path_str(&p)),
                &m.remove_file(&p),
            );
        }
        Op::RemoveDir(p) => {
            let p = p.path();
            agree(
                "remove_dir",
                &vol.remove_dir(&path_str(&p)),
                &m.remove_dir(&p),
            );
        }
        Op::Rename { from, to, mode } => {
            let (from, to) = (from.path(), to.path());
            let (flags, mmode) = match mode {
                Mode::Replace => (RenameFlags::default(), RenameMode::Replace),
                Mode::NoReplace => (
                    RenameFlags {
                        noreplace: true,
                        ..RenameFlags::default()
                    },
                    RenameMode::NoReplace,
                ),
                Mode::Exchange => (
                    RenameFlags {
                        exchange: true,
                        ..RenameFlags::default()
                    },
                    RenameMode::Exchange,
                ),
            };
            let got = vol.rename_with(&path_str(&from), &path_str(&to), flags);
            agree("rename", &got, &m.rename(&from, &to, mmode));
        }
        Op::HardLink { orig, link } => {
            let (orig, link) = (orig.path(), link.path());
            let got = vol.hard_link(&path_str(&orig), &path_str(&link));
            agree("hard_link", &got, &m.hard_link(&orig, &link));
        }
        Op::Symlink(p) => {
            let p = p.path();
            let got = vol.symlink(SYMLINK_TARGET, &path_str(&p));
            agree("symlink", &got, &m.symlink(&p));
        }
        Op::Read(p) => {
            let p = p.path();
            let got = vol.read(&path_str(&p));
            let want = m.read(&p);
            agree("read", &got, &want);
            if let (Ok(g), Ok(w)) = (&got, &want) {
                assert!(
                    g == w,
                    "read {}: content differs from the model",
                    path_str(&p)
                );
            }
        }
        Op::Stat { p, follow } => {
            let p = p.path();
            let s = path_str(&p);
            let got = if follow {
                vol.metadata(&s)
            } else {
                vol.symlink_metadata(&s)
            };
            let want = m.stat(&p, follow);
            agree("stat", &got, &want);
            if let (Ok(g), Ok(w)) = (&got, &want) {
                assert_eq!(&stat_of(g), w, "stat {s}");
            }
        }
        Op::ReadDir(p) => {
            let p = p.path();
            let got = vol.read_dir(&path_str(&p)).map(|rd| {
                let mut names: Vec<String> = rd
                    .map(|e| {
                        e.expect("listing entry")
                            .file_name()
                            .into_string()
                            .expect("utf-8")
                    })
                    .collect();
                names.sort();
                names
            });
            let want = m.read_dir(&p);
            agree("read_dir", &got, &want);
            if let (Ok(g), Ok(w)) = (&got, &want) {
                assert_eq!(g, w, "read_dir {}", path_str(&p));
            }
        }
        // Handled above.
        Op::Remount => {}
    }
    vol.clone()
}

/// Recovers `image`, checks it clean and returns its tree.
fn recover(image: &[u8]) -> model::Snapshot {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::from_image(image).expect("heap region"));
    let vol = Volume::mount(media.clone()).unwrap_or_else(|e| panic!("recovery failed: {e}"));
    let snap = model::snapshot_volume(&vol).unwrap_or_else(|e| panic!("after recovery: {e}"));
    vol.close().expect("close after recovery");
    let report = fsck::check(media).expect("fsck after recovery");
    assert!(
        report.is_clean(),
        "fsck after recovery: {:#?}",
        report.problems
    );
    snap
}

fuzz_target!(|input: Input| {
    let ops = &input.ops[..input.ops.len().min(MAX_OPS)];
    let fresh = common::formatted(input.mapping, input.allocator);
    let mut m = Model::new();
    match input.crash {
        None => {
            let media = common::region(fresh);
            let mut vol = Volume::mount(media.clone()).expect("mount of a new volume");
            for &op in ops {
                vol = step(vol, &media, &mut m, op);
            }
            vol.close().expect("clean close");
            let report = fsck::check(media.clone()).expect("fsck");
            assert!(report.is_clean(), "fsck: {:#?}", report.problems);
            let vol = Volume::mount(media).expect("mount after a clean close");
            assert_eq!(model::snapshot_volume(&vol).expect("walk"), m.snapshot());
        }
        Some(crash) => {
            let sim = Arc::new(SimRegion::from_image(fresh).expect("simulated region"));
            let media: Arc<dyn Media> = sim.clone();
            let vol = Volume::mount(media.clone()).expect("mount of a new volume");
            sim.persist_all();
            // Model trees after each completed operation; `done` operations have returned.
            let states = RefCell::new(vec![m.snapshot()]);
            // A write that creates its file is two engine calls, each atomic on its own: the
            // open creates the empty file, the write fills it. The tree between them, per op.
            let between = RefCell::new(Vec::new());
            let done = Cell::new(0usize);
            let mut kept: Option<(Vec<u8>, usize)> = None;
            let mut vol = Some(vol);
            Explorer::new(u64::from(crash.fence))
                .exhaustive_limit(4)
                .samples(4)
                .store_prefixes(crash.store_prefixes)
                .run(
                    &sim,
                    |_| {
                        let mut v = vol.take().expect("volume");
                        for &op in ops {
                            let mut opened = m.clone();
                            between.borrow_mut().push(match op {
                                Op::Write { p, .. } => opened
                                    .write(&p.path(), 0, &[])
                                    .ok()
                                    .map(|()| opened.snapshot()),
                                _ => None,
                            });
                            v = step(v, &media, &mut m, op);
                            states.borrow_mut().push(m.snapshot());
                            done.set(done.get() + 1);
                        }
                        vol = Some(v);
                    },
                    |cp| {
                        let hit = cp.fence == u64::from(crash.fence)
                            && (kept.is_none() || cp.index == u64::from(crash.image % 4));
                        if hit || (cp.end && kept.is_none()) {
                            kept = Some((cp.image.to_vec(), done.get()));
                        }
                        Ok(())
                    },
                )
                .expect("keeping images never fails");
            drop(vol);
            let (image, k) = kept.expect("the end of the run is a crash point");
            let got = recover(&image);
            let states = states.borrow();
            let before = &states[k];
            let after = states.get(k + 1).unwrap_or(before);
            let mid = between.borrow().get(k).cloned().flatten();
            assert!(
                &got == before || &got == after || Some(&got) == mid.as_ref(),
                "after a crash during operation {k} ({:?}): recovered {got:#?}\nbefore {before:#?}\nafter {after:#?}",
                ops.get(k)
            );
        }
    }
});
