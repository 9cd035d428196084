//! Bad input through the kernel and the FUSE daemon gets the errno POSIX asks for, and leaves
//! the volume clean: over-long names, paths through regular files, renaming a directory into
//! its own subtree, removing a non-empty directory, and hard links to directories.

mod common;

use std::fs;
use std::io::ErrorKind;

use common::Pool;

fn errno(r: std::io::Result<impl Sized>) -> i32 {
    match r {
        Ok(_) => panic!("the call succeeded"),
        Err(e) => e.raw_os_error().expect("an errno"),
    }
}

#[test]
fn hostile_paths_fail_with_posix_errnos_and_fsck_stays_clean() {
    let pool = Pool::new("hostile", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);

    let longest = "n".repeat(255);
    fs::write(m.join(&longest), b"ok").unwrap();
    assert_eq!(fs::read(m.join(&longest)).unwrap(), b"ok");
    let too_long = "n".repeat(256);
    assert_eq!(
        errno(fs::write(m.join(&too_long), b"x")),
        libc::ENAMETOOLONG
    );
    assert_eq!(errno(fs::create_dir(m.join(&too_long))), libc::ENAMETOOLONG);

    fs::write(m.join("file"), b"data").unwrap();
    assert_eq!(errno(fs::write(m.join("file/child"), b"x")), libc::ENOTDIR);
    assert_eq!(errno(fs::create_dir(m.join("file/sub"))), libc::ENOTDIR);

    fs::create_dir_all(m.join("a/b/c")).unwrap();
    assert_eq!(
        errno(fs::rename(m.join("a"), m.join("a/b/c/a"))),
        libc::EINVAL
    );
    assert_eq!(errno(fs::remove_dir(m.join("a"))), libc::ENOTEMPTY);
    assert_eq!(
        errno(fs::hard_link(m.join("a"), m.join("alink"))),
        libc::EPERM
    );
    assert_eq!(
        fs::remove_file(m.join("missing")).unwrap_err().kind(),
        ErrorKind::NotFound
    );

    assert!(m.join("a/b/c").is_dir(), "failed calls changed nothing");
    assert_eq!(fs::read(m.join("file")).unwrap(), b"data");
    m.unmount();
    pool.fsck_clean();
}
