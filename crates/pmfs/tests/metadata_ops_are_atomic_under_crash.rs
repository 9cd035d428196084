//! Every metadata operation is atomic under a crash at any fence: after recovery fsck is
//! clean and the namespace equals the state before or after the operation (after, once it
//! returned). Small trees, explored exhaustively where a crash point has at most 1024 images
//! (else sampled, `PMFS_CRASH_SAMPLES`).

mod common;

use pmfs::{File, Ino, Permissions, Volume};

use common::KINDS;
use common::crash::check_op;

fn tree(vol: &Volume) {
    vol.create_dir("/d").unwrap();
    vol.write("/d/a", b"aaaa").unwrap();
    vol.write("/f", b"f").unwrap();
}

#[test]
fn create_is_atomic() {
    for kind in KINDS {
        check_op(kind, 1, tree, |v, _| v.write("/d/new", b""));
        check_op(kind, 2, |_| (), |v, _| v.create_file("/first").map(drop));
    }
}

#[test]
fn create_into_a_reused_fragment_is_atomic() {
    for kind in KINDS {
        check_op(
            kind,
            3,
            |v| {
                tree(v);
                v.write("/d/b", b"").unwrap();
                v.write("/d/c", b"").unwrap();
                v.remove_file("/d/b").unwrap();
            },
            |v, _| v.write("/d/x", b""),
        );
    }
}

/// The fragment an entry leaves still holds its bytes. A create into it that a crash cuts
/// short, before any line of its own entry was written back, leaves them where its entry goes:
/// when the inode they name lives on under another name (renamed away, or one of several
/// links), recovery must not take them for the create's entry and free that inode.
#[test]
fn create_into_the_fragment_of_an_entry_whose_inode_lives_on_is_atomic() {
    for kind in KINDS {
        let renamed = |v: &Volume| {
            tree(v);
            v.rename("/d/a", "/e").unwrap();
        };
        check_op(kind, 24, renamed, |v, _| v.write("/d/x", b""));
        let unlinked = |v: &Volume| {
            tree(v);
            v.hard_link("/d/a", "/l").unwrap();
            v.remove_file("/d/a").unwrap();
        };
        check_op(kind, 25, unlinked, |v, _| v.write("/d/x", b""));
    }
}

#[test]
fn create_that_appends_a_page_is_atomic() {
    for kind in KINDS {
        check_op(
            kind,
            4,
            |v| {
                v.create_dir("/big").unwrap();
                // 14 entries of 288 bytes fill a page's 4032 bytes exactly.
                for i in 0..14 {
                    let name = format!("/big/{i:0>255}");
                    v.write(&name, b"").unwrap();
                }
            },
            |v, _| v.write("/big/next", b""),
        );
    }
}

#[test]
fn mkdir_and_symlink_are_atomic() {
    for kind in KINDS {
        check_op(kind, 5, tree, |v, _| v.create_dir("/d/sub"));
        check_op(kind, 6, tree, |v, _| v.symlink("/d/a", "/d/ln"));
    }
}

#[test]
fn unlink_of_the_last_link_is_atomic() {
    for kind in KINDS {
        check_op(kind, 7, tree, |v, _| v.remove_file("/d/a"));
    }
}

#[test]
fn unlink_of_a_file_with_blocks_past_its_end_is_atomic() {
    // Freeing a file zeroes the word that bounds the blocks it maps past its end (fallocate
    // with KEEP_SIZE) before it removes them: a crash between leaves an orphan mapping blocks
    // past both, which the next mount frees like the rest of it.
    for kind in KINDS {
        check_op(
            kind,
            40,
            |v| {
                tree(v);
                let md = v.metadata("/d/a").unwrap();
                let ino = Ino::from_raw(u64::from(md.generation()) << 32 | md.ino());
                let f = v.open_ino(ino, common::RW).unwrap();
                f.allocate(0, 3 * 4096, true).unwrap();
            },
            |v, _| v.remove_file("/d/a"),
        );
    }
}

#[test]
fn unlink_of_an_open_file_leaves_no_orphan() {
    for kind in KINDS {
        check_op(
            kind,
            8,
            |v| -> File {
                tree(v);
                v.open_file("/d/a").unwrap()
            },
            |v, _| v.remove_file("/d/a"),
        );
    }
}

#[test]
fn unlink_of_one_of_several_links_is_atomic() {
    for kind in KINDS {
        check_op(
            kind,
            9,
            |v| {
                tree(v);
                v.hard_link("/d/a", "/d/a2").unwrap();
            },
            |v, _| v.remove_file("/d/a"),
        );
    }
}

