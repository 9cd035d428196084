//! Two data-only clients (as two processes would) have one HashFS file open, and one of them
//! overwrites it until its log has been compacted many times. The blocks those compactions
//! unlink cannot be freed while the other client may still be reading them, so they stay
//! allocated; but once the writer closes the file, the other client, alone with it now, frees
//! them at its next compaction (and would at its close). Before, they stayed allocated until
//! the file was deleted. If the writer vanishes instead (a killed process: its handle never
//! closes), nobody is ever alone with the file again, and the next mount frees them. A
//! mapping of the file keeps it from being freed but reads no log block, so it does not keep
//! a client that maps and writes the file from freeing what its compactions retire; nor does
//! the owner's handle of a log it opened for a truncation or a read through the kernel.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::RW;
use pmfs::{Client, Ino, OpenMode, OpenNode, Owner, Volume, fsck};
use pmfs_core::pm::{Media, PmRegion};

const BS: u64 = 4096;
const BLOCKS: u64 = 8;
const WRITES: u64 = 40_000;

/// A file of `BLOCKS` blocks in a fresh pool, open in two clients, after the first (the
/// writer) overwrote it `WRITES` times while the second (the reader) had it open.
struct TwoClients {
    path: PathBuf,
    owner: Volume,
    /// Free blocks before the clients opened the file.
    before: u64,
    writer: (Client, OpenNode),
    reader: (Client, OpenNode),
}

/// A fresh pool with one file of `BLOCKS` blocks: its path, owner, number, and the free
/// blocks then.
fn one_file(tag: &str) -> (PathBuf, Volume, Ino, u64) {
    let (path, owner) = common::client_pool_of(tag, 64 << 20);
    let who = Owner { uid: 0, gid: 0 };
    let (attr, node, _) = owner
        .create_open(owner.root(), b"f", 0o644, who, true, RW)
        .unwrap();
    node.write_at(&vec![1u8; (BLOCKS * BS) as usize], 0)
        .unwrap();
    drop(node);
    let before = owner.statfs().unwrap().free_blocks;
    (path, owner, attr.ino, before)
}

impl TwoClients {
    fn new(tag: &str) -> TwoClients {
        let (path, owner, ino, before) = one_file(tag);
        let open = || {
            let c = Volume::attach(&path).unwrap();
            let n = c.open_ino(ino, RW).unwrap();
            (c, n)
        };
        let (writer, reader) = (open(), open());
        for i in 0..WRITES {
            overwrite(&writer.1, i);
        }
        TwoClients {
            path,
            owner,
            before,
            writer,
            reader,
        }
    }

    /// Blocks allocated since the clients opened the file.
    fn held(owner: &Volume, before: u64) -> u64 {
        before - owner.statfs().unwrap().free_blocks
    }
}

fn overwrite(f: &OpenNode, i: u64) {
    f.write_at(&[i as u8; BS as usize], i % BLOCKS * BS)
        .unwrap();
}

