//! Real programs on a mounted volume: `cp -a` and `tar` round trips compared byte for byte
//! (`tar --sparse` of a file still open for writing too), sqlite3 building and checking a
//! database, hard links, symbolic links, special files, extended attributes, rename over an
//! existing file, statfs; then unmount, fsck clean, remount, and the same tree.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;

use common::{Pool, TempDir, sh, snapshot};

/// A source tree with files of many sizes, nested directories, links, a FIFO and odd modes.
fn build_tree(root: &Path) {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect()
    };
    for (i, size) in [0usize, 1, 100, 4095, 4096, 4097, 65536, 1 << 20, 3 << 20]
        .iter()
        .enumerate()
    {
        fs::write(root.join(format!("f{i}")), bytes(*size)).unwrap();
    }
    for d in 0..4 {
        let dir = root.join(format!("dir{d}/sub{d}/leaf"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..20 {
            fs::write(dir.join(format!("file-{f}.txt")), bytes(f * 37 + d)).unwrap();
        }
    }
    fs::write(root.join("with space and ünïcode"), b"names are bytes").unwrap();
    fs::hard_link(root.join("f5"), root.join("dir0/hardlink-to-f5")).unwrap();
    symlink("f3", root.join("rel-link")).unwrap();
    symlink("/nonexistent/target", root.join("dangling")).unwrap();
    symlink("dir1/sub1", root.join("dir-link")).unwrap();
    sh(&format!("mkfifo {}", root.join("fifo").display()));
    sh(&format!("chmod 0640 {}", root.join("f1").display()));
    sh(&format!("chmod 0700 {}", root.join("dir2").display()));
    sh(&format!("chmod 1777 {}", root.join("dir3").display()));
    sh(&format!(
        "touch -h -d '2001-02-03 04:05:06.789' {} {}",
        root.join("f2").display(),
        root.join("rel-link").display()
    ));
}

fn mtimes(root: &Path) -> Vec<(String, i64, i64)> {
    let mut v: Vec<_> = sh(&format!("cd {} && find . | sort", root.display()))
        .lines()
        .filter(|l| *l != ".")
        .map(|l| {
            let md = fs::symlink_metadata(root.join(l)).unwrap();
            (l.to_owned(), md.mtime(), md.mtime_nsec())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn real_programs_round_trip_and_the_tree_survives_a_remount() {
    let pool = Pool::new("programs", "256M", "hashfs");
    let src_dir = TempDir::new("programs-src");
    let src = src_dir.path().join("tree");
    fs::create_dir(&src).unwrap();
    build_tree(&src);
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let mnt = m.path();

    // cp -a in: same bytes, types, modes, link counts and times.
    sh(&format!(
        "cp -a {} {}",
        src.display(),
        mnt.join("copy").display()
    ));
    assert_eq!(snapshot(&src), snapshot(&mnt.join("copy")));
    assert_eq!(mtimes(&src), mtimes(&mnt.join("copy")));
    let a = fs::metadata(mnt.join("copy/f5")).unwrap();
    let b = fs::metadata(mnt.join("copy/dir0/hardlink-to-f5")).unwrap();
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));

    // tar out of the mount and back in.
    let out = TempDir::new("programs-tar");
    let archive = out.path().join("t.tar");
    sh(&format!(
        "tar -C {} --xattrs -cf {} copy",
        mnt.display(),
        archive.display()
    ));
    fs::create_dir(mnt.join("untar")).unwrap();
    sh(&format!(
        "tar -C {} --xattrs -xpf {}",
        mnt.join("untar").display(),
        archive.display()
    ));
    assert_eq!(snapshot(&src), snapshot(&mnt.join("untar/copy")));
    sh(&format!(
        "tar -C {} -xpf {}",
        out.path().display(),
        archive.display()
    ));
    assert_eq!(snapshot(&src), snapshot(&out.path().join("copy")));

    // tar --sparse of a file written after a hole and still open, its write not digested:
    // tar takes a file whose st_blocks is 0 for all holes, and would archive no data.
    let sparse = mnt.join("sparse");
    let open = fs::File::create(&sparse).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&open, &[0x5a; 30_000], 70_000).unwrap();
    sh(&format!(
        "tar -C {} --sparse -cf {} sparse",
        mnt.display(),
        out.path().join("s.tar").display()
    ));
    drop(open);
    sh(&format!(
        "tar -C {} -xf {}",
        out.path().display(),
        out.path().join("s.tar").display()
    ));
    assert!(
        fs::read(out.path().join("sparse")).unwrap() == fs::read(&sparse).unwrap(),
        "tar --sparse archived other bytes than the open file has"
    );

    // sqlite3 builds, checks and queries a database.
    let db = mnt.join("test.db");
    let sql = "PRAGMA journal_mode=WAL; \
        CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, n INTEGER); \
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 20000) \
        INSERT INTO t(v, n) SELECT printf('row-%d-%s', x, hex(randomblob(20))), x FROM c; \
        CREATE INDEX tv ON t(v); \
        DELETE FROM t WHERE n % 3 = 0; \
        UPDATE t SET n = n * 2 WHERE n % 5 = 0; \
        PRAGMA integrity_check; \
        SELECT count(*), sum(n) FROM t;";
    let r = sh(&format!("sqlite3 {} \"{sql}\"", db.display()));
    let lines: Vec<&str> = r.lines().collect();
    assert_eq!(lines, ["wal", "ok", "13334|160020002"], "{r}");
    let r = sh(&format!(
        "sqlite3 {} 'PRAGMA journal_mode=DELETE; VACUUM; PRAGMA integrity_check;'",
        db.display()
    ));
    assert_eq!(r.lines().last(), Some("ok"));

    // Rename over an existing file replaces it atomically.
    fs::write(mnt.join("old"), b"old contents").unwrap();
    fs::write(mnt.join("new"), b"new contents").unwrap();
    let ino_new = fs::metadata(mnt.join("new")).unwrap().ino();
    fs::rename(mnt.join("new"), mnt.join("old")).unwrap();
    assert_eq!(fs::read(mnt.join("old")).unwrap(), b"new contents");
    assert_eq!(fs::metadata(mnt.join("old")).unwrap().ino(), ino_new);
    assert!(!mnt.join("new").exists());
    sh(&format!(
        "mv -f {} {}",
        mnt.join("copy/f1").display(),
        mnt.join("copy/f0").display()
    ));
    assert_eq!(
        fs::read(mnt.join("copy/f0")).unwrap(),
        fs::read(src.join("f1")).unwrap()
    );

    // Hard links and symbolic links.
    fs::hard_link(mnt.join("old"), mnt.join("old-link")).unwrap();
    assert_eq!(fs::metadata(mnt.join("old")).unwrap().nlink(), 2);
    fs::write(mnt.join("old-link"), b"through the link").unwrap();
    assert_eq!(fs::read(mnt.join("old")).unwrap(), b"through the link");
    fs::remove_file(mnt.join("old")).unwrap();
    assert_eq!(fs::metadata(mnt.join("old-link")).unwrap().nlink(), 1);
    symlink("copy/dir1", mnt.join("to-dir1")).unwrap();
    assert_eq!(
        fs::read_dir(mnt.join("to-dir1/sub1/leaf")).unwrap().count(),
        20
    );
    assert_eq!(
        fs::read_link(mnt.join("to-dir1")).unwrap(),
        Path::new("copy/dir1")
    );

    // Special files.
    sh(&format!("mknod {} c 1 3", mnt.join("null-dev").display()));
    sh(&format!("mknod {} b 7 0", mnt.join("loop-dev").display()));
    sh(&format!("mkfifo {}", mnt.join("pipe").display()));
    let md = fs::symlink_metadata(mnt.join("null-dev")).unwrap();
    assert_eq!((md.mode() & 0o170000, md.rdev()), (0o020000, (1 << 8) | 3));
    let md = fs::symlink_metadata(mnt.join("loop-dev")).unwrap();
    assert_eq!((md.mode() & 0o170000, md.rdev()), (0o060000, 7 << 8));
    // A FIFO on the mount works as a pipe.
    let p = mnt.join("pipe");
    sh(&format!(
        "(echo through-the-fifo > {0} &) ; cat {0} > {1}",
        p.display(),
        mnt.join("fifo-out").display()
    ));
    assert_eq!(
        fs::read(mnt.join("fifo-out")).unwrap(),
        b"through-the-fifo\n"
    );

    // Extended attributes, kept by cp -a and tar --xattrs.
    let x = mnt.join("copy/f4");
    sh(&format!("setfattr -n user.color -v blue {}", x.display()));
    sh(&format!("setfattr -n user.empty {}", x.display()));
    sh(&format!("setfattr -n user.bin -v 0x00ff10 {}", x.display()));
    sh(&format!(
        "setfattr -n trusted.secret -v root-only {}",
        x.display()
    ));
    assert_eq!(
        sh(&format!(
            "getfattr --only-values -n user.color {}",
            x.display()
        )),
        "blue"
    );
    sh(&format!("setfattr -x user.empty {}", x.display()));
    let names = sh(&format!("getfattr -m - --absolute-names {}", x.display()));
    assert!(
        names.contains("user.color") && names.contains("user.bin"),
        "{names}"
    );
    assert!(!names.contains("user.empty"), "{names}");
    assert!(
        !std::process::Command::new("getfattr")
            .args(["-n", "user.missing"])
            .arg(&x)
            .output()
            .unwrap()
            .status
            .success()
    );
    sh(&format!(
        "cp -a {} {}",
        x.display(),
        mnt.join("xcopy").display()
    ));
    let hex = sh(&format!(
        "getfattr -e hex -n user.bin --absolute-names {}",
        mnt.join("xcopy").display()
    ));
    assert!(hex.contains("user.bin=0x00ff10"), "{hex}");
    let dir_attr = mnt.join("copy/dir1");
    sh(&format!(
        "setfattr -n user.on-dir -v yes {}",
        dir_attr.display()
    ));

    // statfs: 4 KiB blocks, the data region, free space going down as files grow.
    let stat = |p: &Path| -> Vec<u64> {
        sh(&format!("stat -f -c '%S %b %f %c %d %l' {}", p.display()))
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect()
    };
    let before = stat(mnt);
    assert_eq!(before[0], 4096);
    assert_eq!(before[5], 255);
    assert!(before[2] < before[1] && before[4] < before[3]);
    fs::write(mnt.join("eight-mib"), vec![1u8; 8 << 20]).unwrap();
    let after = stat(mnt);
    assert!(before[2] - after[2] >= 2048, "{before:?} {after:?}");

    // Unmount, check, remount: the same tree, the same inode numbers.
    let tree = snapshot(mnt);
    let times = mtimes(mnt);
    let inos: Vec<u64> = ["copy/f5", "copy/dir1", "test.db", "to-dir1"]
        .iter()
        .map(|p| fs::symlink_metadata(mnt.join(p)).unwrap().ino())
        .collect();
    m.unmount();
    let report = pool.fsck_clean();
    assert!(report.contains("clean"), "{report}");
    let m = pool.mount(&dir, &[]);
    assert_eq!(snapshot(m.path()), tree);
    assert_eq!(mtimes(m.path()), times);
    let again: Vec<u64> = ["copy/f5", "copy/dir1", "test.db", "to-dir1"]
        .iter()
        .map(|p| fs::symlink_metadata(m.join(p)).unwrap().ino())
        .collect();
    assert_eq!(again, inos);
    assert_eq!(
        sh(&format!(
            "getfattr --only-values -n user.color {}",
            m.join("copy/f4").display()
        )),
        "blue"
    );
    assert_eq!(
        sh(&format!(
            "getfattr --only-values -n user.on-dir {}",
            m.join("copy/dir1").display()
        )),
        "yes"
    );
    assert_eq!(
        sh(&format!(
            "sqlite3 {} 'PRAGMA integrity_check; SELECT count(*) FROM t;'",
            m.join("test.db").display()
        )),
        "ok\n13334\n"
    );
    m.unmount();
    pool.fsck_clean();
}
