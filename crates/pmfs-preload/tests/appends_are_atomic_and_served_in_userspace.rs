//! `O_APPEND` writes under the library go through the engine's atomic append in userspace.
//! A C program (`programs/append.c`) appends with write, writev, pwrite and pwritev (which
//! append on Linux), through dup'd and read-write descriptions, after in-place writes,
//! truncation and `F_SETFL` changes of other descriptions, and prints the results and the
//! descriptors' offsets: on a pmfs mount the transcript and the file are the same with and
//! without the library and the same as on a local directory. Then several processes append
//! variable-length records to one file at once: every record is there exactly once, whole.
//! The counters show each of those appends was served in userspace.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::{Mounted, TempDir, compile, counters, library, runs_agree};

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
