//! Harness of the data-path benches (`data_fig6`, `data_fig8`), which reproduce the shape of
//! Figures 6 and 8 of the MadFS paper (FAST'23, §5.1–5.2) through the pmfs embedding API.
//!
//! Every bench runs the same operations on every [`Subject`]: one pmfs volume per mapping
//! structure on a pool file under [`bench_dir`] (default `/dev/shm`), whose files are read and
//! written with [`pmfs::File::read_at`] / [`pmfs::File::write_at`], and a tmpfs directory under
//! the same path, whose files are read and written with `pread`/`pwrite`
//! ([`std::os::unix::fs::FileExt`]). Both sides therefore live in DRAM; pmfs makes every
//! write atomic and durable before it returns, tmpfs neither.
//!
//! Knobs (environment variables, read once per call of [`Timing::from_env`], [`allocator`]
//! or [`Subject::all`]):
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `PMFS_BENCH_DIR` | `/dev/shm` | where pools and tmpfs files live |
//! | `PMFS_BENCH_WARMUP_MS` | 300 | criterion warm-up per benchmark |
//! | `PMFS_BENCH_MEASURE_MS` | 1000 | criterion measurement time per benchmark |
//! | `PMFS_BENCH_SAMPLES` | 20 | criterion samples per benchmark (at least 10) |
//! | `PMFS_BENCH_ALLOC` | `cffs` | block allocator of the pmfs volumes (`simple`, `baseline`, `cffs`) |
//! | `PMFS_BENCH_FIG8_MIB` | 256 | size of the file `data_fig8` shares between its threads |
//! | `PMFS_BENCH_ROTATE` | 0 | subjects move this many places forward in the run order (4: tmpfs first) |

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use pmfs::{AllocatorKind, MappingKind, OpenOptions, Options, Volume};
use rand::Rng;

/// The four mapping structures, in the order the benches run them.
pub const MAPPINGS: [MappingKind; 4] = [
    MappingKind::Extent,
    MappingKind::Radix,
    MappingKind::Cuckoo,
    MappingKind::HashFs,
];

/// Size of a file-system block.
pub const BLOCK: u64 = pmfs_core::layout::BLOCK_SIZE;

