//! A process that reads a file through the kernel (without the library) keeps the pages it
//! read in the kernel's page cache, and the kernel drops them only when the file's mtime or
//! size it fetches before each read has changed. Writes served in userspace bypass the
//! kernel; the daemon marks files whose pages the kernel may hold, and a client's write to
//! such a file moves the mtime, so each read through the kernel after a write returned sees
//! it. A C program (`programs/writer.c`) under the library writes (and punches holes) one step
//! at a time while this test reads through the kernel from a descriptor it keeps open.

mod common;

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;

use common::{Mounted, TempDir, compile, counters, stepped};

#[test]
fn reads_through_the_kernel_see_each_write_served_in_userspace() {
    let work = TempDir::new("kernel-readers");
    let exe = compile("writer", work.path());
    let stats = work.path().join("stats");
    let m = Mounted::new("kernel-readers", "64M", "hashfs");
    let path = m.path().join("f");
    std::fs::write(&path, vec![b'.'; 3 * 4096]).unwrap();
    let reader = File::open(&path).unwrap();
    let mut word = [0u8; 8];
    reader.read_exact_at(&mut word, 0).unwrap();
    assert_eq!(&word, b"........");

    let mut child = stepped(&exe, &stats).arg(&path).spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    output.read_line(&mut line).unwrap();
    assert_eq!(line.trim_end(), "ready");
    let mut ask = move |line: String| {
        writeln!(input, "{line}").unwrap();
        let mut answer = String::new();
        output.read_line(&mut answer).unwrap();
        assert_eq!(answer.trim_end(), "ok", "{line}");
    };

    for k in 0..300u32 {
        let text = format!("{k:08}");
        ask(format!("{} {text}", 4096 * (k % 2)));
        reader
            .read_exact_at(&mut word, 4096 * u64::from(k % 2))
            .unwrap();
        assert_eq!(
            std::str::from_utf8(&word).unwrap(),
            text,
            "read {k} through the kernel"
        );
    }
    ask("punch 0 8192".to_owned());
    let mut back = vec![1u8; 3 * 4096];
    reader.read_exact_at(&mut back, 0).unwrap();
    assert!(
        back[..8192].iter().all(|&b| b == 0),
        "the hole reads as zeros"
    );
    assert!(back[8192..].iter().all(|&b| b == b'.'));

    // A writer that opened the file after the last close of every other: the kernel caches
    // nothing of it until it reads again.
    drop(reader);
    ask("100 AFTER-CLOSE".to_owned());
    let again = OpenOptions::new().read(true).open(&path).unwrap();
    let mut tail = [0u8; 11];
    again.read_exact_at(&mut tail, 100).unwrap();
    assert_eq!(&tail, b"AFTER-CLOSE");
    drop(again);

    drop(ask);
    assert!(child.wait().unwrap().success());
    let c = counters(&stats);
    assert!(c.served >= 300, "{c:?}");
    m.unmount_and_fsck();
}
