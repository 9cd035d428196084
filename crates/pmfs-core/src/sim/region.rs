//! [`SimRegion`]: a [`Media`] backend that keeps the program's view and, per cache line, what
//! a power failure could leave on media.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread::{self, ThreadId};

use super::hook;
use super::line::{Event, LINE, LineBytes, LineLog};
use crate::error::{Error, Result};
use crate::layout::PmOff;
use crate::pm::Media;

/// Source of unique region ids, which key the explorer hooks of a thread.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A simulated persistent-memory region implementing [`Media`].
///
/// It keeps the image the program sees and tracks, per 64-byte cache line, which of its
/// stores surely reached media and which may or may not have (see the [module
/// docs](super) for the exact model). Outside an [`Explorer::run`](super::Explorer::run) it
/// behaves like a [`HeapRegion`](crate::pm::HeapRegion) that also remembers durability;
/// inside one, every [`fence`](Media::fence) on the run's thread is a crash point.
///
/// Bounds and alignment errors are those of every [`Media`]: [`Error::OutOfBounds`] for an
/// access outside the region, [`Error::Unaligned`] for an atomic access at an offset that is
/// not a multiple of 8.
pub struct SimRegion {
    id: u64,
    size: u64,
    eadr: bool,
    state: Mutex<State>,
}

/// The mutable part of a region.
#[derive(Debug)]
pub(crate) struct State {
    /// What the program sees, padded to whole lines with zeroes.
    cache: Vec<u8>,
    /// Lines whose media content may differ from `cache`, by line index.
    lines: BTreeMap<u64, LineLog>,
    /// Lines a fence may change (their logs have `queued` set); may hold stale entries.
    fence_queue: Vec<u64>,
    /// Lines stored to since the last [`State::snapshot`] (each once), and their bitmap.
    touched: Vec<u64>,
    touched_bits: Vec<u64>,
    /// The thread of the [`Explorer::run`](super::Explorer::run) in progress, if any.
    run: Option<ThreadId>,
}

/// What an explorer needs at a crash point, taken under the region's lock.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// Lines stored to since the previous snapshot, with the content the program sees.
    pub(crate) sync: Vec<(u64, LineBytes)>,
    /// Lines a crash may leave in more than one state.
    pub(crate) pending: Vec<Pending>,
}

/// One line a crash may leave in more than one state.
#[derive(Debug)]
pub(crate) struct Pending {
    /// Line index (byte offset / 64).
    pub(crate) line: u64,
    /// Its possible contents; the first is the durable one.
    pub(crate) choices: Vec<LineBytes>,
    /// Index in `choices` of the content the program sees.
    pub(crate) latest: usize,
}

/// Where the bytes of a store come from.
#[derive(Clone, Copy)]
enum Src<'a> {
    Bytes(&'a [u8]),
    Fill(u8),
}

impl SimRegion {
    /// A zeroed region of `size` bytes, all of it durable, with ADR semantics (stores need a
    /// flush and a fence to become durable).
    pub fn new(size: u64) -> Result<SimRegion> {
        Self::build(size, false)
    }

    /// A zeroed region of `size` bytes, all of it durable, with eADR semantics: caches are in
    /// the persistence domain, so every ordinary store is durable as soon as it is done (in
    /// program order) and [`needs_flush`](Media::needs_flush) is `false`. Non-temporal stores
    /// still need a fence.
    pub fn new_eadr(size: u64) -> Result<SimRegion> {
        Self::build(size, true)
    }

    /// A region holding a copy of `image`, all of which counts as durable (ADR semantics).
    pub fn from_image(image: &[u8]) -> Result<SimRegion> {
        let r = Self::new(image.len() as u64)?;
        r.lock().cache[..image.len()].copy_from_slice(image);
        Ok(r)
    }

