//! The measured operations: single lookups and appends, cold or hot, and the concurrent
//! read-then-append loop of §4.6. Each `run` returns the time of `iters` operations, the shape
//! criterion's `iter_custom` wants; everything that is not the mapping operation (eviction,
//! shrinking a file that grew too much) stays outside the timed sections.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pmfs_core::Result;
use pmfs_core::traits::{Extent, FileMapping, Run};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::cold::{Evictor, OpTimer};
use super::structures::Structure;
use super::volume::Fixture;

/// Most blocks an append workload adds before the file is shrunk back (untimed) to its
/// starting size, so long runs do not exhaust the volume.
pub const APPEND_GROWTH_BLOCKS: u64 = 16 * 1024;

/// Random start blocks precomputed per workload, so that drawing one costs a hot load.
const RANDOM_POOL: usize = 1 << 16;

/// What the operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Looks up the blocks following the previous lookup (wrapping at the end of the file).
    SeqLookup,
    /// Looks up blocks at a uniformly random position.
    RandLookup,
    /// Maps fresh blocks at the end of the file, allocation included.
    Append,
}

/// Whether CPU caches are evicted before each operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// Evicted before every operation; each operation is timed alone.
    Cold,
    /// Operations run back to back; batches are timed.
    Hot,
}

/// One measured operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// What it does.
    pub kind: OpKind,
    /// Blocks per operation.
    pub io_blocks: u64,
    /// Cold or hot caches.
    pub cache: Cache,
}

impl Op {
    /// An operation on `io_blocks` blocks.
    pub fn new(cache: Cache, kind: OpKind, io_blocks: u64) -> Self {
        Self {
            kind,
            io_blocks,
            cache,
        }
    }
}

impl fmt::Display for Op {
    /// `cold-rand-lookup`, `hot-append`, ...
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cache = match self.cache {
            Cache::Cold => "cold",
            Cache::Hot => "hot",
        };
        let kind = match self.kind {
            OpKind::SeqLookup => "seq-lookup",
            OpKind::RandLookup => "rand-lookup",
            OpKind::Append => "append",
        };
        write!(f, "{cache}-{kind}")
    }
}

/// What a bench binary needs once: the evictor and the calibrated timer.
#[derive(Debug)]
pub struct Harness {
    /// Evicts caches between cold operations.
    pub evictor: Evictor,
    /// Times single operations.
    pub timer: OpTimer,
}

impl Harness {
    /// An evictor sized from the environment and a calibrated timer.
    pub fn from_env() -> Self {
        Self {
            evictor: Evictor::from_env(),
            timer: OpTimer::calibrate(),
        }
    }
}

/// The state of one operation's workload on one file, kept across criterion's calls.
#[derive(Debug)]
pub struct Workload {
    op: Op,
    file: usize,
    base_blocks: u64,
    cursor: u64,
    starts: Vec<u64>,
    next: usize,
    areas: Vec<Extent>,
    out: Vec<Run>,
}

impl Workload {
    /// A workload of `op` on file `file` of `fx`, its random positions drawn from `seed`.
    pub fn new<S: Structure>(fx: &Fixture<S>, file: usize, op: Op, seed: u64) -> Result<Self> {
        let base_blocks = fx.file(file).blocks;
        let mut rng = SmallRng::seed_from_u64(seed);
        let last_start = base_blocks.saturating_sub(op.io_blocks);
        let starts = (0..RANDOM_POOL)
            .map(|_| rng.gen_range(0..=last_start))
            .collect();
        let areas = match op.cache {
            Cache::Cold => fx.metadata_areas(file)?,
            Cache::Hot => Vec::new(),
        };
        Ok(Self {
            op,
            file,
            base_blocks,
            cursor: 0,
            starts,
            next: 0,
            areas,
            out: Vec::with_capacity(op.io_blocks as usize),
        })
    }

    /// The operation.
    pub fn op(&self) -> Op {
        self.op
    }

