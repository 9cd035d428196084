//! The effect of a file's undigested log entries, kept in DRAM (MadFS §4.2's block table,
//! restricted to what the volume's mapping structure does not show yet).
//!
//! A regular file's truth is the mapping structure plus the inode's size word (the *digested*
//! state) plus the log entries that are not digested yet. An [`Overlay`] folds those entries,
//! in log order, into:
//!
//! - an interval map from logical block to `Some(pblk)` (remapped by a write) or `None` (a
//!   hole: punched, or cut by a truncation and not written since), holding for each block only
//!   the latest entry that touched it, with that entry's LSN;
//! - the *truncate floor*: the lowest first-cut block of the undigested truncations. A block at
//!   or above it that the interval map does not name is a hole, whatever the mapping says;
//! - the size, as a function of the digested size: `Exact(s)` once a truncation (or a resize)
//!   was folded, `AtLeast(x)` before that.
//!
//! Pruning below the digested LSN drops what the mapping already shows. The size summary needs
//! no pruning: applied to the size after *any* prefix of the folded entries it gives the same
//! result (`max` is idempotent and a truncation's exact size absorbs everything before it).

use std::collections::BTreeMap;

use pmfs_core::layout::BLOCK_SIZE;
use pmfs_core::log::Entry;

/// What the overlay says about a range of logical blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Src {
    /// Remapped to these physical blocks (`pblk` of the range's first block).
    Mapped(u64),
    /// A hole.
    Hole,
    /// Not touched by an undigested entry: ask the mapping structure.
    Base,
}

/// A range of logical blocks and its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub lblk: u64,
    pub len: u64,
    pub src: Src,
}

/// One interval of the map: `len` blocks from the key, remapped (`Some(pblk)`) or a hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    len: u64,
    pblk: Option<u64>,
    lsn: u64,
}

/// The size after the folded entries, relative to the digested size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Size {
    AtLeast(u64),
    Exact(u64),
}

/// The folded effect of undigested entries (see the module documentation).
#[derive(Clone, Debug)]
pub(crate) struct Overlay {
    spans: BTreeMap<u64, Span>,
    /// Undigested truncations: `(lsn, first cut block)`.
    truncs: Vec<(u64, u64)>,
    size: Size,
    /// LSN of the next entry to fold.
    next: u64,
    /// Every entry folded in has an LSN of at least this one or was dropped by the last
    /// [`prune`](Overlay::prune) (the lower of its digested LSN and `next` then): a prune to
    /// an LSN not above it has nothing to drop.
    pruned: u64,
}

impl Overlay {
    /// An empty overlay whose next entry is `lsn`.
    pub fn new(lsn: u64) -> Overlay {
        Overlay {
            spans: BTreeMap::new(),
            truncs: Vec::new(),
            size: Size::AtLeast(0),
            next: lsn,
            pruned: 0,
        }
    }

    /// The LSN of the next entry to fold.
    pub fn next_lsn(&self) -> u64 {
        self.next
    }

    /// Notes that every entry below `lsn` is folded (a replay reached that tail; reserved
    /// slots carry no entry).
    pub fn advance_to(&mut self, lsn: u64) {
        self.next = self.next.max(lsn);
    }

