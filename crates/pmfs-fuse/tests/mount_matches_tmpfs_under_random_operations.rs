//! Differential test: the same random sequence of file-system calls runs on the mount and on
//! a tmpfs directory. Every call must succeed on both or fail on both with the same errno, and
//! the two trees (names, types, contents, modes, link counts, link targets) must stay equal,
//! also after an unmount and remount. Each seed runs on another mapping structure.
//!
//! `PMFS_DIFF_OPS` sets the number of operations per seed (default 2000).

mod common;

use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use common::{Obj, Pool, TempDir, snapshot};
use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const NAMES: [&str; 5] = ["a", "b", "c", "dir", "x y"];
/// The target of the symbolic links that lead out of the trees: in a directory that does not
/// exist, so that writes through them fail alike on both sides (`ENOENT`) instead of creating
/// a file in the machine's root directory, as `/nonexistent` did.
const OUTSIDE: &str = "/nonexistent-dir/target";

fn random_path(rng: &mut SmallRng) -> String {
    let depth = rng.gen_range(1..=3);
    (0..depth)
        .map(|_| NAMES[rng.gen_range(0..NAMES.len())])
        .collect::<Vec<_>>()
        .join("/")
}

/// File contents, shown by length in failure reports.
#[derive(Clone, PartialEq, Eq)]
struct Bytes(Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

fn data(rng: &mut SmallRng) -> Bytes {
    let len = match rng.gen_range(0..4) {
        0 => 0,
        1 => rng.gen_range(1..100),
        2 => rng.gen_range(4000..4200),
        _ => rng.gen_range(1..40000),
    };
    let b: u8 = rng.r#gen();
    Bytes((0..len).map(|i| b.wrapping_add(i as u8)).collect())
}

/// One operation, drawn once and applied to both trees.
#[derive(Clone, Debug)]
enum Op {
    Write(String, Bytes),
    Append(String, Bytes),
    WriteAt(String, u64, Bytes),
    Truncate(String, u64),
    Mkdir(String),
    Rmdir(String),
    Unlink(String),
    Rename(String, String),
    RenameNoReplace(String, String),
    Exchange(String, String),
    Link(String, String),
    Symlink(String, String),
    Chmod(String, u32),
    Mkfifo(String),
    Read(String),
    List(String),
    /// `copy_file_range` from (path, offset) to (path, offset), this many bytes.
    CopyRange(String, u64, String, u64, usize),
}

/// The next operation; copies pick their files from `tree` (the reference tree).
fn draw(rng: &mut SmallRng, tree: &Path) -> Op {
    let p = random_path(rng);
    match rng.gen_range(0..21) {
        0..=2 => Op::Write(p, data(rng)),
        3 => Op::Append(p, data(rng)),
        4 => Op::WriteAt(p, rng.gen_range(0..50000), data(rng)),
        5 => Op::Truncate(p, rng.gen_range(0..60000)),
        6 | 7 => Op::Mkdir(p),
        8 => Op::Rmdir(p),
        9 => Op::Unlink(p),
        10 | 11 => Op::Rename(p, random_path(rng)),
        12 => Op::RenameNoReplace(p, random_path(rng)),
        13 => Op::Exchange(p, random_path(rng)),
        14 => Op::Link(p, random_path(rng)),
        15 => Op::Symlink(
            ["a", "dir/../b", "dir/c", OUTSIDE][rng.gen_range(0..4)].to_owned(),
            p,
        ),
        16 => Op::Chmod(p, [0o644, 0o600, 0o755, 0o711, 0o4755][rng.gen_range(0..5)]),
        17 => Op::Mkfifo(p),
        18 => Op::Read(p),
        19 => Op::List(p),
        _ => {
            let len = match rng.gen_range(0..4) {
                0 => rng.gen_range(0..100),
                1 => rng.gen_range(4000..4200),
                2 => rng.gen_range(1..70000),
                _ => 1 << 20,
            };
            // Mostly between files that exist, which random paths seldom are.
            let files: Vec<String> = snapshot(tree)
                .into_iter()
                .filter(|(_, o)| matches!(o, Obj::File { .. }))
                .map(|(p, _)| p.to_string_lossy().into_owned())
                .collect();
            let mut file = || match files.len() {
                0 => random_path(rng),
                n if rng.gen_bool(0.9) => files[rng.gen_range(0..n)].clone(),
                _ => random_path(rng),
            };
            let (a, b) = (file(), file());
            Op::CopyRange(a, rng.gen_range(0..20000), b, rng.gen_range(0..50000), len)
        }
    }
}

/// What a call returned, comparable across the two trees.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Data(Bytes),
    Names(Vec<String>),
    Err(Option<i32>),
    Fifo,
    Copied(usize),
}

