//! POSIX permission and timestamp rules on the mount: an unprivileged user is refused where
//! it should be (mode bits, sticky directories, chmod/chown of others' files), set-user-ID
//! and set-group-ID bits are cleared on write, truncation, fallocate and chown as the kernel's
//! VFS clears them, file capabilities on write, set-group-ID directories pass their
//! group on, ctime moves on chmod, chown, link and rename, and utimensat honours UTIME_NOW
//! and UTIME_OMIT.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::thread::sleep;
use std::time::Duration;

use common::{NOBODY, Pool, as_nobody, sh};

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn ctime(p: &Path) -> (i64, i64) {
    let m = fs::symlink_metadata(p).unwrap();
    (m.ctime(), m.ctime_nsec())
}

fn chmod(p: &Path, m: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
}

#[test]
fn other_users_are_refused_where_posix_says_so() {
    let pool = Pool::new("perm", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let q = |p: &str| m.join(p).display().to_string();
    chmod(m.path(), 0o755);

    fs::write(m.join("readable"), b"public").unwrap();
    chmod(&m.join("readable"), 0o644);
    fs::write(m.join("secret"), b"private").unwrap();
    chmod(&m.join("secret"), 0o600);
    assert!(as_nobody(&format!("cat {}", q("readable"))));
    assert!(!as_nobody(&format!("cat {}", q("secret"))));
    assert!(!as_nobody(&format!("echo x >> {}", q("readable"))));
    assert!(!as_nobody(&format!("test -w {}", q("readable"))));
    assert!(as_nobody(&format!("test -r {}", q("readable"))));
    assert!(!as_nobody(&format!("touch {}", q("new-in-root"))));
    assert!(!as_nobody(&format!("rm -f {}", q("readable"))));
    assert!(!as_nobody(&format!("chmod 666 {}", q("readable"))));
    assert!(!as_nobody(&format!("chown {NOBODY} {}", q("readable"))));
    assert!(!as_nobody(&format!(
        "setfattr -n user.x -v 1 {}",
        q("readable")
    )));
    assert_eq!(fs::read(m.join("readable")).unwrap(), b"public");
    assert_eq!(mode(&m.join("readable")), 0o644);

    // A sticky, world-writable directory: everybody creates, only owners delete.
    fs::create_dir(m.join("tmp")).unwrap();
    chmod(&m.join("tmp"), 0o1777);
    fs::write(m.join("tmp/roots"), b"root's").unwrap();
    chmod(&m.join("tmp/roots"), 0o666);
    assert!(as_nobody(&format!("echo mine > {}", q("tmp/nobodys"))));
    assert_eq!(fs::metadata(m.join("tmp/nobodys")).unwrap().uid(), NOBODY);
    assert_eq!(fs::metadata(m.join("tmp/nobodys")).unwrap().gid(), NOBODY);
    assert!(as_nobody(&format!("echo changed > {}", q("tmp/roots"))));
    assert!(!as_nobody(&format!("rm -f {}", q("tmp/roots"))));
    assert!(!as_nobody(&format!(
        "mv {} {}",
        q("tmp/roots"),
        q("tmp/moved")
    )));
    assert!(m.join("tmp/roots").exists());
    assert!(as_nobody(&format!("rm {}", q("tmp/nobodys"))));
    // Without the sticky bit, write permission on the directory is enough.
    chmod(&m.join("tmp"), 0o777);
    assert!(as_nobody(&format!("rm -f {}", q("tmp/roots"))));

    // The owner may chmod its own file, and utime it; not chown it away.
    assert!(as_nobody(&format!(
        "touch {0} && chmod 600 {0}",
        q("tmp/own")
    )));
    assert_eq!(mode(&m.join("tmp/own")), 0o600);
    assert!(as_nobody(&format!(
        "touch -d '2020-01-01' {}",
        q("tmp/own")
    )));
    assert!(!as_nobody(&format!("chown 0 {}", q("tmp/own"))));
    assert!(!as_nobody(&format!(
        "touch -d '2020-01-01' {}",
        q("readable")
    )));
    m.unmount();
    pool.fsck_clean();
}

#[test]
fn privilege_bits_are_cleared_and_inherited_as_posix_says() {
    let pool = Pool::new("perm-bits", "64M", "cuckoo");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let q = |p: &str| m.join(p).display().to_string();
    chmod(m.path(), 0o755);

    // Write by another user clears set-user-ID and set-group-ID.
    fs::write(m.join("suid"), b"#!/bin/sh\n").unwrap();
    chmod(&m.join("suid"), 0o6777);
    assert!(as_nobody(&format!("echo appended >> {}", q("suid"))));
    assert_eq!(mode(&m.join("suid")), 0o777);

    // So do truncation, an O_TRUNC open and fallocate by another user; the daemon clears
    // them itself, which the kernel leaves to it (FUSE_HANDLE_KILLPRIV_V2).
    for cmd in ["truncate -s 1", ": >", "fallocate -l 8192"] {
        chmod(&m.join("suid"), 0o6777);
        assert!(as_nobody(&format!("{cmd} {}", q("suid"))), "{cmd}");
        assert_eq!(mode(&m.join("suid")), 0o777, "{cmd}");
    }

    // And a copy into the file: coreutils' cat copies with copy_file_range, which the daemon
    // serves, into a descriptor opened without O_TRUNC or O_APPEND here.
    fs::write(m.join("plain"), b"copied").unwrap();
    chmod(&m.join("suid"), 0o6777);
    assert!(as_nobody(&format!("cat {} 1<> {}", q("plain"), q("suid"))));
    assert_eq!(mode(&m.join("suid")), 0o777);
    assert!(fs::read(m.join("suid")).unwrap().starts_with(b"copied"));

    // Set-group-ID without group-execute marks mandatory locking, not a privilege: it stays.
    chmod(&m.join("suid"), 0o2666);
    assert!(as_nobody(&format!("echo appended >> {}", q("suid"))));
    assert_eq!(mode(&m.join("suid")), 0o2666);

    // The owner's writes and truncations as root (CAP_FSETID) keep both bits.
    chmod(&m.join("suid"), 0o6777);
    sh(&format!(
        "echo appended >> {0} && truncate -s 3 {0}",
        q("suid")
    ));
    assert_eq!(mode(&m.join("suid")), 0o6777);

    // A write removes file capabilities, whoever writes (cap_net_raw+ep, revision 2).
    let caps = |p: &str| format!("getfattr -n security.capability {} 2>/dev/null", q(p));
    sh(&format!(
        "setfattr -n security.capability -v 0x0100000200200000000000000000000000000000 {}",
        q("suid")
    ));
    sh(&caps("suid"));
    sh(&format!("echo appended >> {}", q("suid")));
    assert!(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(caps("suid"))
            .status()
            .unwrap()
            .code()
            != Some(0)
    );

    // chown clears them too.
    chmod(&m.join("suid"), 0o6755);
    sh(&format!("chown 1234:1234 {}", q("suid")));
    assert_eq!(mode(&m.join("suid")) & 0o6000, 0);
    let md = fs::metadata(m.join("suid")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 1234));

    // A set-group-ID directory passes its group on, and the bit to subdirectories.
    fs::create_dir(m.join("shared")).unwrap();
    sh(&format!("chown 0:4321 {0} && chmod 2775 {0}", q("shared")));
    fs::write(m.join("shared/file"), b"x").unwrap();
    fs::create_dir(m.join("shared/sub")).unwrap();
    assert_eq!(fs::metadata(m.join("shared/file")).unwrap().gid(), 4321);
    let sub = fs::metadata(m.join("shared/sub")).unwrap();
    assert_eq!(sub.gid(), 4321);
    assert_eq!(sub.mode() & 0o2000, 0o2000);
    sh(&format!("mknod {} p", q("shared/fifo")));
    assert_eq!(fs::metadata(m.join("shared/fifo")).unwrap().gid(), 4321);
    // Outside such a directory the creator's group applies.
    fs::create_dir(m.join("open")).unwrap();
    chmod(&m.join("open"), 0o777);
    assert!(as_nobody(&format!(
        "mkdir {0} && touch {0}/f",
        q("open/mine")
    )));
    assert_eq!(fs::metadata(m.join("open/mine/f")).unwrap().gid(), NOBODY);
    m.unmount();
    pool.fsck_clean();
}

