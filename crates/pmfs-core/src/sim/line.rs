//! Per-cache-line durability tracking: the store log of one line that is not yet known to be
//! on media, and the contents a crash may leave in it.

use std::collections::HashSet;

/// Bytes in a cache line, the unit of write-back.
pub(crate) const LINE: usize = 64;
/// Bytes in a word, the unit of failure atomicity.
const WORD: usize = 8;

/// The content of one cache line.
pub(crate) type LineBytes = [u8; LINE];

/// One store to one 8-byte word of a line (a wider store is split into one event per word).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Event {
    /// Index of the word inside the line (0..8).
    word: u8,
    /// Bit `i` set: byte `i` of the word was written.
    mask: u8,
    /// A non-temporal store: guaranteed durable by the next fence, flush or not.
    nt: bool,
    /// Guaranteed durable now, whatever happens to the events before it.
    forced: bool,
    /// The written bytes (only those selected by `mask` are meaningful).
    val: [u8; WORD],
}

impl Event {
    /// An event writing `bytes` at byte `at` of word `word` (`at + bytes.len() <= 8`).
    pub(crate) fn new(word: usize, at: usize, bytes: &[u8], nt: bool, forced: bool) -> Self {
        debug_assert!(word < LINE / WORD && at + bytes.len() <= WORD && !bytes.is_empty());
        let mut val = [0u8; WORD];
        val[at..at + bytes.len()].copy_from_slice(bytes);
        let mask = (((1u16 << bytes.len()) - 1) << at) as u8;
        Self {
            word: word as u8,
            mask,
            nt,
            forced,
            val,
        }
    }

    fn apply(&self, line: &mut LineBytes) {
        let w = usize::from(self.word) * WORD;
        let word: &mut [u8; WORD] = (&mut line[w..w + WORD])
            .try_into()
            .expect("a word lies inside its line");
        // Byte `i` of the mask selects byte `i` of the value (all little-endian).
        let keep = u64::from_le_bytes(std::array::from_fn::<u8, WORD, _>(|i| {
            0xff * (self.mask >> i & 1)
        }));
        let old = u64::from_le_bytes(*word);
        let new = u64::from_le_bytes(self.val);
        *word = (old & !keep | new & keep).to_le_bytes();
    }
}

/// The history of a line whose media content may differ from what the program sees.
///
/// `base` is guaranteed to have reached media (together with every `forced` event); `events`
/// are the word stores since, in program order. With `c(p)` = `base` + `events[..p]`, the line
/// content right after the `p`-th store, a crash now leaves on media one of
/// `c(p)` + the forced events in `events[p..]`, for `p` in `0..=events.len()`:
/// the last write-back of the line (an eviction or a flush) took a snapshot `c(p)`, and every
/// store the hardware guarantees (fenced non-temporal stores, every store under eADR) landed
/// no matter when.
#[derive(Clone, Debug)]
pub(crate) struct LineLog {
    base: LineBytes,
    events: Vec<Event>,
    /// `Some(f)`: the line was flushed after `events[..f]` and no fence followed yet, so at the
    /// next fence `c(f)` (or a later snapshot) is guaranteed on media.
    flushed: Option<usize>,
    /// Non-temporal stores in `events` not yet fenced.
    unfenced_nt: usize,
    /// Whether the region's fence queue holds this line (see [`LineLog::awaits_fence`]).
    pub(crate) queued: bool,
    /// Log length at which [`LineLog::compact`] runs next.
    compact_at: usize,
}

/// Log length beyond which runs of stores overwriting the same word are merged.
pub(crate) const COMPACT_THRESHOLD: usize = 256;

impl LineLog {
    /// A log for a line whose durable content is `base` (the content before the first event).
    pub(crate) fn new(base: LineBytes) -> Self {
        Self {
            base,
            events: Vec::new(),
            flushed: None,
            unfenced_nt: 0,
            queued: false,
            compact_at: COMPACT_THRESHOLD,
        }
    }

    /// Appends a store. Returns `true` if the line is clean afterwards (only possible for a
    /// forced store to a line without other pending stores).
    pub(crate) fn push(&mut self, e: Event) -> bool {
        self.unfenced_nt += usize::from(e.nt && !e.forced);
        self.events.push(e);
        self.fold_forced_head();
        if self.events.len() >= self.compact_at {
            self.compact();
            self.compact_at = COMPACT_THRESHOLD.max(2 * self.events.len());
        }
        self.events.is_empty()
    }

    /// Whether the next fence changes the line: it was flushed or holds non-temporal stores
    /// since the last fence. A fence leaves every other line as it is.
    pub(crate) fn awaits_fence(&self) -> bool {
        self.flushed.is_some() || self.unfenced_nt > 0
    }

    /// Whether media surely equals the program's view (no store pending).
    pub(crate) fn is_clean(&self) -> bool {
        self.events.is_empty()
    }

