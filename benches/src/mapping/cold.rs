//! Cold caches and per-operation timing.
//!
//! The paper's "cold cache" case performs one operation and resets the experiment (§4.1); its
//! cold numbers are those of a structure whose persistent lines are not cached. An
//! [`Evictor`] reproduces that between operations, outside the timed section: it writes back
//! and invalidates every line of the structure's metadata — its static area, the file's node
//! blocks and the allocator's persistent bitmap — with [`Media::flush`] forced onto an
//! invalidating instruction. On request ([`EVICT_MIB_VAR`]) it also reads a buffer as large as
//! the last-level cache, so that DRAM state (the allocator's free-extent map, the open file's
//! cursor or translation cache, page tables, code) is cold too; that adds a fixed cost of
//! several microseconds to every structure alike. Only the operation itself is timed, by an
//! [`OpTimer`].

use std::hint::black_box;
use std::time::{Duration, Instant};

use pmfs_core::Result;
use pmfs_core::layout::{BLOCK_SIZE, CACHE_LINE};
use pmfs_core::pm::Media;
use pmfs_core::pm::persist::{self, DispatchPath, FlushKind};
use pmfs_core::traits::Extent;

/// Environment variable asking for a DRAM eviction buffer: a size in MiB, or `llc` for one
/// and a half times the last-level cache. Unset or 0: metadata lines only.
pub const EVICT_MIB_VAR: &str = "PMFS_BENCH_EVICT_MIB";

/// Eviction buffer size for `llc` when the last-level cache size cannot be read.
const FALLBACK_LLC_BYTES: usize = 64 << 20;

/// Evicts what a mapping operation may touch from the CPU caches.
#[derive(Debug)]
pub struct Evictor {
    buf: Vec<u64>,
}

impl Evictor {
    /// An evictor that reads `bytes` bytes of DRAM per eviction.
    pub fn new(bytes: usize) -> Self {
        // Distinct values, so the pages are really backed and not the shared zero page.
        let buf = (0..bytes / 8).map(|i| i as u64).collect();
        Self { buf }
    }

    /// An evictor whose buffer [`EVICT_MIB_VAR`] sizes (none by default).
    pub fn from_env() -> Self {
        Self::new(std::env::var(EVICT_MIB_VAR).map_or(0, |v| buffer_bytes(&v)))
    }

    /// Bytes read per eviction.
    pub fn buffer_bytes(&self) -> usize {
        self.buf.len() * 8
    }

    /// Flushes every line of `areas` (blocks of `media`) with an invalidating flush
    /// (`clflushopt`, else `clflush`: `clwb` may leave the line cached), fences, and reads the
    /// eviction buffer.
    pub fn evict(&mut self, media: &dyn Media, areas: &[Extent]) -> Result<()> {
        let flush_all = || -> Result<()> {
            for a in areas {
                media.flush(a.start.offset(), a.len * BLOCK_SIZE)?;
            }
            Ok(())
        };
        match evicting_path() {
            Some(path) => persist::with_path(path, flush_all)??,
            None => flush_all()?,
        }
        media.fence();
        let step = (CACHE_LINE / 8) as usize;
        let mut sum = 0u64;
        for i in (0..self.buf.len()).step_by(step) {
            sum = sum.wrapping_add(self.buf[i]);
        }
        black_box(sum);
        Ok(())
    }
}

/// The persistence path with the best invalidating flush this CPU has (none on targets
/// without one).
fn evicting_path() -> Option<DispatchPath> {
    let copy = persist::detected_path().copy;
    [FlushKind::Clflushopt, FlushKind::Clflush]
        .into_iter()
        .map(|flush| DispatchPath { flush, copy })
        .find(|p| p.is_available())
}

/// The buffer size an [`EVICT_MIB_VAR`] value asks for (0 for values that are not
/// understood).
pub fn buffer_bytes(value: &str) -> usize {
    match value.trim() {
        "llc" => {
            let llc = llc_bytes().unwrap_or(FALLBACK_LLC_BYTES);
            llc + llc / 2
        }
        mib => mib.parse::<usize>().map_or(0, |m| m << 20),
    }
}

/// Size of the largest CPU cache of CPU 0 as Linux reports it in sysfs.
pub fn llc_bytes() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("size")).ok())
        .filter_map(|s| parse_cache_size(&s))
        .max()
}

/// Parses a sysfs cache size such as `"107520K"` or `"4M"`.
pub fn parse_cache_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().map(|n| n * mul)
}

/// Times single operations, net of the cost of reading the clock.
#[derive(Clone, Copy, Debug)]
pub struct OpTimer {
    overhead: Duration,
}

impl OpTimer {
    /// Measures the clock's own cost: the smallest of many empty timings.
    pub fn calibrate() -> Self {
        let overhead = (0..10_000)
            .map(|_| {
                let t = Instant::now();
                black_box(());
                t.elapsed()
            })
            .min()
            .unwrap_or_default();
        Self { overhead }
    }

    /// The clock cost subtracted from every timing.
    pub fn overhead(&self) -> Duration {
        self.overhead
    }

    /// Runs `op` and returns how long it took, net of the clock's cost, with its result.
    #[inline]
    pub fn time<R>(&self, op: impl FnOnce() -> R) -> (Duration, R) {
        let t = Instant::now();
        let r = black_box(op());
        (t.elapsed().saturating_sub(self.overhead), r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmfs_core::layout::BlockNo;
    use pmfs_core::pm::HeapRegion;

    #[test]
    fn cache_sizes_parse() {
        assert_eq!(parse_cache_size("107520K\n"), Some(107520 << 10));
        assert_eq!(parse_cache_size("4M"), Some(4 << 20));
        assert_eq!(parse_cache_size("64"), Some(64));
        assert_eq!(parse_cache_size("x"), None);
        assert_eq!(parse_cache_size(""), None);
    }

    #[test]
    fn buffer_sizes_come_from_the_variable() {
        assert_eq!(buffer_bytes("8"), 8 << 20);
        assert_eq!(buffer_bytes(" 0 "), 0);
        assert_eq!(buffer_bytes("lots"), 0);
        assert!(buffer_bytes("llc") >= 1 << 20);
        assert_eq!(Evictor::new(0).buffer_bytes(), 0);
    }

    #[test]
    fn eviction_flushes_areas_inside_the_region_only() {
        let region = HeapRegion::new(8 * BLOCK_SIZE).unwrap();
        let mut ev = Evictor::new(1 << 16);
        assert_eq!(ev.buffer_bytes(), 1 << 16);
        ev.evict(&region, &[Extent::new(BlockNo(2), 3)]).unwrap();
        assert!(ev.evict(&region, &[Extent::new(BlockNo(7), 2)]).is_err());
    }

    #[test]
    fn timer_returns_the_operation_result() {
        let t = OpTimer::calibrate();
        let (_, r) = t.time(|| 6 * 7);
        assert_eq!(r, 42);
    }
}
