//! The radix tree (HashFS paper §3.1.2): a per-file tree of 4 KiB nodes, each resolving 9 bits
//! of the logical block number, read and updated directly on PM.
//!
//! # On-media format
//!
//! **Root word** — the 8-byte word [`FileId::root`] in the caller's inode:
//!
//! | bits | field |
//! |---|---|
//! | 0..48 | block of the top node |
//! | 48..56 | height: number of levels, 1 ..= [`MAX_HEIGHT`] |
//! | 56..64 | tag `0x52` |
//!
//! 0 is an empty file. A tree of height `h` maps logical blocks below `2^(9h)`; its top node is
//! at level `h - 1`, leaves at level 0.
//!
//! **Node** — one 4 KiB block of 512 little-endian 8-byte entries, no header. Entry `i` of a
//! node at level `L` stands for the logical blocks whose bits `9L .. 9L + 9` equal `i`:
//!
//! | bits | field |
//! |---|---|
//! | 0..48 | the child node (levels above 0) or the data block (level 0) |
//! | 48..63 | zero |
//! | 63 | present |
//!
//! An all-zero entry is a hole. Non-top nodes are never all holes (emptied nodes are freed),
//! and a top node above level 0 always has an entry other than entry 0 (otherwise the tree
//! shrinks by a level).
//!
//! **Meta area** — [`crate::undo`]'s header (magic `pmfsRADX`, version [`RADIX_VERSION`]) and
//! its undo-log slots; [`meta_blocks`](RadixTree::meta_blocks) gives its size.
//!
//! # Updates and the undo log
//!
//! Entries are written with 8-byte atomic stores. A call that changes one entry of a
//! reachable node would be atomic by itself, but calls change many (a multi-block insert,
//! a range remove, adding or removing levels), so every mutating call is one [`Tx`]: the old
//! values of the entries and of the root word it overwrites are logged first (a range of
//! holes is logged as "was zero", without payload), new nodes are written without logging,
//! and commit invalidates the log with one store after flushing everything.
//! [`recover`](FileMapping::recover) rolls back a call cut short by a crash.
//!
//! - insert: checks that the range is unmapped, allocates the data (`insert_at` takes the
//!   caller's blocks instead and is otherwise the same call), adds levels on top while
//!   the tree does not reach the last block (each new top node gets the old one as entry 0;
//!   the root word is switched once), creates missing nodes along the way and fills the leaf
//!   entries, one logged range per leaf.
//! - remove: frees subtrees that lie inside the range whole (their parent entry is zeroed,
//!   the subtree itself is not touched), zeroes boundary entries, frees nodes that become all
//!   holes, and removes top levels whose node only uses entry 0 (one root-word switch).
//! - replace: an insert without the check that the range is unmapped; the data blocks of the
//!   leaf entries it overwrites are released, in the same transaction.
//! - replace_many: a run whose every block is mapped already is an overwrite; its leaf
//!   entries are stored in place, each an atomic 8-byte store that needs no undo record (the
//!   call may stop after any of its blocks, see [`FileMapping::replace_many`]), flushed, and
//!   one fence covers the whole batch before the replaced blocks go back to the allocator.
//!   Any other run is a `replace`.
//! - remove_file: stores 0 into the root word (one atomic commit), then frees every block.
//!
//! # Concurrency
//!
//! As for the extent tree: a reader-writer lock in the [`RadixFile`] handle (lookups shared,
//! mutations exclusive; handles of one inode do not exclude each other); different files only
//! share the allocator and the undo slots. The handle's DRAM cursor remembers the last leaf a
//! lookup read; it is used only while the root word and the tree's mutation count are the ones
//! it was taken under (a leaf freed through another handle of the inode may be reused).

#![forbid(unsafe_code)]

mod node;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use pmfs_core::layout::{BlockNo, PmOff};
use pmfs_core::pm::{Media, MediaExt};
use pmfs_core::traits::{BlockAllocator, Extent, FileId, FileMapping, MappingKind, Run};
use pmfs_core::{Error, Result};

pub use node::{BITS_PER_LEVEL, ENTRIES, MAX_HEIGHT};
use node::{Root, covers, decode_entry, entry_off, entry_span, entry_word, height_for, span};

