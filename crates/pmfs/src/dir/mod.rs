//! Directories (CFFS §V): persistent dentry pages with prev/next distances, log-free insertion
//! and removal by ordered 8-byte stores, recovery of half-done operations from mismatched
//! distances, fragment buckets, and the DRAM name index of each directory.
//!
//! # Ordering of the log-free operations
//!
//! *Insert* entry `N` into the fragment after `X` (whose next neighbour is `Y`):
//! 1. write `N` (its distances already pointing at `X` and `Y`; for a create, flagged "new
//!    inode" in its own prev word) and, for a create, the new inode's fields; store
//!    `Y.prev -> N`; one fence;
//! 2. store `X.next -> N` and, for a create, the inode's live state word; one fence.
//!
//! *Remove* entry `B` between `A` and `C`:
//! 1. store `C.prev -> A` with the flag "drops the inode" when this was the inode's last link,
//!    zero the inode's link count, record the removal time in the page header; one fence;
//! 2. store `A.next -> C`; one fence.
//!
//! Recovery (run for every directory after an unclean shutdown, after the journal has been
//! rolled back) walks each page's list and fixes:
//! - `Y.prev` pointing between `X` and `Y` (insert after step 1): undo — restore `Y.prev`,
//!   and free the inode of a create if it went live and no directory links it (the bytes at
//!   `N` may still be those of an entry removed from the fragment earlier, whose inode lives
//!   on under another name). An entry not flagged "new inode" names an inode that was live
//!   before: a link's, or one fsck is linking into `/lost+found`; it stays;
//! - `Y.prev` skipping `X` (remove after step 1): redo — zero `X`'s inode link count when
//!   flagged and store `W.next -> Y`;
//! - a linked entry whose inode is not live or has no links (insert whose second step was
//!   half durable, or remove whose link-count store was durable before its list store):
//!   remove the entry.
//!
//! Every case ends in the state before or after the operation. Operations that touch more
//! (rename, link, ...) use the same stores inside a journal transaction, which recovery
//! undoes first.

pub(crate) mod frag;
pub(crate) mod page;

use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::pm::Media;
use pmfs_core::traits::Run;

use self::frag::{FragPos, Fragments};
use self::page::{HEAD, PAGE, PageView, Pending, TAIL};
use crate::error::{Error, Result};
use crate::fs::{Fs, Release};
use crate::hash::FastMap;
use crate::inode::{Handle, Kind, field};
use crate::mapping::MapFile;

/// Where an entry lives and what it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub page: u32,
    pub off: u16,
    pub kind: Kind,
    pub h: Handle,
}

/// A directory's DRAM state.
#[derive(Debug)]
pub(crate) struct Dir {
    pub h: Handle,
    /// The parent's handle word. Outside the lock: it changes only under the tree lock
    /// (rename), which lets ancestor checks run while directories are locked.
    parent: AtomicU64,
    pub inner: RwLock<DirInner>,
}

impl Dir {
    /// The parent directory.
    pub fn parent(&self) -> Handle {
        Handle::from_word(self.parent.load(Ordering::Acquire))
    }

    /// Records a new parent (rename, under the tree lock).
    pub fn set_parent(&self, h: Handle) {
        self.parent.store(h.word(), Ordering::Release);
    }
}

/// The lock-protected part of [`Dir`].
#[derive(Debug)]
pub(crate) struct DirInner {
    /// Set when the directory was removed: every operation on it fails with `NotFound`.
    pub dead: bool,
    pub map: MapFile,
    pub pages: Vec<BlockNo>,
    /// The dentry cached tree of CFFS, as a hash map: name -> entry.
    pub index: FastMap<Box<[u8]>, Slot>,
    pub frags: Fragments,
    pub subdirs: u64,
    /// Modification time, kept in DRAM and written back at clean close (recovered from the
    /// entries' creation times and the pages' removal times after a crash).
    pub mtime: i64,
    pub mtime_dirty: bool,
}

/// A planned insertion whose new entry is written but not linked. It remembers the two words
/// linking rewrites, as they were when it was planned: the directory must stay locked (and
/// unchanged) from planning to linking.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Insertion {
    page: u32,
    x: u16,
    n: u16,
    y: u16,
    gap: u16,
    nlen: u16,
    x_next: PmOff,
    y_prev: PmOff,
    x_next_word: u64,
    y_prev_word: u64,
}

