//! Two processes map the same pool file and run the copy-on-write path of HashFS at the same
//! time, with no lock between them: each stages, removes and promotes (`insert_at`) blocks of
//! its own inode and of its own range of a shared inode, both stage the same keys of the
//! shared inode over and over (and give them back), and both allocate and free log blocks of
//! the shared inode. The parent then checks the table: every promoted version is mapped,
//! the last staged versions of the shared keys are distinct slots that are still staged, the
//! log blocks each process kept are exactly the shared inode's log blocks, keyed uniquely.
//!
//! The test re-executes its own binary for the two workers (selected by an environment
//! variable), so no fork of a multi-threaded test process is needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{Media, PmRegion};
use pmfs_core::traits::{AllocHint, BlockAllocator, Extent, FileId, FileMapping, Run};
use pmfs_mapping::hashfs::slot::Slot;
use pmfs_mapping::hashfs::{HashFs, HashFsFile, LOG_LBLK_END, LOG_LBLK_FIRST};

const SLOTS: u64 = 2048;
const WORKER_ENV: &str = "PMFS_HASHFS_XPROC_WORKER";
const TEST_NAME: &str = "two_processes_stage_promote_and_allocate_log_blocks_without_locks";
/// The inode both workers use; each worker also has inode `10 + role`.
const SHARED: u64 = 1;
const LEN: u64 = 6;
const ROUNDS: u64 = 1000;
/// Logical block where both workers stage the same keys.
const CONTESTED: u64 = 500;
const LOG_ALLOCS: usize = 40;

fn meta() -> Extent {
    Extent::new(BlockNo(0), HashFs::<PmRegion>::meta_blocks(SLOTS))
}

fn data() -> Extent {
    Extent::new(meta().end(), SLOTS)
}

/// A word after the data region where the workers meet before they start.
fn barrier() -> PmOff {
    data().end().offset()
}

fn pool_bytes() -> u64 {
    (data().end().0 + 1) * BLOCK_SIZE
}

/// Waits until both workers have arrived, so their loops overlap.
fn meet(region: &PmRegion) {
    let mut w = region.load_u64(barrier()).expect("barrier");
    while let Err(now) = region.cas_u64(barrier(), w, w + 1).expect("barrier") {
        w = now;
    }
    let start = std::time::Instant::now();
    while region.load_u64(barrier()).expect("barrier") < 2 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "the other worker never came"
        );
        std::thread::yield_now();
    }
}

fn open(t: &HashFs<PmRegion>, ino: u64) -> HashFsFile {
    t.open_file(FileId {
        ino,
        root: PmOff(0),
    })
    .expect("open_file")
}

fn blocks(runs: &[Run]) -> Vec<(u64, u64)> {
    runs.iter()
        .flat_map(|r| (0..r.len).map(move |k| (r.lblk + k, r.pblk.0 + k)))
        .collect()
}

/// One copy-on-write overwrite of `[lblk, lblk + LEN)`: stage, remove the old version,
/// promote the new one. Returns the new blocks.
fn overwrite(t: &HashFs<PmRegion>, f: &HashFsFile, lblk: u64) -> Vec<(u64, u64)> {
    let mut runs = Vec::new();
    t.stage(f, lblk, LEN, &mut runs).expect("stage");
    t.remove(f, lblk, LEN).expect("remove");
    for r in &runs {
        t.insert_at(f, *r).expect("insert_at");
    }
    blocks(&runs)
}

fn fmt(v: &[(u64, u64)]) -> String {
    v.iter()
        .map(|(l, p)| format!("{l}={p}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn parse(s: &str) -> Vec<(u64, u64)> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| {
            let (l, p) = x.split_once('=').expect("pair");
            (l.parse().expect("lblk"), p.parse().expect("pblk"))
        })
        .collect()
}

fn worker(role: u64, path: &Path) {
    let region = PmRegion::open(path).expect("open pool");
    meet(&region);
    let t = std::sync::Arc::new(HashFs::open(region, meta(), data()).expect("open table"));
    let own = open(&t, 10 + role);
    let shared = open(&t, SHARED);
    let logs = t.log_blocks(SHARED);
    let mut kept_logs = Vec::new();
    let (mut last_own, mut last_shared) = (Vec::new(), Vec::new());
    let mut contested = Vec::new();
    for round in 0..ROUNDS {
        last_own = overwrite(&t, &own, 0);
        last_shared = overwrite(&t, &shared, 100 * (role + 1));
        // Both workers stage the same keys; all but the last round give them back.
        contested.clear();
        t.stage(&shared, CONTESTED, LEN, &mut contested)
            .expect("stage contested");
        if round + 1 < ROUNDS {
            t.unstage(&contested).expect("unstage");
        }
        if (round as usize) < LOG_ALLOCS {
            let e = logs.alloc(1, AllocHint::metadata()).expect("log alloc");
            if round % 2 == 0 {
                kept_logs.push(e.start.0);
            } else {
                logs.free(e).expect("log free");
            }
        }
    }
    let kept: Vec<_> = kept_logs.iter().map(|&p| (0, p)).collect();
    let report = [
        fmt(&last_own),
        fmt(&last_shared),
        fmt(&blocks(&contested)),
        fmt(&kept),
    ]
    .join("\n");
    std::fs::write(report_path(path, role), report).expect("worker report");
}

