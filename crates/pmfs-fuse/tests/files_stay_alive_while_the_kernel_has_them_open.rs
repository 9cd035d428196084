//! The daemon is not asked to open files: it answers OPEN with `ENOSYS`, and the kernel then
//! opens without asking and closes without a RELEASE. What keeps a file alive while the
//! kernel has it open after its last name went is the kernel's count of the file's node id,
//! which it forgets only once no open description has the file. So a file removed or
//! renamed over while open must still read, write, grow, shrink and report its attributes;
//! its blocks must come back once its last description closes; and an `O_TRUNC` open, which
//! the kernel now turns into a truncation of its own, must still empty the file.

mod common;

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Pool, sh};

fn free_blocks(dir: &Path) -> u64 {
    sh(&format!("stat -f -c %f '{}'", dir.display()))
        .trim()
        .parse()
        .unwrap()
}

/// Waits until the volume has at least `want` free blocks: the kernel forgets a closed
/// unlinked file asynchronously.
fn wait_for_free(dir: &Path, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while free_blocks(dir) < want {
        assert!(
            Instant::now() < deadline,
            "{} free blocks, expected {want}",
            free_blocks(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn files_removed_while_open_stay_whole_until_the_last_close() {
    const LEN: usize = 1 << 20;
    let pool = Pool::new("open-unlinked", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    // Written in an earlier mount: this one knows the files only from the lookups of the
    // opens below, and has served no request on them when their names go.
    let m = pool.mount(&dir, &[]);
    fs::write(m.join("a"), pattern(LEN, 1)).unwrap();
    fs::write(m.join("b"), pattern(LEN, 2)).unwrap();
    fs::write(m.join("c"), pattern(LEN, 3)).unwrap();
    m.unmount();
    let m = pool.mount(&dir, &[]);
    let base = free_blocks(m.path());

    let rw = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("a"))
        .unwrap();
    let ro = File::open(m.join("a")).unwrap();
    let over = File::open(m.join("b")).unwrap();
    // Removed by other processes.
    sh(&format!(
        "rm '{}' && mv '{}' '{}'",
        m.join("a").display(),
        m.join("c").display(),
        m.join("b").display()
    ));
    assert!(!m.join("a").exists());

    let mut back = vec![0u8; LEN];
    ro.read_exact_at(&mut back, 0).unwrap();
    assert!(back == pattern(LEN, 1), "the unlinked file reads whole");
    over.read_exact_at(&mut back, 0).unwrap();
    assert!(back == pattern(LEN, 2), "the file renamed over reads whole");
    let mut named = vec![0u8; LEN];
    File::open(m.join("b"))
        .unwrap()
        .read_exact_at(&mut named, 0)
        .unwrap();
    assert!(named == pattern(LEN, 3), "the name has the new file");

    let md = ro.metadata().unwrap();
    assert_eq!((md.len(), md.nlink()), (LEN as u64, 0));
    rw.write_all_at(b"after the unlink", LEN as u64).unwrap();
    let mut tail = [0u8; 16];
    ro.read_exact_at(&mut tail, LEN as u64).unwrap();
    assert_eq!(&tail, b"after the unlink");
    rw.set_len(4096).unwrap();
    assert_eq!(ro.metadata().unwrap().len(), 4096);
    assert_eq!(ro.read_at(&mut tail, 4096).unwrap(), 0);

    // One description left: still alive.
    drop(rw);
    ro.read_exact_at(&mut back[..4096], 0).unwrap();
    assert!(back[..4096] == pattern(LEN, 1)[..4096]);

    // The last closes give the blocks of both back (256 each).
    drop(ro);
    drop(over);
    wait_for_free(m.path(), base + 512);

    m.unmount();
    pool.fsck_clean();
}

#[test]
fn opens_with_o_trunc_empty_the_file() {
    let pool = Pool::new("open-trunc", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let path = m.join("f");
    fs::write(&path, pattern(1 << 20, 7)).unwrap();
    let keep = File::open(&path).unwrap();
    let base = free_blocks(m.path());
    let t = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    assert_eq!(t.metadata().unwrap().len(), 0);
    assert_eq!(keep.metadata().unwrap().len(), 0);
    wait_for_free(m.path(), base + 256);
    t.write_all_at(b"new", 0).unwrap();
    drop((t, keep));
    assert_eq!(fs::read(&path).unwrap(), b"new");
    m.unmount();
    pool.fsck_clean();
}
