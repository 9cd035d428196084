//! Metadata throughput of the pmfs engine through its embedding API, next to tmpfs through
//! `std::fs` in the same run. Reproduces the shape of **Tables 2 and 3** of the CFFS paper
//! (IEEE Access, §VI-C "Directory operations"):
//!
//! - Group `cffs_table3_create_unlink`: create `x` empty files in one directory (create and
//!   close), then unlink them in random order; one iteration is the whole workload, as in
//!   Table 3 (`x` = 512 … 16384). Throughput counts the `2x` operations.
//! - Group `cffs_table2_create`: only the creates of `x` = 4096 files are timed (the files are
//!   removed outside the timed region), as in Table 2 (files/second).
//! - Groups `engine_stat`, `engine_unlink`, `engine_rename`: the same for `metadata`, unlink
//!   and rename (within the directory) of 4096 files.
//! - Group `engine_large_dir`: a directory already holding `n` entries (`n` = 10^3, 10^4,
//!   10^5); timed are 4096 lookups (`metadata`) of random existing names plus 4096 creates
//!   and unlinks of new names in it, to show that large directories stay fast.
//!
//! Subjects: `pmfs-extent`, `pmfs-radix`, `pmfs-cuckoo`, `pmfs-hashfs` (a volume on a pool file
//! mapped from `PMFS_BENCH_DIR`, default `/dev/shm`, so both sides live in DRAM; the
//! allocator `PMFS_BENCH_ALLOC`, default CFFS) and `tmpfs` (a directory under the same path
//! through `std::fs`). pmfs does every operation synchronously and durably (flush + fence);
//! tmpfs keeps nothing across a power failure.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pmfs::{MappingKind, Options, Volume};
use pmfs_benches::{MEASUREMENT, WARM_UP};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;

const TABLE3_SIZES: [usize; 6] = [512, 1024, 2048, 4096, 8192, 16384];
const OP_FILES: usize = 4096;
const SAMPLES: usize = 10;

fn bench_dir() -> PathBuf {
    std::env::var_os("PMFS_BENCH_DIR").map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from)
}

/// One system under test: a pmfs volume or a tmpfs directory.
enum Subject {
    Pmfs { vol: Volume, pool: PathBuf },
    Tmpfs { dir: PathBuf },
}