    /// Whether no undigested entry is folded in.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty() && self.truncs.is_empty() && self.size == Size::AtLeast(0)
    }

    /// The size, given the digested size word.
    pub fn size(&self, digested: u64) -> u64 {
        match self.size {
            Size::AtLeast(x) => digested.max(x),
            Size::Exact(s) => s,
        }
    }

    /// The lowest truncate floor, if any undigested truncation is folded in.
    fn floor(&self) -> Option<u64> {
        self.truncs.iter().map(|&(_, f)| f).min()
    }

    /// Cuts `[lblk, end)` out of the interval map.
    fn cut(&mut self, lblk: u64, end: u64) {
        if lblk >= end {
            return;
        }
        // A span starting before `lblk` that reaches into the range.
        if let Some((&s, &sp)) = self.spans.range(..lblk).next_back()
            && s + sp.len > lblk
        {
            self.spans.insert(
                s,
                Span {
                    len: lblk - s,
                    ..sp
                },
            );
            if s + sp.len > end {
                self.spans.insert(
                    end,
                    Span {
                        len: s + sp.len - end,
                        pblk: sp.pblk.map(|p| p + (end - s)),
                        lsn: sp.lsn,
                    },
                );
            }
        }
        let inside: Vec<u64> = self.spans.range(lblk..end).map(|(&k, _)| k).collect();
        for k in inside {
            let Some(sp) = self.spans.remove(&k) else {
                continue;
            };
            if k + sp.len > end {
                self.spans.insert(
                    end,
                    Span {
                        len: k + sp.len - end,
                        pblk: sp.pblk.map(|p| p + (end - k)),
                        lsn: sp.lsn,
                    },
                );
            }
        }
    }

    fn set(&mut self, lblk: u64, len: u64, pblk: Option<u64>, lsn: u64) {
        if len == 0 {
            return;
        }
        self.cut(lblk, lblk + len);
        self.spans.insert(lblk, Span { len, pblk, lsn });
    }

    /// Folds the entry at `lsn` (which must be [`next_lsn`](Overlay::next_lsn) or later;
    /// earlier ones are ignored, so replaying an overlap is harmless).
    pub fn apply(&mut self, lsn: u64, e: &Entry) {
        if lsn < self.next {
            return;
        }
        self.next = lsn + 1;
        match e {
            Entry::Write { runs, extend_to } => {
                // Runs that continue each other logically (a HashFS write has one per block)
                // are cut out of the map together, then inserted.
                let mut i = 0;
                while i < runs.len() {
                    let mut end = runs[i].lblk + runs[i].len;
                    let mut j = i + 1;
                    while j < runs.len() && runs[j].lblk == end {
                        end += runs[j].len;
                        j += 1;
                    }
                    self.cut(runs[i].lblk, end);
                    for r in runs[i..j].iter().filter(|r| r.len > 0) {
                        let span = Span {
                            len: r.len,
                            pblk: Some(r.pblk.0),
                            lsn,
                        };
                        self.spans.insert(r.lblk, span);
                    }
                    i = j;
                }
                self.size = match self.size {
                    Size::AtLeast(x) => Size::AtLeast(x.max(*extend_to)),
                    Size::Exact(s) => Size::Exact(s.max(*extend_to)),
                };
            }
            Entry::Truncate { size } => {
                let floor = size.div_ceil(BLOCK_SIZE);
                self.cut(floor, u64::MAX);
                self.truncs.push((lsn, floor));
                self.size = Size::Exact(*size);
            }
            Entry::Resize { size } => self.size = Size::Exact(*size),
            Entry::Punch { lblk, len } => {
                self.set(*lblk, *len, None, lsn);
            }
        }
    }

    /// Drops everything the mapping shows once every entry below `digested` is applied.
    pub fn prune(&mut self, digested: u64) {
        if digested <= self.pruned {
            return;
        }
        self.pruned = digested.min(self.next);
        if digested >= self.next {
            // Every folded entry is applied (the common case after a digest): clearing is
            // much cheaper than dropping spans one at a time. The digested size is the size.
            self.spans.clear();
            self.truncs.clear();
            self.size = Size::AtLeast(0);
            return;
        }
        self.spans.retain(|_, sp| sp.lsn >= digested);
        self.truncs.retain(|&(lsn, _)| lsn >= digested);
    }

    /// Describes `[lblk, lblk + len)` as consecutive pieces, appended to `out`.
    pub fn lookup(&self, lblk: u64, len: u64, out: &mut Vec<Piece>) {
        let end = lblk.saturating_add(len);
        let floor = self.floor().unwrap_or(u64::MAX);
        let mut at = lblk;
        let push = |out: &mut Vec<Piece>, s: u64, e: u64, src: Src| {
            if s >= e {
                return;
            }
            // Untouched blocks at or above the floor are holes.
            if src == Src::Base && e > floor {
                if s < floor {
                    out.push(Piece {
                        lblk: s,
                        len: floor - s,
                        src,
                    });
                }
                let h = s.max(floor);
                out.push(Piece {
                    lblk: h,
                    len: e - h,
                    src: Src::Hole,
                });
            } else {
                out.push(Piece {
                    lblk: s,
                    len: e - s,
                    src,
                });
            }
        };
        let before = self
            .spans
            .range(..lblk)
            .next_back()
            .filter(|(s, sp)| *s + sp.len > lblk)
            .map(|(&s, &sp)| (s, sp));
        let iter = before
            .into_iter()
            .chain(self.spans.range(lblk..end).map(|(&s, &sp)| (s, sp)));
        for (s, sp) in iter {
            push(out, at, s.max(at), Src::Base);
            let ps = s.max(at);
            let pe = (s + sp.len).min(end);
            let src = match sp.pblk {
                Some(p) => Src::Mapped(p + (ps - s)),
                None => Src::Hole,
            };
            push(out, ps, pe, src);
            at = pe;
        }
        push(out, at, end, Src::Base);
    }
}

