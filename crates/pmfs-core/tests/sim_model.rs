//! The simulator's crash states agree with a brute-force model of x86 persistence written
//! from the definition: at a crash, each line holds its cache content at some moment `t` no
//! earlier than its last fenced flush, plus every store guaranteed durable after `t`
//! (fenced non-temporal stores; every store under eADR). With store prefixes and no sampling
//! the explorer offers exactly these states (while logs stay short enough not to be
//! compacted); without prefixes, when sampling or after compaction a subset of them; and the
//! program's view always matches.

use std::cell::RefCell;
use std::collections::BTreeSet;

use pmfs_core::layout::PmOff;
use pmfs_core::pm::Media;
use pmfs_core::sim::{CrashPoint, Explorer, SimRegion};
use proptest::prelude::*;

const LINES: usize = 4;
const SIZE: usize = LINES * 64;

#[derive(Clone, Debug)]
enum Op {
    Write {
        off: usize,
        len: usize,
        val: u8,
        nt: bool,
    },
    Store {
        word: usize,
        val: u64,
    },
    Flush {
        off: usize,
        len: usize,
    },
    Fence,
    /// `count` stores of increasing values to one word (a hot counter).
    Burst {
        word: usize,
        count: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..SIZE, 1..=16usize, any::<u8>(), any::<bool>())
            .prop_map(|(off, len, val, nt)| Op::Write { off, len: len.min(SIZE - off), val, nt }),
        2 => (0..SIZE / 8, any::<u64>()).prop_map(|(word, val)| Op::Store { word, val }),
        2 => (0..SIZE, 1..=128usize)
            .prop_map(|(off, len)| Op::Flush { off, len: len.min(SIZE - off) }),
        2 => Just(Op::Fence),
    ]
}

/// [`op`] plus long bursts of stores to one word, which make the simulator compact its logs
/// (forgetting some intermediate states, so only legality can be checked).
fn op_with_bursts() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => op(),
        1 => (0..SIZE / 8, 260..400u64).prop_map(|(word, count)| Op::Burst { word, count }),
    ]
}

/// One word-sized piece of a store, as the hardware performs it.
#[derive(Clone, Debug)]
struct Piece {
    at: usize,
    bytes: Vec<u8>,
    nt: bool,
}

/// The history of one line since the start of the run.
#[derive(Clone, Debug, Default)]
struct History {
    /// Content after each piece; `snaps[0]` is the content at the start.
    snaps: Vec<[u8; 64]>,
    /// `pieces[i]` produced `snaps[i + 1]`.
    pieces: Vec<Piece>,
    /// The content at the last fenced flush (or the start) is the earliest possible state.
    t_min: usize,
    /// Pieces count at the last flush not yet fenced.
    flushed: Option<usize>,
    /// Pieces count at the last fence.
    fenced: usize,
}

#[derive(Debug)]
struct Model {
    eadr: bool,
    lines: Vec<History>,
}

impl Model {
    fn new(eadr: bool) -> Model {
        let h = History {
            snaps: vec![[0; 64]],
            ..History::default()
        };
        Model {
            eadr,
            lines: vec![h; LINES],
        }
    }

    /// A store of `bytes` at `off`, cut into aligned words.
    fn store(&mut self, off: usize, bytes: &[u8], nt: bool) {
        let mut pos = off;
        while pos < off + bytes.len() {
            let end = (off + bytes.len()).min((pos / 8 + 1) * 8);
            let h = &mut self.lines[pos / 64];
            let mut snap = *h.snaps.last().unwrap();
            let at = pos % 64;
            snap[at..at + end - pos].copy_from_slice(&bytes[pos - off..end - off]);
            h.snaps.push(snap);
            h.pieces.push(Piece {
                at,
                bytes: bytes[pos - off..end - off].to_vec(),
                nt,
            });
            pos = end;
        }
    }

    fn flush(&mut self, off: usize, len: usize) {
        for h in &mut self.lines[off / 64..=(off + len - 1) / 64] {
            h.flushed = Some(h.pieces.len());
        }
    }

    fn fence(&mut self) {
        for h in &mut self.lines {
            if let Some(f) = h.flushed.take() {
                h.t_min = h.t_min.max(f);
            }
            h.fenced = h.pieces.len();
        }
    }

    /// Every state a crash now may leave line `l` in.
    fn allowed(&self, l: usize) -> BTreeSet<[u8; 64]> {
        let h = &self.lines[l];
        let guaranteed = |i: usize, p: &Piece| if p.nt { i < h.fenced } else { self.eadr };
        (h.t_min..=h.pieces.len())
            .map(|t| {
                let mut c = h.snaps[t];
                for (i, p) in h.pieces.iter().enumerate().skip(t) {
                    if guaranteed(i, p) {
                        c[p.at..p.at + p.bytes.len()].copy_from_slice(&p.bytes);
                    }
                }
                c
            })
            .collect()
    }