fn apply(root: &Path, op: &Op) -> Outcome {
    let at = |p: &str| -> PathBuf { root.join(p) };
    // Opening a FIFO would wait for a partner: report it instead (the trees are equal, so
    // both sides agree).
    if let Op::Write(p, _)
    | Op::Append(p, _)
    | Op::WriteAt(p, _, _)
    | Op::Truncate(p, _)
    | Op::Read(p)
    | Op::CopyRange(p, ..) = op
        && fs::metadata(at(p)).is_ok_and(|m| m.file_type().is_fifo())
    {
        return Outcome::Fifo;
    }
    if let Op::CopyRange(_, _, p, _, _) = op
        && fs::metadata(at(p)).is_ok_and(|m| m.file_type().is_fifo())
    {
        return Outcome::Fifo;
    }
    let r: io::Result<Outcome> = (|| {
        match op {
            Op::Write(p, d) => fs::write(at(p), &d.0)?,
            Op::Append(p, d) => {
                let f = OpenOptions::new().append(true).open(at(p))?;
                std::io::Write::write_all(&mut &f, &d.0)?;
            }
            Op::WriteAt(p, off, d) => OpenOptions::new()
                .write(true)
                .open(at(p))?
                .write_all_at(&d.0, *off)?,
            Op::Truncate(p, len) => OpenOptions::new().write(true).open(at(p))?.set_len(*len)?,
            Op::Mkdir(p) => fs::create_dir(at(p))?,
            Op::Rmdir(p) => fs::remove_dir(at(p))?,
            Op::Unlink(p) => fs::remove_file(at(p))?,
            Op::Rename(a, b) => fs::rename(at(a), at(b))?,
            Op::RenameNoReplace(a, b) | Op::Exchange(a, b) => {
                let flags = if matches!(op, Op::Exchange(..)) {
                    RenameFlags::RENAME_EXCHANGE
                } else {
                    RenameFlags::RENAME_NOREPLACE
                };
                renameat2(AT_FDCWD, &at(a), AT_FDCWD, &at(b), flags).map_err(io::Error::from)?
            }
            Op::Link(a, b) => fs::hard_link(at(a), at(b))?,
            Op::Symlink(t, p) => symlink(t, at(p))?,
            Op::Chmod(p, m) => fs::set_permissions(at(p), fs::Permissions::from_mode(*m))?,
            Op::Mkfifo(p) => {
                nix::unistd::mkfifo(&at(p), nix::sys::stat::Mode::from_bits_truncate(0o640))
                    .map_err(io::Error::from)?
            }
            Op::Read(p) => return Ok(Outcome::Data(Bytes(fs::read(at(p))?))),
            Op::CopyRange(a, from, b, to, len) => {
                let src = fs::File::open(at(a))?;
                let dst = OpenOptions::new().write(true).open(at(b))?;
                let (mut from, mut to) = (*from as i64, *to as i64);
                // SAFETY: both descriptors are open for the call and the offsets are locals.
                let n = unsafe {
                    libc::copy_file_range(
                        src.as_raw_fd(),
                        &mut from,
                        dst.as_raw_fd(),
                        &mut to,
                        *len,
                        0,
                    )
                };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                return Ok(Outcome::Copied(n as usize));
            }
            Op::List(p) => {
                let mut names: Vec<String> = fs::read_dir(at(p))?
                    .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                    .collect::<io::Result<_>>()?;
                names.sort();
                return Ok(Outcome::Names(names));
            }
        }
        Ok(Outcome::Ok)
    })();
    r.unwrap_or_else(|e| Outcome::Err(e.raw_os_error()))
}

fn run(seed: u64, mapping: &str, ops: usize) {
    let pool = Pool::new(&format!("diff-{seed}"), "128M", mapping);
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let shm = Path::new("/dev/shm");
    let reference = if shm.is_dir() {
        TempDir(shm.join(format!("pmfs-diff-{}-{seed}", std::process::id())))
    } else {
        TempDir::new(&format!("diff-ref-{seed}"))
    };
    let _ = fs::remove_dir_all(reference.path());
    fs::create_dir_all(reference.path()).unwrap();
    fs::set_permissions(m.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(reference.path(), fs::Permissions::from_mode(0o755)).unwrap();

    let mut rng = SmallRng::seed_from_u64(seed);
    let mut log = Vec::new();
    for i in 0..ops {
        let op = draw(&mut rng, reference.path());
        let ours = apply(m.path(), &op);
        let theirs = apply(reference.path(), &op);
        log.push(format!("{op:?} -> {theirs:?}"));
        assert_eq!(
            ours,
            theirs,
            "seed {seed}, op {i}: {op:?}\nhistory:\n{}",
            log.join("\n")
        );
        if i % 100 == 99 {
            assert_eq!(
                snapshot(m.path()),
                snapshot(reference.path()),
                "seed {seed}, after op {i}"
            );
        }
    }
    let expected = snapshot(reference.path());
    assert_eq!(
        snapshot(m.path()),
        expected,
        "seed {seed}: final trees differ"
    );
    m.unmount();
    pool.fsck_clean();
    let m = pool.mount(&dir, &[]);
    assert_eq!(
        snapshot(m.path()),
        expected,
        "seed {seed}: tree changed by remount"
    );
    m.unmount();
}

#[test]
fn mount_matches_tmpfs_under_random_operations() {
    let ops = std::env::var("PMFS_DIFF_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    for (seed, mapping) in [(1, "hashfs"), (2, "extent"), (3, "radix"), (4, "cuckoo")] {
        run(seed, mapping, ops);
    }
}