/// Where pools and tmpfs files live: `$PMFS_BENCH_DIR`, else `/dev/shm`.
pub fn bench_dir() -> PathBuf {
    std::env::var_os("PMFS_BENCH_DIR").map_or_else(|| PathBuf::from("/dev/shm"), PathBuf::from)
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Criterion settings of the data-path benches, tunable from the environment (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Warm-up time per benchmark.
    pub warm_up: Duration,
    /// Measurement time per benchmark.
    pub measurement: Duration,
    /// Samples per benchmark.
    pub samples: usize,
}

impl Timing {
    /// The settings from `PMFS_BENCH_WARMUP_MS`, `PMFS_BENCH_MEASURE_MS` and
    /// `PMFS_BENCH_SAMPLES`, with the defaults of the module docs.
    pub fn from_env() -> Timing {
        Timing {
            warm_up: Duration::from_millis(env_u64("PMFS_BENCH_WARMUP_MS", 300).max(1)),
            measurement: Duration::from_millis(env_u64("PMFS_BENCH_MEASURE_MS", 1000).max(1)),
            samples: env_u64("PMFS_BENCH_SAMPLES", 20).max(10) as usize,
        }
    }
}

/// The block allocator of the benches' pmfs volumes (`$PMFS_BENCH_ALLOC`, default CFFS, the
/// default of `pmfs mkfs`).
pub fn allocator() -> AllocatorKind {
    match std::env::var("PMFS_BENCH_ALLOC").as_deref() {
        Ok("simple") => AllocatorKind::Simple,
        Ok("baseline") => AllocatorKind::Baseline,
        _ => AllocatorKind::Cffs,
    }
}

/// One system under test: a pmfs volume on a pool file, or a tmpfs directory. Dropping it
/// removes the pool or the directory.
#[derive(Debug)]
pub enum Subject {
    /// A pmfs volume and the pool file it lives in.
    Pmfs {
        /// The volume.
        vol: Volume,
        /// Its pool file.
        pool: PathBuf,
    },
    /// A directory on tmpfs.
    Tmpfs {
        /// The directory.
        dir: PathBuf,
    },
}

impl Subject {
    /// A fresh pmfs volume of `size` bytes with mapping `kind`; `tag` names the pool file.
    pub fn pmfs(kind: MappingKind, size: u64, tag: &str) -> Subject {
        let pool = bench_dir().join(format!("pmfs-{tag}-{}-{kind:?}.pool", std::process::id()));
        let _ = fs::remove_file(&pool);
        let opts = Options {
            size,
            inodes: Some(1024),
            allocator: allocator(),
            ..Options::with_mapping(kind)
        };
        let vol = Volume::create(&pool, &opts).expect("create the bench volume");
        Subject::Pmfs { vol, pool }
    }

    /// A fresh tmpfs directory; `tag` names it.
    pub fn tmpfs(tag: &str) -> Subject {
        let dir = bench_dir().join(format!("pmfs-{tag}-{}-tmpfs", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create the tmpfs bench directory");
        Subject::Tmpfs { dir }
    }

    /// The subjects of one run: a pmfs volume of `size` bytes per mapping structure, then
    /// tmpfs; with `PMFS_BENCH_ROTATE=k`, the list rotated left by `k`, so that a comparison
    /// can be checked for a bias of the order in which criterion measures the subjects (each
    /// group measures them one after another, always in this order).
    pub fn all(size: u64, tag: &str) -> Vec<Subject> {
        let mut s: Vec<Subject> = MAPPINGS
            .into_iter()
            .map(|k| Subject::pmfs(k, size, tag))
            .collect();
        s.push(Subject::tmpfs(tag));
        let by = env_u64("PMFS_BENCH_ROTATE", 0) % s.len() as u64;
        s.rotate_left(by as usize);
        s
    }

    /// The benchmark function name: `pmfs-<mapping>` or `tmpfs`.
    pub fn name(&self) -> String {
        match self {
            Subject::Pmfs { vol, .. } => format!("pmfs-{:?}", vol.mapping()).to_lowercase(),
            Subject::Tmpfs { .. } => "tmpfs".into(),
        }
    }

    /// Creates (or truncates) the file `name`, open for reading and writing.
    pub fn file(&self, name: &str) -> DataFile {
        match self {
            Subject::Pmfs { vol, .. } => DataFile::Pmfs(
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(vol, &format!("/{name}"))
                    .expect("create a pmfs bench file"),
            ),
            Subject::Tmpfs { dir } => DataFile::Tmpfs(
                fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(dir.join(name))
                    .expect("create a tmpfs bench file"),
            ),
        }
    }
}

impl Drop for Subject {
    fn drop(&mut self) {
        match self {
            Subject::Pmfs { pool, .. } => {
                let _ = fs::remove_file(pool);
            }
            Subject::Tmpfs { dir } => {
                let _ = fs::remove_dir_all(dir);
            }
        }
    }
}

/// An open file of a [`Subject`]. Operations panic on errors: a bench that cannot do its
/// I/O has nothing to measure.
#[derive(Debug)]
pub enum DataFile {
    /// A pmfs file (`read_at`/`write_at` of the embedding API).
    Pmfs(pmfs::File),
    /// A tmpfs file (`pread`/`pwrite`).
    Tmpfs(fs::File),
}

impl DataFile {
    /// Reads `buf.len()` bytes at `off`; returns how many were read.
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> usize {
        match self {
            DataFile::Pmfs(f) => f.read_at(buf, off).expect("pmfs read_at"),
            DataFile::Tmpfs(f) => f.read_at(buf, off).expect("pread"),
        }
    }

    /// Writes all of `buf` at `off`.
    pub fn write_at(&self, buf: &[u8], off: u64) {
        match self {
            DataFile::Pmfs(f) => f.write_all_at(buf, off).expect("pmfs write_at"),
            DataFile::Tmpfs(f) => f.write_all_at(buf, off).expect("pwrite"),
        }
    }

    /// Truncates or extends the file to `len` bytes.
    pub fn set_len(&self, len: u64) {
        match self {
            DataFile::Pmfs(f) => f.set_len(len).expect("pmfs set_len"),
            DataFile::Tmpfs(f) => f.set_len(len).expect("ftruncate"),
        }
    }

    /// Writes `len` bytes from offset 0 in 1 MiB writes, so every block of the file is
    /// allocated: byte `i` of each MiB is `i % 251 + 1`.
    pub fn fill(&self, len: u64) {
        let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251 + 1) as u8).collect();
        let mut off = 0;
        while off < len {
            let n = (len - off).min(chunk.len() as u64) as usize;
            self.write_at(&chunk[..n], off);
            off += n as u64;
        }
    }
}

/// A Zipfian distribution over `0..n` with skew `theta` (rank 0 most likely), drawn with the
/// constant-time method of Gray et al. ("Quickly generating billion-record synthetic
/// databases", SIGMOD'94) that YCSB uses. Ranks are not scrambled, so the hot items are the
/// first blocks of the file, as in MadFS's Zipfian experiments.
#[derive(Clone, Debug)]
pub struct Zipf {
    n: u64,
    theta: f64,
    alpha: f64,
    zeta_n: f64,
    eta: f64,
}

impl Zipf {
    /// The distribution over `0..n` (`n` ≥ 2) with skew `theta` in `(0, 1)`.
    pub fn new(n: u64, theta: f64) -> Zipf {
        assert!(n >= 2, "a Zipfian distribution needs at least two items");
        assert!(theta > 0.0 && theta < 1.0, "theta must lie in (0, 1)");
        let zeta = |k: u64| (1..=k).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zeta_n = zeta(n);
        let zeta_2 = zeta(2);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta_2 / zeta_n);
        Zipf {
            n,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta_n,
            eta,
        }
    }

    /// Draws one rank.
    pub fn sample(&self, rng: &mut impl Rng) -> u64 {
        let u: f64 = rng.r#gen();
        let uz = u * self.zeta_n;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }
}

