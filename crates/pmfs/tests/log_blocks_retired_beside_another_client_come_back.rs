//! Two data-only clients (as two processes would) have one HashFS file open, and one of them
//! overwrites it until its log has been compacted many times. The blocks those compactions
//! unlink cannot be freed while the other client may still be reading them, so they stay
//! allocated; but once the writer closes the file, the other client, alone with it now, frees
//! them at its next compaction (and would at its close). Before, they stayed allocated until
//! the file was deleted or the pool mounted again.

mod common;

use std::sync::Arc;

use common::RW;
use pmfs::{Owner, Volume, fsck};
use pmfs_core::pm::{Media, PmRegion};

const BS: u64 = 4096;
const BLOCKS: u64 = 8;
const WRITES: u64 = 40_000;

#[test]
fn the_client_left_alone_frees_what_the_other_retired() {
    let (path, owner) = common::client_pool_of("retired-beside", 64 << 20);
    let who = Owner { uid: 0, gid: 0 };
    let (attr, node, _) = owner
        .create_open(owner.root(), b"f", 0o644, who, true, RW)
        .unwrap();
    node.write_at(&vec![1u8; (BLOCKS * BS) as usize], 0)
        .unwrap();
    drop(node);
    let free = || owner.statfs().unwrap().free_blocks;
    let before = free();

    let (writer, reader) = (
        Volume::attach(&path).unwrap(),
        Volume::attach(&path).unwrap(),
    );
    let w = writer.open_ino(attr.ino, RW).unwrap();
    let r = reader.open_ino(attr.ino, RW).unwrap();
    let overwrite = |f: &pmfs::OpenNode, i: u64| {
        f.write_at(&[i as u8; BS as usize], i % BLOCKS * BS)
            .unwrap();
    };
    for i in 0..WRITES {
        overwrite(&w, i);
    }
    // Each block of the log holds about 500 entries.
    let held = before - free();
    assert!(
        held > WRITES / 1000,
        "only {held} blocks held while both are open"
    );
    drop(w);
    drop(writer);

    // Alone now, the reader's own compactions sweep what the writer left. What stays is the
    // reader's own: its log's blocks and the blocks its undigested overwrites replaced (17
    // here; 96 without the sweep).
    for i in 0..WRITES / 4 {
        overwrite(&r, i);
    }
    let alone = before - free();
    assert!(alone <= 32, "{alone} blocks still held (of {held})");
    let mut back = vec![0u8; (BLOCKS * BS) as usize];
    r.read_at(&mut back, 0).unwrap();
    for (k, chunk) in back.chunks(BS as usize).enumerate() {
        let last = (WRITES / 4 - BLOCKS..WRITES / 4)
            .find(|i| i % BLOCKS == k as u64)
            .unwrap();
        assert!(chunk.iter().all(|&b| b == last as u8), "block {k}");
    }
    drop(r);
    drop(reader);
    assert!(before - free() <= 8);
    owner.close().unwrap();
    let media: Arc<dyn Media> = Arc::new(PmRegion::open(&path).unwrap());
    let report = fsck::check(media).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    let _ = std::fs::remove_file(&path);
}
