//! Helpers of the library's tests: the built `libpmfs_preload.so` and `pmfs` binary, a pmfs
//! pool mounted by a `pmfs mount --foreground` daemon that is always unmounted and reaped
//! (even when a test fails), shell commands run with or without the library, and the
//! library's counter lines.
//!
//! The tests need root and `/dev/fuse` (mounting), as in CI.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The directory the test binary was built into (`target/<profile>/deps`).
fn deps_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned()
}

/// Free 4 KiB blocks of the file system at `p`. (Asking also makes the daemon free the files
/// whose release it deferred.)
pub fn free_blocks(p: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and a zeroed statvfs to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail * st.f_frsize / 4096
}

/// The free blocks of the file system at `p` once they are at least `want`, or after 10 s:
/// the daemon frees a deleted file once the kernel has forgotten it, which it tells the
/// daemon in the background.
pub fn free_blocks_reaching(p: &Path, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut free = free_blocks(p);
    while free < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        free = free_blocks(p);
    }
    free
}

/// The library under test, built by cargo next to the test binary.
pub fn library() -> PathBuf {
    let so = deps_dir().join("libpmfs_preload.so");
    assert!(so.exists(), "{} was not built", so.display());
    so
}

/// A command running `exe` under the library, its counters going to `stats`, with standard
/// input and output piped: a program the test steps line by line.
pub fn stepped(exe: &Path, stats: &Path) -> Command {
    let mut cmd = Command::new(exe);
    cmd.env("LD_PRELOAD", library())
        .env("PMFS_PRELOAD_STATS", stats)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    cmd
}

/// The `pmfs` binary of the same build and sources, brought up to date by cargo once per test
/// binary (cargo builds only the package's own binaries for its tests, and one left from an
/// older build would run the old daemon).
pub fn pmfs_bin() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let profile_dir = deps_dir().parent().unwrap().to_owned();
    BUILT.call_once(|| {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "pmfs-fuse", "--bin", "pmfs"])
            .env("CARGO_TARGET_DIR", profile_dir.parent().unwrap());
        if profile_dir.file_name().unwrap() == "release" {
            cmd.arg("--release");
        }
        assert!(cmd.status().unwrap().success(), "building pmfs failed");
    });
    profile_dir.join("pmfs")
}

/// A unique directory under the system's temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "pmfs-preload-{tag}-{}-{}",
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

/// Whether `dir` is a pmfs mount point now.
fn mounted(dir: &Path) -> bool {
    let want = dir.to_string_lossy().replace(' ', "\\040");
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()) && l.contains(" - fuse.pmfs "))
}

/// A fresh pool mounted on a directory next to it; unmounted and its daemon reaped on drop.
#[derive(Debug)]
pub struct Mounted {
    pool: PathBuf,
    mnt: PathBuf,
    /// `-o` options of the mount.
    options: String,
    daemon: Option<Child>,
    // Dropped last: the pool and the mount point live in it.
    dir: TempDir,
}

impl Mounted {
    /// Makes a pool of `size` with `mapping` and mounts it.
    pub fn new(tag: &str, size: &str, mapping: &str) -> Mounted {
        Mounted::with_options(tag, size, mapping, &[])
    }

    /// [`Mounted::new`], mounted with `-o options`.
    pub fn with_options(tag: &str, size: &str, mapping: &str, options: &[&str]) -> Mounted {
        let dir = TempDir::new(tag);
        let pool = dir.path().join("pool");
        let mnt = dir.path().join("mnt");
        fs::create_dir(&mnt).unwrap();
        let out = Command::new(pmfs_bin())
            .arg("mkfs")
            .arg(&pool)
            .args(["--size", size, "--mapping", mapping])
            .output()
            .unwrap();
        assert!(out.status.success(), "mkfs: {out:?}");
        let mut m = Mounted {
            pool,
            mnt,
            options: options.join(","),
            daemon: None,
            dir,
        };
        m.mount();
        m
    }

