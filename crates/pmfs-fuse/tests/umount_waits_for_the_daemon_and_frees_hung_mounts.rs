//! `pmfs umount`: it returns once the daemon has closed the volume, refuses a busy mount unless
//! told to detach it lazily, and `--force` frees a mount whose daemon does not answer (here a
//! stopped one) without waiting on it.

mod common;

use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{PMFS, Pool, TempDir, mounted, pmfs, pmfs_ok, sh, wait_for};

fn fusectl_mounted() -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(" /sys/fs/fuse/connections ") && l.contains(" - fusectl "))
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn umount_returns_once_the_volume_is_closed() {
    let pool = Pool::new("umount-closed", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let mut m = pool.mount(&dir, &[]);
    fs::write(m.join("f"), b"kept").unwrap();
    // Through a relative path with a trailing `.`, from the mount point's parent.
    let o = Command::new(PMFS)
        .args(["umount", "mnt/."])
        .current_dir(pool.dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The owner lock is free the moment umount returns.
    fs::File::open(&pool.pool).unwrap().try_lock().unwrap();
    assert!(!mounted(&dir));
    assert!(pool.fsck_clean().contains("clean"));
    let status = m.daemon.take().unwrap().wait().unwrap();
    assert!(status.success(), "daemon exited with {status}");

    let m = pool.mount(&dir, &[]);
    assert_eq!(fs::read(m.join("f")).unwrap(), b"kept");
    pmfs_ok(&["unmount", dir.to_str().unwrap()]);
    assert!(!mounted(&dir));
}

#[test]
fn a_busy_mount_is_kept_unless_detached_lazily() {
    let pool = Pool::new("umount-busy", "64M", "extent");
    let dir = pool.mount_point("mnt");
    let mut m = pool.mount(&dir, &[]);
    let mut open = fs::File::create(m.join("open")).unwrap();
    let o = pmfs(&["umount", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("busy") && err.contains("--lazy"), "{err}");
    assert!(mounted(&dir));

    pmfs_ok(&["umount", "--lazy", dir.to_str().unwrap()]);
    assert!(!mounted(&dir));
    // The daemon still serves the open file, and ends when it is closed.
    open.write_all(b"after the detach").unwrap();
    open.sync_all().unwrap();
    let mut daemon = m.daemon.take().unwrap();
    assert!(daemon.try_wait().unwrap().is_none());
    drop(open);
    let status = wait_for(daemon, std::time::Duration::from_secs(30));
    assert!(status.success(), "daemon exited with {status}");

    let m = pool.mount(&dir, &[]);
    assert_eq!(fs::read(m.join("open")).unwrap(), b"after the detach");
    m.unmount();
}

#[test]
fn force_frees_a_mount_whose_daemon_does_not_answer() {
    let pool = Pool::new("umount-force", "64M", "hashfs");
    let dir = pool.mount_point("mnt");
    let mut m = pool.mount(&dir, &[]);
    fs::write(m.join("f"), b"durable").unwrap();
    let fusectl_before = fusectl_mounted();
    let daemon = m.daemon.as_ref().unwrap().id();
    sh(&format!("kill -STOP {daemon}"));

    // A lookup the kernel has not cached waits for the stopped daemon.
    let (tx, rx) = mpsc::channel();
    let new_name = m.join("never-looked-up");
    std::thread::spawn(move || tx.send(fs::metadata(new_name).map(|_| ())).unwrap());
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());

    let mut umount = Command::new(PMFS)
        .args(["umount", "--force", dir.to_str().unwrap()])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While the daemon is still stopped: the waiting lookup fails and the mount is gone.
    let waited = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let errno = waited.unwrap_err().raw_os_error();
    assert!(
        errno == Some(libc::ECONNABORTED) || errno == Some(libc::ENOTCONN),
        "{errno:?}"
    );
    wait_until("the mount is gone", Duration::from_secs(20), || {
        !mounted(&dir)
    });
    assert_eq!(fusectl_mounted(), fusectl_before);
    // umount now waits for the daemon to close the volume, which it does once it runs again.
    assert!(umount.try_wait().unwrap().is_none());
    sh(&format!("kill -CONT {daemon}"));
    let out = umount.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = m.daemon.take().unwrap().wait().unwrap();
    assert!(status.success(), "daemon exited with {status}");
    assert!(pool.fsck_clean().contains("clean"));

    let m = pool.mount(&dir, &[]);
    assert_eq!(fs::read(m.join("f")).unwrap(), b"durable");
    m.unmount();
}

#[test]
fn umount_names_what_is_not_a_pmfs_mount() {
    let t = TempDir::new("umount-errors");
    for dir in [t.path().to_owned(), t.path().join("missing").join("mnt")] {
        let o = pmfs(&["umount", "--force", dir.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(1));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("not a pmfs mount point") || err.contains("No such file"),
            "{err}"
        );
    }
    let o = pmfs(&["umount", "/proc"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("/proc: not a pmfs mount point"));
}
