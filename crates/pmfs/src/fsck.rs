//! The file-system checker.
//!
//! [`check`] examines an unmounted volume without writing to it and lists every violated
//! invariant with its location. A volume that was not closed cleanly is examined as its
//! next mount's recovery will leave it, recovered in memory on a
//! [`ShadowRegion`](pmfs_core::pm::ShadowRegion) (see [`check`]). The invariants:
//!
//! - superblock: the primary is valid, the backup equals it; the volume was closed cleanly;
//! - journal: every slot is idle;
//! - inodes: every live record has a known type and a consistent size, and its extended
//!   attributes read back (word, block and checksum);
//! - directories: every page is mapped, has a valid header and a consistent dentry list (no
//!   half-done insertion or removal, checksums match), names are unique, every entry names a
//!   live inode of the entry's type and generation, no page lies past the directory's size;
//! - the tree: every directory is named exactly once, by the directory its parent pointer
//!   names, and is reachable from the root; every file's link count equals its names;
//!   live inodes without links or names are listed as [orphans](Report::orphans), which are
//!   not damage (the next read-write mount frees them);
//! - blocks: every block a mapping or a file's log reports lies in the data region and is
//!   owned once, each log's chain and entries are readable as mount's recovery reads them and
//!   its digest cursor lies within it, no file but an orphan maps blocks past both its end
//!   and its `MAPPED_END` word (nor, on a cleanly closed volume of a format that makes the
//!   word the bound, past the word alone), and used + free equals the data
//!   region (no leak) where the free count is the allocator's persistent state (the baseline
//!   bitmap) or the HashFS table, the bitmap only on a cleanly closed volume (it is synced at
//!   the clean close, and rebuilt by the mount after any other end). A cleanly closed volume
//!   has every log digested, so the blocks of undigested entries are not counted. A file not
//!   marked as having holes maps every block below its size; no dead inode that no entry
//!   names still maps blocks in a table that holds every file's (cuckoo, HashFS); every
//!   symbolic link but an orphan maps its target block, which holds the target without a NUL
//!   byte and zeros after it.
//!
//! [`repair`] mounts the volume (which runs crash recovery when needed), then fixes what can
//! be fixed without guessing: it restores a damaged superblock copy, releases the blocks the
//! hashed tables still map to dead inodes, drops entries naming dead inodes, drops extended
//! attributes that cannot be read, marks files with unmarked holes, corrects link counts and
//! parent pointers, moves a digest cursor that damage left beyond its log's tail back to the
//! tail (before mounting: the mount digests every log), raises a mapped end that mapped blocks
//! lie past (before mounting too), gives an inode whose tree cannot be read an empty one and
//! drops a log that cannot be read (before mounting, which reads every tree and log), frees
//! orphans, links unreachable objects into `/lost+found`, trims blocks past end of file and
//! rebuilds the allocator. It reports what it found before, what it did and what remains
//! (damaged pages, blocks owned twice, damaged symbolic-link targets, which it cannot know).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;

use pmfs_core::layout::{BLOCK_SIZE, PmOff};
use pmfs_core::pm::Media;
use pmfs_core::traits::{Extent, MappingKind, Run};
use pmfs_mapping::hashfs;

use crate::dir::page::{PAGE, PageView, Pending};
use crate::error::{Error, Result};
use crate::format::{self, SbSource};
use crate::fs::Fs;
use crate::fs::used::UsedBlocks;
use crate::inode::{GID_WORD, Handle, INODE_VERSION, Kind, field, flag};
use crate::journal::SlotContent;

/// What kind of invariant a [`Problem`] violates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ProblemKind {
    /// The primary superblock is damaged (the backup was used).
    PrimarySuperblock,
    /// The backup superblock differs from the primary.
    BackupSuperblock,
    /// The volume was not closed cleanly and needs recovery.
    NotClean,
    /// A journal slot holds an unfinished transaction.
    JournalBusy,
    /// An inode record has an unknown type, version or an impossible size.
    InodeRecord,
    /// A directory page is missing or its header is damaged.
    DirectoryPage,
    /// A dentry list is damaged or holds a half-done operation.
    DirectoryList,
    /// An entry names an inode that is not live with that generation.
    DeadEntry,
    /// An entry's type differs from its inode's.
    EntryKind,
    /// Two entries of one directory have the same name.
    DuplicateName,
    /// A directory is named by more or fewer than one entry.
    DirectoryLinks,
    /// A directory's parent pointer does not name the directory holding it.
    ParentPointer,
    /// A file's link count differs from the number of its names.
    LinkCount,
    /// A live inode cannot be reached from the root.
    Unreachable,
    /// A block a mapping reports lies outside the data region.
    BlockOutsideData,
    /// A block is owned by two files.
    BlockOwnedTwice,
    /// A file maps blocks past its end.
    BlocksBeyondEof,
    /// A regular file maps blocks below its size but past its `MAPPED_END` word, which
    /// truncations, `SEEK_DATA` and block counts take as the end of its mapped blocks.
    MappedEnd,
    /// Used plus free blocks differ from the data region: blocks leaked or double-counted.
    FreeSpace,
    /// An inode's extended attributes cannot be read: a damaged attribute word, or a block
    /// that is not mapped, fails its checksum or does not decode.
    Xattrs,
    /// A regular file has holes below its size but its inode is not marked as having any
    /// (its block count then counts them as allocated).
    HolesFlag,
    /// An inode that is not live still maps blocks in a table that holds every file's (the
    /// hashed mappings), and no entry names it: its blocks leak, and a file given the inode
    /// number next would find them mapped.
    DeadInodeBlocks,
    /// A regular file's log chain is damaged.
    FileLog,
    /// A symbolic link's target block is not mapped, or holds a NUL byte in the target or
    /// anything but zeros past it (a create writes the whole block, and nothing changes it).
    SymlinkTarget,
}

/// One violated invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The invariant.
    pub kind: ProblemKind,
    /// Byte offset in the volume of the structure at fault.
    pub at: u64,
    /// The inode concerned, if any.
    pub ino: Option<u64>,
    /// A human-readable description.
    pub detail: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} at {:#x}", self.kind, self.at)?;
        if let Some(ino) = self.ino {
            write!(f, " (inode {ino})")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// The result of a check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Every problem found.
    pub problems: Vec<Problem>,
    /// Live inodes.
    pub live_inodes: u64,
    /// Live directories.
    pub directories: u64,
    /// Directory entries.
    pub entries: u64,
    /// Orphans: live inodes without links or names, files unlinked while open (by the crashed
    /// run, or by a data-only client when the owner closed the volume). They are not damage:
    /// the next read-write mount frees them, and their blocks count as used until then.
    pub orphans: Vec<u64>,
    /// HashFS blocks staged by copy-on-write writes that never committed: a crash leaves them,
    /// and so does a data-only client killed in the middle of a write, on a volume its owner
    /// then closed cleanly (the owner cannot tell them from the staged blocks of live clients'
    /// writes). Not damage either: the next read-write mount frees them, and they count as
    /// neither used nor free until then.
    pub staged_blocks: u64,
    /// Blocks owned by files (data and mapping nodes).
    pub used_blocks: u64,
    /// Free blocks as the HashFS table or a persistent allocator's state counts them (the
    /// baseline bitmap of a cleanly closed volume); for an allocator the mount rebuilds from
    /// the files' blocks (CFFS, and any after a crash), the data region less the used blocks.
    pub free_blocks: u64,
}

impl Report {
    /// Whether no problem was found.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    /// Whether a problem of `kind` was found.
    pub fn has(&self, kind: ProblemKind) -> bool {
        self.problems.iter().any(|p| p.kind == kind)
    }
}

/// The result of a repair.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Repair {
    /// The problems before repairing, as [`check`] reports them.
    pub before: Report,
    /// What was done, one line per action.
    pub actions: Vec<String>,
    /// The problems that remain.
    pub after: Report,
}

