//! Single-threaded data-path throughput of the pmfs engine through its embedding API, next
//! to tmpfs through `pread`/`pwrite` in the same run. Reproduces the shape of **Figure 6** of
//! the MadFS paper (FAST'23, §5.1): six microbenchmarks over I/O sizes of 4 KiB to 1 MiB.
//!
//! - `fig6_read_seq`, `fig6_read_rand`: reads of `size` bytes at consecutive (wrapping) or
//!   uniformly drawn `size`-aligned offsets of a 64 MiB file.
//! - `fig6_overwrite_seq`, `fig6_overwrite_rand`: the same offsets, overwritten.
//! - `fig6_subblock_overwrite`: overwrites of 8 B … 2 KiB inside one block, at a uniformly
//!   drawn block and an unaligned offset inside it (never 0). Throughput in operations.
//! - `fig6_append`: `size`-byte writes at the end of a file; the file is truncated to 0,
//!   untimed, whenever it reaches 32 MiB, so it never grows without bound.
//! - `fig6_subblock_append` (not in the paper): the same with 8 B … 2 KiB, the writes of a
//!   log or a write-ahead log. Throughput in operations.
//! - A `memcpy` column in `fig6_read_seq`, `fig6_overwrite_seq` and `fig6_append`: the same
//!   sizes copied (`copy_from_slice`) from or into consecutive windows of a 64 MiB DRAM buffer,
//!   measured right after the subjects so that load on the machine hits both alike. The
//!   buffer is anonymous memory advised `MADV_HUGEPAGE`, as the pools are: in 4 KiB pages it
//!   would miss the TLB where a pool read does not, and flatter the subjects.
//! - Floors, the bare cost of each operation on this machine, measured right after the
//!   subjects too: in `fig6_read_rand`, `memcpy` copies
//!   from the same offsets of the DRAM buffer; in `fig6_overwrite_rand`, `durable-copy` is
//!   the least a durable copy-on-write write does on a pool (`floor_pool`, mapped like the
//!   volumes' pools): a streaming copy of the bytes to the same offsets and a fence, then one
//!   8-byte compare-and-swap (the commit), flushed and fenced. In `fig6_read_seq`,
//!   `memcpy-scattered` copies `size` bytes as 4 KiB pieces from unrelated blocks of the DRAM
//!   buffer: the floor of a file whose blocks lie apart, as HashFS tables of format version 1
//!   placed them; `memcpy-clusters` copies them as 32 KiB pieces from unrelated places, the
//!   floor of HashFS's clusters (eight blocks hashed as one onto consecutive slots). Both
//!   visit every piece of the buffer once per pass, in a random order, as the sequential
//!   read visits every block of its file once per pass. Both are plain copies; the engine's
//!   reads also hint the blocks ahead, and can come in slightly under them.
//! - `fig6_memcpy`: more 1 MiB bandwidth references, measured once at the end
//!   (`copy_from_slice`): `dram-read` from a 64 MiB DRAM buffer (at consecutive 1 MiB
//!   windows) into a 1 MiB buffer, `dram-write` the other way, and `shm-read` / `shm-write`
//!   the same with a 64 MiB file of the bench directory mapped in place of the big buffer.
//!
//! Subjects: `pmfs-extent`, `pmfs-radix`, `pmfs-cuckoo`, `pmfs-hashfs` (a volume on a pool
//! file in `PMFS_BENCH_DIR`, default `/dev/shm`) and `tmpfs` (a file in the same directory).
//! Every pmfs write is atomic and durable when it returns; tmpfs's are neither. Criterion
//! settings come from the environment (see `pmfs_benches::data`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Bencher;
use criterion::measurement::WallTime;
use criterion::{
    BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use memmap2::{Advice, MmapMut};
use pmfs_benches::data::{BLOCK, DataFile, Pattern, Subject, Timing, bench_dir, offsets};
use pmfs_core::layout::PmOff;
use pmfs_core::pm::{Media, PmRegion};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const SIZES: [u64; 5] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20];
const SUB_BLOCK_SIZES: [u64; 4] = [8, 100, 512, 2048];
/// Length of the file the reads and overwrites work on.
const FILE_LEN: u64 = 64 << 20;
/// The append file is truncated to 0 when it reaches this length.
const APPEND_CAP: u64 = 32 << 20;
/// Size of each pmfs pool: the data file, the append file and room for copy-on-write.
const POOL: u64 = 256 << 20;
/// Offsets drawn per benchmark (cycled).
const OFFSETS: usize = 1 << 14;
const MEMCPY: usize = 1 << 20;
/// The function name of the memcpy reference inside the sequential and append groups and
/// `fig6_read_rand`.
const MEMCPY_COLUMN: &str = "memcpy";
/// The function name of the floor of a durable write inside `fig6_overwrite_rand`.
const DURABLE_COLUMN: &str = "durable-copy";
/// The function name of the scattered-block copy inside `fig6_read_seq`.
const SCATTERED_COLUMN: &str = "memcpy-scattered";
/// The function name of the scattered-cluster copy inside `fig6_read_seq`.
const CLUSTERS_COLUMN: &str = "memcpy-clusters";
/// The bytes of a HashFS cluster: eight blocks.
const CLUSTER: u64 = 8 * BLOCK;
/// Where the `durable-copy` floor puts its commit word: past the data of [`FILE_LEN`].
const COMMIT_WORD: PmOff = PmOff(FILE_LEN);

