//! File calls that reach the library before its constructor ran — from the constructor of an
//! object initialised earlier (`programs/early.c`, listed after the library in `LD_PRELOAD`,
//! which the dynamic linker initialises first; Debian's fio does the same with fopen) — are
//! forwarded correctly and initialise the library on the spot: the pmfs file they open is
//! counted.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Mounted, TempDir, counters, library};

#[test]
fn constructor_calls_before_initialisation_work_and_are_seen() {
    let work = TempDir::new("early");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/early.c");
    let early = work.path().join("early.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&early)
        .arg(&src)
        .output()
        .unwrap();
    assert!(out.status.success(), "cc: {out:?}");
    let m = Mounted::new("early", "64M", "hashfs");
    let file = m.path().join("early.txt");
    std::fs::write(&file, "written before\n").unwrap();
    let stats = work.path().join("stats");
    for off in [false, true] {
        let mut cmd = Command::new("cat");
        cmd.arg(&file)
            .env(
                "LD_PRELOAD",
                format!("{} {}", library().display(), early.display()),
            )
            .env("EARLY_FILE", &file)
            .env("PMFS_PRELOAD_STATS", &stats);
        if off {
            cmd.env("PMFS_PRELOAD", "off");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "early: read 15, stdio written before\nwritten before\n"
        );
    }
    let c = counters(&stats);
    // One report (the run with the library off reports nothing): the early open and cat's.
    assert_eq!((c.processes, c.pmfs_fds), (1, 2), "{c:?}");
    assert!(c.pmfs_calls >= 3 && c.served >= 2, "{c:?}");
    m.unmount_and_fsck();
}
