//! fsck's repairs survive their own crashes: on a volume with a wrong link count, an entry
//! whose inode died, a live inode that no entry names, attributes that fail their checksum, a
//! file whose holes lost their mark, a damaged log, (on the trees) a file and a directory
//! whose trees point past the data region and (with the baseline allocator) a leaked block, a
//! crash at any fence of `fsck::repair` (images enumerated when a crash point has at most 8,
//! else sampled), followed by another repair, ends in the namespace that one uninterrupted
//! repair produces, with fsck clean. Once the repair has returned, the volume checks clean
//! without another.

mod common;

use std::sync::Arc;

use pmfs::{AllocatorKind, Ino, MappingKind, Options, Volume, XattrSet, fsck};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::SimRegion;

use common::crash::{SIM_SIZE, light_explorer, sim_options};
use common::{KINDS, Obj, Snapshot, remount, snapshot};

/// The inode that no entry names: inside the simulated volumes' 64.
const STRAY: u64 = 40;

fn heap(image: &[u8]) -> Result<Arc<dyn Media>, String> {
    Ok(Arc::new(
        HeapRegion::from_image(image).map_err(|e| e.to_string())?,
    ))
}

/// A closed, durable volume with the damage. The dead inode's block leaks (a sixth problem)
/// where free space is kept on media: in the baseline allocator's persistent bitmap, or in the
/// table of HashFS. The mount rebuilds the volatile allocators from the live files, which
/// leaves the block free.
fn damaged(kind: MappingKind, allocator: AllocatorKind) -> Arc<SimRegion> {
    let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
    let media: Arc<dyn Media> = region.clone();
    let opts = Options {
        allocator,
        ..sim_options(kind)
    };
    let vol = Volume::format(media.clone(), &opts).unwrap();
    vol.create_dir_all("/d/e").unwrap();
    vol.write("/d/victim-entry", b"v").unwrap();
    vol.write("/d/e/file", &[7u8; 9000]).unwrap();
    vol.hard_link("/d/e/file", "/d/link").unwrap();
    let sparse = vol.create_file("/d/sparse").unwrap();
    sparse.set_len(5 * 4096).unwrap();
    sparse.write_all_at(b"s", 4 * 4096).unwrap();
    drop(sparse);
    let md = vol.metadata("/d/e/file").unwrap();
    let handle = Ino::from_raw(u64::from(md.generation()) << 32 | md.ino());
    vol.set_xattr(handle, b"user.k", b"v", XattrSet::Any)
        .unwrap();
    vol.write("/d/logged", &[5u8; 6000]).unwrap();
    let tree = matches!(kind, MappingKind::Extent | MappingKind::Radix);
    if tree {
        vol.write("/d/tree", &[9u8; 8192]).unwrap();
        vol.create_dir("/t").unwrap();
        vol.write("/t/x", b"x").unwrap();
    }
    let info = vol.info();
    let ino = |path| vol.symlink_metadata(path).unwrap().ino();
    let (file, victim, holey) = (ino("/d/e/file"), ino("/d/victim-entry"), ino("/d/sparse"));
    let logged = ino("/d/logged");
    let tree_victims = if tree {
        vec![ino("/d/tree"), ino("/t")]
    } else {
        Vec::new()
    };
    vol.close().unwrap();

    let inode = |ino: u64| PmOff(info.inode_table_offset + ino * info.inode_size);
    media.store_u64(inode(file) + 24, 5).unwrap();
    let state = media.load_u64(inode(victim)).unwrap();
    media.store_u64(inode(victim), state & !(1 << 63)).unwrap();
    let mut rec = [0u8; 128];
    rec[0..8].copy_from_slice(&((1u64 << 63) | 1).to_le_bytes());
    rec[8..12].copy_from_slice(&0o100644u32.to_le_bytes());
    rec[20..22].copy_from_slice(&1u16.to_le_bytes());
    rec[24..32].copy_from_slice(&1u64.to_le_bytes());
    media.write(inode(STRAY), &rec).unwrap();
    // The attributes' checksum, and the holes mark.
    let xattr = media.load_u64(inode(file) + 96).unwrap();
    media.store_u64(inode(file) + 96, xattr ^ 1 << 40).unwrap();
    let flags = media.load_u64(inode(holey) + 16).unwrap();
    media
        .store_u64(inode(holey) + 16, flags & !(1 << 48))
        .unwrap();
    // A log block's magic.
    let log_block = (media.load_u64(inode(logged) + 104).unwrap() & ((1 << 48) - 1)) * 4096;
    let magic = media.load_u64(PmOff(log_block)).unwrap();
    media.store_u64(PmOff(log_block), magic ^ 0xff).unwrap();
    // A file's and a directory's tree that point at a block past the data region (their only
    // node's first entry).
    for t in tree_victims {
        common::point_tree_outside(&media, &info, kind, t);
    }
    region.persist_all();
    region
}

