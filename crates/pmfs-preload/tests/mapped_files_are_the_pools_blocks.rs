//! Shared mappings of pmfs files under the library map the file's blocks straight from the
//! pool. A C program (`programs/mapped.c`) stores through mappings and reads back with `read`,
//! writes and reads the mapping, maps sparse files, unmaps and syncs parts, shrinks, moves and
//! grows with `mremap`, maps over a mapping, forks a child that stores through its inherited
//! mapping, and maps past the end of file: its transcript and files are the same with and
//! without the library and as on a local directory. `/proc/<pid>/maps` shows the pool file
//! behind a mapping; other processes' writes (served in userspace or through the daemon) appear
//! in it at once and its stores in their reads; the file is written in place while mapped (a
//! fork child that inherited the mapping and left changes nothing) and relocated by
//! copy-on-write again once the mapping is gone (its pin released by `munmap` or at exit, or
//! taken for dead by the daemon once its program was killed, which also frees the file once
//! deleted); once the mount is gone the mapping no longer reaches the pool; sqlite3 in WAL
//! mode (its `-shm` index is mapped) works across processes. `pmfs fsck` is clean after every
//! run.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::{
    Mounted, TempDir, With, compile, counters, free_blocks, free_blocks_reaching, library,
    runs_agree, sh_ok,
};

#[test]
fn mapped_files_give_the_same_bytes_with_and_without_the_library() {
    let ((_, files), c, m) = runs_agree("mapped", str::to_owned);
    assert_eq!(files.len(), 12);
    // The program, and the fork child whose msync and munmap of the mapping it inherited
    // are calls on a pmfs file.
    assert_eq!(c.processes, 2, "{c:?}");
    assert!(c.served >= 30, "{c:?}");
    m.unmount_and_fsck();
}

/// A work directory with the program in it, a pool of `size` mounted with file `f` of `pages`
/// pages of dots on it, and a counters file.
fn with_file(tag: &str, size: &str, pages: usize) -> (TempDir, PathBuf, Mounted, PathBuf) {
    let work = TempDir::new(tag);
    let exe = compile("mapped", work.path());
    let m = Mounted::new(tag, size, "hashfs");
    std::fs::write(m.path().join("f"), vec![b'.'; pages * 4096]).unwrap();
    let stats = work.path().join("stats");
    (work, exe, m, stats)
}

/// A running `mapped hold FILE`: one line in, one line out.
struct Holder {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Holder {
    fn start(exe: &Path, dir: &Path, file: &str, stats: Option<&Path>) -> Holder {
        let mut cmd = Command::new(exe);
        cmd.args(["hold", file])
            .current_dir(dir)
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if let Some(stats) = stats {
            cmd.env("LD_PRELOAD", library())
                .env("PMFS_PRELOAD_STATS", stats);
        }
        let mut child = cmd.spawn().unwrap();
        let mut h = Holder {
            input: child.stdin.take().unwrap(),
            output: BufReader::new(child.stdout.take().unwrap()),
            child,
        };
        assert_eq!(h.line(), "ready");
        h
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        assert!(
            self.output.read_line(&mut l).unwrap() > 0,
            "the holder died"
        );
        l.trim_end().to_owned()
    }

    fn ask(&mut self, q: &str) -> String {
        writeln!(self.input, "{q}").unwrap();
        self.input.flush().unwrap();
        self.line()
    }

    /// The pool offset of the mapping's first page, asserting the pool file backs it.
    fn pool_offset(&mut self, pool: &Path) -> u64 {
        let w = self.ask("where");
        let rest = w
            .strip_prefix(&format!("backing {} at ", pool.display()))
            .unwrap_or_else(|| panic!("not mapped from the pool: {w}"));
        assert!(rest.ends_with(" rw-s"), "{w}");
        u64::from_str_radix(rest.split(' ').next().unwrap(), 16).unwrap()
    }

    /// Kills the holder (`SIGKILL`, its mapping and pins in place) and reaps it.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Unmaps and exits (end of input), or exits with the mapping in place (`quit`).
    fn finish(mut self, unmap: bool) {
        if !unmap {
            writeln!(self.input, "quit").unwrap();
        }
        drop(self.input);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status}");
    }
}

