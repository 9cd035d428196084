//! The owner of a HashFS volume frees the blocks of deleted files in batches (one scan of
//! the table frees many files), but never lets them hold more than a small share of the
//! table: a large file's blocks come back when it is deleted. A data-only client, which
//! cannot make the owner free what it deferred, can then write into them; and the slots of
//! the dead files do not lengthen every walk of the table meanwhile.

mod common;

use pmfs::{OpenMode, Owner};

const RW: OpenMode = OpenMode {
    read: true,
    write: true,
    truncate: false,
};

#[test]
fn a_client_writes_into_the_space_of_a_large_file_the_owner_deleted() {
    let (path, vol) = common::client_pool("deferred-share");
    let root = vol.root();
    let who = Owner { uid: 0, gid: 0 };
    let free = vol.statfs().unwrap().free_blocks;
    let len = (free * 3 / 5 * 4096) as usize;

    let (_, big, _) = vol.create_open(root, b"big", 0o644, who, true, RW).unwrap();
    big.write_at(&vec![7; len], 0).unwrap();
    drop(big);
    let (next, _, _) = vol
        .create_open(root, b"next", 0o644, who, true, RW)
        .unwrap();
    vol.unlink_at(root, b"big").unwrap();

    let client = pmfs::Volume::attach(&path).unwrap();
    let node = client.open_ino(next.ino, RW).unwrap();
    node.write_at(&vec![9; len], 0).unwrap();
    assert_eq!(client.size(next.ino).unwrap(), len as u64);
    let mut back = vec![0; len];
    assert_eq!(node.read_at(&mut back, 0).unwrap(), len);
    assert!(back.iter().all(|&b| b == 9));
    drop(node);
    drop(client);
    drop(vol);
    let _ = std::fs::remove_file(&path);
}