#[test]
fn timestamps_follow_posix_rules() {
    let pool = Pool::new("times", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let q = |p: &str| m.join(p).display().to_string();
    let tick = || sleep(Duration::from_millis(20));
    let f = m.join("f");
    fs::write(&f, b"data").unwrap();

    let c0 = ctime(&f);
    tick();
    chmod(&f, 0o600);
    let c1 = ctime(&f);
    assert!(c1 > c0, "chmod must change ctime");
    tick();
    sh(&format!("chown 7:7 {}", q("f")));
    let c2 = ctime(&f);
    assert!(c2 > c1, "chown must change ctime");
    tick();
    fs::hard_link(&f, m.join("g")).unwrap();
    let c3 = ctime(&f);
    assert!(c3 > c2, "link must change ctime");
    tick();
    fs::rename(&f, m.join("h")).unwrap();
    let c4 = ctime(&m.join("h"));
    assert!(c4 > c3, "rename must change ctime");

    // Writes move mtime and ctime; the directory's mtime moves with its entries.
    let d0 = fs::metadata(m.path()).unwrap().modified().unwrap();
    let t0 = fs::metadata(m.join("h")).unwrap().modified().unwrap();
    tick();
    fs::write(m.join("h"), b"more data").unwrap();
    assert!(fs::metadata(m.join("h")).unwrap().modified().unwrap() > t0);
    tick();
    fs::write(m.join("newfile"), b"").unwrap();
    assert!(fs::metadata(m.path()).unwrap().modified().unwrap() > d0);

    // utimensat: explicit times, UTIME_OMIT (touch -m / -a change one of them only), and
    // UTIME_NOW.
    let h = m.join("h");
    sh(&format!("touch -d '2001-09-09 01:46:40.5' {}", h.display()));
    let md = fs::metadata(&h).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 500_000_000));
    assert_eq!((md.atime(), md.atime_nsec()), (1_000_000_000, 500_000_000));
    sh(&format!(
        "touch -m -d '2010-01-01 00:00:00' {}",
        h.display()
    ));
    let md = fs::metadata(&h).unwrap();
    assert_eq!(md.mtime(), 1_262_304_000);
    assert_eq!(md.atime(), 1_000_000_000, "atime must be omitted");
    sh(&format!(
        "touch -a -d '2011-01-01 00:00:00' {}",
        h.display()
    ));
    let md = fs::metadata(&h).unwrap();
    assert_eq!(md.atime(), 1_293_840_000);
    assert_eq!(md.mtime(), 1_262_304_000, "mtime must be omitted");
    let before = std::time::SystemTime::now();
    sh(&format!("touch -m {}", h.display()));
    let md = fs::metadata(&h).unwrap();
    assert!(md.modified().unwrap() >= before - Duration::from_secs(1));
    assert_eq!(md.atime(), 1_293_840_000);
    m.unmount();
    pool.fsck_clean();
}
