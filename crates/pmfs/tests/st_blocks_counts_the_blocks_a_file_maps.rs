//! `st_blocks` (`Attr::blocks`, in 512-byte units) counts the data blocks a regular file
//! maps: holes made by writes and allocations past the end, by growing truncations and by
//! punches are not counted, blocks allocated past the end of file are; on every mapping
//! structure, after a remount, and through a data-only client; from the commit of each
//! change, while the file is still open and its writes are not digested.

mod common;

use pmfs::{Attr, Ino, OpenMode, OpenNode, Owner, Volume};

use common::{KINDS, fresh, remount};

const RW: OpenMode = OpenMode {
    read: true,
    write: true,
    truncate: false,
};
const BS: u64 = 4096;
/// 512-byte units per block.
const UNITS: u64 = BS / 512;

fn create(vol: &Volume, name: &[u8]) -> (Attr, OpenNode) {
    let who = Owner { uid: 0, gid: 0 };
    let (a, node, _) = vol
        .create_open(vol.root(), name, 0o644, who, true, RW)
        .unwrap();
    (a, node)
}

/// Checks that `ino` counts `n` blocks of [`BS`].
fn expect(vol: &Volume, ino: Ino, n: u64, what: &str) {
    assert_eq!(blocks(vol, ino), n * UNITS, "{what}");
}

fn blocks(vol: &Volume, ino: Ino) -> u64 {
    vol.getattr(ino).unwrap().blocks
}

#[test]
fn holes_are_not_counted_and_allocations_past_the_end_are() {
    for kind in KINDS {
        let (vol, media) = fresh(kind);
        let data = vec![5u8; 10 * BS as usize];

        // Dense: every block below the size.
        let (dense, node) = create(&vol, b"dense");
        node.write_at(&data, 0).unwrap();
        node.write_at(b"tail", 10 * BS).unwrap();
        drop(node);
        assert_eq!(blocks(&vol, dense.ino), 11 * UNITS, "{kind:?} dense");

        // One byte written a megabyte in: one block.
        let (sparse, node) = create(&vol, b"sparse");
        node.write_at(b"x", 1 << 20).unwrap();
        drop(node);
        assert_eq!(vol.getattr(sparse.ino).unwrap().size, (1 << 20) + 1);
        assert_eq!(blocks(&vol, sparse.ino), UNITS, "{kind:?} sparse");

        // Grown by truncation: the old block only.
        let (grown, node) = create(&vol, b"grown");
        node.write_at(b"abc", 0).unwrap();
        node.set_len(1 << 20).unwrap();
        drop(node);
        assert_eq!(blocks(&vol, grown.ino), UNITS, "{kind:?} grown");

        // Four whole blocks punched out of ten.
        let (punched, node) = create(&vol, b"punched");
        node.write_at(&data, 0).unwrap();
        node.punch_hole(3 * BS, 4 * BS).unwrap();
        drop(node);
        assert_eq!(blocks(&vol, punched.ino), 6 * UNITS, "{kind:?} punched");

        // Allocated past the end, the size unchanged: counted.
        let (kept, node) = create(&vol, b"kept");
        node.write_at(b"abc", 0).unwrap();
        node.allocate(0, 5 * BS, true).unwrap();
        drop(node);
        assert_eq!(vol.getattr(kept.ino).unwrap().size, 3);
        assert_eq!(blocks(&vol, kept.ino), 5 * UNITS, "{kind:?} kept");

        // Allocated with a gap after the end: the gap is a hole.
        let (gap, node) = create(&vol, b"gap");
        node.write_at(b"abc", 0).unwrap();
        node.allocate(4 * BS, 2 * BS, false).unwrap();
        drop(node);
        assert_eq!(blocks(&vol, gap.ino), 3 * UNITS, "{kind:?} gap");

        // Filling the holes counts the blocks again.
        let node = vol.open_ino(punched.ino, RW).unwrap();
        node.write_at(&data[..4 * BS as usize], 3 * BS).unwrap();
        drop(node);
        assert_eq!(blocks(&vol, punched.ino), 10 * UNITS, "{kind:?} refilled");

        let expect = [
            (dense.ino, 11),
            (sparse.ino, 1),
            (grown.ino, 1),
            (punched.ino, 10),
            (kept.ino, 5),
            (gap.ino, 3),
        ];
        vol.close().unwrap();
        let vol = remount(&media);
        for (ino, n) in expect {
            assert_eq!(
                blocks(&vol, ino),
                n * UNITS,
                "{kind:?} {ino:?} after a remount"
            );
        }
        // The volume's usage counts the same blocks.
        let usage = vol.usage(&mut |_, _| {}).unwrap();
        let total: u64 = expect.iter().map(|&(_, n)| n).sum();
        assert_eq!(usage.file_blocks, total, "{kind:?} usage");
    }
}

