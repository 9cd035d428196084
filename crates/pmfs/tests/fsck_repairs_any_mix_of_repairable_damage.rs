//! fsck's repair takes any mix of the damage it is meant to repair, on every mapping structure
//! and every allocator: files and directories whose inodes died under their names, wrong link
//! counts, wrong parent pointers, live inodes no entry names, files whose holes lost their
//! mark, mapped ends below their blocks, sizes below them and damaged extended attributes.
//! The repair must succeed and leave the volume checking clean, and a second repair must find
//! nothing. Every file whose inode was not killed must read as before (up to its damaged size)
//! under each of its names outside killed directories, or from `/lost+found` when it has none
//! left, with its extended attribute unless that was damaged; every stray inode must be in
//! `/lost+found`; and new files (which get the numbers of the killed inodes) must map nothing.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use pmfs::{AllocatorKind, Ino, MappingKind, Options, Volume, VolumeInfo, XattrSet, fsck};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::{HeapRegion, Media};
use proptest::prelude::*;

use common::{KINDS, SIZE, open_rw, options, remount};

const BS: usize = 4096;
/// Inode record fields, in bytes from the record's start.
const STATE: u64 = 0;
const FLAGS_WORD: u64 = 16;
const NLINK: u64 = 24;
const SIZE_WORD: u64 = 32;
const PARENT: u64 = 80;
const XATTR: u64 = 96;
const MAPPED_END: u64 = 120;
/// The live bit of the state word, and the holes mark in the flags word.
const LIVE: u64 = 1 << 63;
const HOLES: u64 = 1 << 48;
/// Stray inodes are made at `STRAY_BASE + k`, inside the test volumes' 2048 inodes.
const STRAY_BASE: u64 = 1500;

/// The files of a populated volume: their names and contents. The first one has a second
/// name; the last one is sparse.
fn files() -> Vec<(Vec<&'static str>, Vec<u8>)> {
    let pattern = |n: usize, seed: u8| -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
    };
    let mut sparse = vec![0u8; 5 * BS];
    sparse[3 * BS..3 * BS + 5].copy_from_slice(b"holey");
    vec![
        (vec!["/a/f0", "/c/link"], pattern(9000, 1)),
        (vec!["/a/b/f1"], b"1".to_vec()),
        (vec!["/c/f2"], pattern(16 * BS, 2)),
        (vec!["/a/f3"], Vec::new()),
        (vec!["/c/f4"], pattern(3 * BS, 4)),
        (vec!["/f5"], sparse),
    ]
}

/// The directories damage may hit (each file keeps a name outside them or has none left).
const DIRS: [&str; 2] = ["/a/b", "/c"];

/// A populated volume: its media, layout, and the inode numbers of [`files`] and [`DIRS`].
fn populated(
    kind: MappingKind,
    allocator: AllocatorKind,
) -> (Arc<dyn Media>, VolumeInfo, Vec<u64>, Vec<u64>) {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIZE).unwrap());
    let opts = Options {
        allocator,
        ..options(kind)
    };
    let vol = Volume::format(media.clone(), &opts).unwrap();
    vol.create_dir_all("/a/b").unwrap();
    vol.create_dir("/c").unwrap();
    vol.symlink("/a", "/s").unwrap();
    let mut inos = Vec::new();
    for (names, data) in files() {
        let (first, others) = names.split_first().unwrap();
        if first == &"/f5" {
            let f = open_rw(&vol, first);
            f.set_len(data.len() as u64).unwrap();
            f.write_all_at(b"holey", 3 * BS as u64).unwrap();
        } else {
            vol.write(first, &data).unwrap();
        }
        for other in others {
            vol.hard_link(first, other).unwrap();
        }
        let md = vol.metadata(first).unwrap();
        let ino = Ino::from_raw(u64::from(md.generation()) << 32 | md.ino());
        vol.set_xattr(ino, b"user.name", first.as_bytes(), XattrSet::Any)
            .unwrap();
        inos.push(md.ino());
    }
    let dirs = DIRS.map(|d| vol.metadata(d).unwrap().ino()).to_vec();
    let info = vol.info();
    vol.close().unwrap();
    (media, info, inos, dirs)
}

