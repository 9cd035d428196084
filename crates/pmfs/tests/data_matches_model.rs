//! A proptest state machine of the data path: writes, reads, truncates, `fallocate` (mode 0 and
//! `KEEP_SIZE`, also past end of file), hole punching, zeroing ranges (`ZERO_RANGE`, with and
//! without `KEEP_SIZE`) and SEEK_DATA/SEEK_HOLE on three files, against a byte-vector model of
//! each file plus a per-block model of which blocks are allocated, on all four mapping kinds.
//! Handles are reopened, the volume is remounted and reopened from a crash copy in the middle.
//! After every operation every file's size and contents equal the model, holes read as zeros,
//! and seeks agree with the block model; fsck is clean at the end. Honours `PROPTEST_CASES`
//! (default 24 sequences per mapping).

mod data_common;

use std::sync::Arc;

use pmfs::{MappingKind, OpenNode, SeekTarget, Volume};
use pmfs_core::pm::{HeapRegion, Media};
use proptest::prelude::*;

use data_common::model::Model;
use data_common::{BS, Config, KINDS, create, fsck_clean, image_of, open, sim_options};

const FILES: [&str; 3] = ["a", "b", "c"];
/// Offsets stay below this many blocks.
const SPAN: u64 = 20;

#[derive(Clone, Debug)]
enum Op {
    Write {
        f: usize,
        off: u64,
        len: u64,
        tag: u8,
    },
    Read {
        f: usize,
        off: u64,
        len: u64,
    },
    SetLen {
        f: usize,
        size: u64,
    },
    Allocate {
        f: usize,
        off: u64,
        len: u64,
        keep: bool,
    },
    Punch {
        f: usize,
        off: u64,
        len: u64,
    },
    ZeroRange {
        f: usize,
        off: u64,
        len: u64,
        keep: bool,
    },
    Seek {
        f: usize,
        off: u64,
    },
    Reopen {
        f: usize,
    },
    Remount,
    CrashRemount,
}

/// An offset: block-aligned, near a block edge, or anywhere.
fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0..SPAN).prop_map(|b| b * BS),
        (1..SPAN, 1..64u64).prop_map(|(b, d)| b * BS - d),
        0..SPAN * BS,
    ]
}

fn length() -> impl Strategy<Value = u64> {
    prop_oneof![(1..4u64).prop_map(|b| b * BS), 1..200u64, 1..4 * BS,]
}

fn op() -> impl Strategy<Value = Op> {
    let f = 0..FILES.len();
    prop_oneof![
        6 => (f.clone(), offset(), length(), any::<u8>())
            .prop_map(|(f, off, len, tag)| Op::Write { f, off, len, tag }),
        2 => (f.clone(), offset(), length()).prop_map(|(f, off, len)| Op::Read { f, off, len }),
        2 => (f.clone(), offset()).prop_map(|(f, size)| Op::SetLen { f, size }),
        2 => (f.clone(), offset(), length(), any::<bool>())
            .prop_map(|(f, off, len, keep)| Op::Allocate { f, off, len, keep }),
        2 => (f.clone(), offset(), length()).prop_map(|(f, off, len)| Op::Punch { f, off, len }),
        2 => (f.clone(), offset(), length(), any::<bool>())
            .prop_map(|(f, off, len, keep)| Op::ZeroRange { f, off, len, keep }),
        2 => (f.clone(), offset()).prop_map(|(f, off)| Op::Seek { f, off }),
        1 => f.prop_map(|f| Op::Reopen { f }),
        1 => Just(Op::Remount),
        1 => Just(Op::CrashRemount),
    ]
}

/// Whether a block is allocated. `Either` where the engine may legitimately do both (a
/// partial block a punch zeroes that was a hole; a block preallocated past end of file once
/// the file grows over it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blk {
    Hole,
    Mapped,
    Either,
}

/// One file of the model.
#[derive(Clone, Debug, Default)]
struct FileModel {
    bytes: Model,
    blocks: Vec<Blk>,
}

impl FileModel {
    fn size(&self) -> u64 {
        self.bytes.0.len() as u64
    }

    fn set(&mut self, from: u64, to: u64, b: Blk) {
        if self.blocks.len() < to as usize {
            self.blocks.resize(to as usize, Blk::Hole);
        }
        for x in &mut self.blocks[from as usize..to as usize] {
            *x = b;
        }
    }

    fn block(&self, b: u64) -> Blk {
        self.blocks.get(b as usize).copied().unwrap_or(Blk::Hole)
    }