#[test]
fn a_mapping_is_the_pools_blocks_and_coherent_with_other_processes() {
    let (_work, exe, m, stats) = with_file("mapped-coherent", "256M", 3);

    let mut kernel = Holder::start(&exe, m.path(), "f", None);
    let w = kernel.ask("where");
    assert_eq!(w, format!("backing {}/f at 0 rw-s", m.path().display()));
    assert_eq!(kernel.ask("grow"), "grown");
    kernel.finish(true);

    let mut h = Holder::start(&exe, m.path(), "f", Some(&stats));
    assert!(h.pool_offset(m.pool()) > 0);
    let poke = |off: &str, text: &str, with: With<'_>| {
        let cmd = format!("{} poke f {off} {text}", exe.display());
        sh_ok(m.path(), &cmd, with);
    };
    poke("100", "FROM-A-CLIENT", With::Library(&stats));
    assert_eq!(h.ask("show 100 13"), "FROM-A-CLIENT");
    poke("5000", "THROUGH-THE-DAEMON", With::Kernel);
    assert_eq!(h.ask("show 5000 18"), "THROUGH-THE-DAEMON");
    assert_eq!(h.ask("store 9000 STORED"), "stored 0");
    assert_eq!(h.ask("pread 9000 6"), "pread STORED");
    // Growing would extend the mapping over the pool bytes after the file's.
    assert_eq!(h.ask("grow"), "grow -1 errno Cannot allocate memory");
    let f = std::fs::read(m.path().join("f")).unwrap();
    assert_eq!(&f[9000..9006], b"STORED", "the daemon reads the store");
    let cat = sh_ok(m.path(), "cat f", With::Library(&stats));
    assert_eq!(&cat[9000..9006], b"STORED", "a client reads the store");
    assert_eq!(&cat[100..113], b"FROM-A-CLIENT");
    h.finish(true);

    let c = counters(&stats);
    assert_eq!(c.processes, 3, "{c:?}");
    // The mmap and the msync of the holder, the poke's pwrite, cat's reads.
    assert!(c.served >= 5, "{c:?}");
    m.unmount_and_fsck();
}

/// Overwrites the first block of `f` in `m` with `fill` under the library.
fn overwrite_first_block(m: &Mounted, stats: &Path, fill: char) {
    let cmd = format!(
        "printf '{fill}%.0s' $(seq 4096) | dd of=f bs=4096 iflag=fullblock conv=notrunc status=none"
    );
    sh_ok(m.path(), &cmd, With::Library(stats));
}

/// Overwrites the first block of `f` with `fill`, then maps the file in a new holder and
/// checks that the write copied on write: the block is no longer at pool offset `was` (where
/// a mapping kept it until `gone`) and holds the new bytes. Returns the holder and the
/// block's new offset.
fn relocated(
    exe: &Path,
    m: &Mounted,
    stats: &Path,
    fill: char,
    was: u64,
    gone: &str,
) -> (Holder, u64) {
    overwrite_first_block(m, stats, fill);
    let mut h = Holder::start(exe, m.path(), "f", Some(stats));
    let now = h.pool_offset(m.pool());
    assert_ne!(now, was, "written in place after {gone}");
    assert_eq!(h.ask("show 0 3"), fill.to_string().repeat(3));
    (h, now)
}

#[test]
fn files_are_written_in_place_while_mapped_and_relocated_after() {
    let (_work, exe, m, stats) = with_file("mapped-pin", "256M", 2);
    let overwrite = |fill: char| overwrite_first_block(&m, &stats, fill);

    let mut a = Holder::start(&exe, m.path(), "f", Some(&stats));
    let first = a.pool_offset(m.pool());
    overwrite('a');
    assert_eq!(a.ask("show 0 3"), "aaa", "the write is in the mapping");
    assert_eq!(a.pool_offset(m.pool()), first, "a mapped file moved");
    // A fork child inherits the mapping and leaves: the parent's pin stays.
    assert_eq!(a.ask("fork 5000 FROM-A-CHILD"), "child 0");
    assert_eq!(a.ask("show 5000 12"), "FROM-A-CHILD");
    overwrite('z');
    assert_eq!(
        a.ask("show 0 3"),
        "zzz",
        "the write after the fork is not in the mapping"
    );
    assert_eq!(
        a.pool_offset(m.pool()),
        first,
        "moved after the fork child left"
    );
    // Gone at exit, its mapping still in place: the pin goes with it.
    a.finish(false);

    let (b, second) = relocated(&exe, &m, &stats, 'b', first, "the process exited");
    // Unmapped: the pin goes with the last segment.
    b.finish(true);
    relocated(&exe, &m, &stats, 'c', second, "munmap")
        .0
        .finish(true);
    m.unmount_and_fsck();
}

/// A program killed while it maps a file leaves its pin on the file's log and its share of
/// mapped mode behind. The daemon takes both for dead when the kernel next asks for the
/// file's attributes (the next open does) and no data client is attached: the next write
/// copies on write again instead of writing in place without atomicity until the next
/// mount, and deleting the file frees it (once the kernel forgot it).
#[test]
fn a_file_a_killed_program_mapped_leaves_mapped_mode_and_is_freed_once_deleted() {
    let (_work, exe, m, stats) = with_file("mapped-killed", "256M", 64);

    let mut a = Holder::start(&exe, m.path(), "f", Some(&stats));
    let first = a.pool_offset(m.pool());
    a.kill();
    relocated(&exe, &m, &stats, 'k', first, "its program was killed")
        .0
        .kill();

    let before = free_blocks(m.path());
    std::fs::remove_file(m.path().join("f")).unwrap();
    let after = free_blocks_reaching(m.path(), before + 64);
    assert!(
        after >= before + 64,
        "{before} blocks free before the deletion, {after} after"
    );
    m.unmount_and_fsck();
}