impl Insertion {
    /// The words linking changes.
    pub fn words(&self) -> [PmOff; 2] {
        [self.x_next, self.y_prev]
    }
}

/// A planned removal.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Removal {
    page: u32,
    a: u16,
    b: u16,
    c: u16,
    alen: u16,
    gap_a: u16,
    gap_b: u16,
    a_next: PmOff,
    c_prev: PmOff,
    b_prev: PmOff,
    b_next: PmOff,
}

impl Removal {
    /// The words unlinking changes, plus `B`'s own distance words (which an insertion next to
    /// `B` in the same transaction may change).
    pub fn words(&self) -> [PmOff; 4] {
        [self.a_next, self.c_prev, self.b_prev, self.b_next]
    }

    /// Offset of the page header's removal-time word.
    fn rm_time(&self, d: &DirInner) -> PmOff {
        d.at(self.page, page::hdr::RM_TIME as u16)
    }
}

/// Offsets of an entry's words.
pub(crate) struct EntryWords {
    pub prev: PmOff,
    pub handle: PmOff,
    pub ctime: PmOff,
    pub next: PmOff,
}

fn corrupt(what: &'static str, at: PmOff) -> Error {
    Error::Corrupt { what, at }
}

impl DirInner {
    pub fn at(&self, page: u32, off: u16) -> PmOff {
        self.pages[page as usize].offset() + u64::from(off)
    }

    /// Length of the entry (or sentinel) at `off`.
    fn len_at(&self, m: &dyn Media, page: u32, off: u16) -> Result<u16> {
        if off == HEAD || off == TAIL {
            return Ok(8);
        }
        let w = m.load_u64(self.at(page, off))?;
        let name_len = usize::from((w >> 24) as u8);
        let len = page::entry_len(name_len);
        if name_len == 0 || off < page::FIRST || u32::from(off) + u32::from(len) > u32::from(TAIL) {
            return Err(corrupt("directory entry length", self.at(page, off)));
        }
        Ok(len)
    }

    fn next_word_off(&self, m: &dyn Media, page: u32, x: u16) -> Result<PmOff> {
        let len = self.len_at(m, page, x)?;
        Ok(self.at(page, x + len - 8))
    }

    fn next_of(&self, m: &dyn Media, page: u32, x: u16) -> Result<u16> {
        let off = self.next_word_off(m, page, x)?;
        let d = m.load_u64(off)? as u16;
        let y = u32::from(x) + u32::from(d);
        if d == 0 || y > u32::from(TAIL) || !y.is_multiple_of(8) {
            return Err(corrupt("directory entry next distance", off));
        }
        Ok(y as u16)
    }

    fn prev_of(&self, m: &dyn Media, page: u32, y: u16) -> Result<u16> {
        let off = self.at(page, y);
        let d = m.load_u64(off)? as u16;
        if d == 0 || d > y - HEAD || !d.is_multiple_of(8) {
            return Err(corrupt("directory entry prev distance", off));
        }
        Ok(y - d)
    }

    /// The word offsets of the entry in `s`.
    pub fn entry_words(&self, m: &dyn Media, s: &Slot) -> Result<EntryWords> {
        let base = self.at(s.page, s.off);
        Ok(EntryWords {
            prev: base,
            handle: base + 8,
            ctime: base + 16,
            next: self.next_word_off(m, s.page, s.off)?,
        })
    }

    /// Finds room for an entry of `len` bytes, appending a page when no fragment fits.
    fn reserve(&mut self, fs: &Fs, owner: Handle, len: u16) -> Result<(FragPos, u16)> {
        if let Some(hit) = self.frags.find(len) {
            return Ok(hit);
        }
        self.append_page(fs, owner)?;
        self.frags.find(len).ok_or(corrupt(
            "directory fragment index",
            self.at(self.pages.len() as u32 - 1, HEAD),
        ))
    }