/// One subject with its files.
struct Rig {
    subject: Subject,
    data: DataFile,
    append: DataFile,
}

fn group<'a>(c: &'a mut Criterion, name: &str, t: Timing) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.warm_up_time(t.warm_up)
        .measurement_time(t.measurement)
        .sample_size(t.samples);
    g
}

fn payload(len: u64) -> Vec<u8> {
    (0..len).map(|i| (i % 253) as u8 ^ 0x5a).collect()
}

fn reads(
    c: &mut Criterion,
    rigs: &[Rig],
    dram: &mut [u8],
    t: Timing,
    name: &str,
    pattern: Pattern,
) {
    let mut g = group(c, name, t);
    let mut rng = SmallRng::seed_from_u64(6);
    for size in SIZES {
        g.throughput(Throughput::Bytes(size));
        let offs = offsets(pattern, size, FILE_LEN, OFFSETS, &mut rng);
        let mut buf = vec![0u8; size as usize];
        for r in rigs {
            let mut i = 0;
            g.bench_function(BenchmarkId::new(r.subject.name(), size), |b| {
                b.iter(|| {
                    let n = r.data.read_at(&mut buf, offs[i % OFFSETS]);
                    i += 1;
                    black_box(&buf);
                    n
                })
            });
        }
        match pattern {
            Pattern::Sequential => {
                g.bench_function(BenchmarkId::new(MEMCPY_COLUMN, size), |b| {
                    copy_windows(b, dram, &mut buf, false)
                });
                for (column, piece) in [(SCATTERED_COLUMN, BLOCK), (CLUSTERS_COLUMN, CLUSTER)] {
                    if size > piece {
                        let at = shuffled_pieces(piece, &mut rng);
                        g.bench_function(BenchmarkId::new(column, size), |b| {
                            copy_scattered(b, dram, &mut buf, &at, piece as usize)
                        });
                    }
                }
            }
            _ => {
                let mut i = 0;
                g.bench_function(BenchmarkId::new(MEMCPY_COLUMN, size), |b| {
                    b.iter(|| {
                        let at = offs[i % OFFSETS] as usize;
                        i += 1;
                        buf.copy_from_slice(black_box(&dram[at..at + size as usize]));
                        black_box(&buf);
                    })
                });
            }
        }
    }
    g.finish();
}

/// The offsets of the `piece`-byte pieces of a [`FILE_LEN`] buffer, each once, in random
/// order. A floor of a sequential read copies them in this order (cycled), so that, like the
/// read, it meets every byte of the buffer once per pass and finds none of it left in the
/// last-level cache (smaller than the buffer). Offsets drawn independently revisit some
/// pieces while they are still cached and made the floor 5–10% lower (1 MiB in 32 KiB and
/// in 4 KiB pieces from a 64 MiB buffer, eight interleaved rounds of both orders in one
/// process: medians 9% and 4% lower).
fn shuffled_pieces(piece: u64, rng: &mut SmallRng) -> Vec<u64> {
    let mut at: Vec<u64> = (0..FILE_LEN / piece).map(|k| k * piece).collect();
    at.shuffle(rng);
    at
}

/// Fills `small` from `piece`-byte pieces of `big` at the offsets `starts` (cycled).
fn copy_scattered(b: &mut Bencher<'_>, big: &[u8], small: &mut [u8], starts: &[u64], piece: usize) {
    let mut i = 0;
    b.iter(|| {
        for piece in small.chunks_mut(piece) {
            let at = starts[i % starts.len()] as usize;
            i += 1;
            piece.copy_from_slice(black_box(&big[at..at + piece.len()]));
        }
        black_box(&*small);
    });
}