/// One piece of damage; file indices are taken modulo the number of files.
#[derive(Clone, Copy, Debug)]
enum Damage {
    /// The file's inode dies under its names.
    Kill(usize),
    /// The file's link count becomes this.
    Nlink(usize, u8),
    /// A live, well-formed file inode that no entry names, at `STRAY_BASE + k`.
    Stray(u8),
    /// The file loses its holes mark.
    ClearHoles(usize),
    /// The file's mapped end drops to block 0.
    LowMappedEnd(usize),
    /// The checksum in the file's extended-attribute word no longer matches.
    Xattrs(usize),
    /// The file's size drops to the given fraction (in 256ths): its blocks past the new end
    /// are cut off.
    Shrink(usize, u8),
    /// The directory of [`DIRS`] dies under its name, with its entries.
    KillDir(usize),
    /// The directory's parent pointer names the other directory of [`DIRS`].
    Parent(usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0usize..8).prop_map(Damage::Kill),
        (0usize..8, 0u8..5).prop_map(|(i, n)| Damage::Nlink(i, n)),
        (0u8..4).prop_map(Damage::Stray),
        (0usize..8).prop_map(Damage::ClearHoles),
        (0usize..8).prop_map(Damage::LowMappedEnd),
        (0usize..8).prop_map(Damage::Xattrs),
        (0usize..8, any::<u8>()).prop_map(|(i, f)| Damage::Shrink(i, f)),
        (0usize..2).prop_map(Damage::KillDir),
        (0usize..2).prop_map(Damage::Parent),
    ]
}

/// What the damage did.
#[derive(Default)]
struct Done {
    /// Indices of the files whose inodes died.
    killed: BTreeSet<usize>,
    /// Indices of the directories of [`DIRS`] whose inodes died.
    killed_dirs: BTreeSet<usize>,
    /// Indices of the files whose link count is 0.
    unlinked: BTreeSet<usize>,
    /// Stray inode numbers.
    strays: BTreeSet<u64>,
    /// Indices of the files whose extended attributes were damaged.
    lost_xattrs: BTreeSet<usize>,
    /// The size of each file.
    sizes: Vec<usize>,
}

/// Applies `damages` to the volume [`populated`] made, whose files and directories have the
/// inode numbers `inos` and `dirs`.
fn apply(
    media: &Arc<dyn Media>,
    info: &VolumeInfo,
    (inos, dirs): (&[u64], &[u64]),
    damages: &[Damage],
) -> Done {
    let record = |ino: u64| info.inode_table_offset + ino * info.inode_size;
    let word = |ino: u64, field: u64| PmOff(record(ino) + field);
    let update = |ino: u64, field: u64, f: &dyn Fn(u64) -> u64| {
        let w = word(ino, field);
        media.store_u64(w, f(media.load_u64(w).unwrap())).unwrap();
    };
    let mut done = Done {
        sizes: files().iter().map(|(_, data)| data.len()).collect(),
        ..Done::default()
    };
    for d in damages {
        match *d {
            Damage::Kill(i) => {
                let i = i % inos.len();
                update(inos[i], STATE, &|w| w & !LIVE);
                done.killed.insert(i);
            }
            Damage::Nlink(i, n) => {
                let i = i % inos.len();
                update(inos[i], NLINK, &|_| u64::from(n));
                if n == 0 {
                    done.unlinked.insert(i);
                } else {
                    done.unlinked.remove(&i);
                }
            }
            Damage::Stray(k) => {
                let ino = STRAY_BASE + u64::from(k);
                let mut rec = [0u8; 128];
                rec[0..8].copy_from_slice(&(LIVE | 1).to_le_bytes());
                rec[8..12].copy_from_slice(&0o100644u32.to_le_bytes());
                rec[20..22].copy_from_slice(&1u16.to_le_bytes());
                rec[24..32].copy_from_slice(&1u64.to_le_bytes());
                media.write(PmOff(record(ino)), &rec).unwrap();
                done.strays.insert(ino);
            }
            Damage::ClearHoles(i) => update(inos[i % inos.len()], FLAGS_WORD, &|w| w & !HOLES),
            Damage::LowMappedEnd(i) => update(inos[i % inos.len()], MAPPED_END, &|_| 0),
            Damage::Xattrs(i) => {
                let i = i % inos.len();
                update(inos[i], XATTR, &|w| w ^ 1 << 40);
                // A second flip puts the checksum back.
                if !done.lost_xattrs.insert(i) {
                    done.lost_xattrs.remove(&i);
                }
            }
            Damage::Shrink(i, fraction) => {
                let i = i % inos.len();
                done.sizes[i] = done.sizes[i] * usize::from(fraction) / 256;
                update(inos[i], SIZE_WORD, &|_| done.sizes[i] as u64);
            }
            Damage::KillDir(j) => {
                update(dirs[j], STATE, &|w| w & !LIVE);
                done.killed_dirs.insert(j);
            }
            Damage::Parent(j) => {
                let other = dirs[1 - j];
                let generation = media.load_u64(word(other, STATE)).unwrap() & 0xffff_ffff;
                update(dirs[j], PARENT, &|_| generation << 32 | other);
            }
        }
    }
    done
}