/// What the checker learned about one live inode.
#[derive(Clone, Copy, Debug)]
struct Info {
    h: Handle,
    kind: Option<Kind>,
    nlink: u64,
    size: u64,
    parent: u64,
}

/// Everything the checker gathered (reused by repair).
#[derive(Debug, Default)]
struct Model {
    live: HashMap<u32, Info>,
    /// Names of each inode: (directory, entry name).
    names: HashMap<u32, Vec<(Handle, Vec<u8>)>>,
    /// Entries that name dead inodes or the wrong type: (directory, name).
    bad_entries: Vec<(Handle, Vec<u8>)>,
    /// Inode numbers named by entries whose inode is dead (their blocks may have leaked; the
    /// dead entry reports them).
    dead_named: Vec<u32>,
    /// Inode numbers that are not live but still own blocks in a table that holds every
    /// file's (the hashed mappings), sorted: named by dead entries, or by none when the
    /// damage removed their names too, or a HashFS recovery dropped the entries naming them.
    dead_owners: Vec<u32>,
    reachable: HashSet<u32>,
    owners: HashMap<u64, u32>,
    beyond_eof: Vec<(Handle, u64, u64)>,
    /// Files that map blocks past their `MAPPED_END` word: (file, the end of the last one).
    low_mapped_end: Vec<(Handle, u64)>,
    /// Inodes whose extended attributes cannot be read.
    bad_xattrs: Vec<Handle>,
    /// Files with holes below their size that are not marked as having any.
    unmarked_holes: Vec<Handle>,
    /// Files whose digest cursor lies beyond their log's tail: (inode, tail LSN).
    cursor_beyond_tail: Vec<(u32, u64)>,
    /// Inodes whose own mapping structure (a tree) cannot be read.
    unreadable_maps: Vec<Info>,
    /// Files whose log cannot be read.
    unreadable_logs: Vec<Info>,
}

struct Checker<'a> {
    fs: &'a Fs,
    /// The volume was closed cleanly.
    clean: bool,
    report: Report,
    model: Model,
}