/// How offsets are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pattern {
    /// Consecutive `size`-byte slots from offset 0, wrapping at the end of the file.
    Sequential,
    /// `size`-aligned slots drawn uniformly.
    Uniform,
    /// `size`-aligned slots drawn from a Zipfian distribution with this skew.
    Zipfian(f64),
}

/// `count` offsets of `size`-byte accesses in a file of `file_len` bytes (a multiple of
/// `size`), drawn by `pattern` from `rng`.
pub fn offsets(
    pattern: Pattern,
    size: u64,
    file_len: u64,
    count: usize,
    rng: &mut impl Rng,
) -> Vec<u64> {
    let slots = (file_len / size).max(1);
    match pattern {
        Pattern::Sequential => (0..count as u64).map(|i| (i % slots) * size).collect(),
        Pattern::Uniform => (0..count).map(|_| rng.gen_range(0..slots) * size).collect(),
        Pattern::Zipfian(theta) => {
            let z = Zipf::new(slots.max(2), theta);
            (0..count)
                .map(|_| z.sample(rng).min(slots - 1) * size)
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    #[test]
    fn zipf_stays_in_range_and_favours_low_ranks() {
        let z = Zipf::new(1000, 0.9);
        let mut rng = SmallRng::seed_from_u64(1);
        let mut counts = vec![0u32; 1000];
        for _ in 0..100_000 {
            counts[z.sample(&mut rng) as usize] += 1;
        }
        assert!(counts[0] > counts[1] && counts[1] > counts[10] && counts[10] > counts[500]);
        // theta 0.9 over 1000 items puts 1 / zeta(1000) = 9.6% of the mass on rank 0.
        assert!((8_500..10_700).contains(&counts[0]), "{}", counts[0]);
        assert!(counts[900..].iter().any(|&c| c > 0));
    }

    #[test]
    fn offsets_are_aligned_and_inside_the_file() {
        let mut rng = SmallRng::seed_from_u64(2);
        let len = 64 * BLOCK;
        for p in [Pattern::Sequential, Pattern::Uniform, Pattern::Zipfian(0.9)] {
            let v = offsets(p, BLOCK, len, 500, &mut rng);
            assert_eq!(v.len(), 500);
            assert!(
                v.iter().all(|&o| o % BLOCK == 0 && o + BLOCK <= len),
                "{p:?}"
            );
        }
        let seq = offsets(Pattern::Sequential, 2 * BLOCK, len, 40, &mut rng);
        assert_eq!(seq[1], 2 * BLOCK);
        assert_eq!(seq[32], 0);
    }

    #[test]
    fn subjects_read_back_what_they_wrote_and_clean_up() {
        let dir = std::env::temp_dir().join(format!("pmfs-bench-data-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut pools = Vec::new();
        for s in [
            Subject::Pmfs {
                vol: Volume::create(
                    dir.join("p.pool"),
                    &Options {
                        size: 32 << 20,
                        inodes: Some(64),
                        allocator: allocator(),
                        ..Options::with_mapping(MappingKind::HashFs)
                    },
                )
                .unwrap(),
                pool: dir.join("p.pool"),
            },
            Subject::Tmpfs { dir: dir.join("t") },
        ] {
            if let Subject::Tmpfs { dir } = &s {
                fs::create_dir_all(dir).unwrap();
            }
            let f = s.file("x");
            f.fill(3 << 20);
            let mut buf = vec![0u8; 4096];
            assert_eq!(f.read_at(&mut buf, (2 << 20) + 10), 4096);
            assert_eq!(buf[0], 11);
            f.write_at(b"abc", 5);
            f.set_len(8);
            let mut small = [0u8; 16];
            assert_eq!(f.read_at(&mut small, 0), 8);
            assert_eq!(&small[5..8], b"abc");
            pools.push(match &s {
                Subject::Pmfs { pool, .. } => pool.clone(),
                Subject::Tmpfs { dir } => dir.clone(),
            });
            assert_eq!(
                s.name(),
                if pools.len() == 1 {
                    "pmfs-hashfs"
                } else {
                    "tmpfs"
                }
            );
        }
        assert!(pools.iter().all(|p| !p.exists()));
        fs::remove_dir_all(&dir).unwrap();
    }
}
