//! Log entries as the caller sees them, and their encodings: an inline slot word when the
//! entry fits one, else the payload words of an extended entry.

use super::format::{
    GROW_MAX_SIZE, INLINE_MAX_LEN, Inline, MAX_RECORD_WORDS, SEGMENT_HEADER_WORDS, grow_word,
};
use crate::error::{Error, Result};
use crate::layout::{BLOCK_SIZE, BlockNo, PmOff};
use crate::traits::{Run, Runs};

/// One metadata update of a file, committed atomically by one log slot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Entry {
    /// Maps each run's logical blocks to its physical blocks (a copy-on-write commit), in
    /// order, then sets the file size to `max(size, extend_to)` (0 leaves it unchanged).
    Write {
        /// The remapped runs (may be empty for a pure size extension).
        runs: Runs,
        /// Lower bound for the new file size in bytes.
        extend_to: u64,
    },
    /// Sets the file size to `size` and unmaps every block at or after
    /// `size.div_ceil(BLOCK_SIZE)`.
    Truncate {
        /// The new size in bytes.
        size: u64,
    },
    /// Sets the file size to `size` and unmaps nothing: the blocks past the new end stay
    /// the file's (a file that processes have mapped keeps its blocks while it is shrunk).
    Resize {
        /// The new size in bytes.
        size: u64,
    },
    /// Unmaps logical blocks `[lblk, lblk + len)` without changing the size.
    Punch {
        /// First logical block.
        lblk: u64,
        /// Blocks (at least 1).
        len: u64,
    },
}

/// Record kinds (low byte of an extended entry's first payload word).
const KIND_WRITE: u64 = 1;
const KIND_TRUNCATE: u64 = 2;
const KIND_PUNCH: u64 = 3;
const KIND_RESIZE: u64 = 4;

/// Bits of a run's physical block in an extended entry; the length takes the rest.
const RUN_PBLK_BITS: u32 = 40;
/// Longest run an extended entry holds.
pub const MAX_RUN_LEN: u64 = (1 << (64 - RUN_PBLK_BITS)) - 1;

impl Entry {
    /// A write of one run that extends the size to at least `extend_to`.
    pub fn write(lblk: u64, pblk: BlockNo, len: u64, extend_to: u64) -> Entry {
        Entry::Write {
            runs: smallvec::smallvec![Run { lblk, pblk, len }],
            extend_to,
        }
    }

    /// Checks the entry against the encodings' limits and a region of `blocks` blocks.
    pub fn validate(&self, blocks: u64) -> Result<()> {
        let bad = |m| Err(Error::InvalidArgument(m));
        match self {
            Entry::Write { runs, .. } => {
                if (runs.len() as u64).saturating_mul(2).saturating_add(2) > MAX_RECORD_WORDS {
                    return bad("too many runs in one log entry");
                }
                for r in runs {
                    if r.len == 0 || r.len > MAX_RUN_LEN {
                        return bad("log run length out of range");
                    }
                    if r.lblk.checked_add(r.len).is_none() {
                        return bad("log run beyond the largest logical block");
                    }
                    if r.pblk.0.checked_add(r.len).is_none_or(|end| end > blocks) {
                        return bad("log run outside the region");
                    }
                }
                Ok(())
            }
            Entry::Truncate { .. } | Entry::Resize { .. } => Ok(()),
            Entry::Punch { lblk, len } => {
                if *len == 0 || lblk.checked_add(*len).is_none() {
                    return bad("punched range out of range");
                }
                Ok(())
            }
        }
    }

    /// The inline slot word, if the entry has one: a single run that fits, with either no
    /// size change or a size extension to exactly the end of the run; or no run and a size
    /// extension below 2^48 bytes (a `GROW` word).
    pub fn inline_word(&self) -> Option<u64> {
        if let Entry::Write { runs, extend_to } = self
            && runs.is_empty()
            && (1..GROW_MAX_SIZE).contains(extend_to)
        {
            return Some(grow_word(*extend_to));
        }
        self.inline().map(Inline::encode)
    }

