//! `O_APPEND` writes under the library go through the engine's atomic append in userspace.
//! A C program (`programs/append.c`) appends with write, writev, pwrite and pwritev (which
//! append on Linux), through dup'd and read-write descriptions, after in-place writes,
//! truncation and `F_SETFL` changes of other descriptions, and prints the results and the
//! descriptors' offsets: on a pmfs mount the transcript and the file are the same with and
//! without the library and the same as on a local directory. Then several processes append
//! variable-length records to one file at once: every record is there exactly once, whole.
//! The counters show each of those appends was served in userspace. Last, a process on the
//! kernel path appends after a library client grew the file: its bytes land after that
//! growth, not at the size the kernel had cached.

mod common;

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::Write;
use std::process::Command;

use common::{Mounted, TempDir, With, compile, counters, library, runs_agree, sh_ok};

#[test]
fn appends_give_the_kernels_results_and_offsets() {
    let ((library, _), c, m) = runs_agree("append", str::to_owned);
    assert!(!library.contains("errno"), "{library}");
    assert_eq!(c.processes, 1, "{c:?}");
    // 7 writes, a writev, a pwrite, a pwritev and 5 more writes append; the in-place
    // writes, ftruncate and the reads are served too.
    assert!(c.served >= 16 + 4, "{c:?}");
    m.unmount_and_fsck();
}

#[test]
fn concurrent_appenders_never_overwrite_each_other() {
    const WRITERS: usize = 4;
    const RECORDS: usize = 300;
    let work = TempDir::new("append-hammer");
    let exe = compile("append", work.path());
    let m = Mounted::new("append-hammer", "256M", "hashfs");
    let stats = work.path().join("stats");
    let writers: Vec<_> = (0..WRITERS)
        .map(|id| {
            Command::new(&exe)
                .args(["hammer", &id.to_string(), &RECORDS.to_string()])
                .current_dir(m.path())
                .env("LD_PRELOAD", library())
                .env("PMFS_PRELOAD_STATS", &stats)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut w in writers {
        assert!(w.wait().unwrap().success());
    }

    let data = std::fs::read(m.path().join("shared")).unwrap();
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for rec in data.split_inclusive(|&b| b == b'\n') {
        let text = std::str::from_utf8(rec).unwrap();
        let mut head = text.splitn(4, ':');
        let id: usize = head.next().unwrap().parse().unwrap();
        let i: usize = head.next().unwrap().parse().unwrap();
        let len: usize = head.next().unwrap().parse().unwrap();
        let fill = head.next().unwrap();
        assert_eq!(rec.len(), len, "record {id}:{i} torn");
        let letter = char::from(b'a' + id as u8);
        assert!(
            fill.trim_end_matches('\n').chars().all(|ch| ch == letter),
            "record {id}:{i} mixed with another"
        );
        assert!(seen.insert((id, i)), "record {id}:{i} twice");
        total += len;
    }
    assert_eq!(seen.len(), WRITERS * RECORDS, "records lost");
    assert_eq!(total, data.len());

    let c = counters(&stats);
    assert_eq!(c.processes, WRITERS as u64, "{c:?}");
    assert!(c.served >= (WRITERS * RECORDS) as u64, "{c:?}");
    m.unmount_and_fsck();
}

#[test]
fn kernel_path_appends_land_after_what_a_library_client_appended() {
    let work = TempDir::new("append-mixed");
    let m = Mounted::new("append-mixed", "64M", "hashfs");
    let path = m.path().join("log");
    std::fs::write(&path, vec![b'a'; 1 << 20]).unwrap();
    // This process appends through the kernel, which has seen the file at 1 MiB (opening it
    // asked the daemon for its attributes).
    let mut kernel = OpenOptions::new().append(true).open(&path).unwrap();
    let stats = work.path().join("stats");
    sh_ok(
        m.path(),
        "dd if=/dev/zero of=log bs=1M count=3 oflag=append conv=notrunc status=none",
        With::Library(&stats),
    );
    assert!(counters(&stats).served >= 3, "{:?}", counters(&stats));
    kernel.write_all(b"TAIL").unwrap();
    drop(kernel);
    let data = std::fs::read(&path).unwrap();
    assert_eq!(data.len(), (4 << 20) + 4, "an append overwrote another");
    assert!(data[..1 << 20].iter().all(|&b| b == b'a'));
    assert!(data[1 << 20..4 << 20].iter().all(|&b| b == 0));
    assert_eq!(&data[4 << 20..], b"TAIL");
    m.unmount_and_fsck();
}