    /// Records a flush (clwb/clflushopt) of the line: its content now is durable at the next
    /// fence.
    pub(crate) fn flush(&mut self) {
        self.flushed = Some(self.events.len());
    }

    /// Applies a fence: pending non-temporal stores and the last flushed snapshot become
    /// durable. Returns `true` if the line is clean (media equals the program's view).
    pub(crate) fn fence(&mut self) -> bool {
        self.unfenced_nt = 0;
        let mut any_forced = false;
        for e in &mut self.events {
            e.forced |= e.nt;
            any_forced |= e.forced;
        }
        if any_forced {
            self.drop_overwritten();
        }
        if let Some(f) = self.flushed.take() {
            self.fold(f);
        }
        self.fold_forced_head();
        self.events.is_empty()
    }

    /// Number of stores not yet folded into `base`.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.events.len()
    }

    /// The content a crash leaves if no write-back happened since `base`: the minimum.
    pub(crate) fn durable(&self) -> LineBytes {
        let mut line = self.base;
        for e in self.events.iter().filter(|e| e.forced) {
            e.apply(&mut line);
        }
        line
    }

    /// The content the program sees now: the maximum.
    pub(crate) fn latest(&self) -> LineBytes {
        let mut line = self.base;
        for e in &self.events {
            e.apply(&mut line);
        }
        line
    }

    /// The distinct contents a crash may leave and the index of the latest one among them;
    /// the first is the durable content. With `prefixes` every store prefix counts (`c(p)`
    /// plus later forced stores, for every `p`); without, only the durable and the latest
    /// content.
    pub(crate) fn choices(&self, prefixes: bool) -> (Vec<LineBytes>, usize) {
        let durable = self.durable();
        let latest = self.latest();
        if !prefixes {
            return if durable == latest {
                (vec![latest], 0)
            } else {
                (vec![durable, latest], 1)
            };
        }
        let forced: Vec<usize> = self
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.forced)
            .map(|(i, _)| i)
            .collect();
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        let mut prefix = self.base;
        for p in 0..=self.events.len() {
            if p > 0 {
                self.events[p - 1].apply(&mut prefix);
            }
            let mut c = prefix;
            for &i in forced.iter().filter(|&&i| i >= p) {
                self.events[i].apply(&mut c);
            }
            if seen.insert(c) {
                out.push(c);
            }
        }
        let at = out.iter().position(|c| *c == latest).unwrap_or(0);
        (out, at)
    }

    /// Folds the first `n` events into `base`.
    fn fold(&mut self, n: usize) {
        for e in self.events.drain(..n) {
            e.apply(&mut self.base);
        }
        self.flushed = self.flushed.map(|f| f.saturating_sub(n));
    }

    /// Drops unforced events whose bytes a later forced event of the same word overwrites:
    /// whatever snapshot a crash keeps, the forced event lands on top of them.
    fn drop_overwritten(&mut self) {
        let mut keep = vec![true; self.events.len()];
        for (i, later) in self.events.iter().enumerate().filter(|(_, e)| e.forced) {
            for (j, e) in self.events[..i].iter().enumerate() {
                if !e.forced && e.word == later.word && e.mask & !later.mask == 0 {
                    keep[j] = false;
                }
            }
        }
        self.retain(&keep);
    }

    /// Keeps the events whose `keep` entry is set, moving the flush point along.
    fn retain(&mut self, keep: &[bool]) {
        let mut idx = 0;
        self.events.retain(|_| {
            idx += 1;
            keep[idx - 1]
        });
        self.flushed = self
            .flushed
            .map(|f| keep[..f].iter().filter(|&&k| k).count());
    }

    /// Bounds the log of a line stored to over and over without a write-back (a counter kept
    /// in PM but never flushed): drops every ordinary store that the very next store
    /// overwrites (same word, a superset of its bytes), unless a flush lies between the two.
    /// This forgets only the states right between such two stores; every state that remains
    /// is one the line really had, so no illegal image appears.
    fn compact(&mut self) {
        let f = self.flushed;
        let n = self.events.len();
        let mut keep = vec![true; n];
        for i in 1..n {
            let (prev, next) = (&self.events[i - 1], &self.events[i]);
            let mergeable = !prev.nt
                && !prev.forced
                && !next.forced
                && prev.word == next.word
                && prev.mask & !next.mask == 0
                && f != Some(i);
            keep[i - 1] = !mergeable;
        }
        self.retain(&keep);
    }

    /// Folds leading forced events: a snapshot before them can no longer be on media.
    fn fold_forced_head(&mut self) {
        let n = self.events.iter().take_while(|e| e.forced).count();
        if n > 0 {
            self.fold(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(b: u8) -> LineBytes {
        [b; LINE]
    }

    fn with(mut l: LineBytes, at: usize, bytes: &[u8]) -> LineBytes {
        l[at..at + bytes.len()].copy_from_slice(bytes);
        l
    }

    fn store(log: &mut LineLog, word: usize, val: u64, nt: bool) -> bool {
        log.push(Event::new(word, 0, &val.to_le_bytes(), nt, false))
    }

    #[test]
    fn event_mask_covers_only_written_bytes() {
        let e = Event::new(1, 3, &[9, 9], false, false);
        let mut l = line(0);
        e.apply(&mut l);
        assert_eq!(l, with(line(0), 11, &[9, 9]));
    }

    #[test]
    fn unflushed_store_stays_pending_across_fences() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 0, 7, false);
        assert!(!log.fence());
        assert_eq!(log.durable(), line(0));
        assert_eq!(log.choices(false), (vec![line(0), log.latest()], 1));
    }

    #[test]
    fn flush_then_fence_makes_flush_time_snapshot_durable() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 0, 1, false);
        log.flush();
        store(&mut log, 1, 2, false);
        assert!(!log.fence());
        let after_first = with(line(0), 0, &1u64.to_le_bytes());
        assert_eq!(log.durable(), after_first);
        assert_eq!(log.pending(), 1);
        log.flush();
        assert!(log.fence());
    }

    #[test]
    fn flush_without_fence_guarantees_nothing() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 0, 1, false);
        log.flush();
        assert_eq!(log.durable(), line(0));
    }

    #[test]
    fn nt_store_is_durable_at_fence_without_flush() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 2, 5, true);
        assert_eq!(log.durable(), line(0));
        assert!(log.fence());
    }

    #[test]
    fn fenced_nt_store_does_not_drag_earlier_cached_stores() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 0, 1, false);
        store(&mut log, 1, 2, true);
        assert!(!log.fence());
        let nt_only = with(line(0), 8, &2u64.to_le_bytes());
        assert_eq!(log.durable(), nt_only);
        assert_eq!(log.choices(true), (vec![nt_only, log.latest()], 1));
    }

    #[test]
    fn store_overwritten_by_fenced_nt_store_is_forgotten() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 0, 1, false);
        store(&mut log, 1, 9, false);
        log.flush();
        store(&mut log, 0, 2, true);
        assert!(log.fence());
        assert_eq!(log.durable(), log.latest());
    }

    #[test]
    fn later_nt_store_wins_over_earlier_cached_store_of_same_word() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 0, 1, false);
        store(&mut log, 0, 2, true);
        assert!(log.fence());
    }

    #[test]
    fn prefixes_enumerate_every_store_prefix() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 0, 1, false);
        store(&mut log, 1, 2, false);
        store(&mut log, 0, 3, false);
        let (c, latest) = log.choices(true);
        assert_eq!((c.len(), latest), (4, 3));
        assert_eq!(c[0], line(0));
        assert_eq!(c[1], with(line(0), 0, &1u64.to_le_bytes()));
        assert_eq!(c[3], log.latest());
        assert_eq!(log.choices(false).0.len(), 2);
    }

    #[test]
    fn prefixes_deduplicate_equal_contents() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 0, 1, false);
        store(&mut log, 0, 0, false);
        let once = with(line(0), 0, &1u64.to_le_bytes());
        assert_eq!(log.choices(false), (vec![line(0)], 0));
        assert_eq!(log.choices(true), (vec![line(0), once], 0));
        store(&mut log, 1, 4, false);
        assert_eq!(log.choices(true).0.len(), 3);
    }

    #[test]
    fn hot_word_log_is_compacted_to_real_states() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 1, 77, false);
        log.flush();
        for v in 1..=1000u64 {
            store(&mut log, 0, v, false);
        }
        assert!(log.pending() < COMPACT_THRESHOLD, "{}", log.pending());
        let (c, latest) = log.choices(true);
        // Every state is one the line really had: word 0 holds a counter value.
        let w0 = |l: &LineBytes| u64::from_le_bytes(l[..8].try_into().unwrap());
        assert_eq!(w0(&c[latest]), 1000);
        assert!(c.iter().all(|l| w0(l) <= 1000));
        // The flush point survives compaction: the fence makes word 1 durable, not word 0.
        assert!(!log.fence());
        assert_eq!(log.durable(), with(line(0), 8, &77u64.to_le_bytes()));
    }

    #[test]
    fn only_flushed_or_nt_lines_await_the_fence() {
        let mut log = LineLog::new(line(0));
        store(&mut log, 0, 1, false);
        assert!(!log.awaits_fence());
        store(&mut log, 1, 1, true);
        assert!(log.awaits_fence());
        log.fence();
        assert!(!log.awaits_fence());
        log.flush();
        assert!(log.awaits_fence());
    }

    #[test]
    fn forced_store_on_clean_line_folds_at_once() {
        let mut log = LineLog::new(line(0));
        assert!(log.push(Event::new(0, 0, &[1], false, true)));
        assert_eq!(log.latest(), with(line(0), 0, &[1]));
    }
}
