//! A read-only mount of a volume that was not closed cleanly recovers it in memory: at the
//! crash images of a workload that leaves every kind of repair behind (a journal transaction,
//! half-done directory updates, an orphan, file logs to digest), the read-only mount reports
//! the recovery a read-write mount runs, reads the namespace and the free space that mount
//! leaves, and writes nothing to the image. Images sampled per crash point (8, or
//! `PMFS_CRASH_SAMPLES`).

mod common;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::Arc;

use pmfs::{MappingKind, MountReport, OpenOptions, Volume};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::SimRegion;

use common::crash::{SIM_SIZE, light_explorer, sim_options};
use common::crash_image::unchanged;
use common::{Snapshot, snapshot};

/// What a mount of a crash image shows: its report, namespace and free blocks and inodes.
#[derive(PartialEq)]
struct View {
    report: MountReport,
    tree: Snapshot,
    free: (u64, u64),
}

fn view(vol: &Volume) -> View {
    let st = vol.statfs().unwrap();
    View {
        report: vol.mount_report(),
        tree: snapshot(vol),
        free: (st.free_blocks, st.free_inodes),
    }
}

/// How the read-only view `ro` differs from the read-write one `rw`, in a few lines.
fn differences(ro: &View, rw: &View) -> String {
    let mut d = Vec::new();
    if ro.report != rw.report {
        d.push(format!("reports {:?} and {:?}", ro.report, rw.report));
    }
    if ro.free != rw.free {
        d.push(format!(
            "free (blocks, inodes) {:?} and {:?}",
            ro.free, rw.free
        ));
    }
    let paths: BTreeSet<&String> = ro
        .tree
        .objects
        .keys()
        .chain(rw.tree.objects.keys())
        .collect();
    for p in paths {
        if ro.tree.objects.get(p) != rw.tree.objects.get(p) {
            d.push(format!("{p} differs"));
        }
    }
    if ro.tree.links != rw.tree.links {
        d.push(format!("links {:?} and {:?}", ro.tree.links, rw.tree.links));
    }
    d.join("; ")
}

/// The read-only mount of `image` against a read-write mount of a copy of it.
fn compare(image: &[u8]) -> Result<(), String> {
    let media: Arc<dyn Media> = Arc::new(HeapRegion::from_image(image).unwrap());
    let ro = Volume::mount_read_only(media.clone())
        .map_err(|e| format!("read-only mount failed: {e}"))?;
    if ro.mount_report().clean {
        return Err("a crash image mounted read-only reports a clean volume".into());
    }
    let seen = view(&ro);
    ro.close().map_err(|e| e.to_string())?;
    unchanged(&*media, image, "the read-only mount")?;
    let rw = Volume::mount(Arc::new(HeapRegion::from_image(image).unwrap()))
        .map_err(|e| format!("read-write mount failed: {e}"))?;
    let recovered = view(&rw);
    drop(rw);
    if seen == recovered {
        Ok(())
    } else {
        Err(format!(
            "the read-only mount differs from the read-write one: {}",
            differences(&seen, &recovered)
        ))
    }
}

/// The crash images of the workload on `kind`'s volume (a test per mapping: they run in
/// parallel).
fn read_only_mounts_see_what_recovery_leaves(kind: MappingKind, seed: u64) {
    let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
    let vol = Volume::format(region.clone(), &sim_options(kind)).unwrap();
    vol.create_dir("/d").unwrap();
    vol.write("/d/a", b"aaaa").unwrap();
    vol.write("/f", &vec![7u8; 3 << 12]).unwrap();
    region.persist_all();
    let open = RefCell::new(None);
    light_explorer(seed)
        .run(
            &region,
            |_| {
                vol.rename("/d/a", "/e").unwrap();
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&vol, "/f")
                    .unwrap();
                f.write_at(&[9u8; 5000], 1000).unwrap();
                vol.write("/d/gone", b"orphan").unwrap();
                let held = OpenOptions::new().read(true).open(&vol, "/d/gone").unwrap();
                vol.remove_file("/d/gone").unwrap();
                *open.borrow_mut() = Some((f, held));
                vol.create_dir("/d/sub").unwrap();
            },
            |cp| compare(cp.image).map_err(|e| format!("{kind:?}: {e}")),
        )
        .unwrap_or_else(|f| panic!("{f}"));
    drop(open);
    drop(vol);
}

#[test]
fn on_the_extent_tree() {
    read_only_mounts_see_what_recovery_leaves(MappingKind::Extent, 0);
}

#[test]
fn on_the_radix_tree() {
    read_only_mounts_see_what_recovery_leaves(MappingKind::Radix, 1);
}

#[test]
fn on_the_cuckoo_hash() {
    read_only_mounts_see_what_recovery_leaves(MappingKind::Cuckoo, 2);
}

#[test]
fn on_hashfs() {
    read_only_mounts_see_what_recovery_leaves(MappingKind::HashFs, 3);
}