/// Repairs `media` and checks that the repair leaves it clean; returns its namespace.
fn repaired(media: Arc<dyn Media>) -> Result<Snapshot, String> {
    let fixed = fsck::repair(media.clone()).map_err(|e| format!("repair failed: {e}"))?;
    if !fixed.after.is_clean() {
        return Err(format!("left after repair: {:#?}", fixed.after.problems));
    }
    let vol = Volume::mount(media).map_err(|e| format!("mount after repair: {e}"))?;
    let snap = snapshot(&vol);
    vol.close()
        .map_err(|e| format!("close after repair: {e}"))?;
    Ok(snap)
}

/// Paths, kinds, file sizes and link counts of a snapshot, and its hard-link groups.
fn outline(s: &Snapshot) -> String {
    let objects: Vec<String> = s
        .objects
        .iter()
        .map(|(path, obj)| match obj {
            Obj::File(data, nlink) => format!("{path}: {} bytes, {nlink} links", data.len()),
            other => format!("{path}: {other:?}"),
        })
        .collect();
    format!("{objects:?}, linked {:?}", s.links)
}

#[test]
fn a_repair_cut_short_by_a_crash_is_finished_by_the_next() {
    let volumes = [AllocatorKind::Baseline, AllocatorKind::Cffs]
        .into_iter()
        .flat_map(|a| KINDS.map(|kind| (kind, a)));
    for (seed, (kind, allocator)) in volumes.enumerate() {
        let region = damaged(kind, allocator);
        let copy = heap(&region.image()).unwrap();
        let found = fsck::check(copy.clone()).unwrap();
        let leaks = allocator == AllocatorKind::Baseline || kind == MappingKind::HashFs;
        let tree = matches!(kind, MappingKind::Extent | MappingKind::Radix);
        assert_eq!(
            found.problems.len(),
            // On the trees: the file's unreadable tree; the directory's, its page and its
            // file, unreachable.
            6 + usize::from(leaks) + 4 * usize::from(tree),
            "{kind:?}, {allocator:?}: {:#?}",
            found.problems
        );
        let want = repaired(copy.clone()).unwrap();
        let vol = remount(&copy);
        assert_eq!(vol.metadata("/d/link").unwrap().nlink(), 2);
        assert!(!vol.exists("/d/victim-entry").unwrap());
        assert_eq!(vol.read("/d/logged").unwrap(), vec![5u8; 6000]);
        if tree {
            assert_eq!(vol.read("/d/tree").unwrap(), vec![0; 8192]);
            assert_eq!(vol.read_dir("/t").unwrap().count(), 0);
            let found = vol.read_dir("/lost+found").unwrap().count();
            assert_eq!(found, 2, "the stray inode and /t/x");
        }
        assert!(
            vol.metadata(&format!("/lost+found/#{STRAY}"))
                .unwrap()
                .is_file()
        );
        vol.close().unwrap();

        let media: Arc<dyn Media> = region.clone();
        let stats = light_explorer(seed as u64)
            .run(
                &region,
                |_| {
                    fsck::repair(media.clone()).unwrap();
                },
                |cp| {
                    if cp.end {
                        let report = fsck::check(heap(cp.image)?)
                            .map_err(|e| format!("check after the repair: {e}"))?;
                        if !report.is_clean() {
                            return Err(format!("after the repair: {:#?}", report.problems));
                        }
                    }
                    let got = repaired(heap(cp.image)?)?;
                    if got == want {
                        Ok(())
                    } else {
                        Err(format!(
                            "repaired to {}\nnot {}",
                            outline(&got),
                            outline(&want)
                        ))
                    }
                },
            )
            .unwrap_or_else(|f| panic!("{kind:?}, {allocator:?}: {f}"));
        assert!(stats.fences > 4, "{kind:?}, {allocator:?}: {stats:?}");
    }
}