    fn build(size: u64, eadr: bool) -> Result<SimRegion> {
        if size == 0 {
            return Err(Error::InvalidArgument("empty region"));
        }
        let lines = size.div_ceil(LINE as u64);
        let padded = lines
            .checked_mul(LINE as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or(Error::InvalidArgument("region too large"))?;
        let mut cache = Vec::new();
        cache
            .try_reserve_exact(padded)
            .map_err(|_| Error::NoSpace)?;
        cache.resize(padded, 0);
        let bitmap_words = lines.div_ceil(64) as usize;
        Ok(SimRegion {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            size,
            eadr,
            state: Mutex::new(State {
                cache,
                lines: BTreeMap::new(),
                fence_queue: Vec::new(),
                touched: Vec::new(),
                touched_bits: vec![0; bitmap_words],
                run: None,
            }),
        })
    }

    /// What the program sees now.
    pub fn image(&self) -> Vec<u8> {
        self.lock().cache[..self.size as usize].to_vec()
    }

    /// What surely survives a crash now: every line at its durable content (the image a
    /// crash leaves if no line was written back on its own).
    pub fn durable_image(&self) -> Vec<u8> {
        let st = self.lock();
        let mut img = st.cache.clone();
        for (&line, log) in &st.lines {
            img[line_range(line)].copy_from_slice(&log.durable());
        }
        img.truncate(self.size as usize);
        img
    }

    /// Makes everything the program sees durable, as a clean shutdown would (write back
    /// every line, then fence). Not a crash point.
    pub fn persist_all(&self) {
        let mut st = self.lock();
        st.lines.clear();
        st.fence_queue.clear();
    }

    /// Number of cache lines whose media content may differ from what the program sees.
    pub fn pending_lines(&self) -> usize {
        self.lock().lines.len()
    }

    /// Whether the region has eADR semantics (see [`SimRegion::new_eadr`]).
    pub fn is_eadr(&self) -> bool {
        self.eadr
    }

    /// The size as an index into images (the view is held in memory, so it fits).
    pub(crate) fn size_usize(&self) -> usize {
        self.size as usize
    }

    /// The id that keys this region's explorer hook.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock except on internal bugs; the state stays
        // consistent between statements, so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check(&self, off: PmOff, len: u64) -> Result<()> {
        match off.0.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::OutOfBounds {
                off,
                len,
                size: self.size,
            }),
        }
    }

    fn check_word(&self, off: PmOff) -> Result<()> {
        if !off.is_aligned(8) {
            return Err(Error::Unaligned(off));
        }
        self.check(off, 8)
    }

    fn store(&self, off: PmOff, len: u64, src: Src<'_>, nt: bool) -> Result<()> {
        self.check(off, len)?;
        self.lock().store(off.0, len, src, nt, self.eadr && !nt);
        Ok(())
    }
}

impl State {
    fn store(&mut self, off: u64, len: u64, src: Src<'_>, nt: bool, forced: bool) {
        let end = off + len;
        let mut pos = off;
        while pos < end {
            let line = pos / LINE as u64;
            let line_end = end.min((line + 1) * LINE as u64);
            self.touch(line);
            let base = line_bytes(&self.cache, line);
            let log = self.lines.entry(line).or_insert_with(|| LineLog::new(base));
            while pos < line_end {
                let word_end = line_end.min((pos / 8 + 1) * 8);
                let (a, b) = (pos as usize, word_end as usize);
                match src {
                    Src::Bytes(s) => self.cache[a..b]
                        .copy_from_slice(&s[(pos - off) as usize..(word_end - off) as usize]),
                    Src::Fill(byte) => self.cache[a..b].fill(byte),
                }
                let in_line = a % LINE;
                log.push(Event::new(
                    in_line / 8,
                    in_line % 8,
                    &self.cache[a..b],
                    nt,
                    forced,
                ));
                pos = word_end;
            }
            if log.is_clean() {
                self.lines.remove(&line);
            } else if !log.queued && log.awaits_fence() {
                log.queued = true;
                self.fence_queue.push(line);
            }
        }
    }

    fn flush(&mut self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = off / LINE as u64;
        let last = (off + len - 1) / LINE as u64;
        for (&line, log) in self.lines.range_mut(first..=last) {
            log.flush();
            if !log.queued {
                log.queued = true;
                self.fence_queue.push(line);
            }
        }
    }

    fn fence(&mut self) {
        for line in std::mem::take(&mut self.fence_queue) {
            if let Some(log) = self.lines.get_mut(&line) {
                log.queued = false;
                if log.fence() {
                    self.lines.remove(&line);
                }
            }
        }
    }

