//! Round trips to the daemon are what small calls on the mount cost (20–45 µs each on the
//! test VM), so the daemon tells the kernel what it need not ask: it declines OPEN, FLUSH,
//! FSYNC, OPENDIR and CREATE for good, and its MKNOD replies let the kernel keep new names.
//! These tests count the requests the kernel sends for a few calls, through a private
//! instance of the kernel's `fuse:fuse_request_send` trace event, filtered to the test's own
//! connection.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::Pool;

/// Where tracefs is mounted.
const TRACEFS: &str = "/sys/kernel/tracing";

/// A tracefs instance that records the requests the kernel sends on one FUSE connection.
/// Removed on drop.
struct Requests {
    dir: PathBuf,
}

impl Requests {
    /// Starts recording the requests sent on the connection of the mount at `mnt`.
    fn on(mnt: &Path) -> Requests {
        // Once for the tests of this binary, which run in parallel: two mounts at once would
        // see tracefs missing, and the second would fail.
        static MOUNTED: OnceLock<bool> = OnceLock::new();
        let mounted = MOUNTED.get_or_init(|| {
            Path::new(TRACEFS).join("instances").is_dir()
                || std::process::Command::new("mount")
                    .args(["-t", "tracefs", "tracefs", TRACEFS])
                    .status()
                    .unwrap()
                    .success()
        });
        assert!(
            *mounted,
            "tracefs is not mounted on {TRACEFS} and could not be"
        );
        // The event's connection is the kernel's encoding of the mount's device number, which
        // no other mount has while this one exists: it names the instance too.
        let dev = fs::metadata(mnt).unwrap().dev();
        let conn = (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev));
        let dir = Path::new(TRACEFS)
            .join("instances")
            .join(format!("pmfs-test-{}-{conn}", std::process::id()));
        fs::create_dir(&dir).unwrap();
        let r = Requests { dir };
        let ev = r.dir.join("events/fuse/fuse_request_send");
        assert!(
            ev.is_dir(),
            "this kernel has no fuse:fuse_request_send event"
        );
        fs::write(ev.join("filter"), format!("connection == {conn}")).unwrap();
        fs::write(ev.join("enable"), "1").unwrap();
        r
    }

    /// The requests recorded since the last call, by name (`FUSE_LOOKUP`, ...), in order.
    fn take(&self) -> Vec<String> {
        let text = fs::read_to_string(self.dir.join("trace")).unwrap();
        fs::write(self.dir.join("trace"), "").unwrap();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let op = l.split_once("opcode ")?.1;
                let name = op.split_once('(')?.1.split_once(')')?.0;
                Some(name.to_owned())
            })
            .collect()
    }
}

impl Drop for Requests {
    fn drop(&mut self) {
        let _ = fs::write(self.dir.join("events/fuse/fuse_request_send/enable"), "0");
        let _ = fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_name_made_by_open_stays_in_the_kernels_cache() {
    let pool = Pool::new("created-names", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let req = Requests::on(m.path());
    let create = |p: &Path| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(p)
            .unwrap();
        f.write_all(b"x").unwrap();
    };
    // The first creation of the mount has its CREATE declined, and is made with MKNOD.
    create(&m.join("first"));
    let first = req.take();
    assert!(first.iter().any(|r| r == "FUSE_MKNOD"), "{first:?}");
    for i in 0..3 {
        let f = m.join(&format!("f{i}"));
        let g = m.join(&format!("g{i}"));
        // Negative entries first, as `sqlite3` looks for its journal before it makes it.
        assert!(fs::metadata(&f).is_err() && fs::metadata(&g).is_err());
        req.take();
        // `O_CREAT` without `O_EXCL` (which has the kernel look the name up again).
        create(&f);
        let made = req.take();
        assert_eq!(count(&made, "FUSE_MKNOD"), 1, "{made:?}");
        assert_eq!(
            count(&made, "FUSE_CREATE") + count(&made, "FUSE_LOOKUP"),
            0,
            "{made:?}"
        );
        // The name is cached: using it asks for attributes (never cached for regular
        // files) but looks nothing up. The kernel looks up a rename's target whatever it
        // has cached.
        assert_eq!(fs::metadata(&f).unwrap().len(), 1);
        fs::rename(&f, &g).unwrap();
        fs::remove_file(&g).unwrap();
        let used = req.take();
        assert_eq!(count(&used, "FUSE_LOOKUP"), 1, "{used:?}");
        assert_eq!(count(&used, "FUSE_UNLINK"), 1, "{used:?}");
    }
    drop(req);
    m.unmount();
    pool.fsck_clean();
}

fn count(requests: &[String], name: &str) -> usize {
    requests.iter().filter(|r| *r == name).count()
}

#[test]
fn open_fsync_and_close_send_no_request() {
    let pool = Pool::new("declined", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let f = m.join("f");
    fs::write(&f, b"data").unwrap();
    fs::create_dir(m.join("d")).unwrap();
    let req = Requests::on(m.path());
    // Each declined request is sent once per mount.
    for _ in 0..2 {
        let file = OpenOptions::new().read(true).write(true).open(&f).unwrap();
        file.sync_all().unwrap();
        drop(file);
        File::open(m.join("d")).unwrap().sync_all().unwrap();
        fs::read_dir(m.join("d")).unwrap().for_each(drop);
    }
    req.take();
    for _ in 0..3 {
        let file = OpenOptions::new().read(true).write(true).open(&f).unwrap();
        file.sync_all().unwrap();
        file.sync_data().unwrap();
        drop(file);
        let d = File::open(m.join("d")).unwrap();
        d.sync_all().unwrap();
        drop(d);
        fs::read_dir(m.join("d")).unwrap().for_each(drop);
    }
    let sent = req.take();
    let declined = [
        "FUSE_OPEN",
        "FUSE_FLUSH",
        "FUSE_FSYNC",
        "FUSE_RELEASE",
        "FUSE_OPENDIR",
        "FUSE_FSYNCDIR",
        "FUSE_RELEASEDIR",
    ];
    assert!(
        !sent.iter().any(|r| declined.contains(&r.as_str())),
        "{sent:?}"
    );
    // What is left: attributes for the permission checks, and the listings.
    assert!(
        sent.iter()
            .all(|r| ["FUSE_GETATTR", "FUSE_READDIR", "FUSE_READDIRPLUS"].contains(&r.as_str())),
        "{sent:?}"
    );
    drop(req);
    m.unmount();
    pool.fsck_clean();
}