    fn mount(&mut self) {
        let mut cmd = Command::new(pmfs_bin());
        cmd.arg("mount")
            .arg(&self.pool)
            .arg(&self.mnt)
            .arg("--foreground");
        if !self.options.is_empty() {
            cmd.args(["-o", &self.options]);
        }
        let daemon = cmd.stdin(Stdio::null()).spawn().unwrap();
        self.daemon = Some(daemon);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !mounted(&self.mnt) {
            if let Some(s) = self.daemon.as_mut().unwrap().try_wait().unwrap() {
                panic!("pmfs mount exited with {s} before mounting");
            }
            assert!(Instant::now() < deadline, "the mount did not appear");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Unmounts and mounts the pool again (the owner's mount recovers what clients left).
    pub fn remount(mut self) -> Mounted {
        self.unmount();
        self.mount();
        self
    }

    /// Unmounts and mounts the pool again with `-o options`.
    pub fn remount_with(mut self, options: &[&str]) -> Mounted {
        self.unmount();
        self.options = options.join(",");
        self.mount();
        self
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }

    /// The pool file.
    pub fn pool(&self) -> &Path {
        &self.pool
    }

    /// Unmounts, requiring a clean daemon exit and a clean `pmfs fsck`: the processes that used
    /// the library left no pin, staged block or orphan behind.
    pub fn unmount_and_fsck(mut self) {
        self.unmount();
        let out = Command::new(pmfs_bin())
            .arg("fsck")
            .arg(&self.pool)
            .output()
            .unwrap();
        assert!(out.status.success(), "fsck: {out:?}");
    }

    /// Kills the daemon with SIGKILL and detaches the dead mount lazily (open descriptors on
    /// it then fail). [`remount`](Self::remount) mounts the pool again.
    pub fn kill_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        self.detach();
    }

    /// Takes the mount out of the mount table lazily (`fusermount3 -u -z`): a daemon still
    /// running serves the descriptors open on it and exits after the last is closed.
    pub fn detach(&mut self) {
        let out = Command::new("fusermount3")
            .arg("-uz")
            .arg(&self.mnt)
            .output()
            .unwrap();
        assert!(out.status.success(), "fusermount3 -uz: {out:?}");
    }

    fn unmount(&mut self) {
        let Some(mut daemon) = self.daemon.take() else {
            return;
        };
        // A program that used the mount just before may still be ending and keep it busy:
        // retry for a while.
        let deadline = Instant::now() + Duration::from_secs(20);
        while mounted(&self.mnt) && Instant::now() < deadline {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status();
            if mounted(&self.mnt) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        if mounted(&self.mnt) {
            let _ = daemon.kill();
            let _ = Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.mnt)
                .status();
            let _ = daemon.wait();
            panic!("the mount stayed busy");
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = daemon.try_wait().unwrap() {
                assert!(s.success(), "the daemon exited with {s}");
                return;
            }
            if Instant::now() > deadline {
                let _ = daemon.kill();
                let _ = daemon.wait();
                panic!("the daemon did not exit");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(mut d) = self.daemon.take() {
                let _ = d.kill();
                let _ = d.wait();
                let _ = Command::new("fusermount3")
                    .arg("-uz")
                    .arg(&self.mnt)
                    .status();
            }
        } else {
            self.unmount();
        }
    }
}

/// How a command is run.
#[derive(Clone, Copy, Debug)]
pub enum With<'a> {
    /// Without the library.
    Kernel,
    /// Under the library, its counters appended to this file.
    Library(&'a Path),
    /// Under the library with `PMFS_PRELOAD=off`, counters asked for in this file.
    LibraryOff(&'a Path),
}

/// Runs `sh -c script` in `dir`.
pub fn sh_in(dir: &Path, script: &str, with: With<'_>) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(script)
        .current_dir(dir)
        .stdin(Stdio::null())
        .env_remove("LD_PRELOAD")
        .env_remove("PMFS_PRELOAD")
        .env_remove("PMFS_PRELOAD_STATS");
    match with {
        With::Kernel => {}
        With::Library(stats) => {
            cmd.env("LD_PRELOAD", library())
                .env("PMFS_PRELOAD_STATS", stats);
        }
        With::LibraryOff(stats) => {
            cmd.env("LD_PRELOAD", library())
                .env("PMFS_PRELOAD", "off")
                .env("PMFS_PRELOAD_STATS", stats);
        }
    }
    cmd.output().unwrap()
}

/// As [`sh_in`], requiring success; returns stdout.
pub fn sh_ok(dir: &Path, script: &str, with: With<'_>) -> Vec<u8> {
    let out = sh_in(dir, script, with);
    assert!(
        out.status.success(),
        "`{script}` in {} ({with:?}) failed ({}): {}{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The library's counters, summed over every process that wrote a line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Processes that reported.
    pub processes: u64,
    /// Descriptors recognised as pmfs files.
    pub pmfs_fds: u64,
    /// Data calls on them.
    pub pmfs_calls: u64,
    /// Calls served in userspace.
    pub served: u64,
}

/// Reads and sums the counter lines in `file` (none if it does not exist).
pub fn counters(file: &Path) -> Counters {
    let Ok(text) = fs::read_to_string(file) else {
        return Counters::default();
    };
    let mut c = Counters::default();
    for line in text.lines() {
        // pmfs-preload: pid P: F pmfs fds, C calls on them, S served in userspace
        let nums: Vec<u64> = line
            .split(|ch: char| !ch.is_ascii_digit())
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        assert!(
            line.starts_with("pmfs-preload: pid ") && nums.len() == 4,
            "unexpected counter line {line:?}"
        );
        c.processes += 1;
        c.pmfs_fds += nums[1];
        c.pmfs_calls += nums[2];
        c.served += nums[3];
    }
    c
}

/// Compiles `tests/programs/{name}.c` into `dir`; returns the executable.
pub fn compile(name: &str, dir: &Path) -> PathBuf {
    cc(name, &dir.join(name), &[])
}

/// Compiles `tests/programs/{name}.c` into the shared object `dir/{name}.so`; returns it.
pub fn compile_shared(name: &str, dir: &Path) -> PathBuf {
    cc(name, &dir.join(format!("{name}.so")), &["-shared", "-fPIC"])
}

fn cc(name: &str, out_file: &Path, extra: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"));
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-pthread"])
        .args(extra)
        .arg("-o")
        .arg(out_file)
        .arg(&src)
        .output()
        .unwrap();
    assert!(out.status.success(), "cc: {out:?}");
    out_file.to_owned()
}

/// Pseudo-random bytes from a seed.
pub fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// What a program printed, and the files it left by relative path.
pub type Run = (String, Vec<(String, Vec<u8>)>);

/// Compiles `tests/programs/{name}.c` and runs it three times, each in a new directory: in a
/// local directory without the library, on a fresh HashFS mount without it, and on the mount
/// under it. Asserts that the library changed no result and no file, and that the pmfs runs
/// match the local one (their transcripts compared through `comparable`, which may drop lines
/// a local file system answers differently). Returns the library's run, its counters, and the
/// mount.
pub fn runs_agree(name: &str, comparable: impl Fn(&str) -> String) -> (Run, Counters, Mounted) {
    runs_agree_on(name, &[], comparable)
}

/// [`runs_agree`] on a mount with `-o options`.
pub fn runs_agree_on(
    name: &str,
    options: &[&str],
    comparable: impl Fn(&str) -> String,
) -> (Run, Counters, Mounted) {
    let work = TempDir::new(name);
    let exe = compile(name, work.path());
    let m = Mounted::with_options(name, "256M", "hashfs", options);
    let stats = work.path().join("stats");
    let run = |dir: PathBuf, with: With<'_>| {
        fs::create_dir(&dir).unwrap();
        let out = sh_ok(&dir, &exe.display().to_string(), with);
        (String::from_utf8_lossy(&out).into_owned(), tree(&dir))
    };
    let (local, local_files) = run(work.path().join("local"), With::Kernel);
    let (kernel, kernel_files) = run(m.path().join("kernel"), With::Kernel);
    let (library, library_files) = run(m.path().join("library"), With::Library(&stats));

    assert_eq!(kernel, library, "the library changed a result");
    assert_eq!(
        comparable(&local),
        comparable(&library),
        "pmfs results differ from local ones"
    );
    assert!(kernel_files == library_files, "the library changed a file");
    assert!(local_files == library_files, "pmfs files differ");
    ((library, library_files), counters(&stats), m)
}

/// Every regular file under `root` with its bytes, by relative path.
pub fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, fs::read(e.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}
