//! Writes are digested into the mapping structure and the inode's size word in batches, so
//! while a file is open the size word may lag behind its log. `metadata` by path, through an
//! open file, and by inode number must still report the size with every returned write in
//! it: from this process's open file, and from a file another client of the pool has open and
//! this process does not.

mod common;

use std::sync::Arc;

use common::KINDS;
use pmfs::{OpenMode, OpenOptions, Options, Volume};
use pmfs_core::pm::HeapRegion;

#[test]
fn stat_by_path_sees_the_writes_of_an_open_file() {
    for kind in KINDS {
        let media = Arc::new(HeapRegion::new(16 << 20).unwrap());
        let vol = Volume::format(media, &Options::with_mapping(kind)).unwrap();
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .open(&vol, "/f")
            .unwrap();
        for i in 0..3u64 {
            f.write_at(&[i as u8 + 1; 1000], i * 1000).unwrap();
            assert_eq!(
                vol.metadata("/f").unwrap().len(),
                (i + 1) * 1000,
                "{kind:?}"
            );
        }
        f.write_at(b"x", 9999).unwrap();
        assert_eq!(vol.metadata("/f").unwrap().len(), 10_000, "{kind:?}");
        assert_eq!(f.metadata().unwrap().len(), 10_000, "{kind:?}");
        f.set_len(1500).unwrap();
        assert_eq!(vol.metadata("/f").unwrap().len(), 1500, "{kind:?}");
        drop(f);
        assert_eq!(vol.metadata("/f").unwrap().len(), 1500, "{kind:?}");
        assert_eq!(vol.read("/f").unwrap().len(), 1500, "{kind:?}");
    }
}

#[test]
fn the_owner_sees_the_size_a_client_wrote() {
    let (path, owner) = common::client_pool("stat-client");
    owner.write("/f", b"").unwrap();
    let ino = owner.lookup(owner.root(), b"f").unwrap().ino;
    let client = Volume::attach(&path).unwrap();
    let rw = OpenMode {
        read: true,
        write: true,
        truncate: false,
    };
    let f = client.open_ino(ino, rw).unwrap();
    f.write_at(&[5u8; 5000], 0).unwrap();
    // The owner has no open file: it reads the client's log through a handle of its own.
    assert_eq!(owner.metadata("/f").unwrap().len(), 5000);
    assert_eq!(owner.getattr(ino).unwrap().size, 5000);
    f.write_at(&[6u8; 10], 7000).unwrap();
    assert_eq!(owner.metadata("/f").unwrap().len(), 7010);
    drop(f);
    drop(client);
    assert_eq!(owner.metadata("/f").unwrap().len(), 7010);
    owner.close().unwrap();
    std::fs::remove_file(&path).unwrap();
}
