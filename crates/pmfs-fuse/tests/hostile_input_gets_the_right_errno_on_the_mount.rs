//! Bad input through the kernel and the FUSE daemon gets the errno POSIX asks for, and leaves
//! the volume clean: over-long names, paths through regular files, renaming a directory into
//! its own subtree, removing a non-empty directory, and hard links to directories; and inode
//! flags (`chattr`), which pmfs does not keep.

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

/// The inode flags `lsattr` reads and `chattr` sets: pmfs keeps none. Files and directories
/// read none (in both forms of the request), clearing them succeeds, setting one fails with
/// `EOPNOTSUPP`, and a terminal request gets `ENOTTY`.
#[test]
fn inode_flags_read_as_none_and_none_can_be_set() {
    use std::os::fd::AsRawFd;
    let pool = Pool::new("inode-flags", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    fs::write(m.join("f"), b"data").unwrap();
    fs::create_dir(m.join("d")).unwrap();
    let result = |r: libc::c_int| {
        if r == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap()
        }
    };
    for p in ["f", "d"] {
        let f = fs::File::open(m.join(p)).unwrap();
        let fd = f.as_raw_fd();
        // The kernel reads and writes an int, whatever the request's number says.
        let mut flags: libc::c_int = -1;
        // SAFETY: a live descriptor and a buffer of the size the kernel uses.
        let r = unsafe { libc::ioctl(fd, libc::FS_IOC_GETFLAGS, &mut flags) };
        assert_eq!((result(r), flags), (0, 0), "{p}");
        // struct fsxattr: flags, extent size, extents, project id, CoW extent size, padding.
        let mut fsx = [0xffu8; 28];
        // SAFETY: as above (FS_IOC_FSGETXATTR).
        let r = unsafe { libc::ioctl(fd, 0x801c_581f, fsx.as_mut_ptr()) };
        assert_eq!(result(r), 0);
        assert_eq!(&fsx[..16], &[0; 16], "{p}");
        let none: libc::c_int = 0;
        // SAFETY: as above.
        let r = unsafe { libc::ioctl(fd, libc::FS_IOC_SETFLAGS, &none) };
        assert_eq!(result(r), 0, "{p}");
        // FS_IMMUTABLE_FL, FS_APPEND_FL, FS_NODUMP_FL (linux/fs.h).
        for flag in [0x10, 0x20, 0x40] {
            let one: libc::c_int = flag;
            // SAFETY: as above.
            let r = unsafe { libc::ioctl(fd, libc::FS_IOC_SETFLAGS, &one) };
            assert_eq!(result(r), libc::EOPNOTSUPP, "{p} {flag:#x}");
        }
        let mut tio = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: as above.
        let r = unsafe { libc::ioctl(fd, libc::TCGETS, tio.as_mut_ptr()) };
        assert_eq!(result(r), libc::ENOTTY, "{p}");
    }
    m.unmount();
    pool.fsck_clean();
}
