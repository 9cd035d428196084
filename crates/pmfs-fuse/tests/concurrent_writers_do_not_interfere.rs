//! Concurrent clients of one mount: threads writing their own files, threads writing
//! disjoint regions of one shared file, and threads creating, renaming and removing names in
//! one directory, all at once. Every byte ends up where its writer put it, and the volume is
//! consistent afterwards.

mod common;

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::thread;

use common::{Pool, snapshot};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const WRITERS: usize = 4;
const FILE: usize = 3 << 20;
const REGION: usize = 512 << 10;

fn pattern(writer: usize, off: usize) -> u8 {
    (writer as u8).wrapping_mul(31) ^ (off as u8) ^ ((off >> 12) as u8)
}

#[test]
fn concurrent_writers_do_not_interfere() {
    let pool = Pool::new("concurrent", "256M", "hashfs");
    let dir = pool.mount_point("mnt");
    let m = pool.mount(&dir, &[]);
    let shared = m.join("shared");
    fs::write(&shared, vec![0u8; WRITERS * REGION]).unwrap();
    fs::create_dir(m.join("names")).unwrap();

    thread::scope(|s| {
        for w in 0..WRITERS {
            let own = m.join(&format!("own-{w}"));
            let shared = shared.clone();
            s.spawn(move || {
                let mut rng = SmallRng::seed_from_u64(w as u64);
                let f = fs::File::create(&own).unwrap();
                let g = OpenOptions::new().write(true).open(&shared).unwrap();
                let mut off = 0;
                while off < FILE {
                    let n = rng.gen_range(1..=64 << 10).min(FILE - off);
                    let buf: Vec<u8> = (off..off + n).map(|o| pattern(w, o)).collect();
                    f.write_all_at(&buf, off as u64).unwrap();
                    off += n;
                }
                // Disjoint regions of the shared file, written in random order.
                let mut chunks: Vec<usize> = (0..REGION / 4096).collect();
                for i in (1..chunks.len()).rev() {
                    chunks.swap(i, rng.gen_range(0..=i));
                }
                for c in chunks {
                    let at = w * REGION + c * 4096;
                    let buf: Vec<u8> = (at..at + 4096).map(|o| pattern(w, o)).collect();
                    g.write_all_at(&buf, at as u64).unwrap();
                }
                f.sync_all().unwrap();
            });
        }
        for w in 0..2 {
            let names = m.join("names");
            s.spawn(move || {
                for i in 0..200 {
                    let a = names.join(format!("t{w}-{i}"));
                    fs::write(&a, format!("{w}/{i}")).unwrap();
                    assert_eq!(fs::read_to_string(&a).unwrap(), format!("{w}/{i}"));
                    let b = names.join(format!("t{w}-{i}.renamed"));
                    fs::rename(&a, &b).unwrap();
                    if i % 2 == 0 {
                        fs::remove_file(&b).unwrap();
                    }
                }
            });
        }
    });

    for w in 0..WRITERS {
        let got = fs::read(m.join(&format!("own-{w}"))).unwrap();
        assert_eq!(got.len(), FILE);
        assert!(
            got.iter().enumerate().all(|(o, &b)| b == pattern(w, o)),
            "file of writer {w} differs"
        );
    }
    let got = fs::read(&shared).unwrap();
    assert!(
        got.iter()
            .enumerate()
            .all(|(o, &b)| b == pattern(o / REGION, o)),
        "shared file differs"
    );
    let names: Vec<String> = fs::read_dir(m.join("names"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 200);
    assert!(names.iter().all(|n| n.ends_with(".renamed")));
    let tree = snapshot(m.path());
    m.unmount();
    pool.fsck_clean();
    let m = pool.mount(&dir, &[]);
    assert_eq!(snapshot(m.path()), tree);
    m.unmount();
}