    fn view(&self) -> Vec<u8> {
        self.lines
            .iter()
            .flat_map(|h| *h.snaps.last().unwrap())
            .collect()
    }
}

fn line(image: &[u8], l: usize) -> [u8; 64] {
    image[l * 64..(l + 1) * 64].try_into().unwrap()
}

/// The states one crash point offered per line, and those the model allowed there.
struct PointStates {
    key: (u64, bool),
    allowed: Vec<BTreeSet<[u8; 64]>>,
    seen: Vec<BTreeSet<[u8; 64]>>,
}

/// Runs `ops` and compares every crash image with the model. With `complete`, also checks
/// that each crash point offers every state the model allows.
fn check_against_model(ops: &[Op], eadr: bool, explorer: &Explorer, complete: bool) {
    let region = if eadr {
        SimRegion::new_eadr(SIZE as u64).unwrap()
    } else {
        SimRegion::new(SIZE as u64).unwrap()
    };
    let model = RefCell::new(Model::new(eadr));
    let points: RefCell<Vec<PointStates>> = RefCell::new(Vec::new());
    let check = |cp: &CrashPoint<'_>| {
        let m = model.borrow();
        let mut points = points.borrow_mut();
        let key = (cp.fence, cp.end);
        if points.last().is_none_or(|p| p.key != key) {
            points.push(PointStates {
                key,
                allowed: (0..LINES).map(|l| m.allowed(l)).collect(),
                seen: vec![BTreeSet::new(); LINES],
            });
        }
        let p = points.last_mut().unwrap();
        for l in 0..LINES {
            let c = line(cp.image, l);
            if !p.allowed[l].contains(&c) {
                return Err(format!("line {l} in a state the model forbids: {c:?}"));
            }
            p.seen[l].insert(c);
        }
        Ok(())
    };
    let result = explorer.run(
        &region,
        |pm| {
            for op in ops {
                match *op {
                    Op::Write { off, len, val, nt } => {
                        let bytes: Vec<u8> = (0..len).map(|i| val.wrapping_add(i as u8)).collect();
                        if nt {
                            pm.write_nt(PmOff(off as u64), &bytes).unwrap();
                        } else {
                            pm.write(PmOff(off as u64), &bytes).unwrap();
                        }
                        model.borrow_mut().store(off, &bytes, nt);
                    }
                    Op::Store { word, val } => {
                        pm.store_u64(PmOff(word as u64 * 8), val).unwrap();
                        model
                            .borrow_mut()
                            .store(word * 8, &val.to_le_bytes(), false);
                    }
                    Op::Flush { off, len } => {
                        pm.flush(PmOff(off as u64), len as u64).unwrap();
                        model.borrow_mut().flush(off, len);
                    }
                    Op::Fence => {
                        pm.fence();
                        model.borrow_mut().fence();
                    }
                    Op::Burst { word, count } => {
                        for val in 1..=count {
                            pm.store_u64(PmOff(word as u64 * 8), val).unwrap();
                            model
                                .borrow_mut()
                                .store(word * 8, &val.to_le_bytes(), false);
                        }
                    }
                }
            }
        },
        check,
    );
    if let Err(f) = result {
        panic!("{f}");
    }
    let points = points.into_inner();
    let fences = ops.iter().filter(|o| matches!(o, Op::Fence)).count();
    assert_eq!(
        points.len(),
        fences + 1,
        "one crash point per fence and the end"
    );
    if complete {
        for p in &points {
            assert_eq!(p.seen, p.allowed, "crash point {:?}", p.key);
        }
    }
    let m = model.borrow();
    assert_eq!(region.image(), m.view());
    let durable = region.durable_image();
    for l in 0..LINES {
        assert!(
            m.allowed(l).contains(&line(&durable, l)),
            "durable line {l}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
    ))]

    #[test]
    fn store_prefix_states_are_exactly_the_legal_states(
        ops in prop::collection::vec(op(), 1..14),
        eadr in any::<bool>(),
    ) {
        let e = Explorer::new(0).store_prefixes(true).exhaustive_limit(1 << 16);
        check_against_model(&ops, eadr, &e, true);
    }

    #[test]
    fn whole_line_and_sampled_states_are_legal(
        ops in prop::collection::vec(op_with_bursts(), 1..24),
        eadr in any::<bool>(),
        prefixes in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let e = Explorer::new(seed).store_prefixes(prefixes).exhaustive_limit(4).samples(8);
        check_against_model(&ops, eadr, &e, false);
    }
}