impl Checker<'_> {
    fn problem(&mut self, kind: ProblemKind, at: PmOff, ino: Option<u32>, detail: String) {
        self.report.problems.push(Problem {
            kind,
            at: at.0,
            ino: ino.map(u64::from),
            detail,
        });
    }

    fn inode_at(&self, ino: u32) -> PmOff {
        self.fs.inodes.field(ino, 0)
    }

    fn journal(&mut self) -> Result<()> {
        let m = self.fs.m();
        for i in 0..self.fs.journal.slots() {
            let at = self.fs.geo.journal_off(i as u32);
            match self.fs.journal.read_slot(m, i) {
                Ok(SlotContent::Idle) => {}
                Ok(_) => self.problem(
                    ProblemKind::JournalBusy,
                    at,
                    None,
                    format!("journal slot {i} holds an unfinished transaction"),
                ),
                Err(e) => self.problem(
                    ProblemKind::JournalBusy,
                    at,
                    None,
                    format!("journal slot {i} is unreadable: {e}"),
                ),
            }
        }
        Ok(())
    }

    fn inodes(&mut self) -> Result<()> {
        let fs = self.fs;
        let mut found = Vec::new();
        fs.inodes.scan(fs.m(), |ino, r| {
            if ino != 0 && r.is_live() {
                found.push((ino, *r));
            }
            Ok(())
        })?;
        for (ino, r) in found {
            let kind = r.kind();
            let h = Handle {
                ino,
                generation: r.generation(),
            };
            let bad = match kind {
                None => Some(format!("unknown mode {:o}", r.mode)),
                Some(_) if r.version != INODE_VERSION => {
                    Some(format!("record version {}", r.version))
                }
                Some(Kind::Dir)
                    if !r.size.is_multiple_of(BLOCK_SIZE)
                        || r.size / BLOCK_SIZE > fs.geo.data_blocks =>
                {
                    Some(format!("impossible directory size {}", r.size))
                }
                Some(Kind::Dir) if r.nlink > 1 => {
                    Some(format!("directory link count {} (expected 1)", r.nlink))
                }
                Some(Kind::Symlink) if r.size == 0 || r.size >= BLOCK_SIZE => {
                    Some(format!("symbolic link length {}", r.size))
                }
                Some(_) if r.size > crate::fs::MAX_FILE_SIZE => {
                    Some(format!("size {} beyond the maximum", r.size))
                }
                _ => None,
            };
            if let Some(detail) = bad {
                self.problem(
                    ProblemKind::InodeRecord,
                    self.inode_at(ino),
                    Some(ino),
                    detail,
                );
            } else if let Err(e) = fs.xattrs(h) {
                self.problem(
                    ProblemKind::Xattrs,
                    fs.inodes.field(ino, field::XATTR),
                    Some(ino),
                    format!("extended attributes unreadable: {e}"),
                );
                self.model.bad_xattrs.push(h);
            }
            self.model.live.insert(
                ino,
                Info {
                    h,
                    kind,
                    nlink: r.nlink,
                    size: r.size,
                    parent: r.parent,
                },
            );
        }
        self.report.live_inodes = self.model.live.len() as u64;
        Ok(())
    }

    /// Checks one directory's pages and entries.
    fn directory(&mut self, info: Info) -> Result<()> {
        let fs = self.fs;
        let m = fs.m();
        let h = info.h;
        let iat = self.inode_at(h.ino);
        let npages = info.size / BLOCK_SIZE;
        if npages > fs.geo.data_blocks {
            // Reported with the inode record.
            return Ok(());
        }
        let map = fs.map.open_file(fs.file_id(h.ino))?;
        let mut runs = Vec::new();
        if let Err(e) = fs.map.lookup(&map, 0, npages + 1, &mut runs) {
            self.problem(
                ProblemKind::DirectoryPage,
                iat,
                Some(h.ino),
                format!("page lookup failed: {e}"),
            );
            return Ok(());
        }
        let mut pages = vec![None; npages as usize];
        for r in &runs {
            for i in 0..r.len {
                let l = r.lblk + i;
                if l < npages {
                    pages[l as usize] = Some(r.pblk + i);
                } else {
                    self.problem(
                        ProblemKind::BlocksBeyondEof,
                        iat,
                        Some(h.ino),
                        format!("directory page {l} mapped past the directory size"),
                    );
                    self.model.beyond_eof.push((h, npages, l + 1));
                }
            }
        }
        let mut names = HashSet::new();
        let mut buf = vec![0u8; PAGE];
        for (idx, page) in pages.iter().enumerate() {
            let Some(pblk) = *page else {
                self.problem(
                    ProblemKind::DirectoryPage,
                    iat,
                    Some(h.ino),
                    format!("directory page {idx} is not mapped"),
                );
                continue;
            };
            let base = pblk.offset();
            if let Err(e) = m.read(base, &mut buf) {
                self.problem(
                    ProblemKind::DirectoryPage,
                    base,
                    Some(h.ino),
                    format!("page {idx} unreadable: {e}"),
                );
                continue;
            }
            let view = PageView::new(&buf);
            if !view.header_ok(h.word(), idx as u64) {
                self.problem(
                    ProblemKind::DirectoryPage,
                    base,
                    Some(h.ino),
                    format!("page {idx} header is damaged or belongs elsewhere"),
                );
                continue;
            }
            let walk = match view.walk(|o| base + u64::from(o)) {
                Ok(w) => w,
                Err(Error::Corrupt { what, at }) => {
                    self.problem(ProblemKind::DirectoryList, at, Some(h.ino), what.into());
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(p) = walk.pending {
                let (what, off) = match p {
                    Pending::Insert { n, .. } => ("half-done insertion", n),
                    Pending::Remove { x, .. } => ("half-done removal", x),
                };
                self.problem(
                    ProblemKind::DirectoryList,
                    base + u64::from(off),
                    Some(h.ino),
                    what.into(),
                );
            }
            for e in walk.entries {
                self.report.entries += 1;
                let at = base + u64::from(e.off);
                let name_text = String::from_utf8_lossy(&e.name).into_owned();
                if !names.insert(e.name.clone()) {
                    self.problem(
                        ProblemKind::DuplicateName,
                        at,
                        Some(h.ino),
                        format!("name {name_text:?} appears twice"),
                    );
                    continue;
                }
                let eh = Handle::from_word(e.handle);
                let target = self.model.live.get(&eh.ino).copied();
                match target {
                    Some(t) if t.h == eh => {
                        if t.kind != Kind::from_code(e.kind) {
                            self.problem(
                                ProblemKind::EntryKind,
                                at,
                                Some(eh.ino),
                                format!("entry {name_text:?} has the wrong type"),
                            );
                            self.model.bad_entries.push((h, e.name));
                            continue;
                        }
                        self.model
                            .names
                            .entry(eh.ino)
                            .or_default()
                            .push((h, e.name));
                    }
                    _ => {
                        if target.is_none() && u64::from(eh.ino) < fs.inodes.count() {
                            self.model.dead_named.push(eh.ino);
                        }
                        self.problem(
                            ProblemKind::DeadEntry,
                            at,
                            Some(eh.ino),
                            format!("entry {name_text:?} names a dead inode"),
                        );
                        self.model.bad_entries.push((h, e.name));
                    }
                }
            }
        }
        Ok(())
    }

    fn tree(&mut self) -> Result<()> {
        let fs = self.fs;
        let root = fs.root;
        let mut dirs: Vec<Info> = self
            .model
            .live
            .values()
            .filter(|i| i.kind == Some(Kind::Dir))
            .copied()
            .collect();
        dirs.sort_by_key(|i| i.h.ino);
        self.report.directories = dirs.len() as u64;
        for d in dirs {
            self.directory(d)?;
        }
        // Reachability from the root, through entries of live directories.
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for (&ino, names) in &self.model.names {
            for (dir, _) in names {
                children.entry(dir.ino).or_default().push(ino);
            }
        }
        let mut queue = VecDeque::from([root.ino]);
        self.model.reachable.insert(root.ino);
        while let Some(d) = queue.pop_front() {
            for &c in children.get(&d).map_or(&[][..], |v| &v[..]) {
                if self.model.reachable.insert(c)
                    && self.model.live.get(&c).and_then(|i| i.kind) == Some(Kind::Dir)
                {
                    queue.push_back(c);
                }
            }
        }
        let mut live: Vec<Info> = self.model.live.values().copied().collect();
        live.sort_by_key(|i| i.h.ino);
        for info in live {
            let ino = info.h.ino;
            if ino == root.ino {
                continue;
            }
            let at = self.inode_at(ino);
            let names = self.model.names.get(&ino).map_or(0, Vec::len) as u64;
            if info.nlink == 0 {
                if names == 0 {
                    self.report.orphans.push(u64::from(ino));
                    continue;
                }
                self.problem(
                    ProblemKind::LinkCount,
                    at + field::NLINK,
                    Some(ino),
                    format!("link count 0 but {names} names"),
                );
            }
            match info.kind {
                Some(Kind::Dir) => {
                    if names != 1 {
                        self.problem(
                            ProblemKind::DirectoryLinks,
                            at,
                            Some(ino),
                            format!("directory has {names} names"),
                        );
                    }
                    if let Some((dir, _)) = self.model.names.get(&ino).and_then(|v| v.first())
                        && info.parent != dir.word()
                    {
                        self.problem(
                            ProblemKind::ParentPointer,
                            at + field::PARENT,
                            Some(ino),
                            format!("parent pointer does not name directory {}", dir.ino),
                        );
                    }
                }
                Some(_) if info.nlink != names && info.nlink != 0 && names > 0 => self.problem(
                    ProblemKind::LinkCount,
                    at + field::NLINK,
                    Some(ino),
                    format!("link count {} but {names} names", info.nlink),
                ),
                _ => {}
            }
            if !self.model.reachable.contains(&ino) {
                self.problem(
                    ProblemKind::Unreachable,
                    at,
                    Some(ino),
                    "not reachable from the root".into(),
                );
            }
        }
        Ok(())
    }

    /// Checks inode `ino`'s log as mount's recovery would read it (chain and entries) and
    /// that its digest cursor lies within it, then adds its blocks to `out` ([`log_blocks`]).
    fn file_log(&mut self, ino: u32, out: &mut Vec<Extent>) -> Result<()> {
        let m = self.fs.m();
        let root = self.fs.inodes.field(ino, field::LOG);
        if m.load_u64(root)? == 0 {
            return Ok(());
        }
        let log = pmfs_core::log::inspect(m, root)?;
        let cursor = self.fs.inodes.field(ino, field::DIGEST);
        let applied = pmfs_core::log::cursor_lsn(m, cursor)?;
        if applied > log.tail {
            self.problem(
                ProblemKind::FileLog,
                cursor,
                Some(ino),
                format!(
                    "digest cursor at LSN {applied} beyond the log tail at LSN {}",
                    log.tail
                ),
            );
            self.model.cursor_beyond_tail.push((ino, log.tail));
        }
        log_blocks(self.fs, ino, out)
    }

    /// Every live inode's runs, sorted by logical block, found in one pass over the table of a
    /// structure that keeps all files in one
    /// ([`visit_all`](pmfs_core::traits::FileMapping::visit_all)); `None` on the others, and
    /// where the pass cannot read the table (each file's walk then reports what it cannot
    /// read). A block a damaged table maps twice counts once, as in a lookup. Notes the inodes
    /// that are not live but own blocks in the table
    /// ([`dead_owners`](Model::dead_owners)), and reports those no entry names (the others
    /// are reported as dead entries).
    fn tabled_runs(&mut self) -> Option<HashMap<u32, Vec<Run>>> {
        let mut by_ino: HashMap<u32, Vec<Run>> = HashMap::new();
        let mut dead: HashMap<u32, u64> = HashMap::new();
        let live = &self.model.live;
        let count = self.fs.inodes.count();
        let pass = self
            .fs
            .map
            .visit_all(&mut |ino, r| match u32::try_from(ino) {
                Ok(ino) if live.contains_key(&ino) => by_ino.entry(ino).or_default().push(r),
                Ok(ino) if ino != 0 && u64::from(ino) < count => {
                    *dead.entry(ino).or_default() += r.len;
                }
                _ => {}
            });
        if !matches!(pass, Ok(true)) {
            return None;
        }
        let mut dead: Vec<(u32, u64)> = dead.into_iter().collect();
        dead.sort_unstable();
        let named: HashSet<u32> = self.model.dead_named.iter().copied().collect();
        for &(ino, blocks) in &dead {
            if !named.contains(&ino) {
                self.problem(
                    ProblemKind::DeadInodeBlocks,
                    self.inode_at(ino),
                    Some(ino),
                    format!("inode {ino} is not live but still maps {blocks} blocks"),
                );
            }
        }
        self.model.dead_owners = dead.into_iter().map(|(ino, _)| ino).collect();
        by_ino.values_mut().for_each(sort_runs);
        Some(by_ino)
    }

    fn blocks(&mut self) -> Result<()> {
        let fs = self.fs;
        let data = fs.geo.data_extent();
        let mut live: Vec<Info> = self.model.live.values().copied().collect();
        live.sort_by_key(|i| i.h.ino);
        let mut used = 0u64;
        let mut tabled = self.tabled_runs();
        let orphans: HashSet<u64> = self.report.orphans.iter().copied().collect();
        for info in live {
            let ino = info.h.ino;
            let at = self.inode_at(ino);
            let map = fs.map.open_file(fs.file_id(ino))?;
            let runs = tabled.as_mut().map(|t| t.remove(&ino).unwrap_or_default());
            // The runs of `[from, from + len)`, from the table's pass or by a lookup.
            let mapped = |from: u64, len: u64| -> Result<Vec<Run>> {
                match &runs {
                    Some(runs) => Ok(clip(runs, from, from.saturating_add(len))),
                    None => {
                        let mut out = Vec::new();
                        fs.map.lookup(&map, from, len, &mut out)?;
                        Ok(out)
                    }
                }
            };
            let mut owned: Vec<Extent> = Vec::new();
            if let Some(runs) = &runs {
                owned.extend(runs.iter().map(|r| r.extent()));
            } else if let Err(e) = fs.map.owned_blocks(&map, &mut |e| owned.push(e)) {
                self.problem(
                    ProblemKind::BlockOutsideData,
                    at,
                    Some(ino),
                    format!("mapping unreadable: {e}"),
                );
                self.model.unreadable_maps.push(info);
                continue;
            }
            if info.kind == Some(Kind::File)
                && let Err(e) = self.file_log(ino, &mut owned)
            {
                self.problem(
                    ProblemKind::FileLog,
                    at,
                    Some(ino),
                    format!("log unreadable: {e}"),
                );
                self.model.unreadable_logs.push(info);
            }
            // HashFS keeps a file's log blocks in the file's own logical space, and they go
            // with the log (a read-write mount frees those of files without one).
            if let Some(runs) = &runs
                && info.kind == Some(Kind::File)
                && fs.map.kind() == MappingKind::HashFs
                && fs.inodes.load(fs.m(), ino, field::LOG)? == 0
                && !clip(runs, hashfs::LOG_LBLK_FIRST, hashfs::LOG_LBLK_END).is_empty()
            {
                self.problem(
                    ProblemKind::FileLog,
                    fs.inodes.field(ino, field::LOG),
                    Some(ino),
                    "log blocks mapped without a log".into(),
                );
            }
            for e in owned {
                for b in e.start.0..e.start.0.saturating_add(e.len) {
                    if !data.contains(pmfs_core::layout::BlockNo(b)) {
                        self.problem(
                            ProblemKind::BlockOutsideData,
                            at,
                            Some(ino),
                            format!("block {b} outside the data region"),
                        );
                        break;
                    }
                    used += 1;
                    if let Some(other) = self.model.owners.insert(b, ino) {
                        self.problem(
                            ProblemKind::BlockOwnedTwice,
                            at,
                            Some(ino),
                            format!("block {b} also owned by inode {other}"),
                        );
                    }
                }
            }
            // An orphan's blocks all go when the mount frees it, wherever they lie. Freeing
            // a file zeroes its MAPPED_END first, so one that a crash cut short can map
            // blocks past both its end and the word.
            if info.kind != Some(Kind::Dir) && !orphans.contains(&u64::from(ino)) {
                if info.kind == Some(Kind::Symlink)
                    && (1..BLOCK_SIZE).contains(&info.size)
                    && let Some((at, detail)) =
                        symlink_target_damage(fs, ino, mapped(0, 1)?.first(), info.size)
                {
                    self.problem(ProblemKind::SymlinkTarget, at, Some(ino), detail);
                }
                // Regular files may map blocks past their end up to MAPPED_END (fallocate
                // with KEEP_SIZE); MAPPED_END bounds every mapped block.
                let mapped_end = match info.kind {
                    Some(Kind::File) => fs.inodes.load(fs.m(), ino, field::MAPPED_END)?,
                    _ => 0,
                };
                let size_blocks = info.size.div_ceil(BLOCK_SIZE);
                let eof = size_blocks.max(mapped_end);
                // From MAPPED_END_VERSION on the word alone bounds the mapped blocks, once the
                // logs are digested (a crash may leave the word of an unfinished digest
                // behind, which the mount's digest raises again).
                if info.kind == Some(Kind::File)
                    && self.clean
                    && fs.geo.version >= format::MAPPED_END_VERSION
                    && mapped_end < size_blocks
                {
                    let span = size_blocks.min(crate::fs::MAX_FILE_SIZE / BLOCK_SIZE);
                    let past = mapped(mapped_end, span - mapped_end)?;
                    if let Some(upto) = past.iter().map(|r| r.lblk + r.len).max() {
                        self.problem(
                            ProblemKind::MappedEnd,
                            fs.inodes.field(ino, field::MAPPED_END),
                            Some(ino),
                            format!(
                                "blocks mapped up to block {upto}, past the mapped end at \
                                 block {mapped_end}"
                            ),
                        );
                        self.model.low_mapped_end.push((info.h, upto));
                    }
                }
                // A file never marked as having holes maps every block below its size: its
                // block count and the placement of its writes take that without a lookup.
                // The mark is durable before an update that makes a hole commits.
                if info.kind == Some(Kind::File)
                    && self.clean
                    && fs.inodes.flags(fs.m(), ino)? & flag::HOLES == 0
                {
                    let span = size_blocks.min(crate::fs::MAX_FILE_SIZE / BLOCK_SIZE);
                    let covered: u64 = mapped(0, span)?.iter().map(|r| r.len).sum();
                    if covered < span {
                        self.problem(
                            ProblemKind::HolesFlag,
                            fs.inodes.field(ino, GID_WORD),
                            Some(ino),
                            format!(
                                "{} of its {span} blocks are holes, but it is not marked as \
                                 having any",
                                span - covered
                            ),
                        );
                        self.model.unmarked_holes.push(info.h);
                    }
                }
                // Up to the largest file size: the log blocks (HashFS) and the
                // extended-attribute blocks lie past it.
                let span = data
                    .len
                    .max(1)
                    .min((crate::fs::MAX_FILE_SIZE / BLOCK_SIZE).saturating_sub(eof));
                let past = if span > 0 {
                    mapped(eof, span)?
                } else {
                    Vec::new()
                };
                if let Some(last) = past.last() {
                    self.problem(
                        ProblemKind::BlocksBeyondEof,
                        at,
                        Some(ino),
                        format!("blocks mapped past end of file (block {eof} on)"),
                    );
                    self.model
                        .beyond_eof
                        .push((info.h, eof, last.lblk + last.len));
                }
            }
        }
        self.report.used_blocks = used;
        let accountable =
            fs.alloc.is_none() || self.clean && crate::parts::alloc_is_persistent(fs.geo.allocator);
        // A volatile allocator, or a persistent one a crash left behind, is rebuilt by the
        // mount from the files' blocks: what is free then is what they leave.
        let free = if accountable {
            fs.free_blocks()?
        } else {
            data.len.saturating_sub(used)
        };
        self.report.free_blocks = free;
        if let crate::parts::Stager::Hash(t) = &fs.stage {
            self.report.staged_blocks = t.count_staged()?;
        }
        if accountable && used + free + self.report.staged_blocks != data.len {
            self.problem(
                ProblemKind::FreeSpace,
                data.start.offset(),
                None,
                format!(
                    "{used} used + {free} free + {} staged blocks but the data region has {}",
                    self.report.staged_blocks, data.len
                ),
            );
        }
        Ok(())
    }
}

/// Sorts `runs` by logical block and cuts from each the blocks a run before it maps already,
/// as a lookup keeps one mapping of a block a damaged table holds twice.
fn sort_runs(runs: &mut Vec<Run>) {
    runs.sort_unstable_by_key(|r| r.lblk);
    let mut end = 0u64;
    *runs = runs
        .iter()
        .filter_map(|r| {
            let kept = r.within(end, u64::MAX)?;
            end = kept.lblk + kept.len;
            Some(kept)
        })
        .collect();
}

/// The parts of `runs` (sorted by logical block, disjoint) inside `[from, end)`.
fn clip(runs: &[Run], from: u64, end: u64) -> Vec<Run> {
    runs.iter().filter_map(|r| r.within(from, end)).collect()
}

/// Examines `fs`, opened with [`Fs::open_for_check`] from superblock copy `src`. `clean`
/// says whether it was closed cleanly; `crashed`, the detail of a [`ProblemKind::NotClean`]
/// problem to report first (a volume recovered on a shadow for the check was closed cleanly
/// there, but not where it came from).
fn examine(
    fs: &Fs,
    src: SbSource,
    clean: bool,
    crashed: Option<String>,
) -> Result<(Report, Model)> {
    let mut c = Checker {
        fs,
        clean,
        report: Report::default(),
        model: Model::default(),
    };
    let m = fs.m();
    if src == SbSource::Backup {
        c.problem(
            ProblemKind::PrimarySuperblock,
            PmOff(0),
            None,
            "primary superblock damaged; the backup is valid".into(),
        );
    } else if !format::backup_matches(m, &fs.geo)? {
        c.problem(
            ProblemKind::BackupSuperblock,
            PmOff(BLOCK_SIZE),
            None,
            "backup superblock differs from the primary".into(),
        );
    }
    if let Some(detail) = crashed {
        c.problem(ProblemKind::NotClean, format::MOUNT_STATE_OFF, None, detail);
    }
    c.journal()?;
    c.inodes()?;
    if c.model.live.get(&fs.root.ino).map(|i| i.kind) != Some(Some(Kind::Dir)) {
        return Err(Error::Corrupt {
            what: "root inode",
            at: c.inode_at(fs.root.ino),
        });
    }
    c.tree()?;
    c.blocks()?;
    Ok((c.report, c.model))
}

/// The detail of the [`ProblemKind::NotClean`] problem of a volume examined as a crash left
/// it.
const AS_LEFT: &str = "volume was not closed cleanly; mounting will recover it";

/// Checks the volume on `media` without writing to it. Fails only when the volume cannot be
/// examined at all (no valid superblock, no root directory).
///
/// A volume that was not closed cleanly is checked as its next mount will leave it: the check
/// recovers it on a [`ShadowRegion`](pmfs_core::pm::ShadowRegion) over `media`, which keeps what
/// recovery writes in memory, and examines the result. A crash leaves half-done operations that
/// recovery undoes or completes (a journal transaction, a directory insertion, an unfinished table
/// update); they are not damage, and only damage that survives recovery is reported, after the
/// [`ProblemKind::NotClean`] problem, whose detail says what recovery did. Where recovery fails,
/// the volume is examined as the crash left it.
pub fn check(media: Arc<dyn Media>) -> Result<Report> {
    check_recovering(media).map(|(r, _)| r)
}

/// [`check`], and whether the volume was clean or its recovery worked.
fn check_recovering(media: Arc<dyn Media>) -> Result<(Report, bool)> {
    let (fs, src, clean) = Fs::open_for_check(media.clone())?;
    if clean {
        return examine(&fs, src, true, None).map(|(r, _)| (r, true));
    }
    match Fs::recover_in_memory(media, false) {
        Ok((shadow, r)) => {
            let (shadow_fs, _, _) = Fs::open_for_check(shadow)?;
            let detail = format!("{AS_LEFT} ({r}; checked as recovered)");
            examine(&shadow_fs, src, true, Some(detail)).map(|(r, _)| (r, true))
        }
        Err(e) => {
            let detail = format!("{AS_LEFT}, but recovery fails ({e}); checked as left");
            examine(&fs, src, false, Some(detail)).map(|(r, _)| (r, false))
        }
    }
}

/// Sets the link count of each live inode that has names but a zero count to its number of
/// names.
fn relink_named(fs: &Fs, model: &Model, actions: &mut Vec<String>) -> Result<()> {
    let m = fs.m();
    let mut named: Vec<(u32, u64)> = model
        .live
        .values()
        .filter(|i| i.nlink == 0)
        .filter_map(|i| {
            let n = model.names.get(&i.h.ino).map_or(0, Vec::len) as u64;
            (n > 0).then_some((i.h.ino, n))
        })
        .collect();
    named.sort_unstable();
    for &(ino, n) in &named {
        fs.inodes.store(m, ino, field::NLINK, n)?;
        actions.push(format!("set link count of inode {ino} from 0 to {n}"));
    }
    m.fence();
    Ok(())
}

/// Gives every inode whose mapping cannot be read (a damaged tree node, or a pointer outside
/// the data region, which the trees refuse) an empty one: a file keeps its size and reads as
/// zeros, a directory is emptied (the repair after the mount links what it held into
/// `/lost+found`), a symbolic link loses its target. The tree's blocks come back with the
/// allocator's rebuild. The first step of each makes the second safe to find undone: a file
/// is marked as having holes and a directory's size goes to zero before the root word does.
fn drop_unreadable_maps(fs: &Fs, model: &Model, actions: &mut Vec<String>) -> Result<()> {
    let m = fs.m();
    for info in &model.unreadable_maps {
        let h = info.h;
        if fs.inodes.load(m, h.ino, field::STATE)? != h.live_state() {
            continue;
        }
        match info.kind {
            Some(Kind::File) => fs.inodes.set_flags(m, h.ino, flag::HOLES)?,
            Some(Kind::Dir) => fs.inodes.store(m, h.ino, field::SIZE, 0)?,
            _ => {}
        }
        m.fence();
        fs.inodes.store(m, h.ino, field::ROOT, 0)?;
        m.fence();
        let lost = match info.kind {
            Some(Kind::File) => "its data reads as zeros",
            Some(Kind::Dir) => "its entries are gone",
            _ => "its contents are gone",
        };
        actions.push(format!(
            "dropped the damaged mapping of inode {}: {lost}",
            h.ino
        ));
    }
    Ok(())
}

/// Drops every log that cannot be read, which the mount would fail on: the digest cursor goes
/// to zero first, then the log word (a cursor left behind alone would lie beyond the next log's
/// tail). On a cleanly closed volume every entry is applied already and nothing is lost;
/// after a crash the writes not yet applied are. The log's blocks come back with the
/// allocator's rebuild, or on HashFS, where they stay mapped in the file's own space, with
/// the mount, which frees the log blocks of files without a log.
fn drop_unreadable_logs(
    fs: &Fs,
    model: &Model,
    clean: bool,
    actions: &mut Vec<String>,
) -> Result<()> {
    let m = fs.m();
    for info in &model.unreadable_logs {
        let h = info.h;
        if fs.inodes.load(m, h.ino, field::STATE)? != h.live_state() {
            continue;
        }
        fs.inodes.store(m, h.ino, field::DIGEST, 0)?;
        m.fence();
        fs.inodes.store(m, h.ino, field::LOG, 0)?;
        m.fence();
        actions.push(format!(
            "dropped the damaged log of inode {}: {}",
            h.ino,
            if clean {
                "every entry of it was applied"
            } else {
                "writes it had not applied are lost"
            }
        ));
    }
    Ok(())
}

/// Repairs the volume on `media` (see the module documentation).
pub fn repair(media: Arc<dyn Media>) -> Result<Repair> {
    let mut actions = Vec::new();
    let before = {
        let (fs, src, clean) = Fs::open_for_check(media.clone())?;
        // What a check reports, before anything changes: of a crashed volume, what survives
        // its recovery. The fixes before mounting below work from the volume as it is.
        let (checked, recovers) = if clean {
            (None, true)
        } else {
            let (r, recovers) = check_recovering(media.clone())?;
            (Some(r), recovers)
        };
        let (as_left, model) = examine(&fs, src, clean, (!clean).then(|| AS_LEFT.into()))?;
        // Before mounting, which digests every log: a cursor beyond its log's tail (damage
        // took entries the mapping already holds) goes back to the tail, where the next
        // commit lands.
        for &(ino, tail) in &model.cursor_beyond_tail {
            let cursor = fs.inodes.field(ino, field::DIGEST);
            if let Some(was) = pmfs_core::log::clamp_cursor(fs.m(), cursor, tail)? {
                actions.push(format!(
                    "moved the digest cursor of inode {ino} from LSN {was} back to the log \
                     tail at LSN {tail}"
                ));
            }
        }
        // Also before mounting, which frees every inode without links: a named inode whose
        // link count damage zeroed gets its count of names back. Only on a cleanly closed
        // volume, where no half-done unlink still names the inode it is dropping.
        if clean {
            relink_named(&fs, &model, &mut actions)?;
        }
        // And before anything takes the mapped end for a bound: raised over every block the
        // file maps.
        for &(h, upto) in &model.low_mapped_end {
            let m = fs.m();
            if fs.inodes.load(m, h.ino, field::STATE)? == h.live_state()
                && fs.inodes.load(m, h.ino, field::MAPPED_END)? < upto
            {
                fs.inodes.store(m, h.ino, field::MAPPED_END, upto)?;
                m.fence();
                actions.push(format!(
                    "raised the mapped end of inode {} to block {upto}",
                    h.ino
                ));
            }
        }
        // And before the mount, which reads every mapping to rebuild a volatile allocator and
        // fails on one it cannot read. Only where that is damage: as a crash left it, a tree
        // may be caught in an update that the mount's recovery finishes, and unless that
        // recovery fails the tree is left to it (a repair of the recovered volume finds it
        // if it is still damaged).
        if clean || !recovers {
            drop_unreadable_maps(&fs, &model, &mut actions)?;
            drop_unreadable_logs(&fs, &model, clean, &mut actions)?;
        }
        checked.unwrap_or(as_left)
    };
    if before.is_clean() && before.orphans.is_empty() && before.staged_blocks == 0 {
        return Ok(Repair {
            after: before.clone(),
            before,
            actions,
        });
    }
    {
        let fs = Fs::mount(media.clone(), false)?;
        let r = fs.report;
        if !r.clean {
            actions.push(format!("recovered: {r}"));
        } else if r.did_anything() {
            actions.push(format!("mounted: {r}"));
        }
        if before.staged_blocks > 0 {
            actions.push(format!(
                "dropped {} blocks staged by writes that never committed",
                before.staged_blocks
            ));
        }
        let m = fs.m();
        if !format::backup_matches(m, &fs.geo)? {
            format::restore_backup(m, &fs.geo)?;
            actions.push("rewrote the backup superblock".into());
        }
        let (_, model) = examine(&fs, SbSource::Primary, true, None)?;
        fix(&fs, &model, &mut actions)?;
        fs.shutdown()?;
    }
    let after = check(media)?;
    Ok(Repair {
        before,
        actions,
        after,
    })
}

/// What [`check_dentry_page`] found in one directory page.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DentryPage {
    /// The names of the entries, in list order (up to a half-done operation).
    pub names: Vec<Vec<u8>>,
    /// Whether the list holds a half-done insertion or removal, which recovery would undo or
    /// complete. The walk stops there: `names` lists the entries before it.
    pub pending: bool,
}