    /// Adds an empty page at the end: map a block as the next logical block of the
    /// directory, initialise it, make it durable, then publish the new size.
    fn append_page(&mut self, fs: &Fs, owner: Handle) -> Result<()> {
        let idx = self.pages.len() as u64;
        if idx >= u64::from(u32::MAX) {
            return Err(Error::NoSpace);
        }
        let mut runs: Vec<Run> = Vec::with_capacity(1);
        fs.map.insert(&self.map, idx, 1, &mut runs)?;
        let pblk = runs
            .first()
            .filter(|r| r.lblk == idx && r.len == 1)
            .ok_or(Error::InvalidArgument("mapping returned an unexpected run"))?
            .pblk;
        let m = fs.m();
        m.write_nt(pblk.offset(), &page::empty_page(owner.word(), idx))?;
        m.fence();
        fs.inodes
            .store(m, owner.ino, field::SIZE, (idx + 1) * PAGE as u64)?;
        m.fence();
        self.pages.push(pblk);
        self.frags.insert(
            FragPos {
                page: idx as u32,
                after: HEAD,
            },
            TAIL - page::FIRST,
        );
        Ok(())
    }

    /// Chooses a place for a new entry and writes it there (flushed, not fenced, not linked);
    /// `new_inode`: the insertion creates `h` ([`page::F_NEW_INODE`]).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_insert(
        &mut self,
        fs: &Fs,
        owner: Handle,
        name: &[u8],
        kind: Kind,
        h: Handle,
        new_inode: bool,
        ctime: i64,
    ) -> Result<Insertion> {
        let m = fs.m();
        let nlen = page::entry_len(name.len());
        let (pos, gap) = self.reserve(fs, owner, nlen)?;
        let (pg, x) = (pos.page, pos.after);
        let xlen = self.len_at(m, pg, x)?;
        let x_next = self.at(pg, x + xlen - 8);
        let d_word = m.load_u64(x_next)?;
        let d = d_word as u16;
        let y = u32::from(x) + u32::from(d);
        let n = x + xlen;
        if d == 0
            || y > u32::from(TAIL)
            || !y.is_multiple_of(8)
            || y < u32::from(n)
            || y as u16 - n != gap
            || gap < nlen
        {
            return Err(corrupt("directory fragment index", self.at(pg, x)));
        }
        let y = y as u16;
        let y_prev = self.at(pg, y);
        let y_prev_word = m.load_u64(y_prev)?;
        let mut buf = [0u8; page::MAX_ENTRY];
        let len = page::encode_entry_into(
            &mut buf,
            n - x,
            y - n,
            h.word(),
            ctime as u64,
            kind.code(),
            name,
        )
        .len();
        let bytes = &mut buf[..len];
        if new_inode {
            page::flag_prev(bytes, page::F_NEW_INODE);
        }
        let at = self.at(pg, n);
        m.write(at, bytes)?;
        m.flush(at, bytes.len() as u64)?;
        Ok(Insertion {
            page: pg,
            x,
            n,
            y,
            gap,
            nlen,
            x_next,
            y_prev,
            x_next_word: d_word,
            y_prev_word,
        })
    }

    /// Step 1 of linking: `Y.prev -> N` (flushed, not fenced).
    pub fn link_prev(&self, m: &dyn Media, ins: &Insertion) -> Result<()> {
        let w = ins.y_prev_word;
        m.store_u64(ins.y_prev, page::with_dist_flags(w, ins.y - ins.n, 0))?;
        m.flush(ins.y_prev, 8)?;
        Ok(())
    }

    /// Step 2 of linking: `X.next -> N` (flushed, not fenced).
    pub fn link_next(&self, m: &dyn Media, ins: &Insertion) -> Result<()> {
        let w = ins.x_next_word;
        m.store_u64(ins.x_next, page::with_dist(w, ins.n - ins.x))?;
        m.flush(ins.x_next, 8)?;
        Ok(())
    }

    /// Records a linked insertion in DRAM.
    pub fn finish_insert(&mut self, ins: &Insertion, name: &[u8], kind: Kind, h: Handle) {
        self.frags.remove(
            FragPos {
                page: ins.page,
                after: ins.x,
            },
            ins.gap,
        );
        self.frags.insert(
            FragPos {
                page: ins.page,
                after: ins.n,
            },
            ins.gap - ins.nlen,
        );
        self.index.insert(
            name.into(),
            Slot {
                page: ins.page,
                off: ins.n,
                kind,
                h,
            },
        );
        if kind == Kind::Dir {
            self.subdirs += 1;
        }
    }

    /// Plans the removal of the entry in `s`, reading its neighbours from media.
    pub fn plan_remove(&self, m: &dyn Media, s: &Slot) -> Result<Removal> {
        let (pg, b) = (s.page, s.off);
        let a = self.prev_of(m, pg, b)?;
        let c = self.next_of(m, pg, b)?;
        let alen = self.len_at(m, pg, a)?;
        let blen = self.len_at(m, pg, b)?;
        if self.next_of(m, pg, a)? != b || self.prev_of(m, pg, c)? != b || a + alen > b {
            return Err(corrupt("directory entry neighbours", self.at(pg, b)));
        }
        Ok(Removal {
            page: pg,
            a,
            b,
            c,
            alen,
            gap_a: b - (a + alen),
            gap_b: c - (b + blen),
            a_next: self.next_word_off(m, pg, a)?,
            c_prev: self.at(pg, c),
            b_prev: self.at(pg, b),
            b_next: self.next_word_off(m, pg, b)?,
        })
    }

    /// Step 1 of unlinking: `C.prev -> A` with `flags`, and the page's removal time
    /// (flushed, not fenced).
    pub fn unlink_prev(&self, m: &dyn Media, r: &Removal, flags: u8, now: i64) -> Result<()> {
        let rm = r.rm_time(self);
        m.store_u64(rm, now as u64)?;
        m.flush(rm, 8)?;
        let w = m.load_u64(r.c_prev)?;
        m.store_u64(r.c_prev, page::with_dist_flags(w, r.c - r.a, flags))?;
        m.flush(r.c_prev, 8)?;
        Ok(())
    }

    /// Step 2 of unlinking: `A.next -> C` (flushed, not fenced).
    pub fn unlink_next(&self, m: &dyn Media, r: &Removal) -> Result<()> {
        let w = m.load_u64(r.a_next)?;
        m.store_u64(r.a_next, page::with_dist(w, r.c - r.a))?;
        m.flush(r.a_next, 8)?;
        Ok(())
    }

    /// Records a completed removal in DRAM.
    pub fn finish_remove(&mut self, r: &Removal, name: &[u8]) {
        let pos = |after| FragPos {
            page: r.page,
            after,
        };
        self.frags.remove(pos(r.a), r.gap_a);
        self.frags.remove(pos(r.b), r.gap_b);
        self.frags.insert(pos(r.a), r.c - (r.a + r.alen));
        if let Some(s) = self.index.remove(name)
            && s.kind == Kind::Dir
        {
            self.subdirs -= 1;
        }
    }

    /// Looks a name up.
    pub fn get(&self, name: &[u8]) -> Option<Slot> {
        self.index.get(name).copied()
    }

    /// Bumps the directory's modification time.
    pub fn touch(&mut self, now: i64) {
        if now > self.mtime {
            self.mtime = now;
        }
        self.mtime_dirty = true;
    }
}

