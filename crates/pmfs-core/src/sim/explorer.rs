//! [`Explorer`]: runs a workload on a [`SimRegion`] and checks the crash images at every
//! fence and at the end.

use std::collections::HashSet;
use std::thread;

use super::failure::{CrashFailure, LineChoice};
use super::hook::{self, Hook};
use super::line::LINE;
use super::region::{Pending, SimRegion, Snapshot};

/// Sample count when neither [`Explorer::samples`] nor `PMFS_CRASH_SAMPLES` says otherwise.
pub const DEFAULT_SAMPLES: usize = 64;
/// Default largest number of images a crash point may have to be enumerated exhaustively.
pub const DEFAULT_EXHAUSTIVE_LIMIT: usize = 256;
/// Environment variable holding the default sample count.
pub const SAMPLES_ENV: &str = "PMFS_CRASH_SAMPLES";

/// Runs workloads on a [`SimRegion`] and hands every legal post-crash image to a checker.
///
/// Crash points are every fence the workload issues on the region (the state just before the
/// fence takes effect) and the end of the workload. At each point the images are enumerated
/// exhaustively when there are at most [`exhaustive_limit`](Explorer::exhaustive_limit) of
/// them, else [`samples`](Explorer::samples) images are drawn with a generator seeded from
/// the seed and the point, always including the two extremes. The same seed and workload
/// give the same images in the same order.
#[derive(Clone, Debug)]
pub struct Explorer {
    seed: u64,
    samples: usize,
    exhaustive_limit: usize,
    prefixes: bool,
}

/// The state of one crash image, handed to the checker.
#[derive(Clone, Copy, Debug)]
pub struct CrashPoint<'a> {
    /// Index of the fence the crash precedes, counted from 0 in the run; at the end of the
    /// workload, the number of fences it issued.
    pub fence: u64,
    /// The content of the region after the crash.
    pub image: &'a [u8],
    /// Whether this is the crash point after the workload returned.
    pub end: bool,
    /// Number of the image at this crash point: 0 is the durable image (no line written back
    /// on its own); 1 is the program's view when sampling.
    pub index: u64,
    /// Whether the images of this point are sampled rather than enumerated.
    pub sampled: bool,
}

impl<'a> CrashPoint<'a> {
    /// A crash point for `image` at fence `fence`, index 0 (to call a checker by hand).
    pub fn new(fence: u64, image: &'a [u8]) -> CrashPoint<'a> {
        CrashPoint {
            fence,
            image,
            end: false,
            index: 0,
            sampled: false,
        }
    }
}

/// What a run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Fences the workload issued on the region.
    pub fences: u64,
    /// Images handed to the checker.
    pub images: u64,
    /// Crash points (fences plus the end).
    pub points: u64,
    /// Crash points whose images were sampled rather than enumerated.
    pub sampled_points: u64,
    /// Largest number of lines with more than one possible state at a crash point.
    pub max_pending_lines: u64,
}

impl Explorer {
    /// An explorer with seed `seed`, sample count from `PMFS_CRASH_SAMPLES` (else
    /// [`DEFAULT_SAMPLES`]), exhaustive limit [`DEFAULT_EXHAUSTIVE_LIMIT`] and whole-line
    /// crash states.
    ///
    /// # Panics
    /// If `PMFS_CRASH_SAMPLES` is set but is not a number.
    pub fn new(seed: u64) -> Explorer {
        let samples = match std::env::var(SAMPLES_ENV) {
            Ok(v) => v
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{SAMPLES_ENV}={v:?} is not a sample count")),
            Err(_) => DEFAULT_SAMPLES,
        };
        Explorer {
            seed,
            samples: samples.max(2),
            exhaustive_limit: DEFAULT_EXHAUSTIVE_LIMIT,
            prefixes: false,
        }
    }

    /// Enumerates a crash point exhaustively when it has at most `n` images.
    pub fn exhaustive_limit(mut self, n: usize) -> Explorer {
        self.exhaustive_limit = n;
        self
    }

    /// Draws `n` images (at least 2: the extremes are always included) at crash points with
    /// more images than the exhaustive limit.
    pub fn samples(mut self, n: usize) -> Explorer {
        self.samples = n.max(2);
        self
    }