/// Parses one directory page on its own, with the same code the checker and mount use: the
/// header must belong to page `index` of the directory whose inode is `owner` (its
/// [`Ino::raw`](crate::Ino::raw) value: generation above, number below), and the dentry list
/// must be well formed with matching entry checksums. For tools that inspect single pages
/// and for fuzzing the page parser.
///
/// # Errors
/// [`Error::InvalidArgument`] if `page` is not one block long; [`Error::Corrupt`] for a
/// damaged or foreign header or a damaged dentry list (`at` is the offset in the page).
pub fn check_dentry_page(page: &[u8], owner: u64, index: u64) -> Result<DentryPage> {
    if page.len() != PAGE {
        return Err(Error::InvalidArgument("a directory page is one block long"));
    }
    let view = PageView::new(page);
    if !view.header_ok(owner, index) {
        return Err(Error::Corrupt {
            what: "directory page header",
            at: PmOff(0),
        });
    }
    let walk = view.walk(|o| PmOff(u64::from(o)))?;
    Ok(DentryPage {
        names: walk.entries.into_iter().map(|e| e.name).collect(),
        pending: walk.pending.is_some(),
    })
}

/// Applies the fixes for what `examine` found on a mounted volume.
fn fix(fs: &Fs, model: &Model, actions: &mut Vec<String>) -> Result<()> {
    let m = fs.m();
    release_dead(fs, model, actions)?;
    for (dir, name) in &model.bad_entries {
        let d = fs.dir(*dir)?;
        let mut inner = d.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = inner.get(name) {
            let r = inner.plan_remove(m, &s)?;
            inner.unlink_prev(m, &r, 0, fs.now())?;
            m.fence();
            inner.unlink_next(m, &r)?;
            m.fence();
            inner.finish_remove(&r, name);
            actions.push(format!(
                "dropped entry {:?} of directory {}",
                String::from_utf8_lossy(name),
                dir.ino
            ));
        }
    }
    let mut live: Vec<Info> = model.live.values().copied().collect();
    live.sort_by_key(|i| i.h.ino);
    let names_of = |ino: u32| model.names.get(&ino).map_or(&[][..], |v| &v[..]);
    let orphan = |i: &Info| i.h.ino != fs.root.ino && i.nlink == 0 && names_of(i.h.ino).is_empty();
    let orphans: Vec<Handle> = live.iter().filter(|i| orphan(i)).map(|i| i.h).collect();
    fs.free_whole(&orphans)?;
    for h in &orphans {
        actions.push(format!("freed orphan inode {}", h.ino));
    }
    let mut lost_found = None;
    for info in &live {
        let ino = info.h.ino;
        if ino == fs.root.ino || orphan(info) {
            continue;
        }
        let names = names_of(ino);
        let reachable = model.reachable.contains(&ino);
        match info.kind {
            Some(Kind::Dir) => {
                if let Some((dir, _)) = names.first()
                    && info.parent != dir.word()
                {
                    fs.inodes.store(m, ino, field::PARENT, dir.word())?;
                    m.fence();
                    fs.dir(info.h)?.set_parent(*dir);
                    actions.push(format!("set parent of directory {ino} to {}", dir.ino));
                }
            }
            Some(_) => {
                let want = names.len() as u64;
                if want > 0 && info.nlink != want {
                    fs.inodes.store(m, ino, field::NLINK, want)?;
                    m.fence();
                    actions.push(format!("set link count of inode {ino} to {want}"));
                }
            }
            None => continue,
        }
        if !reachable && names.is_empty() {
            let lf = match &lost_found {
                Some(h) => *h,
                None => {
                    let h = lost_and_found(fs)?;
                    lost_found = Some(h);
                    h
                }
            };
            attach(fs, lf, info, actions)?;
        }
    }
    // The attributes cannot be had back: the inode loses them. The word goes first, so that
    // a crash between the steps leaves blocks mapped without attributes, as a removal of the
    // last attribute can, which the next change of attributes reuses.
    for h in &model.bad_xattrs {
        if fs.inodes.load(m, h.ino, field::STATE)? == h.live_state() {
            fs.inodes.store(m, h.ino, field::XATTR, 0)?;
            m.fence();
            let f = fs.map.open_file(fs.file_id(h.ino))?;
            fs.map
                .remove(&f, crate::xattr::XATTR_LBLK, crate::xattr::XATTR_BLOCKS)?;
            actions.push(format!(
                "dropped the unreadable extended attributes of inode {}",
                h.ino
            ));
        }
    }
    for h in &model.unmarked_holes {
        if fs.inodes.load(m, h.ino, field::STATE)? == h.live_state() {
            fs.inodes.set_flags(m, h.ino, flag::HOLES)?;
            m.fence();
            actions.push(format!("marked inode {} as having holes", h.ino));
        }
    }
    for &(h, from, upto) in &model.beyond_eof {
        if fs.inodes.load(m, h.ino, field::STATE)? == h.live_state() && upto > from {
            let f = fs.map.open_file(fs.file_id(h.ino))?;
            fs.map.remove(&f, from, upto - from)?;
            actions.push(format!("trimmed inode {} past block {from}", h.ino));
        }
    }
    if let Some(alloc) = &fs.alloc {
        // From the inodes live now (repair may have created /lost+found).
        let used = live_blocks(fs)?;
        let disjoint = used.windows(2).all(|w| w[0].end() <= w[1].start);
        if disjoint {
            alloc.rebuild(&mut used.into_iter())?;
            actions.push("rebuilt the allocator from the files' blocks".into());
        }
    }
    Ok(())
}