use crate::undo::{
    AreaKind, Ledger, Tx, UndoGeometry, UndoLog, format_area, open_area, replace_many_in_place,
};

/// Where the data blocks of a new mapping come from.
#[derive(Clone, Copy, Debug)]
enum Data {
    /// Allocate them (`insert`).
    Allocate,
    /// The caller's blocks (`insert_at`).
    Given(Extent),
    /// The caller's blocks, mapped over whatever the range maps (`replace`).
    Over(Extent),
}

/// Magic of the radix tree's meta area.
pub const RADIX_MAGIC: u64 = u64::from_le_bytes(*b"pmfsRADX");
/// Version of the radix tree's on-media format.
pub const RADIX_VERSION: u32 = 1;
const AREA: AreaKind = AreaKind {
    magic: RADIX_MAGIC,
    version: RADIX_VERSION,
};

/// Format-time choices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RadixOptions {
    /// Undo-log slots of the meta area.
    pub undo: UndoGeometry,
}

impl RadixOptions {
    /// Blocks of the meta area these options need.
    pub fn meta_blocks(&self) -> u64 {
        self.undo.area_blocks()
    }
}

/// The radix-tree mapping over media `M`, drawing blocks from allocator `A`.
pub struct RadixTree<M, A> {
    media: M,
    meta: Extent,
    alloc: Arc<A>,
    undo: UndoLog,
    /// Counts mutations of any file: a cursor taken under another count is stale. Handles of
    /// one inode do not see each other's mutations, and the engine opens one per open file.
    generation: AtomicU64,
    blocks: u64,
}

impl<M, A> std::fmt::Debug for RadixTree<M, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RadixTree")
            .field("meta", &self.meta)
            .field("blocks", &self.blocks)
            .finish_non_exhaustive()
    }
}

/// The DRAM state of one open file: its lock and lookup cursor. See the module docs.
#[derive(Debug)]
pub struct RadixFile {
    id: FileId,
    lock: RwLock<()>,
    cursor: Mutex<Option<Cursor>>,
}

/// The last leaf a lookup read: the leaf holding logical blocks `[512·index, 512·index+512)`.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    root: u64,
    generation: u64,
    index: u64,
    leaf: BlockNo,
}

/// Collects the runs of a lookup, merging blocks that continue the previous run.
struct Sink<'a> {
    out: &'a mut Vec<Run>,
    first: usize,
    last_leaf: Option<(u64, BlockNo)>,
    budget: u64,
}

impl Sink<'_> {
    fn push(&mut self, lblk: u64, pblk: u64) {
        if self.out.len() > self.first
            && let Some(last) = self.out.last_mut()
            && last.lblk + last.len == lblk
            && last.pblk.0 + last.len == pblk
        {
            last.len += 1;
            return;
        }
        self.out.push(Run {
            lblk,
            pblk: BlockNo(pblk),
            len: 1,
        });
    }
}

impl<M: Media, A: BlockAllocator> RadixTree<M, A> {
    /// Blocks of the meta area for the default options.
    pub fn meta_blocks() -> u64 {
        RadixOptions::default().meta_blocks()
    }

    /// Formats an empty structure with the default options in `meta`.
    pub fn format(media: M, meta: Extent, alloc: Arc<A>) -> Result<Self> {
        Self::format_with(media, meta, alloc, RadixOptions::default())
    }

    /// Formats an empty structure with chosen options.
    pub fn format_with(media: M, meta: Extent, alloc: Arc<A>, opts: RadixOptions) -> Result<Self> {
        let undo = format_area(&media, meta, AREA, opts.undo, [0; 8])?;
        Ok(Self::assemble(media, meta, alloc, undo))
    }

    /// Opens a formatted structure. Call [`recover`](FileMapping::recover) before use if the
    /// region was not closed cleanly.
    pub fn open(media: M, meta: Extent, alloc: Arc<A>) -> Result<Self> {
        let (undo, _) = open_area(&media, meta, AREA)?;
        Ok(Self::assemble(media, meta, alloc, undo))
    }

