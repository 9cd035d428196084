//! The `pmfs` command as a user meets it: one-line errors for a missing pool, a bad magic, a
//! pool in use and a mount point that is not a directory; `info` and `fsck` output; the
//! background start; a clean unmount on SIGTERM and SIGINT; the `mount.fuse.pmfs` helper name
//! that mount(8) runs; what `info` and a mount after a crash say they repaired.

mod common;

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::process::Command;

use common::{
    PMFS, Pool, TempDir, Unmount, mappings_of, mounted, pmfs, pmfs_as_nobody, pmfs_ok, sh, wait_for,
};

fn one_line_error(args: &[&str]) -> String {
    let o = pmfs(args);
    assert!(!o.status.success(), "pmfs {args:?} succeeded");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("pmfs: "), "{err}");
    err
}

#[test]
fn errors_are_one_line_and_name_the_problem() {
    let t = TempDir::new("cli-errors");
    let missing = t.path().join("missing");
    let e = one_line_error(&["info", missing.to_str().unwrap()]);
    assert!(e.contains("no such pool file"), "{e}");
    let e = one_line_error(&[
        "mount",
        missing.to_str().unwrap(),
        t.path().to_str().unwrap(),
    ]);
    assert!(e.contains("no such pool file"), "{e}");

    let junk = t.path().join("junk");
    fs::write(&junk, vec![0x5au8; 16 << 20]).unwrap();
    let e = one_line_error(&["fsck", junk.to_str().unwrap()]);
    assert!(e.contains("bad magic"), "{e}");
    let e = one_line_error(&["info", junk.to_str().unwrap()]);
    assert!(e.contains("bad magic"), "{e}");

    let pool = Pool::new("cli-in-use", "64M", "cuckoo");
    let p = pool.pool.to_str().unwrap();
    let e = one_line_error(&["mount", p, junk.to_str().unwrap()]);
    assert!(e.contains("is not a directory"), "{e}");
    let e = one_line_error(&["mkfs", p, "--size", "64M"]);
    assert!(e.contains("exists"), "{e}");
    let e = one_line_error(&[
        "mkfs",
        t.path().join("tiny").to_str().unwrap(),
        "--size",
        "1M",
    ]);
    assert!(e.contains("below the minimum"), "{e}");

    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let other = pool.mount_point("other");
    for args in [
        vec!["mount", p, other.to_str().unwrap()],
        vec!["fsck", p],
        vec!["mkfs", p, "--force"],
    ] {
        let e = one_line_error(&args);
        assert!(e.contains("in use"), "{args:?}: {e}");
    }
    // info of a served pool tells where it is mounted and what statfs says.
    let info = pmfs_ok(&["info", p]);
    assert!(
        info.contains(&format!("mounted on {}", dir.display())),
        "{info}"
    );
    assert!(info.contains("data blocks"), "{info}");
    m.unmount();
    let e = one_line_error(&["mount", p, dir.to_str().unwrap(), "-o", "bogus"]);
    assert!(e.contains("unknown mount option"), "{e}");
    assert!(!mounted(&dir));
}