/// How to load a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoadMode {
    /// After a clean close: any half-done operation means corruption.
    Clean,
    /// After a crash: repair half-done operations.
    Repair,
}

/// What repairing a directory did (for tests and statistics).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RepairStats {
    pub undone_inserts: u32,
    pub redone_removes: u32,
    pub dropped_entries: u32,
    pub pages_added: u32,
}

impl Dir {
    /// Builds the DRAM state of directory `h` from media.
    pub fn load(fs: &Fs, h: Handle, mode: LoadMode) -> Result<(Dir, RepairStats)> {
        let m = fs.m();
        let rec = fs.inodes.read_live(m, h)?;
        let iat = fs.inodes.field(h.ino, 0);
        if rec.kind() != Some(Kind::Dir) {
            return Err(Error::NotADirectory);
        }
        let size = rec.size;
        if !size.is_multiple_of(PAGE as u64) || size / PAGE as u64 > fs.geo.data_blocks {
            return Err(corrupt("directory size", iat));
        }
        let mut npages = size / PAGE as u64;
        let map = fs.map.open_file(fs.file_id(h.ino))?;
        let mut stats = RepairStats::default();
        let mut runs = Vec::new();
        let probe = npages + u64::from(mode == LoadMode::Repair);
        fs.map.lookup(&map, 0, probe, &mut runs)?;
        let mut pages = Vec::with_capacity(probe as usize);
        for r in &runs {
            if r.lblk != pages.len() as u64 {
                return Err(corrupt("directory page missing", iat));
            }
            pages.extend((0..r.len).map(|i| r.pblk + i));
        }
        if (pages.len() as u64) < npages {
            return Err(corrupt("directory page missing", iat));
        }
        if pages.len() as u64 > npages {
            // A page appended just before a crash. Entries go only into published pages, so
            // it holds none: initialise it (its initialisation may be partial) and publish it.
            let pblk = pages[npages as usize];
            m.write_nt(pblk.offset(), &page::empty_page(h.word(), npages))?;
            m.fence();
            npages += 1;
            fs.inodes
                .store(m, h.ino, field::SIZE, npages * PAGE as u64)?;
            m.fence();
            stats.pages_added += 1;
        }
        pages.truncate(npages as usize);
        let mut inner = DirInner {
            dead: false,
            map,
            pages,
            index: FastMap::default(),
            frags: Fragments::default(),
            subdirs: 0,
            mtime: rec.mtime as i64,
            mtime_dirty: false,
        };
        let mut buf = vec![0u8; PAGE];
        for pg in 0..npages as u32 {
            let base = inner.pages[pg as usize].offset();
            let at = |o: u16| base + u64::from(o);
            let mut rounds = 0u32;
            let walk = loop {
                m.read(base, &mut buf)?;
                let view = PageView::new(&buf);
                if !view.header_ok(h.word(), u64::from(pg)) {
                    return Err(corrupt("directory page header", base));
                }
                let walk = view.walk(at)?;
                rounds += 1;
                if rounds > 2 + (PAGE as u32 / u32::from(page::MIN_ENTRY)) {
                    return Err(corrupt("directory page keeps changing", base));
                }
                if let Some(p) = walk.pending {
                    if mode == LoadMode::Clean {
                        return Err(corrupt("half-done directory operation", base));
                    }
                    repair_pending(fs, &inner, pg, &view, p, &mut stats)?;
                    continue;
                }
                if mode == LoadMode::Repair
                    && let Some(dead) = first_dead_entry(fs, &walk)?
                {
                    let slot = Slot {
                        page: pg,
                        off: dead,
                        kind: Kind::File,
                        h: Handle {
                            ino: 0,
                            generation: 0,
                        },
                    };
                    let r = inner.plan_remove(m, &slot)?;
                    inner.unlink_prev(m, &r, 0, fs.now())?;
                    m.fence();
                    inner.unlink_next(m, &r)?;
                    m.fence();
                    stats.dropped_entries += 1;
                    continue;
                }
                break walk;
            };
            inner.frags.insert(
                FragPos {
                    page: pg,
                    after: HEAD,
                },
                walk.head_gap,
            );
            // After a crash the DRAM-only modification time is recovered from the entry and
            // removal times; after a clean close the written-back time is exact (and may be
            // older than the entries, after a utimes).
            let recover_mtime = mode == LoadMode::Repair;
            if recover_mtime {
                inner.mtime = inner.mtime.max(walk.rm_time as i64);
            }
            for e in walk.entries {
                let kind =
                    Kind::from_code(e.kind).ok_or(corrupt("directory entry kind", at(e.off)))?;
                let eh = Handle::from_word(e.handle);
                if eh.ino == 0 || u64::from(eh.ino) >= fs.inodes.count() {
                    return Err(corrupt("directory entry inode number", at(e.off)));
                }
                inner.frags.insert(
                    FragPos {
                        page: pg,
                        after: e.off,
                    },
                    e.gap,
                );
                if recover_mtime {
                    inner.mtime = inner.mtime.max(e.ctime as i64);
                }
                if kind == Kind::Dir {
                    inner.subdirs += 1;
                }
                let slot = Slot {
                    page: pg,
                    off: e.off,
                    kind,
                    h: eh,
                };
                if inner.index.insert(e.name.into(), slot).is_some() {
                    return Err(corrupt("duplicate name in directory", at(e.off)));
                }
            }
        }
        if inner.mtime != rec.mtime as i64 {
            inner.mtime_dirty = true;
        }
        Ok((
            Dir {
                h,
                parent: AtomicU64::new(rec.parent),
                inner: RwLock::new(inner),
            },
            stats,
        ))
    }
}