fn repaired(kind: MappingKind, allocator: AllocatorKind, damages: &[Damage]) -> Result<(), String> {
    let (media, info, inos, dirs) = populated(kind, allocator);
    let done = apply(&media, &info, (&inos, &dirs), damages);
    let fixed = fsck::repair(media.clone()).map_err(|e| format!("repair failed: {e}"))?;
    if !fixed.after.is_clean() {
        return Err(format!("left after repair: {:#?}", fixed.after.problems));
    }
    let again = fsck::repair(media.clone()).map_err(|e| format!("second repair: {e}"))?;
    if !again.before.is_clean() || !again.actions.is_empty() {
        return Err(format!(
            "a second repair found {:#?}\nand did {:?}",
            again.before.problems, again.actions
        ));
    }
    let vol = remount(&media);
    let in_killed_dir = |name: &str| {
        done.killed_dirs
            .iter()
            .any(|&j| name.starts_with(&format!("{}/", DIRS[j])))
    };
    for (i, (names, data)) in files().into_iter().enumerate() {
        let lost = format!("/lost+found/#{}", inos[i]);
        let first = names[0];
        let (gone, kept): (Vec<&str>, Vec<&str>) =
            names.into_iter().partition(|n| in_killed_dir(n));
        // A live file without links or names is an orphan (a file unlinked while open), which
        // the mount frees.
        let orphan = kept.is_empty() && done.unlinked.contains(&i);
        let wanted = if kept.is_empty() {
            vec![lost.as_str()]
        } else {
            kept
        };
        for name in wanted.into_iter().chain(gone) {
            let dead = done.killed.contains(&i) || in_killed_dir(name) || orphan;
            match (dead, vol.read(name)) {
                (true, Err(_)) => {}
                (false, Ok(got)) if got == data[..done.sizes[i]] => {}
                (true, Ok(_)) => return Err(format!("{name}, whose inode died, is still there")),
                (false, got) => return Err(format!("{name} reads {got:?}")),
            }
            if !dead {
                let md = vol.metadata(name).map_err(|e| e.to_string())?;
                let ino = Ino::from_raw(u64::from(md.generation()) << 32 | md.ino());
                let want = (!done.lost_xattrs.contains(&i)).then(|| first.as_bytes().to_vec());
                let got = vol
                    .get_xattr(ino, b"user.name")
                    .map_err(|e| e.to_string())?;
                if got != want {
                    return Err(format!("{name} has the attribute {got:?}, not {want:?}"));
                }
            }
        }
    }
    for ino in &done.strays {
        let path = format!("/lost+found/#{ino}");
        if !vol.metadata(&path).is_ok_and(|m| m.is_file()) {
            return Err(format!("stray inode {ino} not at {path}"));
        }
    }
    for k in 0..done.killed.len() + done.killed_dirs.len() + 2 {
        let path = format!("/new-{k}");
        let f = open_rw(&vol, &path);
        f.set_len(3 * BS as u64).map_err(|e| e.to_string())?;
        if vol.read(&path).map_err(|e| e.to_string())? != vec![0u8; 3 * BS] {
            let ino = vol.metadata(&path).map_err(|e| e.to_string())?.ino();
            return Err(format!("new file {path} (inode {ino}) maps blocks"));
        }
    }
    vol.close().map_err(|e| e.to_string())?;
    let report = fsck::check(media).map_err(|e| e.to_string())?;
    if !report.is_clean() {
        return Err(format!("after new files: {:#?}", report.problems));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
    ))]

    #[test]
    fn any_mix_of_repairable_damage_is_repaired(
        kind in 0usize..4,
        allocator in prop_oneof![
            Just(AllocatorKind::Cffs),
            Just(AllocatorKind::Baseline),
            Just(AllocatorKind::Simple),
        ],
        damages in proptest::collection::vec(damage(), 1..6),
    ) {
        let kind = KINDS[kind];
        if let Err(e) = repaired(kind, allocator, &damages) {
            return Err(TestCaseError::fail(format!("{kind:?}, {allocator:?}, {damages:?}: {e}")));
        }
    }
}