/// Unmaps the blocks that a table holding every file's (the hashed structures) still maps to
/// dead inodes, first of all repairs: their inode numbers may be handed out again below, and
/// the new file would find the blocks mapped. On HashFS, whose table is the allocator too,
/// this is also the only way they come back. The cuckoo table gives them back to the
/// allocator, which the mount rebuilt from the live files (a volatile one) or kept (a
/// persistent one): it may hold them free already, and freeing a free block fails. So it is
/// rebuilt to hold them for the release, and after it to hold the live files' blocks alone.
///
/// The trees hang from the inode's root word, which a new file's record zeroes, so a dead
/// inode's tree is left alone: its blocks come back with the allocator's rebuild at the end,
/// and its nodes, which the allocator may have handed out again since the damage, are not
/// read or written.
fn release_dead(fs: &Fs, model: &Model, actions: &mut Vec<String>) -> Result<()> {
    let m = fs.m();
    let mut releasing = Vec::new();
    for &ino in &model.dead_owners {
        if fs.inodes.load(m, ino, field::STATE)? & crate::inode::LIVE == 0 {
            let f = fs.map.open_file(fs.file_id(ino))?;
            let mut owned = Vec::new();
            fs.map.owned_blocks(&f, &mut |e| owned.push(e))?;
            if !owned.is_empty() {
                releasing.push((ino, f, owned));
            }
        }
    }
    if releasing.is_empty() {
        return Ok(());
    }
    let live = match &fs.alloc {
        Some(alloc) => {
            let mut live = UsedBlocks::new(fs.geo.data_extent());
            for e in live_blocks(fs)? {
                live.mark(e)?;
            }
            let mut held = live.clone();
            for &e in releasing.iter().flat_map(|(_, _, owned)| owned) {
                held.mark(e)?;
            }
            alloc.rebuild(&mut held.extents())?;
            Some((alloc, live))
        }
        None => None,
    };
    for (ino, f, owned) in releasing {
        fs.map.remove_file(&f)?;
        let blocks: u64 = owned.iter().map(|e| e.len).sum();
        actions.push(format!("released {blocks} blocks of dead inode {ino}"));
    }
    if let Some((alloc, live)) = live {
        alloc.rebuild(&mut live.extents())?;
    }
    Ok(())
}

