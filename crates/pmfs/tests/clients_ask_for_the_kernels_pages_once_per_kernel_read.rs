//! `Client::on_kernel_pages`: after an update of a file whose pages the kernel may cache (the
//! owner read it for the kernel), a data-only client calls its hook with the file. The hook
//! asks the owner, whose `forget_kernel_pages` (what the daemon does before it has the kernel
//! drop them) means that no page is cached until the owner reads for the kernel again: until
//! then updates call nothing. Writes, punches, truncations and pins of writable mappings all
//! call it; the owner's own writes, a read-only pin and files the kernel never read do not.

mod common;

use std::sync::{Arc, Mutex};

use common::RW;
use pmfs::{Ino, Owner, Volume};

const BS: u64 = 4096;

#[test]
fn a_client_asks_once_per_kernel_read_of_the_file() {
    let (path, owner) = common::client_pool("kernel-pages");
    let root = owner.root();
    let who = Owner { uid: 0, gid: 0 };
    let (attr, kernel, _) = owner.create_open(root, b"f", 0o644, who, true, RW).unwrap();
    let ino = attr.ino;
    let other = owner
        .create_open(root, b"g", 0o644, who, true, RW)
        .unwrap()
        .0
        .ino;
    kernel.write_at(&[b'.'; 4 * BS as usize], 0).unwrap();

    let client = Volume::attach(&path).unwrap();
    let asked: Arc<Mutex<Vec<Ino>>> = Arc::default();
    let log = asked.clone();
    assert!(client.on_kernel_pages(move |i| log.lock().unwrap().push(i)));
    assert!(!client.on_kernel_pages(|_| {}), "set once");
    let take = || std::mem::take(&mut *asked.lock().unwrap());
    let f = client.open_ino(ino, RW).unwrap();
    let g = client.open_ino(other, RW).unwrap();

    f.write_at(b"never read", 0).unwrap();
    g.write_at(b"never read", 0).unwrap();
    assert_eq!(take(), [], "the kernel read neither file");

    let mut buf = [0u8; 16];
    let step = |update: &dyn Fn()| {
        kernel.read_for_kernel(&mut buf.clone(), 0).unwrap();
        update();
        let once = take();
        owner.forget_kernel_pages(ino).unwrap();
        update();
        assert_eq!(take(), [], "no page cached since they were dropped");
        once
    };
    assert_eq!(
        step(&|| {
            f.write_at(b"written", 8).unwrap();
        }),
        [ino]
    );
    assert_eq!(step(&|| f.punch_hole(BS, BS).unwrap()), [ino]);
    assert_eq!(step(&|| f.set_len(3 * BS).unwrap()), [ino]);
    kernel.read_for_kernel(&mut buf, 0).unwrap();
    // Over the punched hole too: mapping a hole fills it, an update of its own.
    kernel.write_at(&[b'o'; 2 * BS as usize], 0).unwrap();
    assert_eq!(take(), [], "the owner's writes go through the kernel");

    let reader = client.map(ino, 0, 2 * BS).unwrap().into_pin();
    drop(reader);
    assert_eq!(take(), [], "a read-only pin");
    let writer = client.map(ino, 0, 2 * BS).unwrap().into_pin().writable();
    writer.stored().unwrap();
    assert_eq!(take(), [ino], "msync of a writable mapping");
    owner.forget_kernel_pages(ino).unwrap();
    writer.stored().unwrap();
    assert!(writer.stored_later().unwrap().is_none());
    assert_eq!(take(), []);
    kernel.read_for_kernel(&mut buf, 0).unwrap();
    let later = writer.stored_later().unwrap().unwrap();
    assert_eq!(take(), [], "asked only when the request is sent");
    later.send();
    assert_eq!(take(), [ino]);
    owner.forget_kernel_pages(ino).unwrap();
    kernel.read_for_kernel(&mut buf, 0).unwrap();
    drop(writer);
    assert_eq!(take(), [ino], "the last munmap");

    assert!(matches!(
        owner.forget_kernel_pages(root),
        Err(pmfs::Error::NotFound)
    ));
    drop((f, g, kernel, client));
    owner.close().unwrap();
    let _ = std::fs::remove_file(&path);
}

/// The owner's socket is named with a random word each read-write mount stores in the pool:
/// a client reads the owner's, and a new mount has a new one.
#[test]
fn the_rendezvous_word_is_the_owners_and_new_at_each_mount() {
    let (path, owner) = common::client_pool("rendezvous");
    let first = owner.rendezvous();
    let client = Volume::attach(&path).unwrap();
    assert_eq!(client.rendezvous(), first);
    drop(client);
    owner.close().unwrap();
    let owner = Volume::open(&path).unwrap();
    assert_ne!(owner.rendezvous(), first);
    assert_ne!(owner.rendezvous(), 0);
    owner.close().unwrap();
    let _ = std::fs::remove_file(&path);
}
