//! The kernel caches names for `entry_timeout`, and since the daemon answers a lookup of a
//! missing name with a negative entry, it caches their absence too: every change of a name
//! made through the mount (create, mkdir, link, symlink, rename, unlink, rmdir) must show at
//! once, in this process and in others, while the entries involved are cached.

mod common;

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use common::{Pool, sh};

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
