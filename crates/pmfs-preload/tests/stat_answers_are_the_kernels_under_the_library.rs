//! The path forms of `stat` under the library give the kernel's answers, field by field, for
//! every kind of file: pmfs regular files (answered from the pool), files on mounts that
//! answer exactly from the kernel's cache (answered from the library's own path walk: device
//! nodes, directories, symbolic links, regular files on a disk or memory file system), and
//! the rest (pmfs directories and symbolic links, missing paths: forwarded). So does `statx`,
//! with the mount id the caller asked for. A C program (`programs/stats.c`) compares each form
//! with the `newfstatat` or `statx` system call, which the library does not see.

mod common;

use std::fs;
use std::os::unix::fs::symlink;

use common::{Mounted, TempDir, With, compile, sh_ok};

/// The calls `stats.c` makes per path: six forms of `stat`, `statx` with six masks, following
/// symbolic links and not.
const FORMS: usize = 6 + 6 * 2;

#[test]
fn every_path_form_of_stat_gives_the_kernels_answer() {
    let work = TempDir::new("stats");
    let exe = compile("stats", work.path());
    let local = work.path().join("local");
    fs::create_dir(&local).unwrap();
    fs::write(local.join("file"), b"local bytes").unwrap();
    fs::create_dir(local.join("dir")).unwrap();
    symlink("/dev/null", local.join("to-null")).unwrap();
    symlink("file", local.join("to-file")).unwrap();

    let m = Mounted::new("stats", "64M", "hashfs");
    fs::write(m.path().join("file"), b"pmfs bytes").unwrap();
    fs::create_dir(m.path().join("dir")).unwrap();
    symlink("file", m.path().join("to-file")).unwrap();
    symlink("/dev/null", m.path().join("to-null")).unwrap();

    let mut paths: Vec<String> = [
        "/dev/null",
        "/dev",
        "/",
        "/proc",
        "/sys/kernel",
        "/missing",
        "",
    ]
    .map(str::to_owned)
    .to_vec();
    for dir in [&local, &m.path().to_owned()] {
        paths.push(dir.display().to_string());
        for name in ["file", "to-null", "to-file", "dir", "missing"] {
            paths.push(dir.join(name).display().to_string());
        }
    }
    let quoted: Vec<String> = paths.iter().map(|p| format!("'{p}'")).collect();
    let script = format!("{} {}", exe.display(), quoted.join(" "));
    let stats = work.path().join("counters");
    for with in [With::Kernel, With::Library(&stats)] {
        let out = String::from_utf8(sh_ok(work.path(), &script, with)).unwrap();
        assert_eq!(out.lines().count(), paths.len() * FORMS, "{with:?}: {out}");
        assert!(
            out.lines().all(|l| l.ends_with(": same")),
            "{with:?}: {out}"
        );
    }
    m.unmount_and_fsck();
}