impl Subject {
    fn pmfs(kind: MappingKind) -> Subject {
        let pool = bench_dir().join(format!(
            "pmfs-engine-meta-{}-{kind:?}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&pool);
        let opts = Options {
            size: 512 << 20,
            inodes: Some(1 << 17),
            allocator: pmfs_benches::data::allocator(),
            ..Options::with_mapping(kind)
        };
        let vol = Volume::create(&pool, &opts).expect("create the bench volume");
        vol.create_dir("/bench").unwrap();
        Subject::Pmfs { vol, pool }
    }

    fn tmpfs() -> Subject {
        let dir = bench_dir().join(format!("pmfs-engine-meta-{}-tmpfs", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Subject::Tmpfs { dir }
    }

    fn name(&self) -> String {
        match self {
            Subject::Pmfs { vol, .. } => format!("pmfs-{:?}", vol.mapping()).to_lowercase(),
            Subject::Tmpfs { .. } => "tmpfs".into(),
        }
    }

    /// The paths of `n` files named `prefix<i>`.
    fn paths(&self, prefix: &str, n: usize) -> Vec<String> {
        let base = match self {
            Subject::Pmfs { .. } => "/bench".to_owned(),
            Subject::Tmpfs { dir } => dir.to_str().unwrap().to_owned(),
        };
        (0..n).map(|i| format!("{base}/{prefix}{i}")).collect()
    }

    fn create(&self, p: &str) {
        match self {
            Subject::Pmfs { vol, .. } => drop(vol.create_file(p).unwrap()),
            Subject::Tmpfs { .. } => drop(std::fs::File::create(p).unwrap()),
        }
    }

    fn unlink(&self, p: &str) {
        match self {
            Subject::Pmfs { vol, .. } => vol.remove_file(p).unwrap(),
            Subject::Tmpfs { .. } => std::fs::remove_file(p).unwrap(),
        }
    }

    fn stat(&self, p: &str) -> u64 {
        match self {
            Subject::Pmfs { vol, .. } => vol.metadata(p).unwrap().len(),
            Subject::Tmpfs { .. } => std::fs::metadata(p).unwrap().len(),
        }
    }

    fn rename(&self, from: &str, to: &str) {
        match self {
            Subject::Pmfs { vol, .. } => vol.rename(from, to).unwrap(),
            Subject::Tmpfs { .. } => std::fs::rename(from, to).unwrap(),
        }
    }
}

impl Drop for Subject {
    fn drop(&mut self) {
        match self {
            Subject::Pmfs { pool, .. } => {
                let _ = std::fs::remove_file(pool);
            }
            Subject::Tmpfs { dir } => {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

fn subjects() -> Vec<Subject> {
    let mut s: Vec<Subject> = [
        MappingKind::Extent,
        MappingKind::Radix,
        MappingKind::Cuckoo,
        MappingKind::HashFs,
    ]
    .into_iter()
    .map(Subject::pmfs)
    .collect();
    s.push(Subject::tmpfs());
    s
}

fn table3(c: &mut Criterion) {
    let subjects = subjects();
    let mut g = c.benchmark_group("cffs_table3_create_unlink");
    g.warm_up_time(WARM_UP)
        .measurement_time(MEASUREMENT)
        .sample_size(SAMPLES);
    let mut rng = SmallRng::seed_from_u64(3);
    for x in TABLE3_SIZES {
        g.throughput(Throughput::Elements(2 * x as u64));
        for s in &subjects {
            let paths = s.paths("f", x);
            let mut order = paths.clone();
            order.shuffle(&mut rng);
            g.bench_with_input(BenchmarkId::new(s.name(), x), &x, |b, _| {
                b.iter(|| {
                    for p in &paths {
                        s.create(p);
                    }
                    for p in &order {
                        s.unlink(p);
                    }
                });
            });
        }
    }
    g.finish();
}

/// The file paths of an operation and the second names (rename targets).
struct Names {
    paths: Vec<String>,
    targets: Vec<String>,
}

/// Times `op` over `OP_FILES` files; `setup` and `teardown` run untimed around it.
fn per_op(
    c: &mut Criterion,
    group: &str,
    setup: impl Fn(&Subject, &Names),
    op: impl Fn(&Subject, &Names),
    teardown: impl Fn(&Subject, &Names),
) {
    let subjects = subjects();
    let mut g = c.benchmark_group(group);
    g.warm_up_time(WARM_UP)
        .measurement_time(MEASUREMENT)
        .sample_size(SAMPLES)
        .throughput(Throughput::Elements(OP_FILES as u64));
    for s in &subjects {
        let names = Names {
            paths: s.paths("f", OP_FILES),
            targets: s.paths("g", OP_FILES),
        };
        g.bench_function(BenchmarkId::new(s.name(), OP_FILES), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    setup(s, &names);
                    let t = Instant::now();
                    op(s, &names);
                    total += t.elapsed();
                    teardown(s, &names);
                }
                total
            });
        });
    }
    g.finish();
}

fn create_all(s: &Subject, n: &Names) {
    for p in &n.paths {
        s.create(p);
    }
}

fn unlink_all(s: &Subject, n: &Names) {
    for p in &n.paths {
        s.unlink(p);
    }
}

fn table2(c: &mut Criterion) {
    per_op(c, "cffs_table2_create", |_, _| {}, create_all, unlink_all);
}

fn stat(c: &mut Criterion) {
    per_op(
        c,
        "engine_stat",
        create_all,
        |s, n| {
            for p in &n.paths {
                black_box(s.stat(p));
            }
        },
        unlink_all,
    );
}

fn unlink(c: &mut Criterion) {
    per_op(c, "engine_unlink", create_all, unlink_all, |_, _| {});
}

fn rename(c: &mut Criterion) {
    per_op(
        c,
        "engine_rename",
        create_all,
        |s, n| {
            for (p, t) in n.paths.iter().zip(&n.targets) {
                s.rename(p, t);
            }
        },
        |s, n| {
            for t in &n.targets {
                s.unlink(t);
            }
        },
    );
}

fn large_dir(c: &mut Criterion) {
    let subjects = [
        Subject::pmfs(MappingKind::Extent),
        Subject::pmfs(MappingKind::HashFs),
        Subject::tmpfs(),
    ];
    let mut g = c.benchmark_group("engine_large_dir");
    g.warm_up_time(WARM_UP)
        .measurement_time(MEASUREMENT)
        .sample_size(SAMPLES)
        .throughput(Throughput::Elements(3 * OP_FILES as u64));
    let mut rng = SmallRng::seed_from_u64(5);
    let mut present = 0;
    for n in [1_000usize, 10_000, 100_000] {
        for s in &subjects {
            let existing = s.paths("big", n);
            for p in &existing[present.min(n)..] {
                s.create(p);
            }
            let probes: Vec<String> = (0..OP_FILES)
                .map(|i| existing[(i * 7919 + n / 3) % n].clone())
                .collect();
            let mut fresh = s.paths("new", OP_FILES);
            fresh.shuffle(&mut rng);
            g.bench_with_input(BenchmarkId::new(s.name(), n), &n, |b, _| {
                b.iter(|| {
                    for p in &probes {
                        black_box(s.stat(p));
                    }
                    for p in &fresh {
                        s.create(p);
                    }
                    for p in &fresh {
                        s.unlink(p);
                    }
                });
            });
        }
        present = n;
    }
    g.finish();
}

criterion_group!(engine_meta, table3, table2, stat, unlink, rename, large_dir);
criterion_main!(engine_meta);