    /// Growing past an unaligned end of file may allocate the end-of-file block when it is
    /// a hole (its bytes past the old end must read as zeros).
    fn grow_over(&mut self, new_size: u64) {
        let size = self.size();
        if new_size > size && !size.is_multiple_of(BS) && self.block(size / BS) == Blk::Hole {
            self.set(size / BS, size / BS + 1, Blk::Either);
        }
    }

    fn write(&mut self, buf: &[u8], off: u64) {
        self.grow_over(off + buf.len() as u64);
        self.bytes.write(buf, off);
        let end = off + buf.len() as u64;
        self.set(off / BS, end.div_ceil(BS), Blk::Mapped);
    }

    fn set_len(&mut self, size: u64) {
        let old = self.size();
        self.grow_over(size);
        self.bytes.set_len(size);
        let keep = size.div_ceil(BS);
        if size < old {
            self.blocks.truncate(keep as usize);
        } else {
            for b in old.div_ceil(BS)..keep {
                if self.block(b) != Blk::Hole {
                    self.set(b, b + 1, Blk::Either);
                }
            }
        }
    }

    fn allocate(&mut self, off: u64, len: u64, keep: bool) {
        // Growing the file over a gap may allocate the gap or leave it a hole.
        if !keep {
            self.grow_over(off + len);
            for b in self.size().div_ceil(BS)..off / BS {
                if self.block(b) == Blk::Hole {
                    self.set(b, b + 1, Blk::Either);
                }
            }
        }
        self.bytes.allocate(off, len, keep);
        self.set(off / BS, (off + len).div_ceil(BS), Blk::Mapped);
    }

    /// `FALLOC_FL_ZERO_RANGE`: allocated as by `fallocate`, and the range reads as zeros.
    fn zero_range(&mut self, off: u64, len: u64, keep: bool) {
        self.allocate(off, len, keep);
        self.bytes.punch(off, len);
    }

    fn punch(&mut self, off: u64, len: u64) {
        let end = (off + len).min(self.size());
        if off >= end {
            return;
        }
        self.bytes.punch(off, len);
        let (whole_from, whole_to) = (off.div_ceil(BS), end / BS);
        for b in off / BS..end.div_ceil(BS) {
            if b >= whole_from && b < whole_to {
                self.set(b, b + 1, Blk::Hole);
            } else if self.block(b) == Blk::Hole {
                self.set(b, b + 1, Blk::Either);
            }
        }
    }
}

struct World {
    kind: MappingKind,
    media: Arc<dyn Media>,
    vol: Option<Volume>,
    nodes: Vec<Option<OpenNode>>,
    model: Vec<FileModel>,
}

impl World {
    fn new(kind: MappingKind) -> World {
        let media: Arc<dyn Media> = Arc::new(HeapRegion::new(8 << 20).unwrap());
        let cfg = Config {
            kind,
            alloc: pmfs::AllocatorKind::Cffs,
        };
        let vol = Volume::format(media.clone(), &sim_options(cfg)).unwrap();
        let nodes = FILES.iter().map(|n| Some(create(&vol, n))).collect();
        World {
            kind,
            media,
            vol: Some(vol),
            nodes,
            model: vec![FileModel::default(); FILES.len()],
        }
    }

    fn node(&self, f: usize) -> &OpenNode {
        self.nodes[f].as_ref().unwrap()
    }

    fn reopen_all(&mut self) {
        let vol = self.vol.as_ref().unwrap();
        self.nodes = FILES.iter().map(|n| Some(open(vol, n).unwrap())).collect();
    }

