//! Bad names at the API edge: names containing '/' or NUL, empty names, '.' and '..', and
//! names of 256 bytes fail with the POSIX error through both the path API and the inode API,
//! and leave the volume unchanged and clean.

mod common;

use pmfs::{Error, NodeKind, Owner, RenameFlags, Volume, fsck};

use common::{KINDS, crash_copy, fresh, snapshot};

fn errno<T: std::fmt::Debug>(r: pmfs::Result<T>) -> i32 {
    std::io::Error::from(r.unwrap_err()).raw_os_error().unwrap()
}

/// Every create-like call of the inode API with `name` in the root fails with `want`.
fn ino_api_rejects(vol: &Volume, name: &[u8], want: i32) {
    let root = vol.root();
    let o = Owner::default();
    let file = vol.lookup(root, b"file").unwrap().ino;
    let what = String::from_utf8_lossy(name).into_owned();
    assert_eq!(
        errno(vol.mkdir(root, name, 0o755, o)),
        want,
        "mkdir {what:?}"
    );
    assert_eq!(
        errno(vol.mknod(root, name, NodeKind::File, 0o644, o, 0)),
        want,
        "mknod {what:?}"
    );
    assert_eq!(
        errno(vol.symlink_at(root, name, b"/file", o)),
        want,
        "symlink {what:?}"
    );
    assert_eq!(
        errno(vol.create_open(root, name, 0o644, o, true, Default::default())),
        want,
        "create {what:?}"
    );
    assert_eq!(errno(vol.link_at(file, root, name)), want, "link {what:?}");
    // rename(2) answers EBUSY for '.' and '..' (the kernel's LAST_DOT / LAST_DOTDOT).
    let rename_want = if name == b"." || name == b".." {
        libc::EBUSY
    } else {
        want
    };
    assert_eq!(
        errno(vol.rename_at(root, b"file", root, name, RenameFlags::default())),
        rename_want,
        "rename to {what:?}"
    );
}

#[test]
fn bad_names_fail_cleanly_on_every_mapping() {
    for kind in KINDS {
        let (vol, media) = fresh(kind);
        vol.write("/file", b"content").unwrap();
        vol.create_dir("/dir").unwrap();
        let before = snapshot(&vol);

        // The inode API takes names as bytes: '/' and NUL cannot be smuggled into a dentry.
        ino_api_rejects(&vol, b"a/b", libc::EINVAL);
        ino_api_rejects(&vol, b"/", libc::EINVAL);
        ino_api_rejects(&vol, b"a\0b", libc::EINVAL);
        ino_api_rejects(&vol, b"\0", libc::EINVAL);
        ino_api_rejects(&vol, b"", libc::EINVAL);
        ino_api_rejects(&vol, b".", libc::EINVAL);
        ino_api_rejects(&vol, b"..", libc::EINVAL);
        ino_api_rejects(&vol, &[b'n'; 256], libc::ENAMETOOLONG);
        ino_api_rejects(&vol, &[b'n'; 4096], libc::ENAMETOOLONG);
        // Lookups of such names find nothing (or fail) and never reach a dentry.
        let root = vol.root();
        for name in [&b"a/b"[..], b"a\0b", b"", &[b'n'; 256]] {
            assert!(vol.lookup(root, name).is_err());
        }

        // The path API: NUL anywhere, a 256-byte component, relative and empty paths.
        let long = "n".repeat(256);
        for path in ["/a\0b", "/dir/\0", "/\0/x"] {
            assert_eq!(errno(vol.create_dir(path)), libc::EINVAL, "{path:?}");
            assert_eq!(errno(vol.write(path, b"x")), libc::EINVAL, "{path:?}");
            assert_eq!(errno(vol.metadata(path)), libc::EINVAL, "{path:?}");
        }
        for path in [
            format!("/{long}"),
            format!("/dir/{long}"),
            format!("/{long}/x"),
        ] {
            assert_eq!(errno(vol.create_dir(&path)), libc::ENAMETOOLONG);
            assert_eq!(errno(vol.write(&path, b"x")), libc::ENAMETOOLONG);
            assert_eq!(errno(vol.symlink("/file", &path)), libc::ENAMETOOLONG);
            assert_eq!(errno(vol.hard_link("/file", &path)), libc::ENAMETOOLONG);
            assert_eq!(errno(vol.rename("/file", &path)), libc::ENAMETOOLONG);
            assert_eq!(errno(vol.metadata(&path)), libc::ENAMETOOLONG);
        }
        for path in ["", "file", "dir/x"] {
            assert!(matches!(
                vol.create_dir(path),
                Err(Error::InvalidArgument(_))
            ));
            assert!(matches!(vol.metadata(path), Err(Error::InvalidArgument(_))));
        }
        // A symbolic link target with NUL, empty or of a whole block.
        assert_eq!(errno(vol.symlink("a\0b", "/s")), libc::EINVAL);
        assert_eq!(errno(vol.symlink("", "/s")), libc::ENOENT);
        assert_eq!(
            errno(vol.symlink(&"t".repeat(4096), "/s")),
            libc::ENAMETOOLONG
        );
        // The longest name works.
        assert_eq!(snapshot(&vol), before);
        let longest = format!("/{}", "n".repeat(255));
        vol.write(&longest, b"ok").unwrap();
        assert_eq!(vol.read(&longest).unwrap(), b"ok");
        vol.remove_file(&longest).unwrap();

        assert_eq!(snapshot(&vol), before);
        vol.close().unwrap();
        let report = fsck::check(crash_copy(&media)).unwrap();
        assert!(report.is_clean(), "{kind:?}: {:#?}", report.problems);
    }
}
