//! A process that attached to a pool keeps descriptors open while its mount goes away — the
//! daemon killed with SIGKILL, or the mount detached with `fusermount3 -u -z` while the daemon
//! still runs. Its next data calls (`programs/vanish.c`: pwrite, write, pread, read, fsync,
//! ftruncate, lseek) all fail with `EIO` in userspace (the counters show they were answered
//! there), it exits normally, none of them reached the pool, and after the owner mounted the
//! pool again the file holds exactly what was written before and fsck is clean.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use common::{Mounted, TempDir, compile, counters, stepped};

const CALLS_AFTER: [&str; 7] = [
    "pwrite after",
    "write after",
    "pread after",
    "read after",
    "fsync after",
    "ftruncate after",
    "lseek end after",
];

fn calls_fail_with_eio_once(tag: &str, take_away: impl FnOnce(&mut Mounted)) {
    let work = TempDir::new(tag);
    let exe = compile("vanish", work.path());
    let mut m = Mounted::new(tag, "64M", "hashfs");
    std::fs::write(m.path().join("f"), vec![b'a'; 8192]).unwrap();
    let stats = work.path().join("stats");
    let mut prog = stepped(&exe, &stats).current_dir(m.path()).spawn().unwrap();
    let mut out = BufReader::new(prog.stdout.take().unwrap());
    let mut before = String::new();
    while !before.ends_with("ready\n") {
        assert!(out.read_line(&mut before).unwrap() > 0, "{before}");
    }
    assert!(!before.contains("errno"), "{before}");

    take_away(&mut m);
    // The daemon is probed at most every 10 ms: wait longer than that.
    std::thread::sleep(Duration::from_millis(100));
    prog.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let after: Vec<String> = out.lines().map(|l| l.unwrap()).collect();
    let status = prog.wait().unwrap();
    assert!(status.success(), "{status}");
    let want: Vec<String> = CALLS_AFTER
        .iter()
        .map(|c| format!("{c:<28} = -1 errno Input/output error"))
        .collect();
    assert_eq!(after, want);
    let c = counters(&stats);
    assert!(c.served >= 2 + CALLS_AFTER.len() as u64, "{c:?}");

    let m = m.remount();
    let f = std::fs::read(m.path().join("f")).unwrap();
    assert_eq!(
        f.len(),
        8192,
        "a call after the mount went away changed the size"
    );
    assert!(
        f[..4096].iter().all(|&b| b == b'b'),
        "the write before is lost"
    );
    assert!(f[4096..].iter().all(|&b| b == b'a'), "a write after landed");
    m.unmount_and_fsck();
}

#[test]
fn a_client_whose_daemon_was_killed_gets_eio() {
    calls_fail_with_eio_once("eio-killed", Mounted::kill_daemon);
}

#[test]
fn a_client_whose_mount_was_detached_gets_eio() {
    calls_fail_with_eio_once("eio-detached", Mounted::detach);
}