fn assert_clean(path: &std::path::Path) {
    let media: Arc<dyn Media> = Arc::new(PmRegion::open(path).unwrap());
    let report = fsck::check(media).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Mounts the pool at `path` and checks that it found at most `most` log blocks that no log
/// named (retired and never freed), and that fsck then finds it clean.
fn assert_unfreed_at_most(path: &std::path::Path, most: u64) {
    let vol = Volume::open(path).unwrap();
    let left = vol.mount_report().log_blocks_freed;
    assert!(left <= most, "{left} retired log blocks were never freed");
    vol.close().unwrap();
    assert_clean(path);
    let _ = std::fs::remove_file(path);
}

#[test]
fn the_client_left_alone_frees_what_the_other_retired() {
    let t = TwoClients::new("retired-beside");
    // Each block of the log holds about 500 entries.
    let held = TwoClients::held(&t.owner, t.before);
    assert!(
        held > WRITES / 1000,
        "only {held} blocks held while both are open"
    );
    drop(t.writer);

    // Alone now, the reader's own compactions sweep what the writer left.
    let r = &t.reader.1;
    for i in 0..WRITES / 4 {
        overwrite(r, i);
    }
    let mut back = vec![0u8; (BLOCKS * BS) as usize];
    r.read_at(&mut back, 0).unwrap();
    for (k, chunk) in back.chunks(BS as usize).enumerate() {
        let last = (WRITES / 4 - BLOCKS..WRITES / 4)
            .find(|i| i % BLOCKS == k as u64)
            .unwrap();
        assert!(chunk.iter().all(|&b| b == last as u8), "block {k}");
    }
    // The reader vanishes: what it did not sweep is left to the mount, which counts it (79
    // without the sweep). Free space would not tell: it also counts the replaced data blocks
    // that wait for the next digest, up to 128 at any moment.
    std::mem::forget(t.reader);
    t.owner.close().unwrap();
    assert_unfreed_at_most(&t.path, 2);
}

#[test]
fn what_a_vanished_client_retired_is_freed_at_the_next_mount() {
    let t = TwoClients::new("retired-vanished");
    // The writer's process dies: its handle never closes and its pin stays.
    std::mem::forget(t.writer);
    drop(t.reader);
    let held = TwoClients::held(&t.owner, t.before);
    assert!(held > WRITES / 1000, "only {held} blocks held");
    t.owner.close().unwrap();

    // 79 blocks stayed here without the mount's sweep.
    let vol = Volume::open(&t.path).unwrap();
    assert!(vol.mount_report().log_blocks_freed > WRITES / 1000);
    let left = TwoClients::held(&vol, t.before);
    assert!(left <= 8, "{left} blocks still held (of {held})");
    vol.close().unwrap();
    assert_clean(&t.path);
    let _ = std::fs::remove_file(&t.path);
}

#[test]
fn a_client_that_maps_the_file_frees_what_its_compactions_retire() {
    let (path, owner, ino, _) = one_file("retired-mapped");
    let client = Volume::attach(&path).unwrap();
    let node = client.open_ino(ino, RW).unwrap();
    let map = client.map(ino, 0, BLOCKS * BS).unwrap();
    for i in 0..WRITES {
        overwrite(&node, i);
    }
    // The mapping keeps the file, but reads no log block: the handle is alone with the log.
    // The client vanishes; the mount counts what it retired and did not free (79 while the
    // mapping counted as an open handle).
    std::mem::forget(map);
    std::mem::forget(node);
    std::mem::forget(client);
    owner.close().unwrap();
    assert_unfreed_at_most(&path, 2);
}

#[test]
fn the_owner_that_truncated_the_file_leaves_the_log_to_the_client() {
    let (path, owner, ino, _) = one_file("retired-truncated");
    // An open with O_TRUNC under the library: the kernel's open, which the owner serves and
    // keeps open, truncates the file; then the library opens it as a client.
    let truncating = OpenMode {
        truncate: true,
        ..RW
    };
    let kernels = owner.open_ino(ino, truncating).unwrap();
    let client = Volume::attach(&path).unwrap();
    let node = client.open_ino(ino, RW).unwrap();
    // Truncating again through the kernel, with the client's handle open.
    kernels.set_len(0).unwrap();
    for i in 0..WRITES {
        overwrite(&node, i);
    }
    // The client's process dies: whatever its compactions retired and could not free is left
    // to the next mount, which counts it. Free space would not tell (see above).
    std::mem::forget(node);
    std::mem::forget(client);
    let mut back = vec![0u8; BS as usize];
    assert_eq!(kernels.read_at(&mut back, 0).unwrap(), BS as usize);
    drop(kernels);
    owner.close().unwrap();
    // 79 were left while the owner kept its handle of the log after either truncation.
    assert_unfreed_at_most(&path, 2);
}

#[test]
fn the_owner_reading_for_the_kernel_leaves_the_log_to_the_writing_client() {
    let (path, owner, ino, _) = one_file("retired-read-by-owner");
    // A program reads the file through the kernel (`tail -f`), which the owner serves, while
    // another writes it under the library. The owner lets go of the log after each read.
    let kernels = owner.open_ino(ino, RW).unwrap();
    let client = Volume::attach(&path).unwrap();
    let node = client.open_ino(ino, RW).unwrap();
    let mut back = vec![0u8; BS as usize];
    for i in 0..WRITES {
        overwrite(&node, i);
        if i % 1000 == 1 {
            assert_eq!(kernels.read_for_kernel(&mut back, BS).unwrap(), BS as usize);
            assert!(back.iter().all(|&b| b == i as u8), "write {i}");
            kernels.let_go_of_log().unwrap();
        }
    }
    // The client's process dies; the mount counts what its compactions retired and did not
    // free.
    std::mem::forget(node);
    std::mem::forget(client);
    drop(kernels);
    owner.close().unwrap();
    assert_unfreed_at_most(&path, 2);
}