    fn touch(&mut self, line: u64) {
        let (w, bit) = ((line / 64) as usize, 1u64 << (line % 64));
        if self.touched_bits[w] & bit == 0 {
            self.touched_bits[w] |= bit;
            self.touched.push(line);
        }
    }

    /// Marks the start of a run on `thread` and returns a copy of the whole view; forgets
    /// which lines were touched, as the copy is up to date. `None` if a run is in progress.
    pub(crate) fn start_run(&mut self, thread: ThreadId) -> Option<Vec<u8>> {
        if self.run.is_some() {
            return None;
        }
        self.run = Some(thread);
        for line in self.touched.drain(..) {
            self.touched_bits[(line / 64) as usize] = 0;
        }
        Some(self.cache.clone())
    }

    pub(crate) fn end_run(&mut self) {
        self.run = None;
    }

    /// The crash states of the lines now, and the lines changed since the last snapshot.
    pub(crate) fn snapshot(&mut self, prefixes: bool) -> Snapshot {
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        let sync = touched
            .iter()
            .map(|&line| {
                self.touched_bits[(line / 64) as usize] = 0;
                (line, line_bytes(&self.cache, line))
            })
            .collect();
        touched.clear();
        self.touched = touched;
        let pending = self
            .lines
            .iter()
            .filter_map(|(&line, log)| {
                let (choices, latest) = log.choices(prefixes);
                (choices.len() > 1).then_some(Pending {
                    line,
                    choices,
                    latest,
                })
            })
            .collect();
        Snapshot { sync, pending }
    }
}

fn line_range(line: u64) -> std::ops::Range<usize> {
    let a = line as usize * LINE;
    a..a + LINE
}

fn line_bytes(cache: &[u8], line: u64) -> LineBytes {
    let mut b = [0u8; LINE];
    b.copy_from_slice(&cache[line_range(line)]);
    b
}

impl fmt::Debug for SimRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimRegion")
            .field("size", &self.size)
            .field("eadr", &self.eadr)
            .field("pending_lines", &self.pending_lines())
            .finish()
    }
}

impl Media for SimRegion {
    fn size(&self) -> u64 {
        self.size
    }

    fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
        self.check(off, buf.len() as u64)?;
        let a = off.0 as usize;
        buf.copy_from_slice(&self.lock().cache[a..a + buf.len()]);
        Ok(())
    }

    fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.store(off, src.len() as u64, Src::Bytes(src), false)
    }

    fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.store(off, src.len() as u64, Src::Bytes(src), true)
    }

    fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
        self.store(off, len, Src::Fill(byte), true)
    }

    fn flush(&self, off: PmOff, len: u64) -> Result<()> {
        self.check(off, len)?;
        self.lock().flush(off.0, len);
        Ok(())
    }

    fn fence(&self) {
        let me = thread::current().id();
        let owner = self.lock().run;
        assert!(
            owner.is_none_or(|t| t == me),
            "a fence on a SimRegion from another thread than its Explorer::run: \
             explored workloads must be single-threaded"
        );
        hook::crash_point(self.id, |h| {
            let snap = self.lock().snapshot(h.prefixes());
            h.crash_point(snap, false);
        });
        self.lock().fence();
    }

    fn load_u64(&self, off: PmOff) -> Result<u64> {
        self.check_word(off)?;
        let a = off.0 as usize;
        let st = self.lock();
        let mut w = [0u8; 8];
        w.copy_from_slice(&st.cache[a..a + 8]);
        Ok(u64::from_le_bytes(w))
    }

    fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
        self.check_word(off)?;
        self.lock()
            .store(off.0, 8, Src::Bytes(&val.to_le_bytes()), false, self.eadr);
        Ok(())
    }

    fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
        self.check_word(off)?;
        let a = off.0 as usize;
        let mut st = self.lock();
        let mut w = [0u8; 8];
        w.copy_from_slice(&st.cache[a..a + 8]);
        let actual = u64::from_le_bytes(w);
        if actual != current {
            return Ok(Err(actual));
        }
        st.store(off.0, 8, Src::Bytes(&new.to_le_bytes()), false, self.eadr);
        Ok(Ok(current))
    }

    fn needs_flush(&self) -> bool {
        !self.eadr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn is_send_and_sync() {
        assert_send_sync::<SimRegion>();
    }

    #[test]
    fn bounds_and_alignment_like_heap_region() {
        let r = SimRegion::new(4096).unwrap();
        let mut b = [0u8; 5];
        assert!(matches!(
            r.read(PmOff(4094), &mut b),
            Err(Error::OutOfBounds {
                off: PmOff(4094),
                len: 5,
                size: 4096
            })
        ));
        assert!(matches!(r.load_u64(PmOff(4)), Err(Error::Unaligned(_))));
        assert!(matches!(
            r.load_u64(PmOff(4096)),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.write(PmOff(u64::MAX), b"x"),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.flush(PmOff(4000), 100),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.fill_nt(PmOff(1), u64::MAX, 0),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.cas_u64(PmOff(12), 0, 1),
            Err(Error::Unaligned(_))
        ));
        assert!(r.write(PmOff(4096), b"").is_ok());
        assert!(matches!(SimRegion::new(0), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn reads_see_every_kind_of_store() {
        let r = SimRegion::new(300).unwrap();
        r.write(PmOff(60), b"abcdefgh").unwrap();
        r.write_nt(PmOff(100), b"xyz").unwrap();
        r.fill_nt(PmOff(250), 50, 7).unwrap();
        r.store_u64(PmOff(16), 0x1122).unwrap();
        assert_eq!(r.cas_u64(PmOff(16), 0x1122, 5).unwrap(), Ok(0x1122));
        assert_eq!(r.cas_u64(PmOff(16), 0x1122, 6).unwrap(), Err(5));
        assert_eq!(r.load_u64(PmOff(16)).unwrap(), 5);
        let img = r.image();
        assert_eq!(img.len(), 300);
        assert_eq!(&img[60..68], b"abcdefgh");
        assert_eq!(&img[100..103], b"xyz");
        assert!(img[250..].iter().all(|&b| b == 7));
        let mut b = [0u8; 8];
        r.read(PmOff(60), &mut b).unwrap();
        assert_eq!(&b, b"abcdefgh");
    }

    #[test]
    fn durability_follows_flush_and_fence() {
        let r = SimRegion::new(256).unwrap();
        r.write(PmOff(0), &[1; 8]).unwrap();
        r.write(PmOff(64), &[2; 8]).unwrap();
        r.write_nt(PmOff(128), &[3; 8]).unwrap();
        assert_eq!(r.durable_image(), vec![0; 256]);
        assert_eq!(r.pending_lines(), 3);
        r.flush(PmOff(0), 8).unwrap();
        r.write(PmOff(4), &[9; 2]).unwrap();
        r.fence();
        let d = r.durable_image();
        assert_eq!(&d[0..8], &[1; 8], "flush-time content is durable");
        assert_eq!(&d[64..72], &[0; 8], "never flushed");
        assert_eq!(&d[128..136], &[3; 8], "non-temporal store fenced");
        assert_eq!(r.pending_lines(), 2);
        r.persist(PmOff(0), 128).unwrap();
        assert_eq!(r.pending_lines(), 0);
        assert_eq!(r.durable_image(), r.image());
    }

    #[test]
    fn from_image_and_persist_all_count_as_durable() {
        let r = SimRegion::from_image(&[5; 100]).unwrap();
        assert_eq!(r.durable_image(), vec![5; 100]);
        r.write(PmOff(3), &[1]).unwrap();
        assert_eq!(r.durable_image(), vec![5; 100]);
        r.persist_all();
        assert_eq!(r.durable_image(), r.image());
    }

    #[test]
    fn eadr_stores_are_durable_at_once_but_nt_stores_need_a_fence() {
        let r = SimRegion::new_eadr(128).unwrap();
        assert!(!r.needs_flush());
        r.write(PmOff(0), &[1; 8]).unwrap();
        r.store_u64(PmOff(8), 2).unwrap();
        assert_eq!(r.pending_lines(), 0);
        r.write_nt(PmOff(64), &[3; 8]).unwrap();
        assert_eq!(&r.durable_image()[64..72], &[0; 8]);
        r.fence();
        assert_eq!(r.durable_image(), r.image());
    }
}