/// The first entry of a walk whose inode is not live with the entry's generation or has no
/// link left.
fn first_dead_entry(fs: &Fs, walk: &page::Walk) -> Result<Option<u16>> {
    for e in &walk.entries {
        let h = Handle::from_word(e.handle);
        if h.ino == 0 || u64::from(h.ino) >= fs.inodes.count() {
            continue;
        }
        let rec = fs.inodes.read(fs.m(), h.ino)?;
        if rec.state != h.live_state() || rec.nlink == 0 {
            return Ok(Some(e.off));
        }
    }
    Ok(None)
}

/// Whether an entry of a live directory links `h`, half-done operations aside (recovery,
/// rarely: it reads every directory page).
fn linked_anywhere(fs: &Fs, h: Handle) -> Result<bool> {
    let m = fs.m();
    let mut dirs = Vec::new();
    fs.inodes.scan(m, |ino, r| {
        if r.is_live() && r.kind() == Some(Kind::Dir) {
            dirs.push((ino, (r.size / PAGE as u64).min(fs.geo.data_blocks)));
        }
        Ok(())
    })?;
    let mut buf = vec![0u8; PAGE];
    let mut runs = Vec::new();
    for (ino, pages) in dirs {
        let map = fs.map.open_file(fs.file_id(ino))?;
        runs.clear();
        fs.map.lookup(&map, 0, pages, &mut runs)?;
        for b in runs
            .iter()
            .flat_map(|r| (0..r.len).map(move |i| r.pblk + i))
        {
            m.read(b.offset(), &mut buf)?;
            let mut found = false;
            PageView::new(&buf).each_linked(&mut |w| found |= w == h.word());
            if found {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Repairs one half-done operation on page `pg` (see the module documentation).
fn repair_pending(
    fs: &Fs,
    d: &DirInner,
    pg: u32,
    view: &PageView<'_>,
    p: Pending,
    stats: &mut RepairStats,
) -> Result<()> {
    let m = fs.m();
    match p {
        Pending::Insert { x, n, y, n_valid } => {
            // The inode of a create whose second step was half durable went live: free it.
            // Only a create's: the inode of a link or rename, or one fsck was linking into
            // `/lost+found`, was live before. And the bytes at `N` may be those of an entry
            // removed from this fragment earlier, which fit between `X` and `Y` as the new
            // entry would, when none of the new entry's lines was written back: their inode
            // may live on under another name (renamed, or one of several links), and must
            // not be freed.
            if n_valid
                && view.prev_flags(n) & page::F_NEW_INODE != 0
                && let Some(e) = view.entry(n)
            {
                let h = Handle::from_word(e.handle);
                if h.ino != 0 && u64::from(h.ino) < fs.inodes.count() {
                    let rec = fs.inodes.read(m, h.ino)?;
                    if rec.state == h.live_state() && !linked_anywhere(fs, h)? {
                        fs.free_inode(h, None, Release::Everything)?;
                    }
                }
            }
            let off = d.at(pg, y);
            let w = m.load_u64(off)?;
            m.store_u64(off, page::with_dist_flags(w, y - x, 0))?;
            m.persist(off, 8)?;
            stats.undone_inserts += 1;
        }
        Pending::Remove { w, x, y, flags } => {
            if flags & page::F_DROPS_INODE != 0
                && let Some(e) = view.entry(x)
            {
                let h = Handle::from_word(e.handle);
                if h.ino != 0 && u64::from(h.ino) < fs.inodes.count() {
                    let rec = fs.inodes.read(m, h.ino)?;
                    if rec.state == h.live_state() && rec.nlink != 0 {
                        fs.inodes.store(m, h.ino, field::NLINK, 0)?;
                        m.fence();
                    }
                }
            }
            let off = d.next_word_off(m, pg, w)?;
            let word = m.load_u64(off)?;
            m.store_u64(off, page::with_dist(word, y - w))?;
            m.persist(off, 8)?;
            stats.redone_removes += 1;
        }
    }
    Ok(())
}