    /// Log slots the entry takes when it is committed into a block with room for it: one for
    /// an inline word, else the reservation word, the segment header and the payload words.
    pub fn slots(&self) -> u64 {
        if self.inline_word().is_some() {
            return 1;
        }
        let payload = match self {
            Entry::Write { runs, .. } => 2 + 2 * runs.len() as u64,
            Entry::Truncate { .. } | Entry::Resize { .. } => 2,
            Entry::Punch { .. } => 3,
        };
        1 + SEGMENT_HEADER_WORDS + payload
    }

    /// The inline run encoding, if the entry has one: a single run that fits, and either no
    /// size change or a size extension to exactly the end of the run.
    pub fn inline(&self) -> Option<Inline> {
        let Entry::Write { runs, extend_to } = self else {
            return None;
        };
        let [r] = runs.as_slice() else { return None };
        if !Inline::fits(r.lblk, r.pblk.0, r.len) {
            return None;
        }
        let end = (r.lblk + r.len) * BLOCK_SIZE;
        let extend = match *extend_to {
            0 => false,
            e if e == end => true,
            _ => return None,
        };
        Some(Inline {
            lblk: r.lblk,
            pblk: r.pblk.0,
            len: r.len,
            extend,
        })
    }

    /// The entry an inline slot stands for, checked against a region of `blocks` blocks.
    pub fn from_inline(i: Inline, blocks: u64, at: PmOff) -> Result<Entry> {
        debug_assert!((1..=INLINE_MAX_LEN).contains(&i.len));
        if i.pblk + i.len > blocks {
            return Err(Error::Corrupt {
                what: "log run outside the region",
                at,
            });
        }
        Ok(Entry::write(
            i.lblk,
            BlockNo(i.pblk),
            i.len,
            if i.extend {
                (i.lblk + i.len) * BLOCK_SIZE
            } else {
                0
            },
        ))
    }

    /// The payload words of the extended encoding (see the module docs for the layout).
    pub fn record_words(&self) -> Vec<u64> {
        match self {
            Entry::Write { runs, extend_to } => {
                let mut w = Vec::with_capacity(2 + 2 * runs.len());
                w.push(KIND_WRITE | (runs.len() as u64) << 32);
                w.push(*extend_to);
                for r in runs {
                    w.push(r.lblk);
                    w.push(r.pblk.0 | r.len << RUN_PBLK_BITS);
                }
                w
            }
            Entry::Truncate { size } => vec![KIND_TRUNCATE, *size],
            Entry::Resize { size } => vec![KIND_RESIZE, *size],
            Entry::Punch { lblk, len } => vec![KIND_PUNCH, *lblk, *len],
        }
    }

