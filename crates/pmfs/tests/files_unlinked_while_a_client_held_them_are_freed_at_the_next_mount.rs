//! A file unlinked while a data-only client has it open cannot be freed at the owner's last
//! close of it (the client's pin keeps its log), so it stays an orphan: a live inode without
//! links. The owner's next mount frees it, also when the volume was closed cleanly (the
//! everyday case: the FUSE daemon unmounted after a library client closed such a file); so
//! does `Volume::collect_dead_pins` once the client closed it (the FUSE daemon calls it every
//! second).

mod common;

use std::sync::Arc;

use pmfs::fsck;
use pmfs::{Client, OpenMode, OpenNode, Owner, Volume};
use pmfs_core::pm::{Media, PmRegion};

const RW: OpenMode = OpenMode {
    read: true,
    write: true,
    truncate: false,
};

fn orphans(path: &std::path::Path) -> usize {
    let media: Arc<dyn Media> = Arc::new(PmRegion::open(path).unwrap());
    let report = fsck::check(media).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    report.orphans.len()
}

/// A pool with a 1 MiB file that a client has open, unlinked by the owner: the pool file,
/// the owner, the client, its handle and the blocks free before the file was written.
fn unlinked_while_held(tag: &str) -> (std::path::PathBuf, Volume, Client, OpenNode, u64) {
    let (path, vol) = common::client_pool(tag);
    let root = vol.root();
    let who = Owner { uid: 0, gid: 0 };
    // The root directory's first entry page, which stays, is taken before counting.
    vol.create_open(root, b"first", 0o644, who, true, RW)
        .unwrap();
    let free = vol.statfs().unwrap().free_blocks;

    let (kept, node, _) = vol
        .create_open(root, b"kept", 0o644, who, true, RW)
        .unwrap();
    node.write_at(&vec![5; 1 << 20], 0).unwrap();
    drop(node);
    let client = Volume::attach(&path).unwrap();
    let held = client.open_ino(kept.ino, RW).unwrap();
    vol.unlink_at(root, b"kept").unwrap();
    let mut back = vec![0; 4096];
    assert_eq!(held.read_at(&mut back, 4096).unwrap(), 4096);
    assert!(
        back.iter().all(|&b| b == 5),
        "the client still reads the file"
    );
    (path, vol, client, held, free)
}

#[test]
fn a_clean_mount_frees_files_a_client_kept_past_their_unlink() {
    let (path, vol, client, held, free) = unlinked_while_held("client-orphan");
    drop(held);
    drop(client);
    vol.close().unwrap();
    assert_eq!(
        orphans(&path),
        1,
        "the unlinked file outlived the owner's close"
    );

    let vol = Volume::open(&path).unwrap();
    let report = vol.mount_report();
    assert!(report.clean, "{report:?}");
    assert_eq!(report.orphans_freed, 1, "{report:?}");
    assert_eq!(vol.statfs().unwrap().free_blocks, free);
    vol.close().unwrap();
    assert_eq!(orphans(&path), 0);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn collecting_dead_pins_frees_them_once_their_log_is_closed() {
    let (path, vol, client, held, free) = unlinked_while_held("client-orphan-collected");
    assert_eq!(vol.collect_dead_pins().unwrap(), 0, "the client holds it");
    drop(held);
    // Nobody pins its log any more: freed, although the client is still attached.
    assert_eq!(vol.collect_dead_pins().unwrap(), 1);
    assert_eq!(vol.statfs().unwrap().free_blocks, free);
    drop(client);
    assert_eq!(
        vol.collect_dead_pins().unwrap(),
        0,
        "nothing left to look at"
    );
    vol.close().unwrap();
    assert_eq!(orphans(&path), 0);
    let _ = std::fs::remove_file(&path);
}
