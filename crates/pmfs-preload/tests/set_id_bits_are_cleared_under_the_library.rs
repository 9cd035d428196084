//! A write by a user without CAP_FSETID clears a file's set-user-ID bit (and set-group-ID with
//! group-execute), with the library as without it: such a descriptor's updates go through the
//! kernel, whose daemon clears the bits, while root's writes to the same file keep them and
//! are served in userspace.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{Mounted, TempDir, With, counters, library, sh_ok};

const NOBODY: &str = "65534";

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

/// Runs `script` under the library as user and group nobody, without supplementary groups,
/// its counters appended to `stats`.
fn as_nobody_with_library(dir: &Path, script: &str, stats: &Path) {
    let out = Command::new("setpriv")
        .args(["--reuid", NOBODY, "--regid", NOBODY, "--clear-groups"])
        .args(["sh", "-c", script])
        .current_dir(dir)
        .stdin(Stdio::null())
        .env("LD_PRELOAD", library())
        .env("PMFS_PRELOAD_STATS", stats)
        .env_remove("PMFS_PRELOAD")
        .output()
        .unwrap();
    assert!(out.status.success(), "`{script}` as nobody: {out:?}");
}

#[test]
fn writes_by_other_users_clear_set_id_bits_under_the_library() {
    let m = Mounted::new("setid", "64M", "hashfs");
    // Other users may attach to the pool (and so be served in userspace).
    chmod(m.path().parent().unwrap(), 0o755);
    chmod(m.pool(), 0o666);
    chmod(m.path(), 0o777);
    let work = TempDir::new("setid-stats");
    chmod(work.path(), 0o777);
    let f = m.path().join("f");
    fs::write(&f, b"0123").unwrap();

    // Another user's append, truncation and fallocate each clear both bits; its reads are
    // served in userspace, so it was attached.
    let stats = work.path().join("nobody");
    for cmd in ["printf abc >> f", "truncate -s 2 f", "fallocate -l 8192 f"] {
        chmod(&f, 0o6777);
        as_nobody_with_library(m.path(), &format!("{cmd} && cat f > /dev/null"), &stats);
        assert_eq!(mode(&f), 0o777, "{cmd}");
    }
    let c = counters(&stats);
    assert!(c.served >= 3, "{c:?}");
    // Set-group-ID without group-execute is not a privilege: it stays.
    chmod(&f, 0o2666);
    as_nobody_with_library(m.path(), "printf def >> f", &stats);
    assert_eq!(mode(&f), 0o2666);

    // Root keeps them, and its writes are served in userspace.
    chmod(&f, 0o6777);
    let stats = work.path().join("root");
    sh_ok(
        m.path(),
        "printf ghi >> f && printf jkl | dd of=f bs=1 seek=1 conv=notrunc status=none",
        With::Library(&stats),
    );
    assert_eq!(mode(&f), 0o6777);
    let c = counters(&stats);
    assert!(c.served >= 2, "{c:?}");

    let data = fs::read(&f).unwrap();
    assert_eq!(&data[..4], b"0jkl");
    assert!(data.ends_with(b"defghi"), "{data:?}");
    m.unmount_and_fsck();
}