/// The blocks of every live inode (mappings and logs), sorted, a block that several map
/// once per mapping.
fn live_blocks(fs: &Fs) -> Result<Vec<Extent>> {
    let mut live = Vec::new();
    fs.inodes.scan(fs.m(), |ino, r| {
        if ino != 0 && r.is_live() {
            live.push(ino);
        }
        Ok(())
    })?;
    let mut used = Vec::new();
    fs.owned_by(&live, &mut |e| used.push(e), &mut |_| {})?;
    for ino in live {
        log_blocks(fs, ino, &mut used)?;
    }
    used.sort();
    used.dedup();
    Ok(used)
}

/// Adds the blocks of inode `ino`'s log to `out` when the volume's allocator hands them out
/// (HashFS reports a file's log blocks with its mapping already).
fn log_blocks(fs: &Fs, ino: u32, out: &mut Vec<Extent>) -> Result<()> {
    let root = fs.inodes.field(ino, field::LOG);
    if fs.alloc.is_none() || fs.m().load_u64(root)? == 0 {
        return Ok(());
    }
    pmfs_core::log::owned_blocks(fs.m(), root, &mut |b| out.push(Extent::new(b, 1)))?;
    Ok(())
}

/// What is wrong with the target block of symbolic link `ino`, which maps `block` at
/// logical block 0 and whose record gives the target `len` bytes (fewer than a block), and
/// where, if anything.
fn symlink_target_damage(
    fs: &Fs,
    ino: u32,
    block: Option<&Run>,
    len: u64,
) -> Option<(PmOff, String)> {
    let Some(run) = block else {
        return Some((fs.inodes.field(ino, 0), "target block not mapped".into()));
    };
    let at = run.pblk.offset();
    let mut block = vec![0u8; BLOCK_SIZE as usize];
    if let Err(e) = fs.m().read(at, &mut block) {
        return Some((at, format!("target block unreadable: {e}")));
    }
    let (target, rest) = block.split_at(len as usize);
    if let Some(i) = target.iter().position(|&b| b == 0) {
        return Some((at, format!("NUL at byte {i} of the {len}-byte target")));
    }
    if let Some(i) = rest.iter().position(|&b| b != 0) {
        return Some((
            at,
            format!("byte {} past the target is not zero", len as usize + i),
        ));
    }
    None
}