    fn assemble(media: M, meta: Extent, alloc: Arc<A>, undo: UndoLog) -> Self {
        let blocks = media.blocks();
        Self {
            media,
            meta,
            alloc,
            undo,
            generation: AtomicU64::new(0),
            blocks,
        }
    }

    /// Height of a file's tree (0 for an empty file).
    pub fn height(&self, file: &RadixFile) -> Result<u8> {
        let _g = file.lock.read().unwrap_or_else(|e| e.into_inner());
        Ok(self.root(file)?.map_or(0, |r| r.height))
    }

    fn root(&self, file: &RadixFile) -> Result<Option<Root>> {
        Root::unpack(self.media.load_u64(file.id.root)?, file.id.root)
    }

    /// Validates a block an entry points to.
    fn check_block(&self, b: BlockNo, at: PmOff, what: &'static str) -> Result<BlockNo> {
        if b.0 >= self.blocks || self.meta.contains(b) {
            return Err(Error::Corrupt { what, at });
        }
        Ok(b)
    }

    /// Loads and decodes entry `i` of `node`.
    fn entry(&self, node: BlockNo, i: u64) -> Result<(u64, Option<BlockNo>)> {
        let off = entry_off(node, i);
        let w = self.media.load_u64(off)?;
        Ok((w, decode_entry(w, off)?))
    }

    /// The entries `[i0, i1)` of a node at `level` with base `base` that overlap `[a, b)`.
    fn index_range(level: u8, base: u128, a: u128, b: u128) -> (u64, u64) {
        let es = entry_span(level);
        let i0 = (a.max(base) - base) / es;
        let i1 = (b - base).div_ceil(es).min(u128::from(ENTRIES));
        (i0 as u64, i1 as u64)
    }

    /// Appends the mapped blocks of `[a, b)` under `node` (at `level`, first logical block
    /// `base`).
    #[allow(clippy::too_many_arguments)]
    fn walk(
        &self,
        node: BlockNo,
        level: u8,
        base: u128,
        a: u128,
        b: u128,
        sink: &mut Sink<'_>,
    ) -> Result<()> {
        if sink.budget == 0 {
            return Err(Error::Corrupt {
                what: "radix tree larger than the region",
                at: node.offset(),
            });
        }
        sink.budget -= 1;
        let (i0, i1) = Self::index_range(level, base, a, b);
        for i in i0..i1 {
            let (_, child) = self.entry(node, i)?;
            let Some(child) = child else { continue };
            let at = entry_off(node, i);
            let lb = base + u128::from(i) * entry_span(level);
            if level == 0 {
                self.check_block(child, at, "radix data pointer")?;
                sink.push(lb as u64, child.0);
            } else {
                self.check_block(child, at, "radix node pointer")?;
                self.walk(child, level - 1, lb, a, b, sink)?;
            }
        }
        if level == 0 {
            sink.last_leaf = Some(((base >> BITS_PER_LEVEL) as u64, node));
        }
        Ok(())
    }

    /// Appends the mapped runs of `[a, b)` (the caller holds the file lock).
    fn lookup_locked(&self, file: &RadixFile, a: u64, b: u64, out: &mut Vec<Run>) -> Result<()> {
        let root_word = self.media.load_u64(file.id.root)?;
        let Some(root) = Root::unpack(root_word, file.id.root)? else {
            return Ok(());
        };
        let end = u128::from(b).min(span(root.level()));
        let mut at = u128::from(a);
        if at >= end {
            return Ok(());
        }
        let generation = self.generation.load(Ordering::Acquire);
        let mut sink = Sink {
            first: out.len(),
            out,
            last_leaf: None,
            budget: self.blocks,
        };
        let cached = file.cursor.try_lock().ok().and_then(|g| *g).filter(|c| {
            c.root == root_word && c.generation == generation && u128::from(c.index) == at >> 9
        });
        if let Some(c) = cached {
            let leaf_base = u128::from(c.index) << BITS_PER_LEVEL;
            let leaf_end = (leaf_base + u128::from(ENTRIES)).min(end);
            self.check_block(c.leaf, file.id.root, "radix node pointer")?;
            self.walk(c.leaf, 0, leaf_base, at, leaf_end, &mut sink)?;
            at = leaf_end;
        }
        if at < end {
            self.check_block(root.block, file.id.root, "radix node pointer")?;
            self.walk(root.block, root.level(), 0, at, end, &mut sink)?;
        }
        if let Some((index, leaf)) = sink.last_leaf
            && let Ok(mut g) = file.cursor.try_lock()
        {
            *g = Some(Cursor {
                root: root_word,
                generation,
                index,
                leaf,
            });
        }
        Ok(())
    }

