//! `Client::reattach`, what the preload library's `fork` children make of the client they
//! inherit: a new client through the same mapping that serves reads and writes on its own once
//! the first client is gone, and keeps the pool's client lock held as long as it lives.

mod common;

use common::RW;
use pmfs::{Owner, Volume};

#[test]
fn a_reattached_client_outlives_the_first_and_holds_the_client_lock() {
    let (path, owner) = common::client_pool("reattach");
    let (attr, kernel, _) = owner
        .create_open(owner.root(), b"f", 0o644, Owner::default(), true, RW)
        .unwrap();
    kernel.write_at(b"owner's bytes", 0).unwrap();
    assert_eq!(owner.media().client_locks_elsewhere(), Some(false));

    let first = Volume::attach(&path).unwrap();
    first
        .open_ino(attr.ino, RW)
        .unwrap()
        .write_at(b"FIRST", 0)
        .unwrap();
    let again = first.reattach().unwrap();
    drop(first);
    assert_eq!(
        owner.media().client_locks_elsewhere(),
        Some(true),
        "the lock went with the first client"
    );

    let f = again.open_ino(attr.ino, RW).unwrap();
    let mut buf = [0u8; 13];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 13);
    assert_eq!(&buf, b"FIRST's bytes");
    f.write_at(b"AGAIN", 0).unwrap();
    drop(f);
    kernel.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"AGAIN's bytes");

    drop(again);
    assert_eq!(owner.media().client_locks_elsewhere(), Some(false));
    drop(kernel);
    owner.close().unwrap();
    std::fs::remove_file(&path).unwrap();
}