    /// Checks every file against the model.
    fn check(&self, ctx: &str) -> Result<(), TestCaseError> {
        for (f, m) in self.model.iter().enumerate() {
            let node = self.node(f);
            let img = image_of(node).map_err(|e| TestCaseError::fail(format!("{ctx}: {e}")))?;
            prop_assert_eq!(img.size, m.size(), "{}: size of {}", ctx, FILES[f]);
            if let Some(i) = img.data.iter().zip(&m.bytes.0).position(|(a, b)| a != b) {
                prop_assert!(
                    false,
                    "{}: {} byte {} is {}, model {}",
                    ctx,
                    FILES[f],
                    i,
                    img.data[i],
                    m.bytes.0[i]
                );
            }
            for b in 0..m.size().div_ceil(BS) {
                let at = b * BS;
                let data = node.seek(at, SeekTarget::Data).unwrap() == Some(at);
                let hole = node.seek(at, SeekTarget::Hole).unwrap() == Some(at);
                prop_assert!(
                    data != hole,
                    "{}: {} block {} both or neither",
                    ctx,
                    FILES[f],
                    b
                );
                match m.block(b) {
                    Blk::Mapped => {
                        prop_assert!(data, "{}: {} block {} is a hole", ctx, FILES[f], b)
                    }
                    Blk::Hole => prop_assert!(hole, "{}: {} block {} is mapped", ctx, FILES[f], b),
                    Blk::Either => {}
                }
            }
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Write { f, off, len, tag } => {
                let buf: Vec<u8> = (0..len).map(|i| tag ^ (i as u8) | 1).collect();
                prop_assert_eq!(self.node(f).write_at(&buf, off).unwrap(), buf.len());
                self.model[f].write(&buf, off);
            }
            Op::Read { f, off, len } => {
                let mut buf = vec![0xAAu8; len as usize];
                let n = self.node(f).read_at(&mut buf, off).unwrap();
                let m = &self.model[f].bytes.0;
                let want = &m[(off as usize).min(m.len())..((off + len) as usize).min(m.len())];
                prop_assert_eq!(&buf[..n], want);
            }
            Op::SetLen { f, size } => {
                self.node(f).set_len(size).unwrap();
                self.model[f].set_len(size);
            }
            Op::Allocate { f, off, len, keep } => {
                self.node(f).allocate(off, len, keep).unwrap();
                self.model[f].allocate(off, len, keep);
            }
            Op::Punch { f, off, len } => {
                self.node(f).punch_hole(off, len).unwrap();
                self.model[f].punch(off, len);
            }
            Op::ZeroRange { f, off, len, keep } => {
                self.node(f).zero_range(off, len, keep).unwrap();
                self.model[f].zero_range(off, len, keep);
            }
            Op::Seek { f, off } => {
                let m = &self.model[f];
                let size = m.size();
                let (d, h) = (
                    self.node(f).seek(off, SeekTarget::Data).unwrap(),
                    self.node(f).seek(off, SeekTarget::Hole).unwrap(),
                );
                if off >= size {
                    prop_assert_eq!((d, h), (None, None));
                } else {
                    // Data can never be skipped: the first nonzero byte at or after `off`
                    // is not before the data SEEK_DATA finds.
                    let first_nonzero = m.bytes.0[off as usize..]
                        .iter()
                        .position(|&b| b != 0)
                        .map(|i| off + i as u64);
                    if let Some(nz) = first_nonzero {
                        prop_assert!(d.is_some_and(|d| d <= nz), "SEEK_DATA {:?} skips {}", d, nz);
                    }
                    let h = h.unwrap();
                    prop_assert!(h >= off && h <= size);
                }
            }
            Op::Reopen { f } => {
                self.nodes[f] = None;
                self.nodes[f] = Some(open(self.vol.as_ref().unwrap(), FILES[f]).unwrap());
            }
            Op::Remount => {
                self.nodes.clear();
                self.vol.take().unwrap().close().unwrap();
                let vol = Volume::mount(self.media.clone()).unwrap();
                prop_assert!(vol.mount_report().clean);
                self.vol = Some(vol);
                self.reopen_all();
            }
            Op::CrashRemount => {
                let mut img = vec![0u8; self.media.size() as usize];
                self.media
                    .read(pmfs_core::layout::PmOff(0), &mut img)
                    .unwrap();
                self.nodes.clear();
                drop(self.vol.take());
                self.media = Arc::new(HeapRegion::from_image(&img).unwrap());
                let vol = Volume::mount(self.media.clone()).unwrap();
                prop_assert!(!vol.mount_report().clean);
                self.vol = Some(vol);
                self.reopen_all();
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), TestCaseError> {
        self.nodes.clear();
        self.vol.take().unwrap().close().unwrap();
        fsck_clean(self.media.clone())
            .map_err(|e| TestCaseError::fail(format!("{:?}: {e}", self.kind)))
    }
}

fn run(kind: MappingKind, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut w = World::new(kind);
    for (i, op) in ops.iter().enumerate() {
        w.apply(op)?;
        w.check(&format!("{kind:?} after op {i} {op:?}"))?;
    }
    w.finish()
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn extent_tree_data_matches_model(ops in proptest::collection::vec(op(), 1..50)) {
        run(KINDS[0], &ops)?;
    }

    #[test]
    fn radix_tree_data_matches_model(ops in proptest::collection::vec(op(), 1..50)) {
        run(KINDS[1], &ops)?;
    }

    #[test]
    fn cuckoo_data_matches_model(ops in proptest::collection::vec(op(), 1..50)) {
        run(KINDS[2], &ops)?;
    }

    #[test]
    fn hashfs_data_matches_model(ops in proptest::collection::vec(op(), 1..50)) {
        run(KINDS[3], &ops)?;
    }
}
