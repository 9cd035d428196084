//! The on-media format of directory pages and directory entries (CFFS §V.A), and the walk
//! that reads a page's dentry list and detects a half-done insertion or removal.
//!
//! ```text
//! page (4096 bytes)
//!   0   header: magic, version, owner directory handle, page index, crc, last-removal time
//!  56   head sentinel: one "next" word (distance to the first entry)
//!  64   entries and fragments ...
//! 4088  tail sentinel: one "prev" word (distance back to the last entry)
//!
//! entry (8-byte aligned, 32 + name rounded up to 8 bytes, 40 ..= 288 bytes)
//!   +0        prev word: prev distance (16 bits), flags, name length, kind, magic
//!   +8        inode handle (generation << 32 | number)
//!   +16       creation time (ns) — the directory's mtime is recovered from these
//!   +24       name, zero padded
//!   +len-8    next word: next distance (16 bits), magic, crc32c of handle/time/name
//! ```
//!
//! Distances are measured between the starts of two neighbouring entries, so a fragment
//! (unused bytes after an entry) is `distance - length` long. The prev distance sits in the
//! first word of an entry and the next distance in the last, as in CFFS, so an insertion
//! touches the new entry and the ends of its neighbours, usually in the same cache lines.
//!
//! Deviations from CFFS, both to make every case the middle case:
//! - every page has a fixed head and tail sentinel, so a new entry is always inserted between
//!   two entries (into a fragment; the free space at the end of a page is the fragment before
//!   the tail sentinel) and a removed entry always has two neighbours;
//! - the pages of a directory are the blocks of its own file (page `i` is logical block `i`
//!   of the directory inode's mapping), so no page chain, `END` or `CROSS PAGE` marks are
//!   needed: the page count is the directory size.

use pmfs_core::layout::{BLOCK_SIZE, crc32c_append};

use crate::error::{Error, Result};

/// Size of a directory page.
pub(crate) const PAGE: usize = BLOCK_SIZE as usize;
/// Offset of the head sentinel word.
pub(crate) const HEAD: u16 = 56;
/// Offset where entries may start.
pub(crate) const FIRST: u16 = 64;
/// Offset of the tail sentinel word.
pub(crate) const TAIL: u16 = (PAGE - 8) as u16;
/// Longest name.
pub(crate) const NAME_MAX: usize = 255;
/// Shortest entry (one-byte name).
pub(crate) const MIN_ENTRY: u16 = 40;

const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"PMDP");
const PAGE_VERSION: u16 = 1;
const M_ENTRY_PREV: u64 = 0xe1;
const M_ENTRY_NEXT: u64 = 0xe2;
const M_HEAD: u64 = 0xe6;
const M_TAIL: u64 = 0xe7;

/// Flag in a prev word: the removal of the entry before this one drops its inode's last link
/// (recovery completes it by zeroing the link count).
pub(crate) const F_DROPS_INODE: u8 = 1;
/// Flag in a new entry's own prev word: its insertion creates its inode, so that recovery,
/// undoing the half-done insertion, frees the inode. Without it (a link, a rename, fsck
/// linking an unreachable inode into `/lost+found`) the inode was live before and stays.
pub(crate) const F_NEW_INODE: u8 = 2;

/// Offsets inside the page header. The crc covers the immutable part (magic, version,
/// owner, index); the removal time changes with every removal in the page.
pub(crate) mod hdr {
    pub const MAGIC: usize = 0;
    pub const OWNER: usize = 8;
    pub const INDEX: usize = 16;
    pub const CRC: usize = 24;
    pub const RM_TIME: usize = 32;
}

/// Length of the entry for a name of `len` bytes.
pub(crate) fn entry_len(name_len: usize) -> u16 {
    (32 + name_len.div_ceil(8) * 8) as u16
}

/// A prev word.
pub(crate) fn prev_word(dist: u16, flags: u8, name_len: u8, kind: u8) -> u64 {
    u64::from(dist)
        | u64::from(flags) << 16
        | u64::from(name_len) << 24
        | u64::from(kind) << 32
        | M_ENTRY_PREV << 40
}

/// The tail sentinel's prev word.
pub(crate) fn tail_word(dist: u16, flags: u8) -> u64 {
    u64::from(dist) | u64::from(flags) << 16 | M_TAIL << 40
}

/// A next word.
pub(crate) fn next_word(dist: u16, crc: u32) -> u64 {
    u64::from(dist) | M_ENTRY_NEXT << 16 | u64::from(crc) << 32
}