    fn invalidate(&self, file: &RadixFile) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Ok(mut c) = file.cursor.lock() {
            *c = None;
        }
    }

    /// Whether the allocator handed out blocks inside the region and outside the meta area.
    fn inside(&self, e: Extent) -> bool {
        e.start
            .0
            .checked_add(e.len)
            .is_some_and(|end| end <= self.blocks)
            && !(e.start < self.meta.end() && e.end() > self.meta.start)
    }

    /// Allocates and zeroes a node (fresh: written without logging).
    fn new_node(&self, tx: &mut Tx<'_, M>, ledger: &mut Ledger) -> Result<BlockNo> {
        let b = ledger.alloc_node(&*self.alloc, |e| self.inside(e))?;
        tx.zero_fresh_block(b)?;
        Ok(b)
    }

    /// Stores entry words at `off`: logged unless `node` is fresh.
    fn store(
        &self,
        tx: &mut Tx<'_, M>,
        ledger: &Ledger,
        node: BlockNo,
        off: PmOff,
        words: &[u64],
    ) -> Result<()> {
        if ledger.is_fresh_node(node) {
            for (k, &w) in words.iter().enumerate() {
                tx.store_fresh_u64(off + 8 * k as u64, w)?;
            }
            Ok(())
        } else {
            tx.store_words(off, words)
        }
    }

    /// The leaf holding `lblk`, creating the missing nodes on the way down.
    fn ensure_leaf(
        &self,
        tx: &mut Tx<'_, M>,
        ledger: &mut Ledger,
        root: Root,
        lblk: u64,
    ) -> Result<BlockNo> {
        let mut node = self.check_block(root.block, root.block.offset(), "radix node pointer")?;
        for level in (1..=root.level()).rev() {
            let i = (lblk >> (BITS_PER_LEVEL * u32::from(level))) & (ENTRIES - 1);
            let off = entry_off(node, i);
            node = match self.entry(node, i)?.1 {
                Some(child) => self.check_block(child, off, "radix node pointer")?,
                None => {
                    let child = self.new_node(tx, ledger)?;
                    self.store(tx, ledger, node, off, &[entry_word(child)])?;
                    child
                }
            };
        }
        Ok(node)
    }

    /// The body of an insert of `[a, b)` mapped to `data`, inside its transaction. Data blocks
    /// the range mapped before are released (a replace); returns how many.
    #[allow(clippy::too_many_arguments)]
    fn insert_tx(
        &self,
        tx: &mut Tx<'_, M>,
        ledger: &mut Ledger,
        root_off: PmOff,
        root: Option<Root>,
        a: u64,
        b: u64,
        data: &[Extent],
    ) -> Result<u64> {
        let last = b - 1;
        let mut top = match root {
            Some(r) => r,
            None => Root {
                block: self.new_node(tx, ledger)?,
                height: height_for(last),
            },
        };
        while !covers(top.height, last) {
            let block = self.new_node(tx, ledger)?;
            tx.store_fresh_u64(entry_off(block, 0), entry_word(top.block))?;
            top = Root {
                block,
                height: top.height + 1,
            };
        }
        if root != Some(top) {
            tx.store_u64(root_off, top.pack())?;
        }
        let mut pblks = data
            .iter()
            .flat_map(|e| (0..e.len).map(move |k| e.start.0 + k));
        let mut l = a;
        let mut count = 0;
        while l < b {
            let leaf = self.ensure_leaf(tx, ledger, top, l)?;
            let leaf_end = ((l >> BITS_PER_LEVEL) + 1)
                .checked_mul(ENTRIES)
                .map_or(b, |e| e.min(b));
            if !ledger.is_fresh_node(leaf) {
                for i in (l..leaf_end).map(|l| l & (ENTRIES - 1)) {
                    if let (_, Some(old)) = self.entry(leaf, i)? {
                        self.check_block(old, entry_off(leaf, i), "radix data pointer")?;
                        ledger.release(Extent::new(old, 1));
                        count += 1;
                    }
                }
            }
            let words: Vec<u64> = (l..leaf_end)
                .map(|_| pblks.next().map(|p| entry_word(BlockNo(p))))
                .collect::<Option<_>>()
                .ok_or(Error::InvalidArgument("fewer data blocks than the range"))?;
            let at = entry_off(leaf, l & (ENTRIES - 1));
            // One word, the last store of a transaction that has written nothing else: an
            // atomic store with no undo record.
            if let [w] = words[..]
                && leaf_end == b
                && tx.is_untouched()
            {
                tx.store_sole_u64(at, w)?;
            } else {
                self.store(tx, ledger, leaf, at, &words)?;
            }
            l = leaf_end;
        }
        Ok(count)
    }

    /// Maps `[lblk, lblk + len)` to data blocks that `data` says where to take from, in one
    /// transaction; returns the data extents in logical order and the number of data blocks
    /// it replaced (only [`Data::Over`] may replace any). The shared body of `insert`,
    /// `insert_at` and `replace`: only blocks this call allocated (nodes, and the data for
    /// [`Data::Allocate`]) go back to the allocator when it fails.
    fn map_range(
        &self,
        file: &RadixFile,
        lblk: u64,
        len: u64,
        data: Data,
    ) -> Result<(Vec<Extent>, u64)> {
        if len == 0 {
            return Ok((Vec::new(), 0));
        }
        let b = lblk
            .checked_add(len)
            .ok_or(Error::InvalidArgument("logical range overflows"))?;
        if let Data::Given(e) | Data::Over(e) = data
            && !self.inside(e)
        {
            return Err(Error::InvalidArgument(
                "blocks outside the tree's data area",
            ));
        }
        let _g = file.lock.write().unwrap_or_else(|e| e.into_inner());
        let root = self.root(file)?;
        let mut goal = None;
        if root.is_some() && !matches!(data, Data::Over(_)) {
            let mut probe = Vec::new();
            self.lookup_locked(file, lblk, b, &mut probe)?;
            if !probe.is_empty() {
                return Err(Error::InvalidArgument("insert over mapped blocks"));
            }
            if lblk > 0 && matches!(data, Data::Allocate) {
                self.lookup_locked(file, lblk - 1, lblk, &mut probe)?;
                goal = probe.first().map(|r| r.pblk + r.len);
            }
        }
        let mut ledger = Ledger::new();
        let data = match data {
            Data::Allocate => ledger.alloc_data(&*self.alloc, len, goal, |e| self.inside(e))?,
            Data::Given(e) | Data::Over(e) => vec![e],
        };
        let count = self.transact(file, ledger, |tx, ledger| {
            self.insert_tx(tx, ledger, file.id.root, root, lblk, b, &data)
        })?;
        Ok((data, count))
    }

    /// The leaf holding `lblk`, if the tree has one (nothing is created).
    fn find_leaf(&self, root: Root, lblk: u64) -> Result<Option<BlockNo>> {
        if u128::from(lblk) >= span(root.level()) {
            return Ok(None);
        }
        let mut node = self.check_block(root.block, root.block.offset(), "radix node pointer")?;
        for level in (1..=root.level()).rev() {
            let i = (lblk >> (BITS_PER_LEVEL * u32::from(level))) & (ENTRIES - 1);
            match self.entry(node, i)?.1 {
                Some(child) => {
                    node = self.check_block(child, entry_off(node, i), "radix node pointer")?;
                }
                None => return Ok(None),
            }
        }
        Ok(Some(node))
    }

    /// The leaf entries of `run` with the data blocks they map, or `None` if any block of the
    /// run is a hole. The caller holds the file lock.
    fn mapped_entries(&self, root: Root, run: &Run) -> Result<Option<Vec<(PmOff, BlockNo)>>> {
        let mut out = Vec::with_capacity(run.len as usize);
        let end = run.lblk + run.len;
        let mut l = run.lblk;
        while l < end {
            let Some(leaf) = self.find_leaf(root, l)? else {
                return Ok(None);
            };
            let leaf_end = ((l >> BITS_PER_LEVEL) + 1)
                .checked_mul(ENTRIES)
                .map_or(end, |e| e.min(end));
            for l in l..leaf_end {
                let i = l & (ENTRIES - 1);
                let at = entry_off(leaf, i);
                let Some(old) = self.entry(leaf, i)?.1 else {
                    return Ok(None);
                };
                out.push((at, self.check_block(old, at, "radix data pointer")?));
            }
            l = leaf_end;
        }
        Ok(Some(out))
    }

    /// Stores in place the runs of a `replace_many` whose every block is mapped, flushed but
    /// not fenced; their old blocks go to `ledger`, the other runs to `rest`. The caller holds
    /// the file lock.
    fn overwrite_in_place(
        &self,
        file: &RadixFile,
        runs: &[Run],
        ledger: &mut Ledger,
        rest: &mut Vec<Run>,
    ) -> Result<()> {
        let Some(root) = self.root(file)? else {
            rest.extend_from_slice(runs);
            return Ok(());
        };
        let mut dirty: Option<(PmOff, PmOff)> = None;
        let r = runs.iter().try_for_each(|run| {
            let entries = match run.lblk.checked_add(run.len) {
                Some(_) if self.inside(run.extent()) => self.mapped_entries(root, run)?,
                _ => None,
            };
            let Some(entries) = entries else {
                rest.push(*run);
                return Ok(());
            };
            for (k, (at, old)) in entries.into_iter().enumerate() {
                let new = run.pblk + k as u64;
                if old == new {
                    continue;
                }
                self.media.store_u64(at, entry_word(new))?;
                ledger.release(Extent::new(old, 1));
                // Neighbouring entries are flushed as one range.
                match &mut dirty {
                    Some((_, end)) if *end == at => *end = at + 8,
                    _ => {
                        if let Some((from, end)) = dirty.replace((at, at + 8)) {
                            self.media.flush(from, end.0 - from.0)?;
                        }
                    }
                }
            }
            Ok(())
        });
        // Flushed also after an error: the caller frees the old blocks of what was stored.
        let flushed = dirty.map_or(Ok(()), |(from, end)| self.media.flush(from, end.0 - from.0));
        r.and(flushed)
    }

    /// Runs `body` as one transaction of `file` with the call's `ledger`: on success commits
    /// and frees the blocks the call gave up; on failure rolls back and frees the blocks it
    /// allocated.
    fn transact<T>(
        &self,
        file: &RadixFile,
        mut ledger: Ledger,
        body: impl FnOnce(&mut Tx<'_, M>, &mut Ledger) -> Result<T>,
    ) -> Result<T> {
        let mut tx = self.undo.begin(&self.media, file.id.ino);
        let out = match body(&mut tx, &mut ledger) {
            Ok(out) => out,
            Err(e) => {
                // A failure of either leaves its work to recovery (noted in the undo log):
                // the operation's own error is the one to report.
                let _ = tx.abort();
                self.invalidate(file);
                if ledger.finish_aborted(&*self.alloc).is_err() {
                    self.undo.owe();
                }
                return Err(e);
            }
        };
        tx.commit()?;
        self.invalidate(file);
        ledger.finish_committed(&*self.alloc)?;
        Ok(out)
    }

    /// Visits every node (as a 1-block extent, `false`) and data run (`true`) under `node`.
    /// A node reached twice is corruption.
    fn walk_all(
        &self,
        node: BlockNo,
        level: u8,
        seen: &mut HashSet<u64>,
        visit: &mut dyn FnMut(Extent, bool),
    ) -> Result<()> {
        if !seen.insert(node.0) {
            return Err(Error::Corrupt {
                what: "radix node reachable twice",
                at: node.offset(),
            });
        }
        let mut run: Option<Extent> = None;
        for i in 0..ENTRIES {
            let (_, child) = self.entry(node, i)?;
            let Some(child) = child else { continue };
            let at = entry_off(node, i);
            if level == 0 {
                self.check_block(child, at, "radix data pointer")?;
                match &mut run {
                    Some(r) if r.end() == child => r.len += 1,
                    _ => {
                        if let Some(r) = run.take() {
                            visit(r, true);
                        }
                        run = Some(Extent::new(child, 1));
                    }
                }
            } else {
                self.check_block(child, at, "radix node pointer")?;
                self.walk_all(child, level - 1, seen, visit)?;
            }
        }
        if let Some(r) = run {
            visit(r, true);
        }
        visit(Extent::new(node, 1), false);
        Ok(())
    }

    /// Records every block under `node` for release; returns the number of data blocks.
    fn release_subtree(&self, node: BlockNo, level: u8, ledger: &mut Ledger) -> Result<u64> {
        let mut count = 0;
        self.walk_all(node, level, &mut HashSet::new(), &mut |e, is_data| {
            if is_data {
                count += e.len;
            }
            ledger.release(e);
        })?;
        Ok(count)
    }

    /// Unmaps `[a, b)` under `node` (at `level`, first logical block `base`). Returns the
    /// number of data blocks unmapped and whether the node is now all holes.
    #[allow(clippy::too_many_arguments)]
    fn remove_in(
        &self,
        tx: &mut Tx<'_, M>,
        ledger: &mut Ledger,
        node: BlockNo,
        level: u8,
        base: u128,
        a: u128,
        b: u128,
    ) -> Result<(u64, bool)> {
        let (i0, i1) = Self::index_range(level, base, a, b);
        let es = entry_span(level);
        let mut vals = Vec::with_capacity((i1 - i0) as usize);
        let mut changed: Option<(u64, u64)> = None;
        let mut count = 0;
        for i in i0..i1 {
            let (w, child) = self.entry(node, i)?;
            let Some(child) = child else {
                vals.push(0);
                continue;
            };
            let at = entry_off(node, i);
            let lb = base + u128::from(i) * es;
            let cleared = if level == 0 {
                self.check_block(child, at, "radix data pointer")?;
                count += 1;
                ledger.release(Extent::new(child, 1));
                true
            } else {
                self.check_block(child, at, "radix node pointer")?;
                if a <= lb && lb + es <= b {
                    count += self.release_subtree(child, level - 1, ledger)?;
                    true
                } else {
                    let (c, empty) = self.remove_in(tx, ledger, child, level - 1, lb, a, b)?;
                    count += c;
                    if empty {
                        ledger.release(Extent::new(child, 1));
                    }
                    empty
                }
            };
            if cleared {
                vals.push(0);
                changed = Some(changed.map_or((i, i), |(f, _)| (f, i)));
            } else {
                vals.push(w);
            }
        }
        let Some((f, l)) = changed else {
            return Ok((count, false));
        };
        let words = &vals[(f - i0) as usize..=(l - i0) as usize];
        self.store(tx, ledger, node, entry_off(node, f), words)?;
        for i in 0..ENTRIES {
            if self.media.load_u64(entry_off(node, i))? != 0 {
                return Ok((count, false));
            }
        }
        Ok((count, true))
    }

    /// Whether the node's only non-hole entry is entry 0.
    fn only_first_entry(&self, node: BlockNo) -> Result<bool> {
        if self.media.load_u64(entry_off(node, 0))? == 0 {
            return Ok(false);
        }
        for i in 1..ENTRIES {
            if self.media.load_u64(entry_off(node, i))? != 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The body of a remove of `[a, b)`, inside its transaction.
    fn remove_tx(
        &self,
        tx: &mut Tx<'_, M>,
        ledger: &mut Ledger,
        root_off: PmOff,
        root: Root,
        a: u64,
        b: u64,
    ) -> Result<u64> {
        let end = u128::from(b).min(span(root.level()));
        if u128::from(a) >= end {
            return Ok(0);
        }
        self.check_block(root.block, root_off, "radix node pointer")?;
        let (count, empty) =
            self.remove_in(tx, ledger, root.block, root.level(), 0, u128::from(a), end)?;
        let new_root = if empty {
            ledger.release(Extent::new(root.block, 1));
            None
        } else {
            let mut r = root;
            while r.height > 1 && self.only_first_entry(r.block)? {
                let at = entry_off(r.block, 0);
                let child = self.entry(r.block, 0)?.1.ok_or(Error::Corrupt {
                    what: "radix entry",
                    at,
                })?;
                let child = self.check_block(child, at, "radix node pointer")?;
                ledger.release(Extent::new(r.block, 1));
                r = Root {
                    block: child,
                    height: r.height - 1,
                };
            }
            Some(r)
        };
        if new_root != Some(root) {
            tx.store_u64(root_off, new_root.map_or(0, |r| r.pack()))?;
        }
        Ok(count)
    }
}

impl<M: Media, A: BlockAllocator> FileMapping for RadixTree<M, A> {
    type File = RadixFile;

    fn kind(&self) -> MappingKind {
        MappingKind::Radix
    }

    fn open_file(&self, id: FileId) -> Result<RadixFile> {
        Root::unpack(self.media.load_u64(id.root)?, id.root)?;
        Ok(RadixFile {
            id,
            lock: RwLock::new(()),
            cursor: Mutex::new(None),
        })
    }

    fn lookup(&self, file: &RadixFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        let _g = file.lock.read().unwrap_or_else(|e| e.into_inner());
        self.lookup_locked(file, lblk, lblk.saturating_add(len), out)
    }

    fn insert(&self, file: &RadixFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        let (data, _) = self.map_range(file, lblk, len, Data::Allocate)?;
        let mut l = lblk;
        for e in data {
            out.push(Run {
                lblk: l,
                pblk: e.start,
                len: e.len,
            });
            l += e.len;
        }
        Ok(())
    }

    fn insert_at(&self, file: &RadixFile, run: Run) -> Result<()> {
        self.map_range(file, run.lblk, run.len, Data::Given(run.extent()))
            .map(drop)
    }

    fn replace(&self, file: &RadixFile, run: Run) -> Result<u64> {
        self.map_range(file, run.lblk, run.len, Data::Over(run.extent()))
            .map(|(_, count)| count)
    }

    fn replace_many(&self, file: &RadixFile, runs: &[Run]) -> Result<u64> {
        replace_many_in_place(
            &self.media,
            &*self.alloc,
            |ledger, rest| {
                let _g = file.lock.write().unwrap_or_else(|e| e.into_inner());
                self.overwrite_in_place(file, runs, ledger, rest)
            },
            |rest| {
                rest.iter()
                    .try_fold(0, |freed, &run| Ok(freed + self.replace(file, run)?))
            },
        )
    }

    fn remove(&self, file: &RadixFile, lblk: u64, len: u64) -> Result<u64> {
        if len == 0 {
            return Ok(0);
        }
        let b = lblk.saturating_add(len);
        let _g = file.lock.write().unwrap_or_else(|e| e.into_inner());
        let Some(root) = self.root(file)? else {
            return Ok(0);
        };
        self.transact(file, Ledger::new(), |tx, ledger| {
            self.remove_tx(tx, ledger, file.id.root, root, lblk, b)
        })
    }

    fn remove_file(&self, file: &RadixFile) -> Result<()> {
        let _g = file.lock.write().unwrap_or_else(|e| e.into_inner());
        let Some(root) = self.root(file)? else {
            return Ok(());
        };
        let root_block = self.check_block(root.block, file.id.root, "radix node pointer")?;
        let mut ledger = Ledger::new();
        self.release_subtree(root_block, root.level(), &mut ledger)?;
        self.media.store_u64_persist(file.id.root, 0)?;
        self.invalidate(file);
        ledger.finish_committed(&*self.alloc)
    }

    fn owned_blocks(&self, file: &RadixFile, visit: &mut dyn FnMut(Extent)) -> Result<()> {
        let _g = file.lock.read().unwrap_or_else(|e| e.into_inner());
        let Some(root) = self.root(file)? else {
            return Ok(());
        };
        let root_block = self.check_block(root.block, file.id.root, "radix node pointer")?;
        self.walk_all(
            root_block,
            root.level(),
            &mut HashSet::new(),
            &mut |e, _| visit(e),
        )
    }

    fn recover(&self) -> Result<()> {
        self.undo.recover(&self.media).map(drop)
    }

    fn recovery_owed(&self) -> bool {
        self.undo.recovery_owed()
    }
}
