//! Crash test: SIGKILL the daemon in the middle of a write-heavy workload (appending writers
//! that fsync, plus a thread creating, renaming and removing files), remount, and check that
//! the volume recovers, fsck finds it clean, and every fsync'd byte is there.

mod common;

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{Pool, pmfs};

const WRITERS: usize = 3;
const RECORD: usize = 12 << 10;

fn record(writer: usize, k: u64) -> Vec<u8> {
    (0..RECORD)
        .map(|i| (writer as u8) ^ (k as u8).wrapping_mul(7) ^ (i as u8) ^ ((i >> 9) as u8))
        .collect()
}

#[test]
fn fsynced_data_survives_killing_the_daemon() {
    let pool = Pool::new("crash", "256M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    fs::create_dir(m.join("churn")).unwrap();
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..WRITERS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));

    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let path = m.join(&format!("w{w}"));
        let acked = acked.clone();
        let stop = stop.clone();
        threads.push(thread::spawn(move || {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if f.write_all_at(&record(w, k), k * RECORD as u64).is_err() {
                    return;
                }
                k += 1;
                if k.is_multiple_of(4) {
                    if f.sync_all().is_err() {
                        return;
                    }
                    acked[w].store(k, Ordering::Release);
                }
            }
        }));
    }
    {
        let churn = m.join("churn");
        let stop = stop.clone();
        threads.push(thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let a = churn.join(format!("f{i}"));
                if fs::write(&a, vec![i as u8; (i % 9000) as usize]).is_err()
                    || fs::rename(&a, churn.join(format!("g{}", i % 50))).is_err()
                {
                    return;
                }
                if i.is_multiple_of(3) {
                    let _ = fs::remove_file(churn.join(format!("g{}", (i + 7) % 50)));
                }
                i += 1;
            }
        }));
    }

    // Let the workload run until every writer has fsync'd a fair amount, then kill -9.
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked.iter().any(|a| a.load(Ordering::Acquire) < 64) {
        assert!(Instant::now() < deadline, "writers made no progress");
        thread::sleep(Duration::from_millis(5));
    }
    m.kill("KILL");
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let durable: Vec<u64> = acked.iter().map(|a| a.load(Ordering::Acquire)).collect();

    // The checker sees a volume that was not closed cleanly, and no damage once recovered
    // (which it tries in memory); mounting recovers it.
    let before = pmfs(&["fsck", pool.pool.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&before.stdout);
    assert_eq!(before.status.code(), Some(0), "{said}");
    assert!(said.contains("NotClean"), "{said}");
    assert!(
        said.contains("not closed cleanly, and clean once the next mount recovers it"),
        "{said}"
    );
    let m = pool.mount(&dir, &[]);
    for (w, &n) in durable.iter().enumerate() {
        let data = fs::read(m.join(&format!("w{w}"))).unwrap();
        assert!(
            data.len() as u64 >= n * RECORD as u64,
            "writer {w}: {} bytes, {n} records fsync'd",
            data.len()
        );
        for k in 0..n {
            let at = (k as usize) * RECORD;
            assert!(
                data[at..at + RECORD] == record(w, k)[..],
                "writer {w}: fsync'd record {k} differs after the crash"
            );
        }
    }
    assert!(fs::read_dir(m.join("churn")).unwrap().count() <= 51);
    m.unmount();
    pool.fsck_clean();
}