/// The handle of `/lost+found`, created when missing.
fn lost_and_found(fs: &Fs) -> Result<Handle> {
    let root = fs.root_dir()?;
    let existing = root
        .inner
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(b"lost+found");
    match existing {
        Some(s) if s.kind == Kind::Dir => Ok(s.h),
        Some(_) => Err(Error::AlreadyExists),
        None => fs.create(&root, b"lost+found", Kind::Dir, 0o700, None),
    }
}

/// Links an unreachable object into `/lost+found` as `#<ino>`.
fn attach(fs: &Fs, lf: Handle, info: &Info, actions: &mut Vec<String>) -> Result<()> {
    let Some(kind) = info.kind else {
        return Ok(());
    };
    let m = fs.m();
    let dir = fs.dir(lf)?;
    let name = format!("#{}", info.h.ino).into_bytes();
    let mut d = dir.inner.write().unwrap_or_else(|e| e.into_inner());
    if d.get(&name).is_some() {
        return Ok(());
    }
    let now = fs.now();
    let ins = d.prepare_insert(fs, lf, &name, kind, info.h, false, now)?;
    d.link_prev(m, &ins)?;
    m.fence();
    d.link_next(m, &ins)?;
    m.fence();
    d.finish_insert(&ins, &name, kind, info.h);
    d.touch(now);
    if kind == Kind::Dir {
        fs.inodes.store(m, info.h.ino, field::PARENT, lf.word())?;
        if let Ok(child) = fs.dir(info.h) {
            child.set_parent(lf);
        }
    } else {
        fs.inodes.store(m, info.h.ino, field::NLINK, 1)?;
    }
    m.fence();
    actions.push(format!(
        "linked unreachable inode {} into /lost+found",
        info.h.ino
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use pmfs_core::layout::BlockNo;

    use super::*;

    fn run(lblk: u64, pblk: u64, len: u64) -> Run {
        Run::new(lblk, BlockNo(pblk), len)
    }

    #[test]
    fn runs_of_a_pass_are_sorted_and_blocks_mapped_twice_kept_once() {
        let mut runs = vec![
            run(20, 500, 4),
            run(0, 100, 8),
            run(4, 300, 2),
            run(6, 302, 4),
            run(21, 900, 1),
        ];
        sort_runs(&mut runs);
        assert_eq!(runs, [run(0, 100, 8), run(8, 304, 2), run(20, 500, 4)]);
    }

    #[test]
    fn clipping_keeps_the_blocks_of_a_range() {
        let runs = [run(0, 100, 8), run(8, 304, 2), run(20, 500, 4)];
        assert_eq!(
            clip(&runs, 6, 22),
            [run(6, 106, 2), run(8, 304, 2), run(20, 500, 2)]
        );
        assert_eq!(clip(&runs, 10, 20), []);
        assert_eq!(clip(&runs, 23, u64::MAX), [run(23, 503, 1)]);
    }
}