#[test]
fn info_and_fsck_describe_the_volume() {
    let pool = Pool::new("cli-info", "64M", "hashfs");
    let p = pool.pool.to_str().unwrap();
    assert_eq!(
        fs::metadata(&pool.pool).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    fs::write(m.join("a"), vec![7u8; 1 << 20]).unwrap();
    fs::create_dir(m.join("d")).unwrap();
    m.unmount();
    let info = pmfs_ok(&["info", p]);
    for want in [
        "mapping:      HashFs",
        &format!("format:       version {}", pmfs::FORMAT_VERSION),
        "layout score",
        "1 files (1.0 MiB), 2 directories",
        "closed cleanly",
        "inode table",
    ] {
        assert!(info.contains(want), "{want:?} missing in\n{info}");
    }
    // Every data block of a HashFS pool is one slot of its table: the slots in use are the
    // blocks in use, and the three counts add up to the data blocks.
    let numbers = |prefix: &str| -> Vec<u64> {
        let line = info
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in\n{info}"));
        line.split(|c: char| !c.is_ascii_digit() && c != '.')
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    let (used, total) = match numbers("data blocks")[..] {
        [used, total, ..] => (used, total),
        _ => panic!("{info}"),
    };
    let [empty, tombstones, in_use] = numbers("hash slots")[..] else {
        panic!("{info}");
    };
    assert!(used >= 256, "{info}");
    assert_eq!(in_use, used, "{info}");
    assert_eq!(empty + tombstones + in_use, total, "{info}");
    let fsck = pmfs_ok(&["fsck", p]);
    assert!(fsck.ends_with("clean\n"), "{fsck}");
    let r = pmfs_ok(&["fsck", "--repair", p]);
    assert!(r.contains("clean"), "{r}");
    // A pool its user may only read: info and fsck need no more, repair says what it needs.
    fs::set_permissions(&pool.pool, fs::Permissions::from_mode(0o444)).unwrap();
    for (args, out) in [(&["info", p][..], &info), (&["fsck", p], &fsck)] {
        let o = pmfs_as_nobody(args);
        assert!(o.status.success(), "{args:?}: {o:?}");
        assert_eq!(&String::from_utf8_lossy(&o.stdout), out, "{args:?}");
    }
    let o = pmfs_as_nobody(&["fsck", "--repair", p]);
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!(
            "pmfs: {p}: permission denied (the pool file must be readable and writable; \
             `pmfs info`, `pmfs fsck` and `pmfs mount -o ro` only read it)\n"
        )
    );
    fs::set_permissions(&pool.pool, fs::Permissions::from_mode(0o600)).unwrap();
    // Readers share the pool: beside another reader's lock, info and fsck run; whatever
    // writes or serves the pool does not.
    let reader = fs::File::open(&pool.pool).unwrap();
    reader.try_lock_shared().unwrap();
    for (args, out) in [(&["info", p][..], &info), (&["fsck", p], &fsck)] {
        assert_eq!(&pmfs_ok(args), out, "{args:?}");
    }
    let other = pool.mount_point("other");
    for args in [
        vec!["fsck", "--repair", p],
        vec!["mkfs", p, "--force"],
        vec!["mount", p, other.to_str().unwrap(), "-f"],
        vec!["mount", p, other.to_str().unwrap(), "-f", "-o", "ro"],
    ] {
        let e = one_line_error(&args);
        assert!(e.contains("in use"), "{args:?}: {e}");
    }
    drop(reader);
    // A read-only mount holds the pool alone.
    let m = pool.mount(&dir, &["ro"]);
    let e = one_line_error(&["fsck", p]);
    assert!(e.contains("in use"), "{e}");
    m.unmount();
    // --help for every command.
    for cmd in ["mkfs", "mount", "fsck", "info"] {
        let h = pmfs_ok(&[cmd, "--help"]);
        assert!(h.contains("Usage: pmfs"), "{h}");
    }
}

#[test]
fn signals_and_fusermount_unmount_cleanly() {
    let pool = Pool::new("cli-signals", "64M", "hashfs");
    let p = pool.pool.to_str().unwrap();
    let dir = pool.mount_point("mnt");
    for signal in ["TERM", "INT"] {
        let mut m = pool.mount(&dir, &[]);
        fs::write(m.join(signal), signal).unwrap();
        let daemon = m.daemon.take().unwrap();
        sh(&format!("kill -{signal} {}", daemon.id()));
        let status = wait_for(daemon, std::time::Duration::from_secs(30));
        assert!(status.success(), "daemon after SIG{signal}: {status}");
        assert!(!mounted(&dir));
        drop(m);
        // Closed cleanly: a read-only mount reads what was written, takes no write, and
        // writes nothing to the pool, which it maps read-only.
        let before = fs::read(&pool.pool).unwrap();
        let m = pool.mount(&dir, &["ro"]);
        assert_eq!(fs::read(m.join(signal)).unwrap(), signal.as_bytes());
        assert!(fs::write(m.join("x"), b"x").is_err());
        sh(&format!("df {} && ls -l {}", dir.display(), dir.display()));
        assert_eq!(mappings_of(&pool.pool), ["r--s"]);
        m.unmount();
        assert!(
            fs::read(&pool.pool).unwrap() == before,
            "the read-only mount wrote"
        );
    }
    // The background start returns once mounted; fusermount3 -u stops the daemon.
    let _guard = Unmount(dir.clone());
    pmfs_ok(&["mount", p, dir.to_str().unwrap()]);
    assert!(mounted(&dir));
    fs::write(dir.join("bg"), b"background").unwrap();
    sh(&format!("fusermount3 -u {}", dir.display()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while pmfs(&["info", p]).status.code() != Some(0) {
        assert!(std::time::Instant::now() < deadline, "daemon kept the pool");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(pmfs_ok(&["info", p]).contains("state        closed cleanly\n"));
}

#[test]
fn the_mount_helper_takes_mount8_arguments() {
    let pool = Pool::new("cli-helper", "64M", "hashfs");
    let bin = TempDir::new("cli-helper-bin");
    let helper = bin.path().join("mount.fuse.pmfs");
    symlink(PMFS, &helper).unwrap();
    let dir = pool.mount_point("mnt");
    let _guard = Unmount(dir.clone());
    // What mount(8) runs for `mount -t fuse.pmfs POOL DIR -o noatime` or an fstab line.
    let st = Command::new(&helper)
        .arg(&pool.pool)
        .arg(&dir)
        .args([
            "-n",
            "-o",
            "rw,noatime,nofail,x-systemd.automount,threads=2",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(mounted(&dir));
    fs::write(dir.join("via-helper"), b"ok").unwrap();
    sh(&format!("umount {}", dir.display()));
    assert!(!mounted(&dir));
    let st = Command::new(&helper)
        .arg(&pool.pool)
        .args(["-o", "rw"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(2));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while pmfs(&["fsck", pool.pool.to_str().unwrap()]).status.code() != Some(0) {
        assert!(std::time::Instant::now() < deadline, "daemon kept the pool");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn info_and_the_mount_after_a_crash_say_what_was_repaired() {
    let pool = Pool::new("cli-recovered", "64M", "hashfs");
    let p = pool.pool.to_str().unwrap();
    let dir = pool.mount_point("mnt");
    let d = dir.to_str().unwrap();
    // The daemon dies holding a file unlinked while open: an orphan for the next mount.
    let crash = || {
        let m = pool.mount(&dir, &[]);
        fs::write(m.join("kept"), b"kept").unwrap();
        let f = fs::File::create(m.join("gone")).unwrap();
        fs::remove_file(m.join("gone")).unwrap();
        m.kill("KILL");
        drop(f);
    };
    let _guard = Unmount(dir.clone());
    let unmount = || {
        sh(&format!("fusermount3 -u {d}"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while pmfs(&["info", p]).status.code() != Some(0) {
            assert!(std::time::Instant::now() < deadline, "daemon kept the pool");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    crash();
    let left = fs::read(&pool.pool).unwrap();
    // info shows the volume as recovered in memory, and writes nothing.
    let info = pmfs_ok(&["info", p]);
    for want in [
        "not closed cleanly: shown as recovered in memory",
        "recovery     1 orphan inodes freed",
    ] {
        assert!(info.contains(want), "{want:?} missing in\n{info}");
    }
    assert_eq!(pmfs_ok(&["info", p]), info);
    assert!(
        fs::read(&pool.pool).unwrap() == left,
        "info wrote to the pool"
    );
    // So does a read-only mount.
    let o = pmfs(&["mount", p, d, "-o", "ro"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!(
            "pmfs: {p}: was not closed cleanly, recovered in memory (the pool stays as it is until a read-write mount): 1 orphan inodes freed\n"
        )
    );
    assert_eq!(fs::read(dir.join("kept")).unwrap(), b"kept");
    assert_eq!(
        mappings_of(&pool.pool),
        ["r--s"],
        "the daemon maps the pool read-only"
    );
    unmount();
    assert!(
        fs::read(&pool.pool).unwrap() == left,
        "the read-only mount wrote to the pool"
    );

    let mount = || {
        let o = pmfs(&["mount", p, d]);
        assert!(o.status.success(), "{o:?}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let said = mount();
    assert_eq!(
        said,
        format!("pmfs: {p}: was not closed cleanly, recovered: 1 orphan inodes freed\n")
    );
    unmount();
    assert!(pmfs_ok(&["info", p]).contains("closed cleanly\n"));
    // A clean mount that had nothing to do says nothing.
    assert_eq!(mount(), "");
    unmount();
}
