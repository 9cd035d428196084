//! Sparse files and large directories through the kernel: `fallocate` (allocate, punch a
//! hole), `lseek` with SEEK_DATA and SEEK_HOLE, truncation, and directories of thousands of
//! entries listed while they change, across a remount.

mod common;

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;

use common::Pool;
use nix::errno::Errno;
use nix::fcntl::{FallocateFlags, fallocate};
use nix::unistd::{Whence, lseek};

const B: i64 = 4096;

#[test]
fn holes_are_found_and_made() {
    let pool = Pool::new("sparse", "128M", "extent");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let path = m.join("sparse");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    // Data at [16K, 20K) and [64K, 72K); a hole up to 1 MiB.
    f.write_all_at(&[1u8; 4096], 16 << 10).unwrap();
    f.write_all_at(&[2u8; 8192], 64 << 10).unwrap();
    f.set_len(1 << 20).unwrap();
    let seek = |off: i64, w: Whence| lseek(&f, off, w);
    assert_eq!(seek(0, Whence::SeekData), Ok(4 * B));
    assert_eq!(seek(4 * B + 10, Whence::SeekData), Ok(4 * B + 10));
    assert_eq!(seek(5 * B, Whence::SeekData), Ok(16 * B));
    assert_eq!(seek(18 * B, Whence::SeekData), Err(Errno::ENXIO));
    assert_eq!(seek(0, Whence::SeekHole), Ok(0));
    assert_eq!(seek(4 * B, Whence::SeekHole), Ok(5 * B));
    assert_eq!(seek(16 * B, Whence::SeekHole), Ok(18 * B));
    assert_eq!(seek(1 << 20, Whence::SeekHole), Err(Errno::ENXIO));
    let mut buf = vec![9u8; 8192];
    f.read_exact_at(&mut buf, 8 * B as u64).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "a hole reads as zeros");

    // Allocation fills the hole without changing what it reads; mode 0 extends the file.
    fallocate(&f, FallocateFlags::empty(), 0, 16 * B).unwrap();
    assert_eq!(seek(0, Whence::SeekData), Ok(0));
    f.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    fallocate(&f, FallocateFlags::empty(), (1 << 20) - B, 4 * B).unwrap();
    assert_eq!(f.metadata().unwrap().len(), (1 << 20) + 3 * B as u64);
    // Preallocation past the end keeps the size; nothing past it becomes readable.
    let before = f.metadata().unwrap().len();
    fallocate(&f, FallocateFlags::FALLOC_FL_KEEP_SIZE, 2 << 20, B).unwrap();
    assert_eq!(f.metadata().unwrap().len(), before);
    assert_eq!(f.read_at(&mut buf, 2 << 20).unwrap(), 0);

    // Punching a hole: whole blocks go back, edges are zeroed, the size stays.
    let punch = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    let len = f.metadata().unwrap().len();
    fallocate(&f, punch, 64 * 1024 + 100, 6000).unwrap();
    assert_eq!(f.metadata().unwrap().len(), len);
    let mut got = vec![0u8; 8192];
    f.read_exact_at(&mut got, 64 << 10).unwrap();
    assert!(got[..100].iter().all(|&b| b == 2));
    assert!(got[100..6100].iter().all(|&b| b == 0));
    assert!(got[6100..].iter().all(|&b| b == 2));
    fallocate(&f, punch, 16 * B, 2 * B).unwrap();
    assert_eq!(seek(16 * B, Whence::SeekHole), Ok(16 * B));
    f.read_exact_at(&mut buf, 16 * B as u64).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    drop(f);
    let content = fs::read(&path).unwrap();
    m.unmount();
    pool.fsck_clean();
    let m = pool.mount(&dir, &[]);
    assert_eq!(fs::read(m.join("sparse")).unwrap(), content);
    m.unmount();
}

#[test]
fn large_directories_list_completely_while_changing() {
    let pool = Pool::new("bigdir", "128M", "radix");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let d = m.join("big");
    fs::create_dir(&d).unwrap();
    let n = 3000;
    for i in 0..n {
        fs::write(
            d.join(format!("entry-with-a-longer-name-{i:05}")),
            i.to_string(),
        )
        .unwrap();
    }
    let listed: BTreeSet<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listed.len(), n);

    // Remove every other entry while listing: every entry that stays is listed exactly once.
    let mut seen = Vec::new();
    for (i, e) in fs::read_dir(&d).unwrap().enumerate() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if i % 2 == 0 {
            fs::remove_file(d.join(&name)).unwrap();
        } else {
            seen.push(name);
        }
    }
    let left: BTreeSet<String> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let unique: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "an entry was listed twice");
    assert_eq!(left, unique);
    assert_eq!(left.len(), n / 2);
    for name in &left {
        let i: usize = name.rsplit('-').next().unwrap().parse().unwrap();
        assert_eq!(fs::read_to_string(d.join(name)).unwrap(), i.to_string());
    }
    m.unmount();
    pool.fsck_clean();
    let m = pool.mount(&dir, &[]);
    assert_eq!(fs::read_dir(m.join("big")).unwrap().count(), n / 2);
    m.unmount();
}

/// The daemon keeps no state for open directories and answers neither FLUSH, FSYNC nor
/// FSYNCDIR (everything is durable on return): handles must behave as POSIX says anyway.
#[test]
fn directory_handles_and_syncs_behave_without_daemon_state() {
    let pool = Pool::new("handles", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let d = m.join("d");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("f"), b"kept").unwrap();

    // A handle opened before a rename lists the directory under its new name.
    let before = fs::read_dir(&d).unwrap();
    fs::rename(&d, m.join("e")).unwrap();
    let names: Vec<_> = before.map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["f"]);

    // fsync and fdatasync of files and directories succeed, again and again.
    let e = m.join("e");
    for _ in 0..3 {
        let f = OpenOptions::new().write(true).open(e.join("f")).unwrap();
        f.sync_all().unwrap();
        f.sync_data().unwrap();
        fs::File::open(&e).unwrap().sync_all().unwrap();
    }

    // A handle on a directory removed since it was opened lists nothing (the kernel's ENOENT
    // for a dead directory is the end of the listing to libc), not even `.` and `..`.
    fs::remove_file(e.join("f")).unwrap();
    let stale = fs::File::open(&e).unwrap();
    fs::remove_dir(&e).unwrap();
    let mut buf = [0u8; 4096];
    // SAFETY: the buffer is valid for writes of its length for the duration of the call.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            std::os::fd::AsRawFd::as_raw_fd(&stale),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    assert_eq!(n, -1);
    assert_eq!(Errno::last(), Errno::ENOENT);
    drop(stale);

    m.unmount();
    pool.fsck_clean();
}