fn overwrites(
    c: &mut Criterion,
    rigs: &[Rig],
    dram: &mut [u8],
    floor: &PmRegion,
    t: Timing,
    name: &str,
    pattern: Pattern,
) {
    let mut g = group(c, name, t);
    let mut rng = SmallRng::seed_from_u64(7);
    for size in SIZES {
        g.throughput(Throughput::Bytes(size));
        let offs = offsets(pattern, size, FILE_LEN, OFFSETS, &mut rng);
        let mut buf = payload(size);
        for r in rigs {
            let mut i = 0;
            g.bench_function(BenchmarkId::new(r.subject.name(), size), |b| {
                b.iter(|| {
                    r.data.write_at(&buf, offs[i % OFFSETS]);
                    i += 1;
                })
            });
        }
        match pattern {
            Pattern::Sequential => {
                g.bench_function(BenchmarkId::new(MEMCPY_COLUMN, size), |b| {
                    copy_windows(b, dram, &mut buf, true)
                });
            }
            _ => {
                let mut i = 0;
                g.bench_function(BenchmarkId::new(DURABLE_COLUMN, size), |b| {
                    b.iter(|| {
                        durable_copy(floor, offs[i % OFFSETS], &buf, i as u64);
                        i += 1;
                    })
                });
            }
        }
    }
    g.finish();
}

/// The least a durable copy-on-write write of `data` does: streams it to `off` and fences
/// (the data is durable before it is committed), then swaps the commit word to `n + 1`,
/// flushes and fences it (the commit is durable before the call returns).
fn durable_copy(pool: &PmRegion, off: u64, data: &[u8], n: u64) {
    pool.write_persist(PmOff(off), black_box(data))
        .expect("stream into the floor pool");
    let seen = pool.load_u64(COMMIT_WORD).expect("load the commit word");
    pool.cas_u64_persist(COMMIT_WORD, seen, black_box(n.wrapping_add(1)))
        .expect("commit in the floor pool")
        .expect("only this thread swaps the commit word");
}

/// The pool of the `durable-copy` floor: a pool file of the bench directory mapped as the
/// volumes' pools are, faulted in. Removed when the benchmarks end.
fn floor_pool() -> (PmRegion, std::path::PathBuf) {
    let path = bench_dir().join(format!("pmfs-fig6-floor-{}.pool", std::process::id()));
    let len = FILE_LEN + (2 << 20);
    let pool = PmRegion::create(&path, len).expect("create the floor pool");
    pool.fill_nt(PmOff(0), len, 0)
        .expect("fault in the floor pool");
    pool.fence();
    (pool, path)
}

fn sub_block(c: &mut Criterion, rigs: &[Rig], t: Timing) {
    let mut g = group(c, "fig6_subblock_overwrite", t);
    g.throughput(Throughput::Elements(1));
    let mut rng = SmallRng::seed_from_u64(8);
    for size in SUB_BLOCK_SIZES {
        let offs: Vec<u64> = (0..OFFSETS)
            .map(|_| rng.gen_range(0..FILE_LEN / BLOCK) * BLOCK + rng.gen_range(1..=BLOCK - size))
            .collect();
        let buf = payload(size);
        for r in rigs {
            let mut i = 0;
            g.bench_function(BenchmarkId::new(r.subject.name(), size), |b| {
                b.iter(|| {
                    r.data.write_at(&buf, offs[i % OFFSETS]);
                    i += 1;
                })
            });
        }
    }
    g.finish();
}