#[test]
fn rmdir_is_atomic() {
    for kind in KINDS {
        check_op(
            kind,
            10,
            |v| {
                tree(v);
                v.create_dir("/d/empty").unwrap();
            },
            |v, _| v.remove_dir("/d/empty"),
        );
    }
}

#[test]
fn link_is_atomic() {
    for kind in KINDS {
        check_op(kind, 11, tree, |v, _| v.hard_link("/d/a", "/b"));
    }
}

#[test]
fn truncate_is_atomic() {
    for kind in KINDS {
        check_op(
            kind,
            12,
            |v| {
                tree(v);
                v.write("/d/big", &[9u8; 3 * 4096 + 10]).unwrap();
            },
            |v, _| {
                let f = pmfs::OpenOptions::new()
                    .write(true)
                    .open(v, "/d/big")
                    .unwrap();
                f.set_len(4097)
            },
        );
        check_op(kind, 13, tree, |v, _| {
            let f = pmfs::OpenOptions::new().write(true).open(v, "/f").unwrap();
            f.set_len(10_000)
        });
    }
}

#[test]
fn set_permissions_is_atomic() {
    for kind in KINDS {
        // The namespace snapshot does not show modes: check them directly.
        let region =
            std::sync::Arc::new(pmfs_core::sim::SimRegion::new(common::crash::SIM_SIZE).unwrap());
        let vol = Volume::format(region.clone(), &common::crash::sim_options(kind)).unwrap();
        tree(&vol);
        region.persist_all();
        let done = std::cell::Cell::new(false);
        pmfs_core::sim::Explorer::new(14)
            .run(
                &region,
                |_| {
                    vol.set_permissions("/d/a", Permissions::from_mode(0o600))
                        .unwrap();
                    done.set(true);
                },
                |cp| {
                    let media: std::sync::Arc<dyn pmfs_core::pm::Media> = std::sync::Arc::new(
                        pmfs_core::pm::HeapRegion::from_image(cp.image).unwrap(),
                    );
                    let v = Volume::mount(media).map_err(|e| e.to_string())?;
                    let mode = v
                        .metadata("/d/a")
                        .map_err(|e| e.to_string())?
                        .permissions()
                        .mode();
                    match (mode, done.get()) {
                        (0o600, _) | (0o644, false) => Ok(()),
                        (m, returned) => Err(format!(
                            "mode {m:o} after recovery (operation returned: {returned})"
                        )),
                    }
                },
            )
            .unwrap_or_else(|f| panic!("{f}"));
    }
}

/// A mount marks the volume in use, durably, before it changes anything: a session on a
/// volume that was closed cleanly, crashed at any fence of its mount or of a create, is
/// recovered at the next mount (which would otherwise take the half-done create for a
/// damaged directory).
#[test]
fn create_after_mounting_a_volume_closed_cleanly_is_atomic() {
    use std::cell::{Cell, RefCell};
    use std::sync::Arc;

    use common::crash::{SIM_SIZE, light_explorer, recover_and_check, sim_options};
    use common::snapshot;
    use pmfs_core::sim::SimRegion;

    for (i, kind) in KINDS.into_iter().enumerate() {
        let region = Arc::new(SimRegion::new(SIM_SIZE).unwrap());
        let vol = Volume::format(region.clone(), &sim_options(kind)).unwrap();
        tree(&vol);
        let before = snapshot(&vol);
        vol.write("/d/new", b"").unwrap();
        let after = snapshot(&vol);
        vol.remove_file("/d/new").unwrap();
        vol.close().unwrap();
        region.persist_all();
        let done = Cell::new(false);
        // The session outlives the run: its clean close is no crash point.
        let session = RefCell::new(None);
        light_explorer(30 + i as u64)
            .run(
                &region,
                |_| {
                    let vol = Volume::mount(region.clone()).unwrap();
                    vol.write("/d/new", b"").unwrap();
                    done.set(true);
                    *session.borrow_mut() = Some(vol);
                },
                |cp| {
                    let got = recover_and_check(cp.image)?;
                    if got == after || (got == before && !done.get()) {
                        Ok(())
                    } else {
                        Err(format!(
                            "{kind:?}: recovery gives {got:#?} (create returned: {})",
                            done.get()
                        ))
                    }
                },
            )
            .unwrap_or_else(|f| panic!("{f}"));
        session.take().unwrap().close().unwrap();
    }
}