/// Where worker `role` leaves its results.
fn report_path(pool: &Path, role: u64) -> PathBuf {
    pool.with_extension(format!("worker{role}"))
}

fn pool_path() -> PathBuf {
    let dir = Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("pmfs-hashfs-xproc-{}.pool", std::process::id()))
}

/// Removes the pool file when the test ends, however it ends.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn two_processes_stage_promote_and_allocate_log_blocks_without_locks() {
    if let Ok(spec) = std::env::var(WORKER_ENV) {
        let (role, path) = spec.split_once(':').expect("worker spec");
        worker(role.parse().expect("role"), Path::new(path));
        return;
    }
    let path = pool_path();
    let _cleanup = Cleanup(path.clone());
    {
        let region = PmRegion::create(&path, pool_bytes()).expect("create pool");
        HashFs::format_with_salt(region, meta(), data(), 0x1234).expect("format");
    }
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..2)
        .map(|role| {
            Command::new(&exe)
                .args(["--exact", TEST_NAME, "--test-threads=1"])
                .env(WORKER_ENV, format!("{role}:{}", path.display()))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().expect("worker");
        assert!(
            out.status.success(),
            "worker failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let outputs: Vec<_> = (0..2)
        .map(|role| {
            let report = report_path(&path, role);
            let _cleanup = Cleanup(report.clone());
            let text = std::fs::read_to_string(&report).expect("worker report");
            let f: Vec<_> = text.lines().map(parse).collect();
            assert_eq!(f.len(), 4, "worker report {text}");
            (f[0].clone(), f[1].clone(), f[2].clone(), f[3].clone())
        })
        .collect();

    let region = PmRegion::open(&path).expect("open pool");
    let t = HashFs::open(region, meta(), data()).expect("open table");
    let lookup = |ino: u64, lblk: u64, len: u64| {
        let mut runs = Vec::new();
        t.lookup(&open(&t, ino), lblk, len, &mut runs)
            .expect("lookup");
        blocks(&runs)
    };
    let mut contested = BTreeSet::new();
    let mut logs = BTreeSet::new();
    for (role, (own, shared, mine, kept)) in outputs.iter().enumerate() {
        let role = role as u64;
        assert_eq!(lookup(10 + role, 0, 1000), *own);
        assert_eq!(lookup(SHARED, 100 * (role + 1), LEN), *shared);
        assert_eq!(mine.len() as u64, LEN);
        for &(l, p) in mine {
            assert!(contested.insert(p), "both workers staged block {p}");
            let w = t
                .media()
                .load_u64((meta().start + 2).offset() + 8 * (p - data().start.0))
                .expect("slot");
            match Slot::decode(w) {
                Some(Slot::Staged(k)) => assert_eq!((k.ino, k.lblk), (SHARED, l)),
                other => panic!("block {p} of a contested stage is {other:?}"),
            }
        }
        assert_eq!(kept.len(), LOG_ALLOCS / 2);
        logs.extend(kept.iter().map(|k| k.1));
    }
    assert_eq!(logs.len(), LOG_ALLOCS, "two workers got the same log block");
    // The shared inode's data below the log range is exactly the two workers' ranges; its
    // log range holds exactly the kept log blocks, each under its own key.
    assert_eq!(lookup(SHARED, 0, 1000).len() as u64, 2 * LEN);
    let mut owned = BTreeSet::new();
    t.owned_blocks(&open(&t, SHARED), &mut |e| {
        owned.extend(e.start.0..e.end().0);
    })
    .expect("owned_blocks");
    let mut log_keys = BTreeSet::new();
    for p in &logs {
        assert!(owned.contains(p), "log block {p} is not the file's");
        let w = t
            .media()
            .load_u64((meta().start + 2).offset() + 8 * (p - data().start.0))
            .expect("slot");
        match Slot::decode(w) {
            Some(Slot::Committed(k)) if k.ino == SHARED => {
                assert!((LOG_LBLK_FIRST..LOG_LBLK_END).contains(&k.lblk));
                assert!(log_keys.insert(k.lblk), "two log blocks keyed {}", k.lblk);
            }
            other => panic!("log block {p} is {other:?}"),
        }
    }
    assert_eq!(owned.len() as u64, 2 * LEN + LOG_ALLOCS as u64);
    let occ = t.occupancy().expect("occupancy");
    assert_eq!(occ.tentative, 0);
    assert_eq!(occ.staged, 2 * LEN);
    assert_eq!(occ.committed, 2 * LEN + 2 * LEN + LOG_ALLOCS as u64);
    assert_eq!(t.sweep_staged().expect("sweep"), 2 * LEN);
}