    /// Where the next lookup starts.
    fn next_start(&mut self) -> u64 {
        match self.op.kind {
            OpKind::RandLookup => {
                let s = self.starts[self.next];
                self.next = (self.next + 1) % self.starts.len();
                s
            }
            _ => {
                if self.cursor + self.op.io_blocks > self.base_blocks {
                    self.cursor = 0;
                }
                let s = self.cursor;
                self.cursor += self.op.io_blocks;
                s
            }
        }
    }

    /// Blocks appends may add before the file is shrunk back: about the file's own size, so
    /// a small file stays small, but at most [`APPEND_GROWTH_BLOCKS`] and at least 64
    /// operations' worth.
    fn growth_limit(&self) -> u64 {
        APPEND_GROWTH_BLOCKS
            .min(self.base_blocks.max(64))
            .max(64 * self.op.io_blocks)
    }

    /// Shrinks the file back to its starting size if appends grew it too much (untimed).
    fn shrink_if_grown<S: Structure>(&mut self, fx: &mut Fixture<S>) -> Result<()> {
        let grown = fx.file(self.file).blocks - self.base_blocks;
        if grown + self.op.io_blocks > self.growth_limit() {
            fx.truncate(self.file, self.base_blocks)?;
            if self.op.cache == Cache::Cold {
                self.areas = fx.metadata_areas(self.file)?;
            }
        }
        Ok(())
    }

    /// Runs the operation `iters` times and returns the time of `iters` operations.
    ///
    /// Hot operations are timed in batches and summed. Cold operations are timed one by one
    /// and the sample is `iters` times their median: on a shared machine one operation in a
    /// sample may be preempted for milliseconds, which would swamp a mean of microsecond
    /// operations.
    pub fn run<S: Structure>(
        &mut self,
        h: &mut Harness,
        fx: &mut Fixture<S>,
        iters: u64,
    ) -> Result<Duration> {
        let mut total = Duration::ZERO;
        let mut cold = Vec::new();
        let mut done = 0;
        while done < iters {
            if self.op.kind == OpKind::Append {
                self.shrink_if_grown(fx)?;
            }
            match self.op.cache {
                Cache::Cold => {
                    h.evictor.evict(fx.region(), &self.areas)?;
                    cold.push(self.one(&h.timer, fx)?);
                    done += 1;
                }
                Cache::Hot => {
                    let batch = self.hot_batch(fx, iters - done);
                    total += self.batch(fx, batch)?;
                    done += batch;
                }
            }
        }
        if cold.is_empty() {
            return Ok(total);
        }
        Ok(median(&mut cold).mul_f64(iters as f64))
    }

    /// How many hot operations may run before the next shrink check.
    fn hot_batch<S: Structure>(&self, fx: &Fixture<S>, left: u64) -> u64 {
        match self.op.kind {
            OpKind::Append => {
                let grown = fx.file(self.file).blocks - self.base_blocks;
                let room = (self.growth_limit() - grown) / self.op.io_blocks;
                left.min(room.max(1))
            }
            _ => left,
        }
    }

    /// One timed operation.
    fn one<S: Structure>(&mut self, timer: &OpTimer, fx: &mut Fixture<S>) -> Result<Duration> {
        self.out.clear();
        let io = self.op.io_blocks;
        let (d, r) = match self.op.kind {
            OpKind::Append => {
                let out = &mut self.out;
                timer.time(|| fx.append(self.file, io, out))
            }
            _ => {
                let start = self.next_start();
                let out = &mut self.out;
                timer.time(|| fx.lookup(self.file, start, io, out))
            }
        };
        r?;
        Ok(d)
    }