/// Writes are digested in batches, at the latest when the file's last handle closes: until
/// then the count must take in the log's undigested entries (`tar --sparse` takes a file
/// whose `st_blocks` is 0 for all holes, and archives no data).
#[test]
fn changes_count_before_they_are_digested() {
    for kind in KINDS {
        let (vol, _media) = fresh(kind);
        let (f, node) = create(&vol, b"open");
        let open = |n: u64, what: &str| expect(&vol, f.ino, n, &format!("{kind:?} {what}, open"));
        node.write_at(b"x", 1 << 20).unwrap();
        open(1, "one byte a megabyte in");
        node.write_at(&[7u8; 10 * BS as usize], 0).unwrap();
        open(11, "ten blocks at 0");
        node.write_at(&[8u8; 10 * BS as usize], 0).unwrap();
        open(11, "the same blocks again");
        node.punch_hole(3 * BS, 4 * BS).unwrap();
        open(7, "four punched");
        node.set_len(2 * BS).unwrap();
        open(2, "cut to two blocks");
        node.allocate(0, 5 * BS, true).unwrap();
        open(5, "allocated past the end");
        drop(node);
        assert_eq!(blocks(&vol, f.ino), 5 * UNITS, "{kind:?} closed");

        // Changes to digested blocks: overwritten ones count once, punched ones not at all.
        let node = vol.open_ino(f.ino, RW).unwrap();
        node.write_at(&[9u8; 2 * BS as usize], 0).unwrap();
        open(5, "two digested blocks overwritten");
        node.punch_hole(BS, BS).unwrap();
        open(4, "a digested block punched");
        node.write_at(b"z", 8 * BS).unwrap();
        open(5, "a block past the digested ones");
        drop(node);
        assert_eq!(blocks(&vol, f.ino), 5 * UNITS, "{kind:?} closed again");
    }
}

/// A count of undigested pieces keeps what the mapping held under them until the next
/// digest: a block counted as mapped under a pending write, then punched (which digests),
/// counts as a hole under the next write to it.
#[test]
fn counts_under_pending_writes_follow_digests() {
    for kind in KINDS {
        let (vol, _media) = fresh(kind);
        let (f, node) = create(&vol, b"open");
        let open = |n: u64, what: &str| expect(&vol, f.ino, n, &format!("{kind:?} {what}, open"));
        node.write_at(b"far", 100 * BS).unwrap();
        node.write_at(b"near", 5 * BS).unwrap();
        node.punch_hole(50 * BS, BS).unwrap();
        open(2, "two blocks, digested by the punch");
        for round in 0..3 {
            node.write_at(b"again", 5 * BS).unwrap();
            open(2, &format!("round {round}: a mapped block written"));
            node.punch_hole(5 * BS, BS).unwrap();
            open(1, &format!("round {round}: punched"));
            node.write_at(b"back", 5 * BS).unwrap();
            open(2, &format!("round {round}: a hole written"));
        }
    }
}

#[test]
fn a_data_only_clients_sparse_writes_are_counted_by_both_sides() {
    let (path, vol) = common::client_pool("st-blocks");
    let (a, node) = create(&vol, b"f");
    drop(node);
    let client = Volume::attach(&path).unwrap();
    let node = client.open_ino(a.ino, RW).unwrap();
    node.write_at(b"far", 64 * BS).unwrap();
    // Not digested yet while the client holds the file: both sides count it all the same.
    assert_eq!(client.getattr(a.ino).unwrap().blocks, UNITS);
    assert_eq!(blocks(&vol, a.ino), UNITS);
    drop(node);
    assert_eq!(client.getattr(a.ino).unwrap().blocks, UNITS);
    assert_eq!(blocks(&vol, a.ino), UNITS);
    // The owner's count of the file changes with the client's next write.
    let node = client.open_ino(a.ino, RW).unwrap();
    node.write_at(b"first", 0).unwrap();
    assert_eq!(blocks(&vol, a.ino), 2 * UNITS);
    drop(node);
    assert_eq!(client.getattr(a.ino).unwrap().blocks, 2 * UNITS);
    assert_eq!(blocks(&vol, a.ino), 2 * UNITS);
    drop(client);
    drop(vol);
    let _ = std::fs::remove_file(&path);
}