    /// Decodes the payload words of an extended entry, checked against a region of `blocks`
    /// blocks; `at` locates the entry for errors.
    pub fn from_record(w: &[u64], blocks: u64, at: PmOff) -> Result<Entry> {
        let corrupt = |what| Err(Error::Corrupt { what, at });
        let Some(&head) = w.first() else {
            return corrupt("empty extended log entry");
        };
        let count = head >> 32;
        if head & 0xffff_ff00 != 0 {
            return corrupt("extended log entry reserved bits");
        }
        match head & 0xff {
            KIND_WRITE => {
                if count.checked_mul(2).and_then(|n| n.checked_add(2)) != Some(w.len() as u64) {
                    return corrupt("extended log entry length");
                }
                let runs = w[2..]
                    .chunks_exact(2)
                    .map(|c| Run {
                        lblk: c[0],
                        pblk: BlockNo(c[1] & ((1 << RUN_PBLK_BITS) - 1)),
                        len: c[1] >> RUN_PBLK_BITS,
                    })
                    .collect();
                let e = Entry::Write {
                    runs,
                    extend_to: w[1],
                };
                match e.validate(blocks) {
                    Ok(()) => Ok(e),
                    Err(_) => corrupt("extended log entry run"),
                }
            }
            KIND_TRUNCATE if count == 0 && w.len() == 2 => Ok(Entry::Truncate { size: w[1] }),
            KIND_RESIZE if count == 0 && w.len() == 2 => Ok(Entry::Resize { size: w[1] }),
            KIND_PUNCH if count == 0 && w.len() == 3 => {
                let e = Entry::Punch {
                    lblk: w[1],
                    len: w[2],
                };
                match e.validate(blocks) {
                    Ok(()) => Ok(e),
                    Err(_) => corrupt("extended log entry range"),
                }
            }
            KIND_TRUNCATE | KIND_RESIZE | KIND_PUNCH => corrupt("extended log entry length"),
            _ => corrupt("extended log entry kind"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_only_when_it_fits() {
        let e = Entry::write(3, BlockNo(100), 2, 5 * BLOCK_SIZE);
        let i = e.inline().unwrap();
        assert!(i.extend);
        assert_eq!(Entry::from_inline(i, 1000, PmOff(0)).unwrap(), e);
        // A size that is not the run's end needs an extended entry.
        assert!(Entry::write(3, BlockNo(100), 2, 100).inline().is_none());
        assert!(Entry::write(3, BlockNo(100), 65, 0).inline().is_none());
        assert!(Entry::Truncate { size: 0 }.inline().is_none());
        // A pure size extension is a grow word, unless it is too large for one.
        let grow = |extend_to| Entry::Write {
            runs: smallvec::smallvec![],
            extend_to,
        };
        assert_eq!(grow(4097).inline_word(), Some(grow_word(4097)));
        assert_eq!(grow(GROW_MAX_SIZE).inline_word(), None);
        assert_eq!(grow(0).inline_word(), None);
        assert_eq!(e.inline_word(), Some(i.encode()));
        assert_eq!(e.slots(), 1);
        // Reservation, segment header, kind and size.
        assert_eq!(Entry::Truncate { size: 9 }.slots(), 6);
        assert_eq!(Entry::write(3, BlockNo(100), 2, 100).slots(), 8);
        // A run outside the region is corrupt when read back.
        assert!(Entry::from_inline(i, 101, PmOff(0)).is_err());
    }

    #[test]
    fn records_round_trip_and_reject_garbage() {
        for e in [
            Entry::Write {
                runs: smallvec::smallvec![],
                extend_to: 77,
            },
            Entry::Write {
                runs: smallvec::smallvec![
                    Run {
                        lblk: u64::MAX - 5,
                        pblk: BlockNo(9),
                        len: 5,
                    },
                    Run {
                        lblk: 0,
                        pblk: BlockNo(1),
                        len: MAX_RUN_LEN,
                    },
                ],
                extend_to: 0,
            },
            Entry::Truncate { size: 12345 },
            Entry::Resize { size: 4097 },
            Entry::Punch { lblk: 7, len: 9 },
        ] {
            e.validate(1 << 30).unwrap();
            let w = e.record_words();
            if e.inline_word().is_none() {
                assert_eq!(e.slots(), 1 + SEGMENT_HEADER_WORDS + w.len() as u64);
            }
            assert_eq!(Entry::from_record(&w, 1 << 30, PmOff(0)).unwrap(), e);
            assert!(Entry::from_record(&w[..w.len() - 1], 1 << 30, PmOff(0)).is_err());
        }
        assert!(Entry::from_record(&[9, 0], 10, PmOff(0)).is_err());
        assert!(Entry::from_record(&[KIND_PUNCH, 0, 0], 10, PmOff(0)).is_err());
        assert!(Entry::from_record(&[KIND_TRUNCATE | 1 << 8, 0], 10, PmOff(0)).is_err());
        assert!(Entry::from_record(&[KIND_RESIZE, 0, 0], 10, PmOff(0)).is_err());
        assert!(
            Entry::Write {
                runs: smallvec::smallvec![Run {
                    lblk: 0,
                    pblk: BlockNo(9),
                    len: 2
                }],
                extend_to: 0
            }
            .validate(10)
            .is_err()
        );
    }
}