/// Whether entry `e` changes what logical block `lblk` reads (its block, or by a size change
/// the zeros past end of file inside it).
pub(crate) fn touches(e: &Entry, lblk: u64) -> bool {
    touches_range(e, lblk, 1)
}

/// Whether entry `e` changes what any logical block of `[lblk, lblk + len)` reads.
pub(crate) fn touches_range(e: &Entry, lblk: u64, len: u64) -> bool {
    let end = lblk.saturating_add(len);
    let overlaps = |s: u64, l: u64| s < end && lblk < s.saturating_add(l);
    match e {
        Entry::Write { runs, .. } => runs.iter().any(|r| overlaps(r.lblk, r.len)),
        Entry::Truncate { size } | Entry::Resize { size } => end > size / BLOCK_SIZE,
        Entry::Punch { lblk: s, len } => overlaps(*s, *len),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use pmfs_core::layout::BlockNo;
    use pmfs_core::traits::Run;
    use proptest::prelude::*;

    use super::*;

    const SPACE: u64 = 40;

    /// Per-block model: what the base says is `Base`, entries overwrite.
    #[derive(Default)]
    struct Model {
        blocks: HashMap<u64, Option<u64>>,
        floor: Option<u64>,
        size: Option<u64>,
        grow: u64,
    }

    impl Model {
        fn apply(&mut self, e: &Entry) {
            match e {
                Entry::Write { runs, extend_to } => {
                    for r in runs {
                        for i in 0..r.len {
                            self.blocks.insert(r.lblk + i, Some(r.pblk.0 + i));
                        }
                    }
                    match &mut self.size {
                        Some(s) => *s = (*s).max(*extend_to),
                        None => self.grow = self.grow.max(*extend_to),
                    }
                }
                Entry::Truncate { size } => {
                    let f = size.div_ceil(BLOCK_SIZE);
                    self.blocks.retain(|&b, _| b < f);
                    self.floor = Some(self.floor.map_or(f, |x| x.min(f)));
                    self.size = Some(*size);
                }
                Entry::Resize { size } => self.size = Some(*size),
                Entry::Punch { lblk, len } => {
                    for b in *lblk..lblk + len {
                        self.blocks.insert(b, None);
                    }
                }
            }
        }

        fn src(&self, b: u64) -> Src {
            match self.blocks.get(&b) {
                Some(Some(p)) => Src::Mapped(*p),
                Some(None) => Src::Hole,
                None if self.floor.is_some_and(|f| b >= f) => Src::Hole,
                None => Src::Base,
            }
        }
    }

    fn entry() -> impl Strategy<Value = Entry> {
        prop_oneof![
            4 => (0..SPACE, 1..6u64, 0..1000u64, 0..SPACE * BLOCK_SIZE).prop_map(
                |(l, n, p, x)| Entry::Write {
                    runs: smallvec::smallvec![Run { lblk: l, pblk: BlockNo(p * 100), len: n }],
                    extend_to: x,
                }
            ),
            // A write of several runs that continue each other logically (one per block on
            // HashFS), each somewhere else physically.
            2 => (0..SPACE, prop::collection::vec(1..4u64, 2..5), 0..1000u64, 0..SPACE * BLOCK_SIZE)
                .prop_map(|(l, lens, p, x)| {
                    let mut at = l;
                    let runs = lens
                        .iter()
                        .enumerate()
                        .map(|(i, &len)| {
                            let r = Run { lblk: at, pblk: BlockNo(p * 100 + 37 * i as u64), len };
                            at += len;
                            r
                        })
                        .collect();
                    Entry::Write { runs, extend_to: x }
                }),
            1 => (0..SPACE * BLOCK_SIZE).prop_map(|size| Entry::Truncate { size }),
            1 => (0..SPACE * BLOCK_SIZE).prop_map(|size| Entry::Resize { size }),
            1 => (0..SPACE, 1..8u64).prop_map(|(lblk, len)| Entry::Punch { lblk, len }),
        ]
    }

    fn per_block(o: &Overlay, from: u64, len: u64) -> Vec<Src> {
        let mut out = Vec::new();
        o.lookup(from, len, &mut out);
        let mut v = Vec::new();
        let mut at = from;
        for p in out {
            assert_eq!(p.lblk, at, "pieces are consecutive");
            assert!(p.len > 0);
            for i in 0..p.len {
                v.push(match p.src {
                    Src::Mapped(x) => Src::Mapped(x + i),
                    s => s,
                });
            }
            at += p.len;
        }
        assert_eq!(at, from + len);
        v
    }

    proptest! {
        #[test]
        fn overlay_matches_per_block_model(
            entries in prop::collection::vec(entry(), 0..30),
            base in 0..SPACE * BLOCK_SIZE,
            from in 0..SPACE,
            len in 1..SPACE,
        ) {
            let mut o = Overlay::new(7);
            let mut m = Model::default();
            for (i, e) in entries.iter().enumerate() {
                o.apply(7 + i as u64, e);
                m.apply(e);
            }
            let want: Vec<Src> = (from..from + len).map(|b| m.src(b)).collect();
            prop_assert_eq!(per_block(&o, from, len), want);
            let size = match m.size { Some(s) => s, None => base.max(m.grow) };
            prop_assert_eq!(o.size(base), size);
        }

        #[test]
        fn pruning_a_digested_prefix_keeps_the_view(
            entries in prop::collection::vec(entry(), 1..30),
            cut in 0usize..30,
            base in 0..SPACE * BLOCK_SIZE,
        ) {
            let cut = cut.min(entries.len());
            // Digested state: the base (mapping + size) after the first `cut` entries.
            let mut digested = Model::default();
            for e in &entries[..cut] {
                digested.apply(e);
            }
            let mut o = Overlay::new(0);
            let mut full = Model::default();
            for (i, e) in entries.iter().enumerate() {
                o.apply(i as u64, e);
                full.apply(e);
            }
            o.prune(cut as u64);
            let view = per_block(&o, 0, SPACE + 8);
            for (b, src) in (0..SPACE + 8).zip(view) {
                // A Base piece resolves through the digested mapping.
                let resolved = if src == Src::Base { digested.src(b) } else { src };
                prop_assert_eq!(resolved, full.src(b), "block {}", b);
            }
            let dsize = match digested.size { Some(s) => s, None => base.max(digested.grow) };
            let fsize = match full.size { Some(s) => s, None => base.max(full.grow) };
            prop_assert_eq!(o.size(dsize), fsize);
        }
    }

    proptest! {
        #[test]
        fn prunes_between_folds_keep_the_view(
            entries in prop::collection::vec(entry(), 1..30),
            steps in prop::collection::vec(0u64..4, 30),
            base in 0..SPACE * BLOCK_SIZE,
        ) {
            // The digest runs ahead of, level with or behind the fold, a prune after each
            // entry folded; pruning the same LSN twice must drop what was folded in between.
            let mut o = Overlay::new(0);
            let mut digested = 0u64;
            for (i, e) in entries.iter().enumerate() {
                o.apply(i as u64, e);
                digested = (digested + steps[i]).min(entries.len() as u64);
                o.prune(digested);
            }
            o.prune(digested);
            let cut = digested as usize;
            let mut dmodel = Model::default();
            for e in &entries[..cut] {
                dmodel.apply(e);
            }
            let mut full = Model::default();
            for e in &entries {
                full.apply(e);
            }
            for (b, src) in (0..SPACE + 8).zip(per_block(&o, 0, SPACE + 8)) {
                let resolved = if src == Src::Base { dmodel.src(b) } else { src };
                prop_assert_eq!(resolved, full.src(b), "block {}", b);
            }
            let dsize = match dmodel.size { Some(s) => s, None => base.max(dmodel.grow) };
            let fsize = match full.size { Some(s) => s, None => base.max(full.grow) };
            prop_assert_eq!(o.size(dsize), fsize);
        }
    }

    #[test]
    fn a_full_prune_empties_the_overlay() {
        let mut o = Overlay::new(0);
        o.apply(0, &Entry::write(3, BlockNo(50), 2, 5 * BLOCK_SIZE));
        o.apply(1, &Entry::Truncate { size: 100 });
        assert!(!o.is_empty());
        o.prune(2);
        assert!(o.is_empty());
        assert_eq!(o.size(100), 100);
    }

    #[test]
    fn touches_names_the_blocks_an_entry_changes() {
        let w = Entry::write(3, BlockNo(50), 2, 0);
        assert!(touches(&w, 4) && !touches(&w, 5) && !touches(&w, 2));
        let t = Entry::Truncate {
            size: BLOCK_SIZE + 1,
        };
        assert!(touches(&t, 1) && !touches(&t, 0));
        let p = Entry::Punch { lblk: 7, len: 1 };
        assert!(touches(&p, 7) && !touches(&p, 8));
    }
}
