//! A process that reads a file through the kernel (without the library) keeps the pages it
//! read in the kernel's page cache, and the kernel drops them only when the file's mtime or
//! size it fetches before each read has changed. Writes served in userspace bypass the
//! kernel; the daemon marks files whose pages the kernel may hold, and a client's write to
//! such a file moves the mtime, so each read through the kernel after a write returned sees
//! it. A C program (`programs/writer.c`) under the library writes (and punches holes) one step
//! at a time while this test reads through the kernel from a descriptor it keeps open.
//!
//! A kernel mapping fetches no attributes: its pages stay until the daemon has the kernel drop
//! them. A client that updated a file the kernel may cache asks the daemon to (through
//! `pmfs::kernel_pages`) before its update returns, so a mapping through the kernel sees each
//! write, punch and `msync`ed store of the client too. And the daemon does not keep the log
//! of a file it reads for the kernel, which would keep the client from freeing its blocks.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;

use std::path::PathBuf;
use std::process::Child;

use common::{Mounted, TempDir, compile, counters, free_blocks, stepped};

/// A mount named `tag` with a file of three blocks of dots, `programs/writer.c` built in a
/// work directory, and where its counters go.
struct Setup {
    work: TempDir,
    exe: PathBuf,
    m: Mounted,
    path: PathBuf,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let work = TempDir::new(tag);
        let exe = compile("writer", work.path());
        let m = Mounted::new(tag, "64M", "hashfs");
        let path = m.path().join("f");
        std::fs::write(&path, vec![b'.'; 3 * 4096]).unwrap();
        Setup { work, exe, m, path }
    }

    fn stats(&self) -> PathBuf {
        self.work.path().join("stats")
    }

    /// Starts the writer on the file under the library; returns it and a function that sends
    /// it one line and checks that it answered "ok".
    fn writer(&self) -> (Child, impl FnMut(String) + use<>) {
        let mut child = stepped(&self.exe, &self.stats())
            .arg(&self.path)
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        let mut output = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        output.read_line(&mut line).unwrap();
        assert_eq!(line.trim_end(), "ready");
        let ask = move |line: String| {
            writeln!(input, "{line}").unwrap();
            let mut answer = String::new();
            output.read_line(&mut answer).unwrap();
            assert_eq!(answer.trim_end(), "ok", "{line}");
        };
        (child, ask)
    }
}

/// Has the writer write step `k` (its number in 8 digits) `times` times at the start of
/// block `k % blocks`, then reads it back through the kernel from `reader`.
fn write_then_read(ask: &mut impl FnMut(String), reader: &File, k: u32, blocks: u32, times: u32) {
    let text = format!("{k:08}");
    let at = 4096 * u64::from(k % blocks);
    ask(format!("again {times} {at} {text}"));
    let mut word = [0u8; 8];
    reader.read_exact_at(&mut word, at).unwrap();
    assert_eq!(
        std::str::from_utf8(&word).unwrap(),
        text,
        "read {k} through the kernel"
    );
}

#[test]
fn reads_through_the_kernel_see_each_write_served_in_userspace() {
    let s = Setup::new("kernel-readers");
    let path = &s.path;
    let reader = File::open(path).unwrap();
    let mut word = [0u8; 8];
    reader.read_exact_at(&mut word, 0).unwrap();
    assert_eq!(&word, b"........");

    let (mut child, mut ask) = s.writer();

    for k in 0..300u32 {
        write_then_read(&mut ask, &reader, k, 2, 1);
    }
    ask("punch 0 8192".to_owned());
    let mut back = vec![1u8; 3 * 4096];
    reader.read_exact_at(&mut back, 0).unwrap();
    assert!(
        back[..8192].iter().all(|&b| b == 0),
        "the hole reads as zeros"
    );
    assert!(back[8192..].iter().all(|&b| b == b'.'));

    // A write after the reader closed the file: the kernel keeps the pages it read from one
    // open to the next, and the write moves the mtime, which the next open fetches.
    drop(reader);
    ask("100 AFTER-CLOSE".to_owned());
    let again = OpenOptions::new().read(true).open(path).unwrap();
    let mut tail = [0u8; 11];
    again.read_exact_at(&mut tail, 100).unwrap();
    assert_eq!(&tail, b"AFTER-CLOSE");
    drop(again);

    drop(ask);
    assert!(child.wait().unwrap().success());
    let c = counters(&s.stats());
    assert!(c.served >= 300, "{c:?}");
    s.m.unmount_and_fsck();
}

/// The daemon serves the kernel's reads with a handle of the file's log, and lets go of it
/// after each: the writer under the library is then alone with the log and frees the log
/// blocks its compactions retire. While the daemon kept the handle until the kernel released
/// the file, they stayed allocated (one per 500 writes or so) until the reader closed it.
#[test]
fn a_reader_through_the_kernel_leaves_the_log_to_the_writer() {
    let s = Setup::new("kernel-reader-log");
    let reader = File::open(&s.path).unwrap();
    let mut word = [0u8; 8];
    reader.read_exact_at(&mut word, 0).unwrap();
    let (mut child, mut ask) = s.writer();
    let before = free_blocks(s.m.path());
    for k in 0..40u32 {
        write_then_read(&mut ask, &reader, k, 3, 5000);
    }
    let held = before.saturating_sub(free_blocks(s.m.path()));
    drop(ask);
    assert!(child.wait().unwrap().success());
    drop(reader);
    // 200,000 writes: 460 blocks held while the daemon kept its handle, none since; the old
    // data blocks waiting for a digest would count too (up to 128).
    assert!(held < 160, "{held} blocks held");
    s.m.unmount_and_fsck();
}

#[test]
fn mappings_through_the_kernel_see_each_update_served_in_userspace() {
    let s = Setup::new("kernel-mappers");
    let path = &s.path;
    let file = File::open(path).unwrap();
    // SAFETY: the file is not truncated while mapped; its bytes change under the mapping,
    // which is only read through volatile copies into a buffer below.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let seen = |at: usize, len: usize| -> Vec<u8> {
        (at..at + len)
            // SAFETY: in bounds of the mapping.
            .map(|i| unsafe { std::ptr::read_volatile(map.as_ptr().add(i)) })
            .collect()
    };
    assert_eq!(seen(0, 8), b"........");

    let (mut child, mut ask) = s.writer();
    for k in 0..200u32 {
        let text = format!("{k:08}");
        let at = 4096 * (k % 3) as usize + 100;
        match k % 2 {
            0 => ask(format!("{at} {text}")),
            _ => ask(format!("store {at} {text}")),
        }
        assert_eq!(
            String::from_utf8(seen(at, 8)).unwrap(),
            text,
            "step {k}: the kernel's mapping shows the update"
        );
    }
    ask("punch 4096 4096".to_owned());
    assert!(
        seen(4096, 4096).iter().all(|&b| b == 0),
        "the hole reads as zeros"
    );
    drop((map, file));

    drop(ask);
    assert!(child.wait().unwrap().success());
    let c = counters(&s.stats());
    assert!(c.served >= 100, "{c:?}");
    s.m.unmount_and_fsck();
}
