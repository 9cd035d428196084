//! `fchown` under the library (`programs/chown.c`, run as root): a change of owner that changes
//! nothing but the ctime — what `sqlite3` running as root asks after every open of its
//! journal, two FUSE requests through the kernel — is served in userspace; every other change
//! (a new owner or group, a file with set-ID bits a change of owner clears) goes to the
//! kernel. The transcript is the same with and without the library and on a local directory,
//! and a read-only mount still refuses with `EROFS`.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Mounted, TempDir, With, compile, counters, runs_agree, sh_in};

/// POSIX leaves open whether `fchown(fd, -1, -1)` raises the ctime: a local file system
/// does, the pmfs daemon (whose kernel sends it no time) does not. The line that tells is
/// left out of the comparison with the local run; the runs on the mount with and without the
/// library are compared whole.
fn neither_ids_ctime_open(transcript: &str) -> String {
    let mut after_neither = false;
    let mut out = String::new();
    for line in transcript.lines() {
        if !after_neither {
            out.push_str(line);
            out.push('\n');
        }
        after_neither = line.starts_with("fchown -1 -1");
    }
    out
}

#[test]
fn fchown_gives_the_same_results_with_and_without_the_library() {
    let ((transcript, _), c, m) = runs_agree("chown", neither_ids_ctime_open);
    assert!(
        transcript.contains("fchown to 1:2                = 0"),
        "{transcript}"
    );
    // Served and counted: the write and the five calls that change nothing on a file without
    // set-ID bits: two on the writer (same ids, -1 for the group), three on the reader (same
    // ids, -1 for both, the locking bit), which need `statmount` to see that the mount is
    // writable. (`fstat` is served too, but not counted.)
    let on_reader = if kernel_has_statmount() { 3 } else { 0 };
    assert_eq!(c.served, 1 + 2 + on_reader, "{c:?}");
    m.unmount_and_fsck();
}

/// Whether this kernel has `statmount` (Linux 6.8).
fn kernel_has_statmount() -> bool {
    const SYS_STATMOUNT: libc::c_long = 457;
    // SAFETY: a null request makes statmount fail with EFAULT where it exists; nothing is
    // read or written.
    let r = unsafe {
        libc::syscall(
            SYS_STATMOUNT,
            std::ptr::null::<u8>(),
            std::ptr::null_mut::<u8>(),
            0usize,
            0u32,
        )
    };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS)
}

/// A read-only bind mount of a directory, unmounted at drop.
struct ReadOnlyView(TempDir);

impl ReadOnlyView {
    fn of(dir: &Path) -> ReadOnlyView {
        let view = TempDir::new("chown-ro-view");
        let mount = |args: &[&str]| {
            let out = Command::new("mount").args(args).output().unwrap();
            assert!(out.status.success(), "mount {args:?}: {out:?}");
        };
        let at = view.path().to_str().unwrap().to_owned();
        mount(&["--bind", dir.to_str().unwrap(), &at]);
        let view = ReadOnlyView(view);
        mount(&["-o", "remount,bind,ro", &at]);
        view
    }
}

impl Drop for ReadOnlyView {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn a_change_through_a_read_only_mount_fails_with_erofs() {
    let m = Mounted::new("chown-ro", "64M", "hashfs");
    std::fs::write(m.path().join("f"), b"data").unwrap();
    let work = TempDir::new("chown-ro");
    let exe = compile("chown", work.path());
    let stats = work.path().join("stats");
    let outputs = {
        let view = ReadOnlyView::of(m.path());
        let run = |with| {
            let cmd = format!("{} {}", exe.display(), view.0.path().join("f").display());
            let out = sh_in(work.path(), &cmd, with);
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        [run(With::Kernel), run(With::Library(&stats))]
    };
    assert_eq!(outputs[0], outputs[1]);
    assert!(
        outputs[1].contains("Read-only file system"),
        "{}",
        outputs[1]
    );
    // The descriptor was a pmfs file, and the call was left to the kernel.
    let c = counters(&stats);
    assert_eq!((c.pmfs_fds, c.served), (1, 0), "{c:?}");
    m.unmount_and_fsck();
}
