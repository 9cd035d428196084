//! Helpers of the mount tests: a pool in a unique temporary directory, a daemon mounted on it
//! that is always unmounted and stopped again (even when the test fails), tree snapshots,
//! and running programs as an unprivileged user.
//!
//! The tests need root (mounting, other users) and `/dev/fuse`, as in CI.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The `pmfs` binary under test.
pub const PMFS: &str = env!("CARGO_BIN_EXE_pmfs");

/// The uid/gid the tests use as an unprivileged user.
pub const NOBODY: u32 = 65534;

/// A unique directory under the system's temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "pmfs-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Runs `pmfs` with `args`.
pub fn pmfs(args: &[&str]) -> Output {
    Command::new(PMFS)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Runs `pmfs` and requires success; returns stdout.
pub fn pmfs_ok(args: &[&str]) -> String {
    let o = pmfs(args);
    assert!(
        o.status.success(),
        "pmfs {args:?} failed ({}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs a shell command line and requires success; returns stdout.
pub fn sh(cmd: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(
        o.status.success(),
        "`{cmd}` failed ({}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs a shell command line as the unprivileged user; returns whether it succeeded.
pub fn as_nobody(cmd: &str) -> bool {
    Command::new("setpriv")
        .args([
            "--reuid",
            &NOBODY.to_string(),
            "--regid",
            &NOBODY.to_string(),
            "--clear-groups",
            "sh",
            "-c",
            cmd,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// Runs `pmfs` with `args` as the unprivileged user.
pub fn pmfs_as_nobody(args: &[&str]) -> Output {
    let id = NOBODY.to_string();
    Command::new("setpriv")
        .args(["--reuid", &id, "--regid", &id, "--clear-groups", PMFS])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The permissions of every mapping of `file` in every process, as `/proc/PID/maps` lists
/// them.
pub fn mappings_of(file: &Path) -> Vec<String> {
    let file = file.canonicalize().unwrap();
    let mut perms = Vec::new();
    for proc in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(maps) = fs::read_to_string(proc.path().join("maps")) else {
            continue;
        };
        for l in maps.lines().filter(|l| l.ends_with(file.to_str().unwrap())) {
            perms.push(l.split_whitespace().nth(1).unwrap().to_owned());
        }
    }
    perms
}

/// Whether `dir` is a pmfs mount point now.
pub fn mounted(dir: &Path) -> bool {
    let want = dir.to_string_lossy().replace(' ', "\\040");
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()) && l.contains(" - fuse.pmfs "))
}

/// A pool in a temporary directory.
#[derive(Debug)]
pub struct Pool {
    pub dir: TempDir,
    pub pool: PathBuf,
}

impl Pool {
    /// A new pool of `size` with the given mapping.
    pub fn new(tag: &str, size: &str, mapping: &str) -> Pool {
        let dir = TempDir::new(tag);
        let pool = dir.path().join("pool");
        pmfs_ok(&[
            "mkfs",
            pool.to_str().unwrap(),
            "--size",
            size,
            "--mapping",
            mapping,
        ]);
        Pool { dir, pool }
    }

    /// A fresh mount point directory inside the pool's temporary directory.
    pub fn mount_point(&self, name: &str) -> PathBuf {
        let m = self.dir.path().join(name);
        fs::create_dir_all(&m).unwrap();
        m
    }

    /// Mounts the pool on `dir` (a daemon in the foreground, child of the test).
    pub fn mount(&self, dir: &Path, options: &[&str]) -> Mount {
        let mut cmd = Command::new(PMFS);
        cmd.arg("mount")
            .arg(&self.pool)
            .arg(dir)
            .arg("--foreground")
            .stdin(Stdio::null());
        for o in options {
            cmd.arg("-o").arg(o);
        }
        // The guard exists before the mount does: a failure below still cleans up.
        let mut m = Mount {
            dir: dir.to_owned(),
            daemon: Some(cmd.spawn().unwrap()),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !mounted(dir) {
            if let Some(status) = m.daemon.as_mut().unwrap().try_wait().unwrap() {
                panic!("pmfs mount exited with {status} before mounting");
            }
            assert!(Instant::now() < deadline, "mount did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
        m
    }

    /// `pmfs fsck` output; panics unless the volume is clean.
    pub fn fsck_clean(&self) -> String {
        pmfs_ok(&["fsck", self.pool.to_str().unwrap()])
    }
}

/// A mounted volume: unmounted (lazily if need be) and its daemon reaped on drop.
#[derive(Debug)]
pub struct Mount {
    pub dir: PathBuf,
    pub daemon: Option<Child>,
}

impl Mount {
    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.dir.join(p)
    }

    /// Unmounts with `fusermount3 -u` and waits for the daemon to exit cleanly.
    pub fn unmount(mut self) {
        // A program that used the mount just before may still be ending and keep it busy:
        // retry for a moment.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Command::new("fusermount3")
            .arg("-u")
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
        {
            assert!(Instant::now() < deadline, "fusermount3 -u kept failing");
            std::thread::sleep(Duration::from_millis(50));
        }
        let child = self.daemon.take().unwrap();
        let status = wait_for(child, Duration::from_secs(30));
        assert!(status.success(), "daemon exited with {status}");
    }

    /// Kills the daemon with `signal` and detaches the dead mount.
    pub fn kill(mut self, signal: &str) {
        let child = self.daemon.take().unwrap();
        sh(&format!("kill -{signal} {}", child.id()));
        wait_for(child, Duration::from_secs(30));
        detach(&self.dir);
    }
}

/// Waits up to `limit` for `child` to exit and returns its status; kills it after that (its
/// status then says so), so that a daemon that does not stop fails the test instead of
/// hanging it.
pub fn wait_for(mut child: Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Detaches whatever pmfs mount is on the directory when dropped (for daemons the test did
/// not start itself).
#[derive(Debug)]
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        detach(&self.0);
    }
}

fn detach(dir: &Path) {
    if mounted(dir) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(dir)
            .status();
    }
    if mounted(dir) {
        let _ = Command::new("umount").arg("-l").arg(dir).status();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        detach(&self.dir);
        if let Some(child) = self.daemon.take() {
            wait_for(child, Duration::from_secs(10));
        }
    }
}

/// One object of a tree snapshot.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Obj {
    File {
        data: Vec<u8>,
        mode: u32,
        nlink: u64,
    },
    Dir {
        mode: u32,
    },
    Symlink(PathBuf),
    Fifo {
        mode: u32,
    },
    Other {
        mode: u32,
        rdev: u64,
    },
}

/// Relative path -> object, for everything under `root` (not following symbolic links).
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Obj> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Obj>) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        let md = fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().to_owned();
        let ft = md.file_type();
        let mode = md.mode() & 0o7777;
        let obj = if ft.is_dir() {
            walk(root, &p, out);
            Obj::Dir { mode }
        } else if ft.is_symlink() {
            Obj::Symlink(fs::read_link(&p).unwrap())
        } else if ft.is_file() {
            Obj::File {
                data: fs::read(&p).unwrap(),
                mode,
                nlink: md.nlink(),
            }
        } else if ft.is_fifo() {
            Obj::Fifo { mode }
        } else {
            Obj::Other {
                mode,
                rdev: md.rdev(),
            }
        };
        out.insert(rel, obj);
    }
}