/// The head sentinel's next word.
pub(crate) fn head_word(dist: u16) -> u64 {
    u64::from(dist) | M_HEAD << 16
}

/// Replaces the distance of a prev or next word, keeping everything else.
pub(crate) fn with_dist(word: u64, dist: u16) -> u64 {
    (word & !0xffff) | u64::from(dist)
}

/// Replaces distance and flags of a prev word.
pub(crate) fn with_dist_flags(word: u64, dist: u16, flags: u8) -> u64 {
    (word & !0xff_ffff) | u64::from(dist) | u64::from(flags) << 16
}

fn dist(word: u64) -> u16 {
    word as u16
}

fn flags(word: u64) -> u8 {
    (word >> 16) as u8
}

/// Sets `flag` in the prev word of the encoded `entry`.
pub(crate) fn flag_prev(entry: &mut [u8], flag: u8) {
    entry[2] |= flag;
}

/// The crc32c of an entry's immutable part.
pub(crate) fn entry_crc(handle: u64, ctime: u64, kind: u8, name: &[u8]) -> u32 {
    let mut c = crc32c_append(0, &handle.to_le_bytes());
    c = crc32c_append(c, &ctime.to_le_bytes());
    c = crc32c_append(c, &[name.len() as u8, kind]);
    crc32c_append(c, name)
}

/// Longest entry (a 255-byte name).
pub(crate) const MAX_ENTRY: usize = 288;

/// Encodes a whole entry into `buf`; returns its bytes.
pub(crate) fn encode_entry_into<'b>(
    buf: &'b mut [u8; MAX_ENTRY],
    prev: u16,
    next: u16,
    handle: u64,
    ctime: u64,
    kind: u8,
    name: &[u8],
) -> &'b [u8] {
    let len = usize::from(entry_len(name.len()));
    let b = &mut buf[..len];
    b.fill(0);
    b[0..8].copy_from_slice(&prev_word(prev, 0, name.len() as u8, kind).to_le_bytes());
    b[8..16].copy_from_slice(&handle.to_le_bytes());
    b[16..24].copy_from_slice(&ctime.to_le_bytes());
    b[24..24 + name.len()].copy_from_slice(name);
    let crc = entry_crc(handle, ctime, kind, name);
    b[len - 8..].copy_from_slice(&next_word(next, crc).to_le_bytes());
    b
}

/// Encodes a whole entry.
#[cfg(test)]
pub(crate) fn encode_entry(
    prev: u16,
    next: u16,
    handle: u64,
    ctime: u64,
    kind: u8,
    name: &[u8],
) -> Vec<u8> {
    let mut buf = [0u8; MAX_ENTRY];
    encode_entry_into(&mut buf, prev, next, handle, ctime, kind, name).to_vec()
}

/// The header crc.
pub(crate) fn header_crc(page: &[u8]) -> u32 {
    crc32c_append(0, &page[..hdr::CRC])
}

/// An empty page of directory `owner` at index `index`.
pub(crate) fn empty_page(owner: u64, index: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE];
    p[hdr::MAGIC..hdr::MAGIC + 4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
    p[hdr::MAGIC + 4..hdr::MAGIC + 6].copy_from_slice(&PAGE_VERSION.to_le_bytes());
    p[hdr::OWNER..hdr::OWNER + 8].copy_from_slice(&owner.to_le_bytes());
    p[hdr::INDEX..hdr::INDEX + 8].copy_from_slice(&index.to_le_bytes());
    let crc = header_crc(&p);
    p[hdr::CRC..hdr::CRC + 4].copy_from_slice(&crc.to_le_bytes());
    let d = TAIL - HEAD;
    p[usize::from(HEAD)..usize::from(HEAD) + 8].copy_from_slice(&head_word(d).to_le_bytes());
    p[usize::from(TAIL)..].copy_from_slice(&tail_word(d, 0).to_le_bytes());
    p
}

/// One entry as read from a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawDentry {
    pub off: u16,
    pub len: u16,
    pub handle: u64,
    pub ctime: u64,
    pub kind: u8,
    pub name: Vec<u8>,
    /// Bytes of fragment after the entry.
    pub gap: u16,
}

