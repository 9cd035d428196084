//! Persistence primitives: the cost of making bytes durable on a mapped pool.
//!
//! Not a paper figure but the floor under all of them: FLEX (ASPLOS'19) moves the data path to
//! non-temporal stores plus `sfence` instead of `msync`, and every pmfs write ends in such a
//! copy or in an 8-byte store + persist. The goal: our non-temporal copy within 5% of
//! libpmem's `pmem_memcpy_persist` from 4 KiB up, measured in the same run.
//!
//! Pools are files under `/dev/shm` (tmpfs: no `MAP_SYNC`, so the stores land in DRAM; the
//! instruction costs are those of real PM minus the media's write latency). Destinations walk
//! through a 64 MiB pool so that no copy finds its lines already cached; the source is a
//! line-aligned DRAM buffer.
//!
//! - `persist_copy/{ours,libpmem,memcpy+msync}/SIZE`: copy SIZE bytes and make them durable:
//!   ours is `PmRegion::write_persist` (run-time dispatched streaming copy + `sfence`), libpmem
//!   is `pmem_memcpy_persist` on a `pmem_map_file`d pool (feature `libpmem`), the baseline is
//!   a cached copy followed by `msync(MS_SYNC)` of its pages (on tmpfs msync has nothing to
//!   write back, so this is its floor: the system call and the page walk). Throughput is
//!   bytes.
//! - `persist_copy_kernel/{avx512,avx2,sse2}/SIZE`: our copy forced onto each streaming-store
//!   kind the CPU has.
//! - `persist_u64/{ours,libpmem}/{store,cas}`: an 8-byte store (or CAS) followed by flush and
//!   fence of its line.
//!
//! Every sample is timed with the benchmark thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`),
//! not the wall clock: on the shared 2-core machines this project runs on, a wall-clock sample
//! of a few milliseconds mostly measures how long other processes held the CPU. CPU time still
//! includes every stall on memory, which is what these primitives cost.
//!
//! Run: `cargo bench -p pmfs-benches --features libpmem --bench persist`.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{Bencher, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::persist::{self, CopyKind, DispatchPath};
use pmfs_core::pm::{Backend, Media, PmRegion};

const SIZES: [usize; 8] = [
    64,
    256,
    1 << 10,
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
];
const KERNEL_SIZES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
const POOL: u64 = 64 << 20;
/// Measurement time of the small groups (per-kernel copies, 8-byte persists), which keeps the
/// whole suite near two minutes on an idle machine.
const DIAGNOSTIC_MEASUREMENT: Duration = Duration::from_secs(1);
const LINE: u64 = 64;

/// A pool file under /dev/shm mapped with `backend`, removed on drop.
struct Pool {
    region: Option<PmRegion>,
    path: PathBuf,
}