    /// `n` operations back to back, timed together.
    fn batch<S: Structure>(&mut self, fx: &mut Fixture<S>, n: u64) -> Result<Duration> {
        let io = self.op.io_blocks;
        let t = Instant::now();
        for _ in 0..n {
            self.out.clear();
            match self.op.kind {
                OpKind::Append => fx.append(self.file, io, &mut self.out)?,
                _ => {
                    let start = self.next_start();
                    fx.lookup(self.file, start, io, &mut self.out)?
                }
            }
        }
        Ok(t.elapsed())
    }
}

/// The median of `times` (the upper one of an even count; zero for none).
fn median(times: &mut [Duration]) -> Duration {
    if times.is_empty() {
        return Duration::ZERO;
    }
    let mid = times.len() / 2;
    *times.select_nth_unstable(mid).1
}

/// Times of a concurrent run, averaged over threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadedTimes {
    /// Time spent in lookups per thread.
    pub lookup: Duration,
    /// Time spent in appends per thread.
    pub append: Duration,
}

/// The concurrency test of §4.6: `threads` threads each read a random block of file `file`
/// and then append one block to it, `iters` times. Appends to the one file are serialised by
/// a per-file lock, as Strata does; the lock wait is not timed, lookups take no lock. The file
/// is shrunk back to its starting size at the end.
pub fn read_then_append<S: Structure>(
    fx: &mut Fixture<S>,
    file: usize,
    threads: usize,
    iters: u64,
    seed: u64,
) -> Result<ThreadedTimes> {
    let base = fx.file(file).blocks;
    let mapping = fx.mapping();
    let handle = &fx.file(file).handle;
    let size = Mutex::new(base);
    let results: Vec<Result<ThreadedTimes>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let size = &size;
                s.spawn(move || {
                    reader_appender(mapping, handle, size, base, iters, seed + t as u64)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let end = size.into_inner().unwrap_or_else(|e| e.into_inner());
    if end > base {
        mapping.remove(handle, base, end - base)?;
    }
    let mut sum = ThreadedTimes::default();
    for r in results {
        let r = r?;
        sum.lookup += r.lookup;
        sum.append += r.append;
    }
    let n = threads.max(1) as u32;
    Ok(ThreadedTimes {
        lookup: sum.lookup / n,
        append: sum.append / n,
    })
}

/// One thread of [`read_then_append`].
fn reader_appender<F: FileMapping>(
    mapping: &F,
    handle: &F::File,
    size: &Mutex<u64>,
    base: u64,
    iters: u64,
    seed: u64,
) -> Result<ThreadedTimes> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut times = ThreadedTimes::default();
    for _ in 0..iters {
        let lblk = rng.gen_range(0..base.max(1));
        out.clear();
        let t = Instant::now();
        mapping.lookup(handle, lblk, 1, &mut out)?;
        times.lookup += t.elapsed();

        let mut end = size.lock().unwrap_or_else(|e| e.into_inner());
        if *end - base >= APPEND_GROWTH_BLOCKS {
            mapping.remove(handle, base, *end - base)?;
            *end = base;
        }
        out.clear();
        let t = Instant::now();
        mapping.insert(handle, *end, 1, &mut out)?;
        times.append += t.elapsed();
        *end += 1;
    }
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::aging::aged_file_fixture;
    use crate::mapping::structures::{Cuckoo, Extents, HashFsTable, Radix, Simple};
    use crate::mapping::volume::VolumeSpec;
    use pmfs_core::traits::BlockAllocator;

    fn fixture<S: Structure>() -> Fixture<S> {
        let spec = VolumeSpec {
            data_blocks: 40_000,
            max_files: 2,
        };
        aged_file_fixture::<S>(spec, 1000, 0.85, 1).unwrap()
    }

    fn harness() -> Harness {
        Harness {
            evictor: Evictor::new(1 << 16),
            timer: OpTimer::calibrate(),
        }
    }

    fn mapped_blocks<S: Structure>(fx: &Fixture<S>) -> u64 {
        let mut runs = Vec::new();
        fx.lookup(0, 0, fx.file(0).blocks + 100, &mut runs).unwrap();
        runs.iter().map(|r| r.len).sum()
    }

    #[test]
    fn ops_have_paper_style_labels() {
        assert_eq!(
            Op::new(Cache::Cold, OpKind::RandLookup, 1).to_string(),
            "cold-rand-lookup"
        );
        assert_eq!(
            Op::new(Cache::Hot, OpKind::Append, 16).to_string(),
            "hot-append"
        );
    }

    #[test]
    fn medians_ignore_one_preempted_operation() {
        let us = Duration::from_micros;
        assert_eq!(median(&mut [us(3), us(1), us(5000), us(2), us(2)]), us(2));
        assert_eq!(median(&mut [us(4), us(1)]), us(4));
        assert_eq!(median(&mut []), Duration::ZERO);
    }

    #[test]
    fn sequential_lookups_wrap_inside_the_file() {
        let fx = fixture::<Simple>();
        let op = Op::new(Cache::Hot, OpKind::SeqLookup, 300);
        let mut w = Workload::new(&fx, 0, op, 1).unwrap();
        let starts: Vec<u64> = (0..5).map(|_| w.next_start()).collect();
        assert_eq!(starts, vec![0, 300, 600, 0, 300]);
        let op = Op::new(Cache::Hot, OpKind::RandLookup, 16);
        let mut w = Workload::new(&fx, 0, op, 1).unwrap();
        assert!((0..1000).all(|_| w.next_start() <= 1000 - 16));
    }

    fn every_workload_runs_and_appends_stay_bounded<S: Structure>() {
        let mut fx = fixture::<S>();
        let mut h = harness();
        for cache in [Cache::Cold, Cache::Hot] {
            for kind in [OpKind::SeqLookup, OpKind::RandLookup, OpKind::Append] {
                let mut w = Workload::new(&fx, 0, Op::new(cache, kind, 16), 2).unwrap();
                w.run(&mut h, &mut fx, 50).unwrap();
            }
        }
        assert_eq!(fx.file(0).blocks, 1000 + 100 * 16);
        let op = Op::new(Cache::Hot, OpKind::Append, 16);
        let mut w = Workload::new(&fx, 0, op, 2).unwrap();
        w.run(&mut h, &mut fx, 3000).unwrap();
        let grown = fx.file(0).blocks - 2600;
        assert!(grown <= 2600, "grew by {grown}");
        assert_eq!(mapped_blocks(&fx), fx.file(0).blocks);
    }

    #[test]
    fn every_workload_runs_on_every_structure() {
        every_workload_runs_and_appends_stay_bounded::<Simple>();
        every_workload_runs_and_appends_stay_bounded::<Extents>();
        every_workload_runs_and_appends_stay_bounded::<Radix>();
        every_workload_runs_and_appends_stay_bounded::<Cuckoo>();
        every_workload_runs_and_appends_stay_bounded::<HashFsTable>();
    }

    fn concurrent_readers_appenders_leave_the_file_as_it_was<S: Structure>() {
        let mut fx = fixture::<S>();
        let free = fx.alloc().free_blocks();
        let t = read_then_append(&mut fx, 0, 2, 5_000, 5).unwrap();
        assert!(t.lookup > Duration::ZERO && t.append > Duration::ZERO);
        assert_eq!(fx.alloc().free_blocks(), free);
        assert_eq!(mapped_blocks(&fx), 1000);
    }

    #[test]
    fn concurrent_readers_appenders_on_every_structure() {
        concurrent_readers_appenders_leave_the_file_as_it_was::<Simple>();
        concurrent_readers_appenders_leave_the_file_as_it_was::<Extents>();
        concurrent_readers_appenders_leave_the_file_as_it_was::<Radix>();
        concurrent_readers_appenders_leave_the_file_as_it_was::<Cuckoo>();
        concurrent_readers_appenders_leave_the_file_as_it_was::<HashFsTable>();
    }
}