    /// With `true`, a line that is not durable may be left in the state after any prefix of
    /// its stores since it was last durable (each 8-byte word store is one step), not only
    /// in its durable or its latest state. This catches reliance on the order of stores
    /// inside one line, at the price of more images.
    pub fn store_prefixes(mut self, on: bool) -> Explorer {
        self.prefixes = on;
        self
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Runs `workload` on `region`, calling `check` on the crash images at every fence the
    /// workload issues on `region` (synchronously, from inside the fence, before the fence
    /// takes effect) and once after the workload returns.
    ///
    /// After the first image the checker rejects, it is not called again; the workload runs
    /// to its end and the failure is returned. The region keeps the workload's effects (no
    /// crash is applied to it). The workload must not fence `region` from another thread
    /// (that panics); the checker must not write to `region`.
    ///
    /// # Panics
    /// If `region` is already in a run, or if the workload or the checker panics.
    pub fn run<W, C>(
        &self,
        region: &SimRegion,
        workload: W,
        check: C,
    ) -> Result<Stats, CrashFailure>
    where
        W: FnOnce(&SimRegion),
        C: FnMut(&CrashPoint<'_>) -> Result<(), String>,
    {
        let scratch = region.lock().start_run(thread::current().id());
        let scratch = scratch.expect("SimRegion is already being explored by an Explorer::run");
        let _running = Running(region);
        let mut session = Session {
            explorer: self,
            check,
            size: region.size_usize(),
            scratch,
            stats: Stats::default(),
            failure: None,
        };
        {
            let _installed = hook::install(region.id(), &mut session);
            workload(region);
        }
        let snap = region.lock().snapshot(self.prefixes);
        session.crash_point(snap, true);
        match session.failure {
            Some(f) => Err(f),
            None => Ok(session.stats),
        }
    }
}

/// Ends the region's run when dropped, also when unwinding.
struct Running<'r>(&'r SimRegion);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.lock().end_run();
    }
}

/// The explorer's state during one run.
struct Session<'e, C> {
    explorer: &'e Explorer,
    check: C,
    size: usize,
    /// The crash image under construction. Between crash points it equals the region's
    /// view, except on lines stored to since the last point.
    scratch: Vec<u8>,
    stats: Stats,
    failure: Option<CrashFailure>,
}

