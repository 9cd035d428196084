//! The inode-number API's persistent additions under the crash simulator: setting, replacing
//! and removing extended attributes, creating device nodes and FIFOs with their owner, and a
//! chown. At every fence, recovery succeeds, fsck is clean, and the object is as it was
//! before or as it is after the operation (after, once the operation returned).

mod common;

use std::cell::Cell;
use std::sync::Arc;

use pmfs::{Ino, NodeKind, Owner, Volume, XattrSet, fsck};
use pmfs_core::pm::{HeapRegion, Media};
use pmfs_core::sim::{Explorer, SimRegion};

use common::KINDS;
use common::crash::{SIM_SIZE, sim_options};

/// What the test looks at: owner and every attribute of `/f`, and what `/node` is, if it
/// exists.
type State = (
    (u32, u32),
    Vec<(Vec<u8>, Vec<u8>)>,
    Option<(NodeKind, u32, u32, u32, u64)>,
);

fn state(vol: &Volume) -> State {
    let root = vol.root();
    let fa = vol.lookup(root, b"f").unwrap();
    let f = fa.ino;
    let attrs = vol
        .list_xattr(f)
        .unwrap()
        .into_iter()
        .map(|n| {
            let v = vol.get_xattr(f, &n).unwrap().unwrap();
            (n, v)
        })
        .collect();
    let node = vol
        .lookup(root, b"node")
        .ok()
        .map(|a| (a.kind, a.perm, a.uid, a.gid, a.rdev));
    ((fa.uid, fa.gid), attrs, node)
}

fn file(vol: &Volume) -> Ino {
    vol.lookup(vol.root(), b"f").unwrap().ino
}

fn setup(vol: &Volume) {
    vol.write("/f", b"contents").unwrap();
    let f = file(vol);
    vol.set_xattr(f, b"user.keep", b"kept", XattrSet::Any)
        .unwrap();
    vol.set_xattr(f, b"user.old", &[3u8; 700], XattrSet::Any)
        .unwrap();
}

fn setup_one(vol: &Volume) {
    vol.write("/f", b"contents").unwrap();
    vol.set_xattr(file(vol), b"user.only", b"alone", XattrSet::Any)
        .unwrap();
}

fn check(kind: pmfs::MappingKind, seed: u64, op: impl Fn(&Volume) -> pmfs::Result<()>) {
    check_from(kind, seed, setup, op)
}

fn check_from(
    kind: pmfs::MappingKind,
    seed: u64,
    setup: fn(&Volume),
    op: impl Fn(&Volume) -> pmfs::Result<()>,
) {
    let after = {
        let media: Arc<dyn Media> = Arc::new(HeapRegion::new(SIM_SIZE).unwrap());
        let vol = Volume::format(media, &sim_options(kind)).unwrap();
        setup(&vol);
        op(&vol).unwrap();
        state(&vol)
    };
    let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
    let vol = Volume::format(region.clone(), &sim_options(kind)).unwrap();
    setup(&vol);
    let before = state(&vol);
    assert_ne!(before, after, "the operation must change something");
    region.persist_all();
    let done = Cell::new(false);
    let stats = Explorer::new(seed)
        .exhaustive_limit(1024)
        .store_prefixes(true)
        .run(
            &region,
            |_| {
                op(&vol).unwrap();
                done.set(true);
            },
            |cp| {
                let media: Arc<dyn Media> =
                    Arc::new(HeapRegion::from_image(cp.image).map_err(|e| e.to_string())?);
                let v = Volume::mount(media.clone()).map_err(|e| format!("mount: {e}"))?;
                let got = state(&v);
                v.close().map_err(|e| format!("close: {e}"))?;
                let report = fsck::check(media).map_err(|e| format!("fsck: {e}"))?;
                if !report.is_clean() {
                    return Err(format!("fsck after recovery: {:#?}", report.problems));
                }
                if got == after || (got == before && !done.get()) {
                    Ok(())
                } else {
                    Err(format!(
                        "neither before nor after (returned: {}):\ngot {got:?}\nbefore {before:?}\nafter {after:?}",
                        done.get()
                    ))
                }
            },
        )
        .unwrap_or_else(|f| panic!("{f}"));
    assert!(stats.fences > 0);
}

#[test]
fn setting_and_replacing_an_attribute_is_atomic() {
    for kind in KINDS {
        check(kind, 41, |v| {
            v.set_xattr(file(v), b"user.new", b"fresh value", XattrSet::Create)
                .map(drop)
        });
        check(kind, 42, |v| {
            v.set_xattr(file(v), b"user.old", b"shorter", XattrSet::Replace)
                .map(drop)
        });
    }
}

#[test]
fn removing_attributes_is_atomic() {
    for kind in KINDS {
        check(kind, 43, |v| v.remove_xattr(file(v), b"user.old").map(drop));
        // The last attribute: the word goes to zero and the blocks are given back.
        check_from(kind, 44, setup_one, |v| {
            v.remove_xattr(file(v), b"user.only").map(drop)
        });
    }
}

#[test]
fn special_files_and_chown_are_atomic() {
    let owner = Owner { uid: 7, gid: 8 };
    for kind in KINDS {
        check(kind, 45, |v| {
            v.mknod(
                v.root(),
                b"node",
                NodeKind::CharDevice,
                0o620,
                owner,
                0x0103,
            )
            .map(drop)
        });
        check(kind, 46, |v| {
            v.mknod(v.root(), b"node", NodeKind::Fifo, 0o600, owner, 0)
                .map(drop)
        });
        check(kind, 47, |v| {
            let f = file(v);
            let change = pmfs::AttrChange {
                uid: Some(1000),
                gid: Some(1000),
                ..Default::default()
            };
            v.set_attr(f, change, None).map(drop)
        });
    }
}
