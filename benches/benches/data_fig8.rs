//! Concurrent mixed 4 KiB reads and writes on one file through the pmfs embedding API, next to
//! tmpfs through `pread`/`pwrite` in the same run. Reproduces the shape of **Figure 8** (and
//! the Zipfian offsets of Figure 9) of the MadFS paper (FAST'23, §5.2).
//!
//! A file of 256 MiB (`PMFS_BENCH_FIG8_MIB`) is filled once per subject. Then 1 and 2 threads
//! share one open handle and issue block-aligned 4 KiB operations, each a read or a write with
//! probability ½, at offsets drawn
//!
//! - `fig8_mixed_uniform`: uniformly over the file;
//! - `fig8_mixed_zipf`: from a Zipfian distribution with θ = 0.9 (rank 0 = block 0, so the
//!   hot blocks are the first ones and threads collide often).
//!
//! One iteration is 512 operations split evenly over the threads (throughput in bytes moved);
//! the threads are started before and joined after each sample, only the operations between
//! a start barrier and the join are timed. Offsets and the read/write choices are drawn before
//! timing. Subjects: `pmfs-extent`, `pmfs-radix`, `pmfs-cuckoo`, `pmfs-hashfs` (a volume on a
//! pool file in `PMFS_BENCH_DIR`, default `/dev/shm`) and `tmpfs`. Criterion settings come
//! from the environment (see `pmfs_benches::data`). The machine's cores are shared by
//! whatever else runs, so 2-thread numbers are only as good as the machine is idle.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pmfs_benches::data::{BLOCK, DataFile, Pattern, Subject, Timing, offsets};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const THREADS: [usize; 2] = [1, 2];
/// Operations per iteration, split evenly over the threads.
const OPS_PER_ITER: u64 = 512;
/// Operations drawn per thread (cycled).
const DRAWN: usize = 1 << 15;
const THETA: f64 = 0.9;

/// One operation: a read or a write of one block at `off`.
#[derive(Clone, Copy)]
struct Op {
    off: u64,
    write: bool,
}

fn file_len() -> u64 {
    std::env::var("PMFS_BENCH_FIG8_MIB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(256)
        .max(1)
        << 20
}

/// Per-thread operation lists for `threads` threads.
fn draw(pattern: Pattern, len: u64, threads: usize, seed: u64) -> Vec<Vec<Op>> {
    (0..threads)
        .map(|t| {
            let mut rng = SmallRng::seed_from_u64(seed * 16 + t as u64);
            offsets(pattern, BLOCK, len, DRAWN, &mut rng)
                .into_iter()
                .map(|off| Op {
                    off,
                    write: rng.gen_bool(0.5),
                })
                .collect()
        })
        .collect()
}

/// Runs `per_thread` operations on each thread (thread `t` from its list `ops[t]`, starting
/// at `start`) and returns the time from the start barrier to the last join.
fn run(file: &DataFile, ops: &[Vec<Op>], start: usize, per_thread: u64) -> Duration {
    let gate = Barrier::new(ops.len() + 1);
    std::thread::scope(|s| {
        for list in ops {
            let gate = &gate;
            s.spawn(move || {
                let mut rbuf = vec![0u8; BLOCK as usize];
                let wbuf = vec![0xa5u8; BLOCK as usize];
                gate.wait();
                for i in 0..per_thread as usize {
                    let op = list[(start + i) % list.len()];
                    if op.write {
                        file.write_at(&wbuf, op.off);
                    } else {
                        std::hint::black_box(file.read_at(&mut rbuf, op.off));
                    }
                }
            });
        }
        gate.wait();
        // The scope joins every thread before returning this instant.
        Instant::now()
    })
    .elapsed()
}

fn mixed(
    c: &mut Criterion,
    subjects: &[(Subject, DataFile)],
    len: u64,
    name: &str,
    pattern: Pattern,
) {
    let t = Timing::from_env();
    let mut g = c.benchmark_group(name);
    g.warm_up_time(t.warm_up)
        .measurement_time(t.measurement)
        .sample_size(t.samples)
        .throughput(Throughput::Bytes(OPS_PER_ITER * BLOCK));
    for threads in THREADS {
        let ops = draw(pattern, len, threads, threads as u64);
        let per_iter = OPS_PER_ITER / threads as u64;
        for (subject, file) in subjects {
            let mut start = 0;
            g.bench_function(
                BenchmarkId::new(subject.name(), format!("threads={threads}")),
                |b| {
                    b.iter_custom(|iters| {
                        let n = iters * per_iter;
                        let d = run(file, &ops, start, n);
                        start = (start + n as usize) % DRAWN;
                        d
                    })
                },
            );
        }
    }
    g.finish();
}

fn fig8(c: &mut Criterion) {
    let len = file_len();
    let subjects: Vec<(Subject, DataFile)> = Subject::all(2 * len + (64 << 20), "fig8")
        .into_iter()
        .map(|s| {
            let f = s.file("shared");
            f.fill(len);
            (s, f)
        })
        .collect();
    mixed(c, &subjects, len, "fig8_mixed_uniform", Pattern::Uniform);
    mixed(
        c,
        &subjects,
        len,
        "fig8_mixed_zipf",
        Pattern::Zipfian(THETA),
    );
}

criterion_group!(data_fig8, fig8);
criterion_main!(data_fig8);