/// `fig6_append` over [`SIZES`], with the memcpy column (`dram`); `fig6_subblock_append` over
/// [`SUB_BLOCK_SIZES`] without it (`dram` is `None`), in operations.
fn appends(c: &mut Criterion, rigs: &[Rig], mut dram: Option<&mut [u8]>, t: Timing) {
    let (name, sizes): (_, &[u64]) = match dram {
        Some(_) => ("fig6_append", &SIZES),
        None => ("fig6_subblock_append", &SUB_BLOCK_SIZES),
    };
    let mut g = group(c, name, t);
    for &size in sizes {
        g.throughput(match dram {
            Some(_) => Throughput::Bytes(size),
            None => Throughput::Elements(1),
        });
        let mut buf = payload(size);
        for r in rigs {
            g.bench_function(BenchmarkId::new(r.subject.name(), size), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    let mut done = 0;
                    while done < iters {
                        r.append.set_len(0);
                        let n = (iters - done).min(APPEND_CAP / size);
                        let start = Instant::now();
                        for k in 0..n {
                            r.append.write_at(&buf, k * size);
                        }
                        total += start.elapsed();
                        done += n;
                    }
                    total
                })
            });
        }
        if let Some(dram) = dram.as_deref_mut() {
            g.bench_function(BenchmarkId::new(MEMCPY_COLUMN, size), |b| {
                copy_windows(b, dram, &mut buf, true)
            });
        }
    }
    g.finish();
}

/// Copies `small.len()` bytes between `small` and consecutive windows of that size of `big`
/// (`into_big`: from `small` into `big`).
fn copy_windows(b: &mut Bencher<'_>, big: &mut [u8], small: &mut [u8], into_big: bool) {
    let len = small.len();
    let windows = big.len() / len;
    let mut i = 0;
    b.iter(|| {
        let w = &mut big[(i % windows) * len..][..len];
        i += 1;
        if into_big {
            w.copy_from_slice(black_box(&*small));
        } else {
            small.copy_from_slice(black_box(&*w));
        }
        black_box(&*small);
    });
}

fn memcpy(c: &mut Criterion, dram: &mut [u8], t: Timing) {
    let mut g = group(c, "fig6_memcpy", t);
    g.throughput(Throughput::Bytes(MEMCPY as u64));
    let mut small = payload(MEMCPY as u64);
    let path = bench_dir().join(format!("pmfs-fig6-memcpy-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("create the memcpy reference file");
    file.set_len(FILE_LEN)
        .expect("size the memcpy reference file");
    // SAFETY: the file was created by this process under a name no other process uses and
    // is removed below; nothing else resizes or writes it while the map lives.
    let mut shm = unsafe { MmapMut::map_mut(&file) }.expect("map the memcpy reference file");
    shm.copy_from_slice(dram);
    for (name, into_big) in [("dram-read", false), ("dram-write", true)] {
        g.bench_function(BenchmarkId::new(name, MEMCPY), |b| {
            copy_windows(b, dram, &mut small, into_big)
        });
    }
    for (name, into_big) in [("shm-read", false), ("shm-write", true)] {
        g.bench_function(BenchmarkId::new(name, MEMCPY), |b| {
            copy_windows(b, &mut shm, &mut small, into_big)
        });
    }
    g.finish();
    drop(shm);
    let _ = std::fs::remove_file(&path);
}

/// The DRAM buffer of the memcpy references (see the module docs), holding [`payload`].
fn dram_buffer() -> MmapMut {
    let mut m = MmapMut::map_anon(FILE_LEN as usize).expect("map the DRAM reference buffer");
    // Without transparent huge pages the buffer stays in 4 KiB pages; the copy still works.
    let _ = m.advise(Advice::HugePage);
    m.copy_from_slice(&payload(FILE_LEN));
    m
}

fn fig6(c: &mut Criterion) {
    let t = Timing::from_env();
    let rigs: Vec<Rig> = Subject::all(POOL, "fig6")
        .into_iter()
        .map(|subject| {
            let data = subject.file("data");
            data.fill(FILE_LEN);
            let append = subject.file("append");
            Rig {
                subject,
                data,
                append,
            }
        })
        .collect();
    let mut dram = dram_buffer();
    let d = &mut dram[..];
    reads(c, &rigs, d, t, "fig6_read_seq", Pattern::Sequential);
    reads(c, &rigs, d, t, "fig6_read_rand", Pattern::Uniform);
    let (floor, floor_path) = floor_pool();
    overwrites(
        c,
        &rigs,
        d,
        &floor,
        t,
        "fig6_overwrite_seq",
        Pattern::Sequential,
    );
    overwrites(
        c,
        &rigs,
        d,
        &floor,
        t,
        "fig6_overwrite_rand",
        Pattern::Uniform,
    );
    drop(floor);
    let _ = std::fs::remove_file(&floor_path);
    sub_block(c, &rigs, t);
    appends(c, &rigs, Some(&mut *d), t);
    appends(c, &rigs, None, t);
    drop(rigs);
    memcpy(c, d, t);
}

criterion_group!(data_fig6, fig6);
criterion_main!(data_fig6);
