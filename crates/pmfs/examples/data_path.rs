//! Rough throughput of the copy-on-write data path through the embedding API, per mapping
//! structure: 4 KiB random overwrites, 4 KiB appends, 4 KiB random reads, 100-byte
//! overwrites and 1 MiB sequential writes and reads on one file. For a quick look only; the
//! criterion benches in `benches/` are the measurements.
//!
//! ```sh
//! cargo run --release -p pmfs --example data_path [POOL_DIR]
//! ```
//!
//! The pool files go to `POOL_DIR` (default `/dev/shm`, else the temporary directory).
#![allow(clippy::print_stdout)]

use std::time::Instant;

use pmfs::{MappingKind, OpenOptions, Options, Volume};

const FILE_BLOCKS: u64 = 4096;
const OPS: u64 = 20_000;

fn rate(ops: u64, bytes: u64, t: Instant) -> String {
    let s = t.elapsed().as_secs_f64();
    format!(
        "{:>9.0} op/s {:>7.0} MB/s",
        ops as f64 / s,
        bytes as f64 / s / 1e6
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            let shm = std::path::PathBuf::from("/dev/shm");
            if shm.is_dir() {
                shm
            } else {
                std::env::temp_dir()
            }
        });
    for mapping in [
        MappingKind::Extent,
        MappingKind::Radix,
        MappingKind::Cuckoo,
        MappingKind::HashFs,
    ] {
        let pool = dir.join(format!("pmfs-data-path-{}.pool", std::process::id()));
        let _ = std::fs::remove_file(&pool);
        let opts = Options {
            size: 512 << 20,
            ..Options::with_mapping(mapping)
        };
        let vol = Volume::create(&pool, &opts)?;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .open(&vol, "/f")?;
        let block = vec![7u8; 4096];
        for b in 0..FILE_BLOCKS {
            f.write_at(&block, b * 4096)?;
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % FILE_BLOCKS
        };
        let t = Instant::now();
        for _ in 0..OPS {
            f.write_at(&block, next() * 4096)?;
        }
        let overwrite = rate(OPS, OPS * 4096, t);
        let t = Instant::now();
        for _ in 0..OPS {
            f.write_at(&block[..100], next() * 4096 + 1000)?;
        }
        let small = rate(OPS, OPS * 100, t);
        let mut buf = vec![0u8; 4096];
        let t = Instant::now();
        for _ in 0..OPS {
            f.read_at(&mut buf, next() * 4096)?;
        }
        let read = rate(OPS, OPS * 4096, t);
        let g = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&vol, "/g")?;
        let t = Instant::now();
        for _ in 0..OPS {
            g.write_at(&block, 0)?;
        }
        let append = rate(OPS, OPS * 4096, t);
        drop(g);
        vol.remove_file("/g")?;
        let mib = vec![3u8; 1 << 20];
        let t = Instant::now();
        for i in 0..64u64 {
            f.write_at(&mib, (i % 16) << 20)?;
        }
        let seq_w = rate(64, 64 << 20, t);
        let mut big = vec![0u8; 1 << 20];
        let t = Instant::now();
        for i in 0..64u64 {
            f.read_at(&mut big, (i % 16) << 20)?;
        }
        let seq_r = rate(64, 64 << 20, t);
        println!("{mapping:?}:");
        println!("  4 KiB random overwrite {overwrite}");
        println!("  100 B overwrite        {small}");
        println!("  4 KiB random read      {read}");
        println!("  4 KiB append           {append}");
        println!("  1 MiB write            {seq_w}");
        println!("  1 MiB read             {seq_r}");
        drop(f);
        vol.close()?;
        std::fs::remove_file(&pool)?;
    }
    Ok(())
}