impl<C> Hook for Session<'_, C>
where
    C: FnMut(&CrashPoint<'_>) -> Result<(), String>,
{
    fn prefixes(&self) -> bool {
        self.explorer.prefixes
    }

    fn crash_point(&mut self, snap: Snapshot, end: bool) {
        let fence = self.stats.fences;
        if !end {
            self.stats.fences += 1;
        }
        self.stats.points += 1;
        self.stats.max_pending_lines = self.stats.max_pending_lines.max(snap.pending.len() as u64);
        for (line, bytes) in &snap.sync {
            self.set_line(*line, bytes);
        }
        if self.failure.is_none() {
            self.explore(fence, end, &snap.pending);
        }
        for p in &snap.pending {
            self.set_line(p.line, &p.choices[p.latest]);
        }
    }
}

impl<C> Session<'_, C>
where
    C: FnMut(&CrashPoint<'_>) -> Result<(), String>,
{
    fn set_line(&mut self, line: u64, bytes: &[u8; LINE]) {
        let a = line as usize * LINE;
        self.scratch[a..a + LINE].copy_from_slice(bytes);
    }

    /// Checks the images of one crash point; stops at the first failure.
    fn explore(&mut self, fence: u64, end: bool, pending: &[Pending]) {
        let count = pending
            .iter()
            .try_fold(1u64, |n, p| n.checked_mul(p.choices.len() as u64));
        let mut cur = vec![0usize; pending.len()];
        for p in pending {
            self.set_line(p.line, &p.choices[0]);
        }
        match count {
            Some(n) if n <= self.explorer.exhaustive_limit as u64 => {
                for index in 0..n {
                    if index > 0 {
                        self.next_combination(pending, &mut cur);
                    }
                    if !self.check_one(fence, end, index, false, pending, &cur) {
                        return;
                    }
                }
            }
            _ => {
                self.stats.sampled_points += 1;
                for (index, combo) in self.sample(fence, end, pending).into_iter().enumerate() {
                    for (i, (&c, p)) in combo.iter().zip(pending).enumerate() {
                        if cur[i] != c {
                            cur[i] = c;
                            self.set_line(p.line, &p.choices[c]);
                        }
                    }
                    if !self.check_one(fence, end, index as u64, true, pending, &cur) {
                        return;
                    }
                }
            }
        }
    }

    /// Advances `cur` as a mixed-radix counter (first line fastest) and updates the image.
    fn next_combination(&mut self, pending: &[Pending], cur: &mut [usize]) {
        for (i, p) in pending.iter().enumerate() {
            cur[i] += 1;
            if cur[i] < p.choices.len() {
                self.set_line(p.line, &p.choices[cur[i]]);
                return;
            }
            cur[i] = 0;
            self.set_line(p.line, &p.choices[0]);
        }
    }

    /// The sampled combinations of a point: the durable image, the program's view, then
    /// distinct random ones.
    fn sample(&self, fence: u64, end: bool, pending: &[Pending]) -> Vec<Vec<usize>> {
        let want = self.explorer.samples;
        let mut rng = SplitMix64::for_point(self.explorer.seed, fence, end);
        // Combinations are told apart by a 64-bit fingerprint; a collision only costs one
        // sample.
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(want);
        let durable = vec![0; pending.len()];
        let latest: Vec<usize> = pending.iter().map(|p| p.latest).collect();
        for c in [durable, latest] {
            if seen.insert(fingerprint(&c)) {
                out.push(c);
            }
        }
        // Duplicates are rare (there are more images than samples); the bound on attempts
        // only guards against pathological draws.
        let mut attempts = want.saturating_mul(4);
        while out.len() < want && attempts > 0 {
            attempts -= 1;
            let c: Vec<usize> = pending.iter().map(|p| rng.below(p.choices.len())).collect();
            if seen.insert(fingerprint(&c)) {
                out.push(c);
            }
        }
        out
    }

    /// Hands the current image to the checker; records a failure and returns `false` if it
    /// rejects the image.
    fn check_one(
        &mut self,
        fence: u64,
        end: bool,
        index: u64,
        sampled: bool,
        pending: &[Pending],
        cur: &[usize],
    ) -> bool {
        let cp = CrashPoint {
            fence,
            image: &self.scratch[..self.size],
            end,
            index,
            sampled,
        };
        self.stats.images += 1;
        match (self.check)(&cp) {
            Ok(()) => true,
            Err(message) => {
                let lines = pending
                    .iter()
                    .zip(cur)
                    .map(|(p, &c)| LineChoice {
                        offset: p.line * LINE as u64,
                        choice: c as u32,
                        choices: p.choices.len() as u32,
                        latest: p.latest as u32,
                    })
                    .collect();
                self.failure = Some(CrashFailure {
                    fence,
                    image: cp.image.to_vec(),
                    message,
                    seed: self.explorer.seed,
                    end,
                    index,
                    sampled,
                    prefixes: self.explorer.prefixes,
                    lines,
                });
                false
            }
        }
    }
}

/// A 64-bit fingerprint of a combination of line states.
fn fingerprint(combo: &[usize]) -> u64 {
    combo.iter().fold(0x243f_6a88_85a3_08d3, |h, &c| {
        SplitMix64(h ^ c as u64).next_u64()
    })
}

/// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast and the same on every platform and
/// build, so a seed names the same images forever.
struct SplitMix64(u64);

impl SplitMix64 {
    /// The generator of one crash point: independent of how many images earlier points
    /// drew, so a point's images depend only on the seed and the point.
    fn for_point(seed: u64, fence: u64, end: bool) -> SplitMix64 {
        let mut g = SplitMix64(seed);
        let a = g.next_u64();
        let mut h = SplitMix64(fence ^ (u64::from(end) << 63));
        SplitMix64(a ^ h.next_u64())
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`), by multiply-shift.
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_reference_values() {
        // First outputs for seed 1234567 of the reference implementation.
        let mut g = SplitMix64(1234567);
        assert_eq!(g.next_u64(), 6457827717110365317);
        assert_eq!(g.next_u64(), 3203168211198807973);
    }

    use std::panic::{AssertUnwindSafe, catch_unwind};

    use crate::layout::PmOff;
    use crate::pm::Media;

    #[test]
    fn a_panicking_checker_leaves_the_region_usable() {
        let region = SimRegion::new(128).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            Explorer::new(1).run(
                &region,
                |pm| pm.store_u64_persist(PmOff(0), 1).unwrap(),
                |_| panic!("checker bug"),
            )
        }));
        assert!(r.is_err());
        // The hook and the run mark are gone: fences work and a new run starts.
        region.fence();
        let stats = Explorer::new(1)
            .run(
                &region,
                |pm| pm.store_u64_persist(PmOff(8), 2).unwrap(),
                |_| Ok(()),
            )
            .unwrap();
        assert_eq!((stats.fences, stats.images), (1, 3));
    }

    #[test]
    fn a_nested_run_on_the_same_region_panics() {
        let region = SimRegion::new(64).unwrap();
        let inner = Explorer::new(0)
            .run(
                &region,
                |pm| {
                    let r = catch_unwind(AssertUnwindSafe(|| {
                        Explorer::new(0).run(pm, |_| {}, |_| Ok(()))
                    }));
                    assert!(r.is_err());
                },
                |_| Ok(()),
            )
            .unwrap();
        assert_eq!(inner.points, 1);
    }

    #[test]
    fn below_stays_in_range() {
        let mut g = SplitMix64(1);
        assert!((0..1000).all(|_| g.below(3) < 3));
    }
}
