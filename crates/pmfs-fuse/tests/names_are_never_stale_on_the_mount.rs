//! The kernel caches names for `entry_timeout`, and since the daemon answers a lookup of a
//! missing name with a negative entry, it caches their absence too: every change of a name
//! made through the mount (create, mkdir, link, symlink, rename, unlink, rmdir) must show at
//! once, in this process and in others, while the entries involved are cached. It caches
//! the attributes of directories as long (those of regular files not at all): a directory's
//! link count and permissions must follow every change at once too.

mod common;

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::{Pool, as_nobody, sh};

fn missing(p: &Path) -> bool {
    matches!(fs::symlink_metadata(p), Err(e) if e.kind() == ErrorKind::NotFound)
}

/// Whether a shell in another process sees `p`.
fn seen_elsewhere(p: &Path) -> bool {
    sh(&format!(
        "if test -e '{0}' || test -L '{0}'; then echo yes; else echo no; fi",
        p.display()
    ))
    .trim()
        == "yes"
}

#[test]
fn names_appear_and_vanish_at_once() {
    let pool = Pool::new("names", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let a = m.join("a");
    let b = m.join("b");
    for _ in 0..3 {
        // Looked up while missing (a negative entry), then created.
        assert!(missing(&a) && !seen_elsewhere(&a));
        fs::write(&a, b"x").unwrap();
        assert_eq!(fs::read(&a).unwrap(), b"x");
        assert!(seen_elsewhere(&a));
        fs::remove_file(&a).unwrap();
        assert!(missing(&a) && !seen_elsewhere(&a));

        fs::create_dir(&a).unwrap();
        assert!(fs::metadata(&a).unwrap().is_dir() && seen_elsewhere(&a));
        fs::remove_dir(&a).unwrap();
        assert!(missing(&a));

        assert!(missing(&b));
        fs::write(&a, b"y").unwrap();
        fs::rename(&a, &b).unwrap();
        assert!(missing(&a) && !seen_elsewhere(&a));
        assert_eq!(fs::read(&b).unwrap(), b"y");

        fs::hard_link(&b, &a).unwrap();
        assert_eq!(fs::read(&a).unwrap(), b"y");
        fs::remove_file(&a).unwrap();
        std::os::unix::fs::symlink("b", &a).unwrap();
        assert_eq!(fs::read(&a).unwrap(), b"y");
        fs::remove_file(&a).unwrap();
        fs::remove_file(&b).unwrap();
        assert!(missing(&a) && missing(&b));

        // Made by another process, after this one looked the name up and missed.
        assert!(missing(&a));
        sh(&format!("echo z > '{}'", a.display()));
        assert_eq!(fs::read(&a).unwrap(), b"z\n");
        sh(&format!("rm '{}'", a.display()));
        assert!(missing(&a));
    }
    m.unmount();
    pool.fsck_clean();
}

#[test]
fn directory_attributes_follow_every_change_at_once() {
    let pool = Pool::new("dir-attrs", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let d = m.join("d");
    fs::create_dir(&d).unwrap();
    fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(d.join("f"), b"x").unwrap();
    let nlink = |p: &Path| fs::metadata(p).unwrap().nlink();
    let listable = |p: &Path| as_nobody(&format!("ls '{}'", p.display()));
    for _ in 0..3 {
        assert_eq!(nlink(&d), 2);
        fs::create_dir(d.join("sub")).unwrap();
        assert_eq!(nlink(&d), 3, "a new subdirectory's link is not seen");
        fs::remove_dir(d.join("sub")).unwrap();
        assert_eq!(nlink(&d), 2, "a removed subdirectory's link is still seen");

        assert!(listable(&d));
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o700);
        assert!(
            !listable(&d),
            "search permission taken away is still granted"
        );
        sh(&format!("chmod 755 '{}'", d.display()));
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o777, 0o755);
        assert!(
            listable(&d),
            "search permission given back is still refused"
        );
    }
    m.unmount();
    pool.fsck_clean();
}