#[test]
fn a_mapping_stops_reaching_the_pool_once_its_mount_is_gone() {
    let (_work, exe, mut m, stats) = with_file("mapped-gone", "64M", 1);
    let mut h = Holder::start(&exe, m.path(), "f", Some(&stats));
    h.pool_offset(m.pool());
    assert_eq!(h.ask("store 10 BEFORE"), "stored 0");

    m.kill_daemon();
    // The daemon is probed at most every 10 ms: wait longer than that.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(h.ask("pread 10 6"), "pread -1 errno Input/output error");
    let w = h.ask("where");
    assert!(w.ends_with(" rw-p"), "still shared with the pool: {w}");
    assert_eq!(h.ask("show 10 6"), "BEFORE", "the mapping lost its bytes");
    assert_eq!(h.ask("store 100 AFTER"), "stored 0");
    assert_eq!(h.ask("show 100 5"), "AFTER");
    h.finish(true);

    let m = m.remount();
    let f = std::fs::read(m.path().join("f")).unwrap();
    assert_eq!(&f[10..16], b"BEFORE");
    assert_eq!(
        &f[100..105],
        b".....",
        "a store after the mount was gone landed"
    );
    m.unmount_and_fsck();
}

const WAL_SQL: &str = "
PRAGMA journal_mode=wal;
CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000)
INSERT INTO t(k, v) SELECT printf('key-%05d', i), zeroblob(i % 500) FROM n;
.shell cat /proc/$PPID/maps > maps.txt
.shell sqlite3 wal.db 'SELECT count(*) FROM t' > first.txt
DELETE FROM t WHERE id % 3 = 0;
UPDATE t SET v = randomblob(100) WHERE id % 5 = 0;
.shell sqlite3 wal.db 'SELECT count(*) FROM t' > second.txt
SELECT count(*), min(k), max(k) FROM t;
PRAGMA integrity_check;
";

#[test]
fn sqlite_in_wal_mode_maps_its_index_from_the_pool() {
    let work = TempDir::new("mapped-wal");
    let m = Mounted::new("mapped-wal", "256M", "hashfs");
    let stats = work.path().join("stats");
    std::fs::write(work.path().join("script.sql"), WAL_SQL).unwrap();
    let local_dir = work.path().join("local");
    std::fs::create_dir(&local_dir).unwrap();
    let cmd = format!(
        "sqlite3 wal.db < {}",
        work.path().join("script.sql").display()
    );
    let local = sh_ok(&local_dir, &cmd, With::Kernel);
    let lib = sh_ok(m.path(), &cmd, With::Library(&stats));
    let text = String::from_utf8_lossy(&lib);
    assert!(
        text.starts_with("wal") && text.trim_end().ends_with("ok"),
        "{text}"
    );
    assert_eq!(local, lib, "results differ");
    // A second process read the rows through the shared index, before and after the changes.
    for (file, rows) in [("first.txt", "2000"), ("second.txt", "1334")] {
        let got = std::fs::read_to_string(m.path().join(file)).unwrap();
        assert_eq!(got.trim(), rows, "{file}");
    }

    // While the database was open, pool pages backed its -shm index (the client's own mapping
    // of the pool is the whole pool).
    let maps = std::fs::read_to_string(m.path().join("maps.txt")).unwrap();
    let pool = m.pool().display().to_string();
    let small_pool_maps = maps
        .lines()
        .filter(|l| l.split_whitespace().nth(5) == Some(pool.as_str()))
        .filter(|l| {
            let range = l.split(' ').next().unwrap();
            let (lo, hi) = range.split_once('-').unwrap();
            let len = u64::from_str_radix(hi, 16).unwrap() - u64::from_str_radix(lo, 16).unwrap();
            len <= 32768
        })
        .count();
    assert!(small_pool_maps >= 1, "no -shm page from the pool:\n{maps}");

    let check = "SELECT count(*) FROM t; PRAGMA integrity_check;";
    let again = sh_ok(m.path(), &format!("sqlite3 wal.db '{check}'"), With::Kernel);
    assert_eq!(String::from_utf8_lossy(&again), "1334\nok\n");
    let c = counters(&stats);
    assert!(c.processes >= 3, "{c:?}");
    assert!(c.served >= 100, "{c:?}");
    m.unmount_and_fsck();
}