impl Pool {
    fn new(name: &str, backend: Backend) -> Self {
        let path = PathBuf::from(format!(
            "/dev/shm/pmfs-bench-persist-{}-{name}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let region = PmRegion::create_with(&path, POOL, backend)
            .unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        // Fault every page in now, so that no sample pays for populating the page tables.
        region.fill_nt(PmOff(0), POOL, 0).unwrap();
        region.fence();
        Self {
            region: Some(region),
            path,
        }
    }

    fn region(&self) -> &PmRegion {
        self.region.as_ref().expect("present until drop")
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.region = None;
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Destination offsets that walk through the pool in steps of `len` rounded up to a line.
struct Walk {
    next: u64,
    step: u64,
    end: u64,
}

impl Walk {
    fn new(len: usize) -> Self {
        let step = (len as u64).next_multiple_of(LINE);
        Self {
            next: 0,
            step,
            end: POOL - step,
        }
    }

    fn next(&mut self) -> PmOff {
        let off = self.next;
        self.next += self.step;
        if self.next > self.end {
            self.next = 0;
        }
        PmOff(off)
    }
}

/// The calling thread's CPU time.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a Linux constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `op` as criterion asks, timing it with the thread's CPU clock.
fn cpu_timed(b: &mut Bencher<'_>, mut op: impl FnMut()) {
    b.iter_custom(|iters| {
        let start = thread_cpu_time();
        for _ in 0..iters {
            op();
        }
        thread_cpu_time() - start
    });
}

/// A line-aligned source buffer of 1 MiB with non-trivial bytes.
fn source(buf: &mut Vec<u8>) -> &[u8] {
    *buf = (0..(1 << 20) + LINE as usize)
        .map(|i| (i * 7 + 1) as u8)
        .collect();
    let start = buf.as_ptr().align_offset(LINE as usize);
    &buf[start..start + (1 << 20)]
}

fn persist_copy(c: &mut Criterion) {
    let mut buf = Vec::new();
    let src = source(&mut buf);
    let ours = Pool::new("ours", Backend::Mmap);
    let msync = Pool::new("msync", Backend::Mmap);
    #[cfg(feature = "libpmem")]
    let libpmem = Pool::new("libpmem", Backend::Libpmem);

    let mut g = c.benchmark_group("persist_copy");
    for len in SIZES {
        g.throughput(Throughput::Bytes(len as u64));
        let src = &src[..len];
        g.bench_with_input(BenchmarkId::new("ours", len), &len, |b, _| {
            let (r, mut w) = (ours.region(), Walk::new(len));
            cpu_timed(b, || r.write_persist(w.next(), black_box(src)).unwrap());
        });
        #[cfg(feature = "libpmem")]
        g.bench_with_input(BenchmarkId::new("libpmem", len), &len, |b, _| {
            let (r, mut w) = (libpmem.region(), Walk::new(len));
            cpu_timed(b, || r.write_persist(w.next(), black_box(src)).unwrap());
        });
        g.bench_with_input(BenchmarkId::new("memcpy+msync", len), &len, |b, _| {
            let (r, mut w) = (msync.region(), Walk::new(len));
            cpu_timed(b, || {
                let off = w.next();
                r.write(off, black_box(src)).unwrap();
                r.msync(off, len as u64).unwrap();
            });
        });
    }
    g.finish();
}

fn persist_copy_kernel(c: &mut Criterion) {
    let mut buf = Vec::new();
    let src = source(&mut buf);
    let pool = Pool::new("kernel", Backend::Mmap);
    let flush = persist::detected_path().flush;
    let mut g = c.benchmark_group("persist_copy_kernel");
    g.measurement_time(DIAGNOSTIC_MEASUREMENT);
    for copy in CopyKind::ALL {
        let path = DispatchPath { flush, copy };
        if copy == CopyKind::Portable || !path.is_available() {
            continue;
        }
        for len in KERNEL_SIZES {
            g.throughput(Throughput::Bytes(len as u64));
            let src = &src[..len];
            g.bench_with_input(BenchmarkId::new(copy.name(), len), &len, |b, _| {
                let (r, mut w) = (pool.region(), Walk::new(len));
                persist::with_path(path, || {
                    cpu_timed(b, || r.write_persist(w.next(), black_box(src)).unwrap())
                })
                .unwrap();
            });
        }
    }
    g.finish();
}

fn persist_u64(c: &mut Criterion) {
    let pools = [
        ("ours", Backend::Mmap),
        #[cfg(feature = "libpmem")]
        ("libpmem", Backend::Libpmem),
    ]
    .map(|(name, backend)| (name, Pool::new(&format!("u64-{name}"), backend)));
    let mut g = c.benchmark_group("persist_u64");
    g.measurement_time(DIAGNOSTIC_MEASUREMENT);
    for (name, pool) in &pools {
        let r = pool.region();
        g.bench_function(BenchmarkId::new(*name, "store"), |b| {
            let (mut w, mut v) = (Walk::new(LINE as usize), 0u64);
            cpu_timed(b, || {
                v += 1;
                r.store_u64_persist(w.next(), black_box(v)).unwrap();
            });
        });
        g.bench_function(BenchmarkId::new(*name, "cas"), |b| {
            let mut w = Walk::new(LINE as usize);
            cpu_timed(b, || {
                let off = w.next();
                let cur = r.load_u64(off).unwrap();
                r.cas_u64_persist(off, cur, black_box(cur + 1))
                    .unwrap()
                    .unwrap();
            });
        });
    }
    g.finish();
}

/// The suite's shared timing (criterion applies the command line on top).
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(pmfs_benches::WARM_UP)
        .measurement_time(pmfs_benches::MEASUREMENT)
        .sample_size(pmfs_benches::SAMPLE_SIZE)
}

criterion_group! {
    name = benches;
    config = config();
    targets = persist_copy, persist_copy_kernel, persist_u64
}
criterion_main!(benches);