/// A half-done operation found by the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pending {
    /// `y`'s prev points at `n`, which lies between `x` and `y`, while `x`'s next still
    /// points at `y`: an insertion of `n` that did not reach its last step. `n_valid` tells
    /// whether `n` is a well-formed entry placed between them.
    Insert {
        x: u16,
        n: u16,
        y: u16,
        n_valid: bool,
    },
    /// `y`'s prev already skips `x` (pointing at `w`, `x`'s predecessor), while `w`'s next
    /// still points at `x`: a removal of `x` that did not reach its last step.
    Remove { w: u16, x: u16, y: u16, flags: u8 },
}

/// What a walk of a page found.
#[derive(Debug, Default)]
pub(crate) struct Walk {
    /// Entries in list order.
    pub entries: Vec<RawDentry>,
    /// Fragment between the head sentinel and the first entry.
    pub head_gap: u16,
    /// The half-done operation, if any (the walk stops there).
    pub pending: Option<Pending>,
    /// Largest removal time recorded in the header.
    pub rm_time: u64,
}

/// A read-only view of one page.
pub(crate) struct PageView<'a> {
    buf: &'a [u8],
}

impl<'a> PageView<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        debug_assert_eq!(buf.len(), PAGE);
        PageView { buf }
    }

    pub fn word(&self, off: u16) -> u64 {
        let o = usize::from(off);
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.buf[o..o + 8]);
        u64::from_le_bytes(w)
    }

    /// Whether the header is valid for directory `owner`, page `index`.
    pub fn header_ok(&self, owner: u64, index: u64) -> bool {
        let u32_at = |o: usize| u32::from_le_bytes([0, 1, 2, 3].map(|i| self.buf[o + i]));
        let u16_at = |o: usize| u16::from_le_bytes([self.buf[o], self.buf[o + 1]]);
        u32_at(hdr::MAGIC) == PAGE_MAGIC
            && u16_at(hdr::MAGIC + 4) == PAGE_VERSION
            && self.word(hdr::OWNER as u16) == owner
            && self.word(hdr::INDEX as u16) == index
            && u32_at(hdr::CRC) == header_crc(self.buf)
    }

    /// The length of the entry at `off` if a well-formed entry header is there.
    fn entry_at(&self, off: u16) -> Option<u16> {
        if off < FIRST || !off.is_multiple_of(8) || off >= TAIL {
            return None;
        }
        let w = self.word(off);
        let name_len = (w >> 24) as u8;
        if (w >> 40) & 0xff != M_ENTRY_PREV || name_len == 0 || w >> 48 != 0 {
            return None;
        }
        let len = entry_len(usize::from(name_len));
        if u32::from(off) + u32::from(len) > u32::from(TAIL) {
            return None;
        }
        let nw = self.word(off + len - 8);
        if (nw >> 16) & 0xff != M_ENTRY_NEXT {
            return None;
        }
        Some(len)
    }

    fn decode(&self, off: u16, len: u16) -> RawDentry {
        let w = self.word(off);
        let name_len = usize::from((w >> 24) as u8);
        let o = usize::from(off);
        RawDentry {
            off,
            len,
            handle: self.word(off + 8),
            ctime: self.word(off + 16),
            kind: (w >> 32) as u8,
            name: self.buf[o + 24..o + 24 + name_len].to_vec(),
            gap: 0,
        }
    }

    fn crc_ok(&self, d: &RawDentry) -> bool {
        let stored = (self.word(d.off + d.len - 8) >> 32) as u32;
        let padding_clean = self.buf
            [usize::from(d.off) + 24 + d.name.len()..usize::from(d.off + d.len) - 8]
            .iter()
            .all(|&b| b == 0);
        padding_clean && stored == entry_crc(d.handle, d.ctime, d.kind, &d.name)
    }

    /// Walks the dentry list from the head sentinel. `at` maps a page offset to a region
    /// offset for error reports.
    pub fn walk(&self, at: impl Fn(u16) -> pmfs_core::layout::PmOff) -> Result<Walk> {
        let corrupt = |what, off: u16| Error::Corrupt { what, at: at(off) };
        let hw = self.word(HEAD);
        if (hw >> 16) & 0xff != M_HEAD {
            return Err(corrupt("directory page head", HEAD));
        }
        let tw = self.word(TAIL);
        if (tw >> 40) & 0xff != M_TAIL {
            return Err(corrupt("directory page tail", TAIL));
        }
        let mut out = Walk {
            rm_time: self.word(hdr::RM_TIME as u16),
            ..Walk::default()
        };
        // (offset, length) of the current entry X and of its predecessor W.
        let mut x: (u16, u16) = (HEAD, 8);
        let mut w: Option<u16> = None;
        let mut xflags_next = hw;
        loop {
            let d = dist(xflags_next);
            let y = u32::from(x.0) + u32::from(d);
            if d == 0 || !y.is_multiple_of(8) || y > u32::from(TAIL) || y < u32::from(x.0 + x.1) {
                return Err(corrupt("directory entry next distance", x.0));
            }
            let y = y as u16;
            let gap = y - (x.0 + x.1);
            let ylen = if y == TAIL {
                8
            } else {
                self.entry_at(y)
                    .ok_or_else(|| corrupt("directory entry", y))?
            };
            let yprev = self.word(y);
            let pd = dist(yprev);
            if pd == 0 || pd > y - HEAD || !pd.is_multiple_of(8) {
                return Err(corrupt("directory entry prev distance", y));
            }
            let p = y - pd;
            if p == x.0 {
                if x.0 == HEAD {
                    out.head_gap = gap;
                } else if let Some(last) = out.entries.last_mut() {
                    last.gap = gap;
                }
                if y == TAIL {
                    return Ok(out);
                }
                let e = self.decode(y, ylen);
                if !self.crc_ok(&e) {
                    return Err(corrupt("directory entry checksum", y));
                }
                // A name no create could have stored ('/', NUL, ".", "..") is damage, even
                // under a matching checksum: it must never reach a lookup or a readdir.
                if crate::fs::path::check_name(&e.name).is_err() {
                    return Err(corrupt("directory entry name", y));
                }
                out.entries.push(e);
                w = Some(x.0);
                x = (y, ylen);
                xflags_next = self.word(y + ylen - 8);
            } else if p > x.0 {
                let n_valid = p >= x.0 + x.1
                    && self.entry_at(p).is_some_and(|nlen| {
                        let n = self.decode(p, nlen);
                        p + nlen <= y
                            && dist(self.word(p)) == p - x.0
                            && dist(self.word(p + nlen - 8)) == y - p
                            && self.crc_ok(&n)
                    });
                out.pending = Some(Pending::Insert {
                    x: x.0,
                    n: p,
                    y,
                    n_valid,
                });
                return Ok(out);
            } else if Some(p) == w {
                out.entries.pop();
                out.pending = Some(Pending::Remove {
                    w: p,
                    x: x.0,
                    y,
                    flags: flags(yprev),
                });
                return Ok(out);
            } else {
                return Err(corrupt("directory entry prev distance", y));
            }
        }
    }

    /// Calls `f` with the handle word of every entry the page's forward links reach: every
    /// linked entry, whatever operation is half done (an insertion links its entry forward
    /// last, a removal unlinks it forward last). Stops where a link leads to no entry.
    pub fn each_linked(&self, f: &mut impl FnMut(u64)) {
        let (mut x, mut xlen) = (HEAD, 8);
        for _ in 0..=PAGE / usize::from(MIN_ENTRY) {
            let d = dist(self.word(x + xlen - 8));
            let y = x + d;
            if d == 0 || y >= TAIL {
                return;
            }
            let Some(ylen) = self.entry_at(y) else {
                return;
            };
            f(self.decode(y, ylen).handle);
            (x, xlen) = (y, ylen);
        }
    }

    /// Decodes the entry at `off` (for the recovery of a pending operation).
    pub fn entry(&self, off: u16) -> Option<RawDentry> {
        self.entry_at(off).map(|len| self.decode(off, len))
    }

    /// The flags of the prev word at `off`.
    pub fn prev_flags(&self, off: u16) -> u8 {
        flags(self.word(off))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmfs_core::layout::PmOff;

    fn put(page: &mut [u8], off: u16, bytes: &[u8]) {
        page[usize::from(off)..usize::from(off) + bytes.len()].copy_from_slice(bytes);
    }

    fn put_word(page: &mut [u8], off: u16, w: u64) {
        put(page, off, &w.to_le_bytes());
    }

    fn at(o: u16) -> PmOff {
        PmOff(u64::from(o))
    }

    /// A page with entries "a" at 64 and "bb" at 104 (both 40 bytes), fragment after.
    fn two_entries() -> Vec<u8> {
        let mut p = empty_page(7, 0);
        put(&mut p, 64, &encode_entry(8, 40, 100, 5, 1, b"a"));
        put(&mut p, 104, &encode_entry(40, TAIL - 104, 101, 6, 2, b"bb"));
        put_word(&mut p, HEAD, head_word(8));
        put_word(&mut p, TAIL, tail_word(TAIL - 104, 0));
        p
    }

    #[test]
    fn empty_and_populated_pages_walk_cleanly() {
        let p = empty_page(7, 3);
        let v = PageView::new(&p);
        assert!(v.header_ok(7, 3));
        assert!(!v.header_ok(7, 4));
        let w = v.walk(at).unwrap();
        assert!(w.entries.is_empty() && w.pending.is_none());
        assert_eq!(w.head_gap, TAIL - FIRST);

        let p = two_entries();
        let w = PageView::new(&p).walk(at).unwrap();
        assert_eq!(w.entries.len(), 2);
        assert_eq!(w.entries[0].name, b"a");
        assert_eq!(w.entries[1].name, b"bb");
        assert_eq!(w.entries[1].kind, 2);
        assert_eq!(w.entries[0].gap, 0);
        assert_eq!(w.entries[1].gap, TAIL - 144);
        assert_eq!(w.head_gap, 0);
        assert_eq!(entry_len(1), MIN_ENTRY);
        assert_eq!(usize::from(entry_len(255)), MAX_ENTRY);
    }

    #[test]
    fn half_done_insert_and_remove_are_detected() {
        // Insert "c" at 144 between "bb" (104) and the tail: step 2 done (tail.prev -> c).
        let mut p = two_entries();
        put(&mut p, 144, &encode_entry(40, TAIL - 144, 102, 7, 1, b"c"));
        put_word(&mut p, TAIL, tail_word(TAIL - 144, 0));
        let w = PageView::new(&p).walk(at).unwrap();
        assert_eq!(
            w.pending,
            Some(Pending::Insert {
                x: 104,
                n: 144,
                y: TAIL,
                n_valid: true
            })
        );
        // Same with a garbage new entry.
        let mut q = p.clone();
        q[144 + 24] ^= 1;
        let w = PageView::new(&q).walk(at).unwrap();
        assert!(matches!(
            w.pending,
            Some(Pending::Insert { n_valid: false, .. })
        ));

        // Remove "bb": step 1 done (tail.prev skips to "a" with the flag).
        let mut p = two_entries();
        put_word(&mut p, TAIL, tail_word(TAIL - 64, F_DROPS_INODE));
        let w = PageView::new(&p).walk(at).unwrap();
        assert_eq!(
            w.pending,
            Some(Pending::Remove {
                w: 64,
                x: 104,
                y: TAIL,
                flags: F_DROPS_INODE
            })
        );
        assert_eq!(w.entries.len(), 1);
    }

    #[test]
    fn damaged_pages_are_corrupt_not_panics() {
        let base = two_entries();
        for i in 0..PAGE {
            for bit in [0x01u8, 0x80] {
                let mut p = base.clone();
                p[i] ^= bit;
                // Must return, never panic or loop.
                let _ = PageView::new(&p).walk(at);
            }
        }
        let mut p = base.clone();
        put_word(&mut p, HEAD, head_word(0));
        assert!(matches!(
            PageView::new(&p).walk(at),
            Err(Error::Corrupt { .. })
        ));
        let mut p = base;
        p[64 + 25] ^= 0x40; // name byte: crc mismatch
        assert!(matches!(
            PageView::new(&p).walk(at),
            Err(Error::Corrupt {
                what: "directory entry checksum",
                ..
            })
        ));
    }

    #[test]
    fn names_no_create_could_store_are_corrupt_despite_a_valid_checksum() {
        for bad in [&b"a/"[..], b"b\0", b".", b".."] {
            let mut p = empty_page(7, 3);
            let len = entry_len(bad.len());
            put(
                &mut p,
                FIRST,
                &encode_entry(FIRST - HEAD, TAIL - FIRST, 100, 5, 1, bad),
            );
            put_word(&mut p, HEAD, head_word(FIRST - HEAD));
            put_word(&mut p, TAIL, tail_word(TAIL - FIRST, 0));
            assert_eq!(PageView::new(&p).entry_at(FIRST), Some(len));
            assert!(
                matches!(
                    PageView::new(&p).walk(at),
                    Err(Error::Corrupt {
                        what: "directory entry name",
                        ..
                    })
                ),
                "{bad:?} must be refused"
            );
        }
    }
}
