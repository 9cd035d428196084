//! The extent tree (HashFS paper §3.1.1): a per-file B-tree of extents that lives on PM and is
//! read and updated in place, without a page cache.
//!
//! # On-media format
//!
//! **Root word** — the 8-byte word [`FileId::root`] in the caller's inode:
//!
//! | bits | field |
//! |---|---|
//! | 0..48 | block of the root node |
//! | 48..56 | height: number of levels, 1 ..= [`MAX_HEIGHT`] (1: the root is a leaf) |
//! | 56..64 | tag `0xE7` |
//!
//! 0 is an empty file (no node at all). The root moves (grows, shrinks, disappears) with one
//! atomic store of this word.
//!
//! **Node** — one 4 KiB block:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | header word: magic `0x5845` (bits 0..16), version 1 (16..24), level (24..32; 0 = leaf), `nr` = live entries (32..48), zero (48..64) |
//! | 8 | 56 | reserved, zero |
//! | 64 + 16·i | 16 | entry `i`, for `i` < 252 (at most the `fanout` chosen at format) |
//!
//! **Entry** — two little-endian words:
//!
//! | word | bits | leaf entry | index entry |
//! |---|---|---|---|
//! | 0 | 0..64 | first logical block | separator key |
//! | 1 | 0..48 | first physical block | child node |
//! | 1 | 48..63 | length, 1 ..= [`MAX_EXTENT_LEN`] | 0 |
//! | 1 | 63 | valid bit | valid bit |
//!
//! Entries `[0, nr)` are live, sorted by key, and each carries the valid bit (set when the
//! entry is written, before `nr` makes it live; a live entry without it is corruption).
//! Entries at or past `nr` are dead whatever they hold, so new entries are written there
//! first and published by one store of the header word.
//!
//! Child `i` of an index node covers `[key_i, key_{i+1})`; `key_0` is not used for routing
//! (child 0 covers from the node's own lower bound) and the last child extends to the node's
//! upper bound. Every extent of a leaf lies entirely inside the leaf's range, so the leaf a
//! descent for block `x` reaches holds every extent that could contain `x`. Non-root nodes
//! are never empty; the root is never an index node with one child.
//!
//! **Meta area** — [`crate::undo`]'s header (magic `pmfsEXTT`, version [`EXTENT_VERSION`],
//! `params[0]` = fanout) and its undo-log slots; [`meta_blocks`](ExtentTree::meta_blocks)
//! gives its size.
//!
//! # Updates and the undo log
//!
//! Every mutating call is one [`Tx`]: before a live entry, a header word, or the root word is
//! changed in place its old content is logged; new nodes and dead entry space are written
//! without logging. Commit flushes everything the call wrote and invalidates the log with one
//! store, so after a crash [`recover`](FileMapping::recover) puts back the state before the
//! call. A call that fails (out of space, corruption found midway) rolls back the same way
//! before returning. Blocks are freed to the allocator only after commit.
//!
//! - insert: allocates the data first (`insert_at` takes the caller's blocks instead and is
//!   otherwise the same call), checks that the range is unmapped, merges with the
//!   preceding extent when the allocation continues it, otherwise splices the new entries into
//!   the leaf. A full node splits into itself plus fresh nodes (filled up completely when the
//!   entries were appended at the node's end, evenly otherwise); the new separators go into
//!   the parent, up to a new root. If the range crosses the leaf's upper bound, the separator
//!   that defines the bound is raised to the end of the range (the next subtree starts beyond
//!   the unmapped range).
//! - remove: walks the subtrees overlapping the range; subtrees inside it are dropped whole,
//!   boundary extents are shortened or split (a punched hole may split a node); emptied nodes
//!   leave their parent, an underfull boundary child merges with a sibling when both fit into
//!   one node, and a root with a single child is replaced by that child.
//! - replace: one transaction. When the range lies inside the leaf its first block descends
//!   to, the extents it overlaps are cut (their blocks released) and one splice puts what is
//!   left of them and the new extent in their place, merged with neighbours it continues
//!   physically — unless the splice would otherwise rewrite its range in place and the merge
//!   would shift more than 8 entries after it (every shifted entry is undo-logged; random
//!   copy-on-write overwrites, whose fresh block often continues the logical neighbour's,
//!   paid that on most writes). Otherwise the bodies of remove and insert run in the same
//!   transaction.
//! - replace_many: a run that whole leaf entries cover exactly, without a hole, is an
//!   overwrite; each of those entries gets the new blocks by one atomic store of its second
//!   word, with no undo record (the call may stop after any entry, see
//!   [`FileMapping::replace_many`]), and one fence covers the whole batch before the replaced
//!   blocks go back to the allocator. Neighbours are not merged: random overwrites soon cut a
//!   file into entries of the size they write, which this then rewrites in place. The other
//!   runs are replaced as `replace` does, but several to a transaction (until half its undo
//!   slot is used), so that the commit's two fences are paid once per batch.
//! - remove_file: stores 0 into the root word (one atomic commit), then frees every block.
//!
//! # Concurrency
//!
//! A file's [`ExtentFile`] handle holds a reader-writer lock: lookups and `owned_blocks` take
//! it shared, mutations exclusive, so lookups run concurrently with each other and wait for a
//! mutation of the same file. Different files share nothing but the allocator and the undo
//! slots (a transaction takes any free slot). Two handles of one inode do not exclude each
//! other: a caller that opens several (the engine opens one per open file) serializes
//! mutations against lookups itself.
//!
//! The handle also holds the DRAM cursor of the last leaf a lookup reached (its block and
//! range). It is used only if the root word read now equals the one it was built under and the
//! tree has not been mutated since, through any handle (a split through another handle of the
//! inode moves part of the leaf's range away); otherwise the lookup descends from the root.

#![forbid(unsafe_code)]

mod node;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{Media, MediaExt};
use pmfs_core::traits::{
    BlockAllocator, Extent, FileId, FileMapping, MappingKind, Run, maps_exactly,
};
use pmfs_core::{Error, Result};

use node::{Entry, Node, Root, encode_entries, encode_node, header_word};
pub use node::{MAX_EXTENT_LEN, MAX_FANOUT, MAX_HEIGHT};

use crate::undo::{
    AreaKind, Ledger, Tx, UndoGeometry, UndoLog, format_area, open_area, replace_many_in_place,
};

/// Magic of the extent tree's meta area.
pub const EXTENT_MAGIC: u64 = u64::from_le_bytes(*b"pmfsEXTT");
/// Version of the extent tree's on-media format.
pub const EXTENT_VERSION: u32 = 1;
const AREA: AreaKind = AreaKind {
    magic: EXTENT_MAGIC,
    version: EXTENT_VERSION,
};
/// Smallest fanout a tree may be formatted with.
pub const MIN_FANOUT: usize = 4;

/// Format-time choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentOptions {
    /// Most entries per node, [`MIN_FANOUT`] ..= [`MAX_FANOUT`]. Nodes are always 4 KiB; a
    /// small fanout makes trees deep with few extents (tests of splits and merges).
    pub fanout: usize,
    /// Undo-log slots of the meta area.
    pub undo: UndoGeometry,
}

impl Default for ExtentOptions {
    fn default() -> Self {
        Self {
            fanout: MAX_FANOUT,
            undo: UndoGeometry::DEFAULT,
        }
    }
}

impl ExtentOptions {
    /// Blocks of the meta area these options need.
    pub fn meta_blocks(&self) -> u64 {
        self.undo.area_blocks()
    }
}

/// The extent-tree mapping over media `M`, drawing blocks from allocator `A`.
pub struct ExtentTree<M, A> {
    media: M,
    meta: Extent,
    alloc: Arc<A>,
    undo: UndoLog,
    /// Counts mutations of any file: a cursor taken under another count is stale. Handles of
    /// one inode do not see each other's mutations, and the engine opens one per open file.
    generation: AtomicU64,
    fanout: usize,
    blocks: u64,
}

impl<M, A> std::fmt::Debug for ExtentTree<M, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtentTree")
            .field("meta", &self.meta)
            .field("fanout", &self.fanout)
            .field("blocks", &self.blocks)
            .finish_non_exhaustive()
    }
}

/// The DRAM state of one open file: its lock and lookup cursor. See the module docs.
#[derive(Debug)]
pub struct ExtentFile {
    id: FileId,
    lock: RwLock<()>,
    cursor: Mutex<Option<Cursor>>,
}

/// The last leaf a lookup reached.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    root: u64,
    generation: u64,
    leaf: BlockNo,
    lo: u64,
    hi: u64,
}

/// Where the data blocks of a new mapping come from.
#[derive(Clone, Copy, Debug)]
enum Data {
    /// Allocate them (`insert`).
    Allocate,
    /// The caller's blocks (`insert_at`).
    Given(Extent),
}

/// One level of a descent: the node, the child taken and the node's key range `[lo, hi)`.
#[derive(Clone, Copy, Debug)]
struct Step {
    node: Node,
    idx: usize,
    lo: u64,
    hi: u64,
}

/// The leaf entries that map `data` in order from logical block `lblk` (no longer than
/// [`MAX_EXTENT_LEN`] each).
fn leaf_entries(lblk: u64, data: &[Extent]) -> Vec<Entry> {
    let mut entries = Vec::with_capacity(data.len());
    let mut l = lblk;
    for e in data {
        let mut done = 0;
        while done < e.len {
            let n = (e.len - done).min(MAX_EXTENT_LEN);
            entries.push(Entry::extent(l, e.start.0 + done, n));
            l += n;
            done += n;
        }
    }
    entries
}

/// The most entries after a splice that merging a neighbour into a replacement may shift when
/// the splice would otherwise rewrite its range in place (see
/// [`replace_in_leaf`](ExtentTree::replace_in_leaf)).
const MERGE_SHIFT_MAX: usize = 8;

/// What [`cut_leaf`](ExtentTree::cut_leaf) found.
#[derive(Clone, Copy, Debug)]
struct Cut {
    /// The first extent overlapping the range.
    i0: usize,
    /// One past the last.
    i1: usize,
    /// The part of the first one before the range.
    left: Option<Entry>,
    /// The part of the last one after the range.
    right: Option<Entry>,
    /// Data blocks inside the range.
    count: u64,
}

/// The blocks a call takes and gives up, and the live counts nodes had before the call first
/// changed them.
#[derive(Debug, Default)]
struct OpCtx {
    ledger: Ledger,
    first_nr: Vec<(BlockNo, usize)>,
    /// More replaces may follow in this transaction, so a change may not be its sole store
    /// ([`Tx::store_sole_u64`]), after which every record fails.
    more_follow: bool,
}

impl OpCtx {
    fn is_fresh(&self, b: BlockNo) -> bool {
        self.ledger.is_fresh_node(b)
    }

    /// How many entries of `node` may be live in the state a rollback restores: its count
    /// when the transaction began, or now if that is more. Entries past it are dead both in
    /// that state and now, so they may be written without logging.
    fn live_bound(&self, node: &Node) -> usize {
        self.first_nr
            .iter()
            .find(|(b, _)| *b == node.block)
            .map_or(node.nr, |&(_, n)| n.max(node.nr))
    }
}

impl<M: Media, A: BlockAllocator> ExtentTree<M, A> {
    /// Blocks of the meta area for the default options.
    pub fn meta_blocks() -> u64 {
        ExtentOptions::default().meta_blocks()
    }

    /// Formats an empty structure with the default options in `meta`.
    pub fn format(media: M, meta: Extent, alloc: Arc<A>) -> Result<Self> {
        Self::format_with(media, meta, alloc, ExtentOptions::default())
    }

    /// Formats an empty structure with chosen options.
    pub fn format_with(media: M, meta: Extent, alloc: Arc<A>, opts: ExtentOptions) -> Result<Self> {
        if !(MIN_FANOUT..=MAX_FANOUT).contains(&opts.fanout) {
            return Err(Error::InvalidArgument("extent tree fanout out of range"));
        }
        let mut params = [0u64; 8];
        params[0] = opts.fanout as u64;
        let undo = format_area(&media, meta, AREA, opts.undo, params)?;
        Ok(Self::assemble(media, meta, alloc, undo, opts.fanout))
    }

    /// Opens a formatted structure. Call [`recover`](FileMapping::recover) before use if the
    /// region was not closed cleanly.
    pub fn open(media: M, meta: Extent, alloc: Arc<A>) -> Result<Self> {
        let (undo, params) = open_area(&media, meta, AREA)?;
        let fanout = usize::try_from(params[0]).unwrap_or(0);
        if !(MIN_FANOUT..=MAX_FANOUT).contains(&fanout) {
            return Err(Error::Corrupt {
                what: "extent tree fanout",
                at: meta.start.offset(),
            });
        }
        Ok(Self::assemble(media, meta, alloc, undo, fanout))
    }

    fn assemble(media: M, meta: Extent, alloc: Arc<A>, undo: UndoLog, fanout: usize) -> Self {
        let blocks = media.blocks();
        Self {
            media,
            meta,
            alloc,
            undo,
            generation: AtomicU64::new(0),
            fanout,
            blocks,
        }
    }

    /// The fanout the tree was formatted with.
    pub fn fanout(&self) -> usize {
        self.fanout
    }

    /// Height of a file's tree (0 for an empty file).
    pub fn height(&self, file: &ExtentFile) -> Result<u8> {
        let _g = file.lock.read().unwrap_or_else(|e| e.into_inner());
        Ok(self.root(file)?.map_or(0, |r| r.height))
    }

    fn root(&self, file: &ExtentFile) -> Result<Option<Root>> {
        Root::unpack(self.media.load_u64(file.id.root)?, file.id.root)
    }

    fn check_node_block(&self, b: u64) -> Result<BlockNo> {
        if b >= self.blocks || self.meta.contains(BlockNo(b)) {
            return Err(Error::Corrupt {
                what: "extent node pointer",
                at: PmOff(b.saturating_mul(BLOCK_SIZE)),
            });
        }
        Ok(BlockNo(b))
    }

    fn check_data(&self, e: &Entry, at: PmOff) -> Result<()> {
        if !self.inside(Extent::new(BlockNo(e.block), e.len)) {
            return Err(Error::Corrupt {
                what: "extent data pointer",
                at,
            });
        }
        Ok(())
    }

    fn read_node(&self, b: u64, level: u8) -> Result<Node> {
        let b = self.check_node_block(b)?;
        Node::read(&self.media, b, level, self.fanout)
    }

    /// Descends from the root to the leaf whose range holds `key`, recording every level.
    fn descend(&self, root: Root, key: u64, path: &mut Vec<Step>) -> Result<()> {
        path.clear();
        let (mut block, mut lo, mut hi) = (root.block.0, 0u64, u64::MAX);
        for level in (0..root.height).rev() {
            let node = self.read_node(block, level)?;
            if level == 0 {
                path.push(Step {
                    node,
                    idx: 0,
                    lo,
                    hi,
                });
                return Ok(());
            }
            if node.nr == 0 {
                return Err(Error::Corrupt {
                    what: "empty extent index node",
                    at: node.header_off(),
                });
            }
            let i = node.search(&self.media, key)?.unwrap_or(0);
            let e = node.entry(&self.media, i)?;
            let clo = if i == 0 { lo } else { e.key };
            let chi = if i + 1 < node.nr {
                node.entry(&self.media, i + 1)?.key
            } else {
                hi
            };
            if clo < lo || chi > hi || clo >= chi {
                return Err(Error::Corrupt {
                    what: "extent index keys",
                    at: node.entry_off(i),
                });
            }
            path.push(Step {
                node,
                idx: i,
                lo,
                hi,
            });
            block = e.block;
            lo = clo;
            hi = chi;
        }
        Err(Error::Corrupt {
            what: "extent tree height",
            at: root.block.offset(),
        })
    }

    /// The leaf for `key` and its range, from the cursor if it is valid, else by descent.
    fn leaf_for(
        &self,
        file: &ExtentFile,
        root_word: u64,
        root: Root,
        key: u64,
        path: &mut Vec<Step>,
    ) -> Result<(Node, u64, u64)> {
        let generation = self.generation.load(Ordering::Acquire);
        if let Ok(guard) = file.cursor.try_lock()
            && let Some(c) = *guard
            && c.root == root_word
            && c.generation == generation
            && c.lo <= key
            && key < c.hi
        {
            return Ok((self.read_node(c.leaf.0, 0)?, c.lo, c.hi));
        }
        self.descend(root, key, path)?;
        let leaf = path.last().copied().ok_or(Error::Corrupt {
            what: "extent tree height",
            at: root.block.offset(),
        })?;
        if let Ok(mut guard) = file.cursor.try_lock() {
            *guard = Some(Cursor {
                root: root_word,
                generation,
                leaf: leaf.node.block,
                lo: leaf.lo,
                hi: leaf.hi,
            });
        }
        Ok((leaf.node, leaf.lo, leaf.hi))
    }

    /// Appends the mapped runs of `[a, b)` (the caller holds the file lock).
    fn lookup_locked(&self, file: &ExtentFile, a: u64, b: u64, out: &mut Vec<Run>) -> Result<()> {
        let root_word = self.media.load_u64(file.id.root)?;
        let Some(root) = Root::unpack(root_word, file.id.root)? else {
            return Ok(());
        };
        let mut path = Vec::new();
        let mut at = a;
        let mut rounds = 0u64;
        while at < b {
            let (leaf, lo, hi) = self.leaf_for(file, root_word, root, at, &mut path)?;
            self.scan_leaf(&leaf, lo, hi, at, b, out)?;
            if hi >= b {
                break;
            }
            at = hi;
            rounds += 1;
            if rounds > self.blocks {
                return Err(Error::Corrupt {
                    what: "extent tree ranges",
                    at: root.block.offset(),
                });
            }
        }
        Ok(())
    }

    /// Appends the parts of the leaf's extents inside `[at, b)`, validating order and range.
    fn scan_leaf(
        &self,
        leaf: &Node,
        lo: u64,
        hi: u64,
        at: u64,
        b: u64,
        out: &mut Vec<Run>,
    ) -> Result<()> {
        let m = &self.media;
        let start = match leaf.search(m, at)? {
            Some(i) if leaf.entry(m, i)?.end() > at => i,
            Some(i) => i + 1,
            None => 0,
        };
        let mut prev = lo;
        for i in start..leaf.nr {
            let e = leaf.entry(m, i)?;
            if e.key >= b {
                break;
            }
            if e.key < prev || e.end() > hi {
                return Err(Error::Corrupt {
                    what: "extent leaf order",
                    at: leaf.entry_off(i),
                });
            }
            self.check_data(&e, leaf.entry_off(i))?;
            let s = e.key.max(at);
            let t = e.end().min(b);
            if s < t {
                out.push(Run {
                    lblk: s,
                    pblk: BlockNo(e.block + (s - e.key)),
                    len: t - s,
                });
            }
            prev = e.end();
        }
        Ok(())
    }

    /// The offsets and contents of the leaf entries that cover `[a, b)` exactly (the first
    /// starts at `a`, each next one where the previous one ends, the last ends at `b`), or
    /// `None` if no such entries exist. The caller holds the file lock.
    fn covering_entries(
        &self,
        file: &ExtentFile,
        root_word: u64,
        root: Root,
        a: u64,
        b: u64,
    ) -> Result<Option<Vec<(PmOff, Entry)>>> {
        let m = &self.media;
        let mut path = Vec::new();
        let mut out = Vec::new();
        let mut at = a;
        while at < b {
            let (leaf, _, hi) = self.leaf_for(file, root_word, root, at, &mut path)?;
            let Some(mut i) = leaf.search(m, at)? else {
                return Ok(None);
            };
            while at < b && at < hi {
                if i >= leaf.nr {
                    return Ok(None);
                }
                let e = leaf.entry(m, i)?;
                if e.key != at || e.end() > b {
                    return Ok(None);
                }
                self.check_data(&e, leaf.entry_off(i))?;
                out.push((leaf.entry_off(i), e));
                at = e.end();
                i += 1;
            }
        }
        Ok(Some(out))
    }

    /// Stores in place the runs of a `replace_many` that whole entries cover exactly, flushed
    /// but not fenced; their old blocks go to `ledger`, the other runs to `rest`. The caller
    /// holds the file lock.
    fn overwrite_in_place(
        &self,
        file: &ExtentFile,
        runs: &[Run],
        ledger: &mut Ledger,
        rest: &mut Vec<Run>,
    ) -> Result<()> {
        let root_word = self.media.load_u64(file.id.root)?;
        let Some(root) = Root::unpack(root_word, file.id.root)? else {
            rest.extend_from_slice(runs);
            return Ok(());
        };
        let mut dirty = Vec::new();
        let r = runs.iter().try_for_each(|run| {
            let entries = match run.lblk.checked_add(run.len) {
                Some(b) if self.inside(run.extent()) => {
                    self.covering_entries(file, root_word, root, run.lblk, b)?
                }
                _ => None,
            };
            let Some(entries) = entries else {
                // Mapped exactly already, by entries that go on past the run: applied again.
                let mut got = Vec::new();
                self.lookup_locked(file, run.lblk, run.lblk.saturating_add(run.len), &mut got)?;
                if !maps_exactly(run, &mut got) {
                    rest.push(*run);
                }
                return Ok(());
            };
            for (at, e) in entries {
                let new = Entry::extent(e.key, run.pblk.0 + (e.key - run.lblk), e.len);
                if new == e {
                    continue;
                }
                self.media.store_u64(at + 8, new.word1())?;
                dirty.push(at + 8);
                ledger.release(Extent::new(BlockNo(e.block), e.len));
            }
            Ok(())
        });
        // Flushed also after an error: the caller frees the old blocks of what was stored.
        let flushed = dirty.iter().try_for_each(|&at| self.media.flush(at, 8));
        r.and(flushed)
    }

    /// The end of the logical range of `run`, a replace's argument, once checked.
    fn replace_end(&self, run: Run) -> Result<u64> {
        let b = run
            .lblk
            .checked_add(run.len)
            .ok_or(Error::InvalidArgument("logical range overflows"))?;
        if !self.inside(run.extent()) {
            return Err(Error::InvalidArgument(
                "blocks outside the tree's data area",
            ));
        }
        Ok(b)
    }

    /// The runs of a `replace_many` that are not overwrites, replaced several to a
    /// transaction: a commit costs two fences (the transaction's stores, then its slot's
    /// generation), paid here once per [`replace_batch`](Self::replace_batch) instead of once
    /// per run. On error it keeps `replace_many`'s contract: a batch that fails is rolled back
    /// whole, then its first run is replaced alone (failing, as `replace` does, if that run
    /// is the one at fault) and the batches go on after it.
    fn replace_batched(&self, file: &ExtentFile, runs: &[Run]) -> Result<u64> {
        let mut freed = 0;
        let mut at = 0;
        while at < runs.len() {
            let mut tried = 0;
            match self.replace_batch(file, &runs[at..], &mut tried) {
                Ok(n) => {
                    freed += n;
                    at += tried;
                }
                Err(e) if tried <= 1 => return Err(e),
                Err(_) => {
                    freed += self.replace(file, runs[at])?;
                    at += 1;
                }
            }
        }
        Ok(freed)
    }

    /// Replaces a prefix of `runs` (at least one run) in one transaction, which ends before a
    /// run once less than half of its undo slot is free (a replace logs a few node tails; one
    /// that does not fit fails the batch, and [`replace_batched`](Self::replace_batched) gives
    /// the run a transaction of its own); returns the blocks they freed. `tried` counts the
    /// runs it began: on success, the runs it replaced.
    fn replace_batch(&self, file: &ExtentFile, runs: &[Run], tried: &mut usize) -> Result<u64> {
        let reserve = u64::from(self.undo.geometry().slot_blocks) * BLOCK_SIZE / 2;
        let _g = file.lock.write().unwrap_or_else(|e| e.into_inner());
        self.transact(file, OpCtx::default(), |tx, ctx| {
            let mut freed = 0;
            for (i, &run) in runs.iter().enumerate() {
                if *tried > 0 && tx.room() < reserve {
                    break;
                }
                *tried += 1;
                ctx.more_follow = i + 1 < runs.len();
                if run.len == 0 {
                    continue;
                }
                let b = self.replace_end(run)?;
                let root = self.root(file)?;
                let entries = leaf_entries(run.lblk, &[run.extent()]);
                freed += self.replace_tx(tx, ctx, file.id.root, root, run.lblk, b, entries)?;
            }
            Ok(freed)
        })
    }

    fn invalidate(&self, file: &ExtentFile) {
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

    fn alloc_node(&self, ctx: &mut OpCtx) -> Result<BlockNo> {
        ctx.ledger.alloc_node(&*self.alloc, |e| self.inside(e))
    }

    /// Writes `entries` at `from..` of `node` (whose current live count is `node.nr`): the
    /// part below [`OpCtx::live_bound`] is logged unless the node is fresh; the rest is dead
    /// space and written directly.
    fn put(
        &self,
        tx: &mut Tx<'_, M>,
        ctx: &OpCtx,
        node: &Node,
        from: usize,
        entries: &[Entry],
    ) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let split = if ctx.is_fresh(node.block) {
            0
        } else {
            ctx.live_bound(node).saturating_sub(from).min(entries.len())
        };
        let (logged, dead) = entries.split_at(split);
        if !logged.is_empty() {
            tx.write(node.entry_off(from), &encode_entries(logged))?;
        }
        if !dead.is_empty() {
            tx.write_fresh(node.entry_off(from + split), &encode_entries(dead))?;
        }
        Ok(())
    }

    /// Stores a new live count into `node`'s header (`node.nr` is the current one).
    fn set_nr(&self, tx: &mut Tx<'_, M>, ctx: &mut OpCtx, node: &Node, nr: usize) -> Result<()> {
        let w = header_word(node.level, nr);
        if ctx.is_fresh(node.block) {
            return tx.store_fresh_u64(node.header_off(), w);
        }
        if !ctx.first_nr.iter().any(|(b, _)| *b == node.block) {
            ctx.first_nr.push((node.block, node.nr));
        }
        tx.store_u64(node.header_off(), w)
    }

    /// Chunk sizes for `total` entries over several nodes: full nodes when appending at the
    /// end, even shares otherwise.
    fn chunk_sizes(&self, total: usize, append: bool) -> Vec<usize> {
        if append {
            let mut v = Vec::new();
            let mut left = total;
            while left > 0 {
                let n = left.min(self.fanout);
                v.push(n);
                left -= n;
            }
            v
        } else {
            let m = total.div_ceil(self.fanout);
            (0..m)
                .map(|i| total / m + usize::from(i < total % m))
                .collect()
        }
    }

    /// Replaces live entries `[i0, i1)` of `node` with `repl`. Returns the node's new live
    /// count and, if it had to split, the index entries of its new right siblings (fresh
    /// nodes), which belong right after the node's own entry in its parent.
    fn splice(
        &self,
        tx: &mut Tx<'_, M>,
        ctx: &mut OpCtx,
        node: Node,
        i0: usize,
        i1: usize,
        repl: &[Entry],
    ) -> Result<(usize, Vec<Entry>)> {
        let m = &self.media;
        let nr = node.nr;
        let new_nr = nr - (i1 - i0) + repl.len();
        if new_nr <= self.fanout {
            if repl.len() == i1 - i0 {
                self.put(tx, ctx, &node, i0, repl)?;
            } else {
                let mut region = repl.to_vec();
                region.extend(node.entries(m, i1, nr)?);
                self.put(tx, ctx, &node, i0, &region)?;
                self.set_nr(tx, ctx, &node, new_nr)?;
            }
            return Ok((new_nr, Vec::new()));
        }
        let mut all = node.entries(m, 0, i0)?;
        all.extend_from_slice(repl);
        all.extend(node.entries(m, i1, nr)?);
        let chunks = self.chunk_sizes(all.len(), i0 == nr);
        let first = chunks[0];
        let from = i0.min(first);
        self.put(tx, ctx, &node, from, &all[from..first])?;
        self.set_nr(tx, ctx, &node, first)?;
        let mut siblings = Vec::with_capacity(chunks.len() - 1);
        let mut at = first;
        for &n in &chunks[1..] {
            let blk = self.alloc_node(ctx)?;
            tx.write_fresh(blk.offset(), &encode_node(node.level, &all[at..at + n]))?;
            siblings.push(Entry::child(all[at].key, blk.0));
            at += n;
        }
        Ok((first, siblings))
    }

    /// Puts new levels above `root` for the siblings a root split produced.
    fn grow(
        &self,
        tx: &mut Tx<'_, M>,
        ctx: &mut OpCtx,
        root: Root,
        siblings: Vec<Entry>,
    ) -> Result<Root> {
        let mut level_entries = vec![Entry::child(0, root.block.0)];
        level_entries.extend(siblings);
        let mut height = root.height;
        loop {
            if height >= MAX_HEIGHT {
                return Err(Error::InvalidArgument(
                    "extent tree would exceed its height limit",
                ));
            }
            height += 1;
            let level = height - 1;
            if level_entries.len() <= self.fanout {
                let blk = self.alloc_node(ctx)?;
                tx.write_fresh(blk.offset(), &encode_node(level, &level_entries))?;
                return Ok(Root { block: blk, height });
            }
            let mut next = Vec::new();
            let mut at = 0;
            for n in self.chunk_sizes(level_entries.len(), false) {
                let blk = self.alloc_node(ctx)?;
                tx.write_fresh(
                    blk.offset(),
                    &encode_node(level, &level_entries[at..at + n]),
                )?;
                let key = if at == 0 { 0 } else { level_entries[at].key };
                next.push(Entry::child(key, blk.0));
                at += n;
            }
            level_entries = next;
        }
    }

    /// The body of an insert, inside its transaction.
    #[allow(clippy::too_many_arguments)]
    fn insert_tx(
        &self,
        tx: &mut Tx<'_, M>,
        ctx: &mut OpCtx,
        root_off: PmOff,
        root: Option<Root>,
        a: u64,
        b: u64,
        mut entries: Vec<Entry>,
    ) -> Result<()> {
        let m = &self.media;
        let root = match root {
            Some(r) => r,
            None => {
                let blk = self.alloc_node(ctx)?;
                tx.write_fresh(blk.offset(), &encode_node(0, &[]))?;
                let r = Root {
                    block: blk,
                    height: 1,
                };
                tx.store_u64(root_off, r.pack())?;
                r
            }
        };
        let mut path = Vec::new();
        self.descend(root, a, &mut path)?;
        let leaf = path[path.len() - 1];
        let pos = leaf.node.search(m, a)?.map_or(0, |i| i + 1);
        if pos > 0 {
            let p = leaf.node.entry(m, pos - 1)?;
            let f = entries[0];
            if p.end() == a && p.block + p.len == f.block && p.len + f.len <= MAX_EXTENT_LEN {
                let merged = Entry::extent(p.key, p.block, p.len + f.len);
                self.put(tx, ctx, &leaf.node, pos - 1, &[merged])?;
                entries.remove(0);
            }
        }
        if b > leaf.hi {
            // The range runs past the leaf's upper bound: raise the separator that defines it.
            let k = (0..path.len() - 1)
                .rev()
                .find(|&k| path[k].idx + 1 < path[k].node.nr)
                .ok_or(Error::Corrupt {
                    what: "extent index keys",
                    at: leaf.node.header_off(),
                })?;
            let sep_node = path[k].node;
            let j = path[k].idx + 1;
            let sep = sep_node.entry(m, j)?;
            if sep.key != leaf.hi {
                return Err(Error::Corrupt {
                    what: "extent index keys",
                    at: sep_node.entry_off(j),
                });
            }
            self.put(tx, ctx, &sep_node, j, &[Entry::child(b, sep.block)])?;
        }
        if entries.is_empty() {
            return Ok(());
        }
        let (_, pending) = self.splice(tx, ctx, leaf.node, pos, pos, &entries)?;
        self.push_up(tx, ctx, root_off, root, &path, pending)
    }

    /// Puts the index entries of the new right siblings of the leaf at the end of `path` into
    /// its ancestors, splitting them as needed, up to a new root.
    fn push_up(
        &self,
        tx: &mut Tx<'_, M>,
        ctx: &mut OpCtx,
        root_off: PmOff,
        root: Root,
        path: &[Step],
        mut pending: Vec<Entry>,
    ) -> Result<()> {
        for step in path[..path.len() - 1].iter().rev() {
            if pending.is_empty() {
                return Ok(());
            }
            pending = self
                .splice(tx, ctx, step.node, step.idx + 1, step.idx + 1, &pending)?
                .1;
        }
        if !pending.is_empty() {
            let new_root = self.grow(tx, ctx, root, pending)?;
            tx.store_u64(root_off, new_root.pack())?;
        }
        Ok(())
    }

    /// Runs `body` as one transaction of `file` with the call's `ctx`: on success commits and
    /// frees the blocks the call gave up; on failure rolls back and frees the blocks it
    /// allocated.
    fn transact<T>(
        &self,
        file: &ExtentFile,
        mut ctx: OpCtx,
        body: impl FnOnce(&mut Tx<'_, M>, &mut OpCtx) -> Result<T>,
    ) -> Result<T> {
        let mut tx = self.undo.begin(&self.media, file.id.ino);
        let out = match body(&mut tx, &mut ctx) {
            Ok(out) => out,
            Err(e) => {
                // A failure of either leaves its work to recovery (noted in the undo log):
                // the operation's own error is the one to report.
                let _ = tx.abort();
                self.invalidate(file);
                if ctx.ledger.finish_aborted(&*self.alloc).is_err() {
                    self.undo.owe();
                }
                return Err(e);
            }
        };
        tx.commit()?;
        self.invalidate(file);
        ctx.ledger.finish_committed(&*self.alloc)?;
        Ok(out)
    }

    /// Maps `[lblk, lblk + len)` to data blocks that `data` says where to take from, in one
    /// transaction; returns the data extents in logical order. The shared body of `insert` and
    /// `insert_at`: only blocks this call allocated (nodes, and the data for
    /// [`Data::Allocate`]) go back to the allocator when it fails.
    fn map_range(&self, file: &ExtentFile, lblk: u64, len: u64, data: Data) -> Result<Vec<Extent>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let b = lblk
            .checked_add(len)
            .ok_or(Error::InvalidArgument("logical range overflows"))?;
        if let Data::Given(e) = data
            && !self.inside(e)
        {
            return Err(Error::InvalidArgument(
                "blocks outside the tree's data area",
            ));
        }
        let _g = file.lock.write().unwrap_or_else(|e| e.into_inner());
        let root = self.root(file)?;
        let mut goal = None;
        if root.is_some() {
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
        let mut ctx = OpCtx::default();
        let data = match data {
            Data::Allocate => ctx
                .ledger
                .alloc_data(&*self.alloc, len, goal, |e| self.inside(e))?,
            Data::Given(e) => vec![e],
        };
        let entries = leaf_entries(lblk, &data);
        self.transact(file, ctx, |tx, ctx| {
            self.insert_tx(tx, ctx, file.id.root, root, lblk, b, entries)
        })?;
        Ok(data)
    }

    /// Cuts `[a, b)` out of the extents of `leaf` (covering `[lo, hi)`), validating them: the
    /// extents it overlaps are `[i0, i1)`, their blocks inside the range are released, and
    /// what is left of them is `left` (the part before `a`) and `right` (after `b`).
    fn cut_leaf(
        &self,
        ctx: &mut OpCtx,
        leaf: &Node,
        (lo, hi): (u64, u64),
        a: u64,
        b: u64,
    ) -> Result<Cut> {
        let m = &self.media;
        let i0 = match leaf.search(m, a)? {
            Some(i) if leaf.entry(m, i)?.end() > a => i,
            Some(i) => i + 1,
            None => 0,
        };
        let mut cut = Cut {
            i0,
            i1: i0,
            left: None,
            right: None,
            count: 0,
        };
        let mut prev = lo;
        while cut.i1 < leaf.nr {
            let e = leaf.entry(m, cut.i1)?;
            if e.key >= b {
                break;
            }
            if e.key < prev || e.end() > hi {
                return Err(Error::Corrupt {
                    what: "extent leaf order",
                    at: leaf.entry_off(cut.i1),
                });
            }
            self.check_data(&e, leaf.entry_off(cut.i1))?;
            prev = e.end();
            if e.key < a {
                cut.left = Some(Entry::extent(e.key, e.block, a - e.key));
            }
            if e.end() > b {
                cut.right = Some(Entry::extent(b, e.block + (b - e.key), e.end() - b));
            }
            let s = e.key.max(a);
            let t = e.end().min(b);
            cut.count += t - s;
            ctx.ledger
                .release(Extent::new(BlockNo(e.block + (s - e.key)), t - s));
            cut.i1 += 1;
        }
        Ok(cut)
    }

    /// The body of a replace of `[a, b)` by `entries`, inside its transaction. Returns the
    /// number of data blocks unmapped.
    #[allow(clippy::too_many_arguments)]
    fn replace_tx(
        &self,
        tx: &mut Tx<'_, M>,
        ctx: &mut OpCtx,
        root_off: PmOff,
        root: Option<Root>,
        a: u64,
        b: u64,
        entries: Vec<Entry>,
    ) -> Result<u64> {
        if let Some(root) = root {
            let mut path = Vec::new();
            self.descend(root, a, &mut path)?;
            let leaf = path[path.len() - 1];
            if b <= leaf.hi {
                return self.replace_in_leaf(tx, ctx, root_off, root, &path, a, b, &entries);
            }
        }
        let count = match root {
            Some(root) => self.remove_tx(tx, ctx, root_off, root, a, b)?,
            None => 0,
        };
        let root = Root::unpack(self.media.load_u64(root_off)?, root_off)?;
        self.insert_tx(tx, ctx, root_off, root, a, b, entries)?;
        Ok(count)
    }

    /// A replace of `[a, b)` inside the range of the leaf `path` ends in: one splice of the
    /// leaf replaces the extents the range overlaps by what is left of them and `entries`,
    /// merged with the neighbours they continue physically unless that costs a long shift
    /// (see the module docs).
    #[allow(clippy::too_many_arguments)]
    fn replace_in_leaf(
        &self,
        tx: &mut Tx<'_, M>,
        ctx: &mut OpCtx,
        root_off: PmOff,
        root: Root,
        path: &[Step],
        a: u64,
        b: u64,
        entries: &[Entry],
    ) -> Result<u64> {
        let m = &self.media;
        let Step { node, lo, hi, .. } = path[path.len() - 1];
        let Cut {
            i0,
            i1,
            left,
            right,
            count,
        } = self.cut_leaf(ctx, &node, (lo, hi), a, b)?;
        let continues = |p: &Entry, n: &Entry| {
            p.end() == n.key && p.block + p.len == n.block && p.len + n.len <= MAX_EXTENT_LEN
        };
        let fold = |left: Option<Entry>, right: Option<Entry>| {
            let mut repl: Vec<Entry> = Vec::with_capacity(entries.len() + 2);
            for e in left.iter().chain(entries).chain(right.iter()) {
                match repl.last_mut() {
                    Some(p) if continues(p, e) => p.len += e.len,
                    _ => repl.push(*e),
                }
            }
            repl
        };
        // Neighbours the new runs continue physically are merged into them.
        let (mut j0, mut j1, mut merged_left, mut merged_right) = (i0, i1, left, right);
        if let (None, Some(first)) = (left, entries.first())
            && i0 > 0
        {
            let p = node.entry(m, i0 - 1)?;
            if continues(&p, first) {
                merged_left = Some(p);
                j0 -= 1;
            }
        }
        if let (None, Some(last)) = (right, entries.last())
            && i1 < node.nr
        {
            let n = node.entry(m, i1)?;
            if continues(last, &n) {
                merged_right = Some(n);
                j1 += 1;
            }
        }
        let merged = fold(merged_left, merged_right);
        // Unless that turns a rewrite of the range in place into a shift of the entries after
        // it: the shift is undo-logged whole, and a copy-on-write overwrite at random offsets
        // (whose fresh block the allocator places after its logical neighbour's) would pay
        // it on most writes for an entry the next overwrite nearby splits again.
        let plain =
            ((j0, j1) != (i0, i1) && merged.len() != j1 - j0 && node.nr - j1 > MERGE_SHIFT_MAX)
                .then(|| fold(left, right))
                .filter(|plain| plain.len() == i1 - i0);
        let (i0, i1, repl) = match plain {
            Some(plain) => (i0, i1, plain),
            None => (j0, j1, merged),
        };
        // One entry rewritten under the same key by a transaction that has written nothing
        // else, and will write nothing else, changes only the entry's second word: one atomic
        // store, no undo record.
        if let [e] = repl[..]
            && i1 - i0 == 1
            && tx.is_untouched()
            && !ctx.more_follow
            && node.entry(m, i0)?.key == e.key
        {
            tx.store_sole_u64(node.entry_off(i0) + 8, e.word1())?;
            return Ok(count);
        }
        let (_, pending) = self.splice(tx, ctx, node, i0, i1, &repl)?;
        self.push_up(tx, ctx, root_off, root, path, pending)?;
        Ok(count)
    }

    /// Records every block of the subtree at `block` (nodes and data) for release; returns the
    /// number of data blocks.
    fn release_subtree(&self, block: u64, level: u8, ctx: &mut OpCtx) -> Result<u64> {
        let mut count = 0;
        self.walk(block, level, &mut HashSet::new(), &mut |e, is_data| {
            if is_data {
                count += e.len;
            }
            ctx.ledger.release(e);
        })?;
        Ok(count)
    }

    /// Visits every node (as a 1-block extent) and data extent below `block`. A node reached
    /// twice (a cycle or a shared subtree) is corruption.
    fn walk(
        &self,
        block: u64,
        level: u8,
        seen: &mut HashSet<u64>,
        visit: &mut dyn FnMut(Extent, bool),
    ) -> Result<()> {
        let mut stack = vec![(block, level)];
        while let Some((blk, lvl)) = stack.pop() {
            let node = self.read_node(blk, lvl)?;
            if !seen.insert(blk) {
                return Err(Error::Corrupt {
                    what: "extent node reachable twice",
                    at: node.header_off(),
                });
            }
            for i in 0..node.nr {
                let e = node.entry(&self.media, i)?;
                if lvl == 0 {
                    self.check_data(&e, node.entry_off(i))?;
                    visit(Extent::new(BlockNo(e.block), e.len), true);
                } else {
                    stack.push((e.block, lvl - 1));
                }
            }
            visit(Extent::new(BlockNo(blk), 1), false);
        }
        Ok(())
    }

    /// Removes `[a, b)` below `block` (a node at `level` covering `[lo, hi)`). Returns the
    /// node's new live count and the index entries of siblings it split into.
    #[allow(clippy::too_many_arguments)]
    fn remove_node(
        &self,
        tx: &mut Tx<'_, M>,
        ctx: &mut OpCtx,
        block: u64,
        level: u8,
        lo: u64,
        hi: u64,
        a: u64,
        b: u64,
        count: &mut u64,
    ) -> Result<(usize, Vec<Entry>)> {
        let m = &self.media;
        let node = self.read_node(block, level)?;
        if level == 0 {
            let cut = self.cut_leaf(ctx, &node, (lo, hi), a, b)?;
            *count += cut.count;
            let (i0, i1) = (cut.i0, cut.i1);
            if i0 == i1 {
                return Ok((node.nr, Vec::new()));
            }
            let repl: Vec<Entry> = cut.left.into_iter().chain(cut.right).collect();
            return self.splice(tx, ctx, node, i0, i1, &repl);
        }
        if node.nr == 0 {
            return Err(Error::Corrupt {
                what: "empty extent index node",
                at: node.header_off(),
            });
        }
        let c0 = node.search(m, a)?.unwrap_or(0);
        let mut c = c0;
        let mut replacement = Vec::new();
        let mut changed = false;
        let mut partial: Vec<(u64, usize)> = Vec::new();
        let mut e = node.entry(m, c0)?;
        while c < node.nr {
            let clo = if c == 0 { lo } else { e.key };
            if clo >= b {
                break;
            }
            let next = if c + 1 < node.nr {
                Some(node.entry(m, c + 1)?)
            } else {
                None
            };
            let chi = next.map_or(hi, |n| n.key);
            if clo < lo || chi > hi || clo >= chi {
                return Err(Error::Corrupt {
                    what: "extent index keys",
                    at: node.entry_off(c),
                });
            }
            if a <= clo && chi <= b {
                self.check_node_block(e.block)?;
                *count += self.release_subtree(e.block, level - 1, ctx)?;
                changed = true;
            } else {
                let (nr_c, siblings) =
                    self.remove_node(tx, ctx, e.block, level - 1, clo, chi, a, b, count)?;
                if nr_c == 0 && siblings.is_empty() {
                    ctx.ledger.release(Extent::new(BlockNo(e.block), 1));
                    changed = true;
                } else {
                    replacement.push(e);
                    if siblings.is_empty() {
                        partial.push((e.block, nr_c));
                    } else {
                        changed = true;
                        replacement.extend(siblings);
                    }
                }
            }
            c += 1;
            match next {
                Some(n) => e = n,
                None => break,
            }
        }
        if !changed {
            let mut node = node;
            for (child, nr_c) in partial {
                if nr_c * 2 < self.fanout {
                    node = self.try_merge(tx, ctx, node, child)?;
                }
            }
            return Ok((node.nr, Vec::new()));
        }
        let (nr, siblings) = self.splice(tx, ctx, node, c0, c, &replacement)?;
        if !siblings.is_empty() {
            return Ok((nr, siblings));
        }
        let mut node = Node { nr, ..node };
        for (child, nr_c) in partial {
            if nr_c * 2 < self.fanout {
                node = self.try_merge(tx, ctx, node, child)?;
            }
        }
        Ok((node.nr, Vec::new()))
    }

    /// Merges the child `child` of `node` with its right (else left) sibling if both fit into
    /// one node. Returns the parent with its new count.
    fn try_merge(
        &self,
        tx: &mut Tx<'_, M>,
        ctx: &mut OpCtx,
        node: Node,
        child: u64,
    ) -> Result<Node> {
        let m = &self.media;
        if node.nr < 2 {
            return Ok(node);
        }
        let mut j = None;
        for i in 0..node.nr {
            if node.entry(m, i)?.block == child {
                j = Some(i);
                break;
            }
        }
        let Some(j) = j else {
            return Ok(node);
        };
        let (l, r) = if j + 1 < node.nr {
            (j, j + 1)
        } else {
            (j - 1, j)
        };
        let le = node.entry(m, l)?;
        let re = node.entry(m, r)?;
        let level = node.level - 1;
        let ln = self.read_node(le.block, level)?;
        let rn = self.read_node(re.block, level)?;
        if ln.nr + rn.nr > self.fanout || rn.nr == 0 {
            return Ok(node);
        }
        let mut moved = rn.entries(m, 0, rn.nr)?;
        if level > 0 {
            // The right node's first key was not a routing key; in the left node it is.
            moved[0].key = re.key;
        }
        self.put(tx, ctx, &ln, ln.nr, &moved)?;
        self.set_nr(tx, ctx, &ln, ln.nr + rn.nr)?;
        let (nr, siblings) = self.splice(tx, ctx, node, r, r + 1, &[])?;
        debug_assert!(siblings.is_empty());
        ctx.ledger.release(Extent::new(rn.block, 1));
        Ok(Node { nr, ..node })
    }

    /// The body of a remove, inside its transaction. Returns the number of data blocks
    /// unmapped.
    fn remove_tx(
        &self,
        tx: &mut Tx<'_, M>,
        ctx: &mut OpCtx,
        root_off: PmOff,
        root: Root,
        a: u64,
        b: u64,
    ) -> Result<u64> {
        let mut count = 0;
        let (nr, siblings) = self.remove_node(
            tx,
            ctx,
            root.block.0,
            root.height - 1,
            0,
            u64::MAX,
            a,
            b,
            &mut count,
        )?;
        let new_root = if !siblings.is_empty() {
            Some(self.grow(tx, ctx, root, siblings)?)
        } else if nr == 0 {
            ctx.ledger.release(Extent::new(root.block, 1));
            None
        } else {
            let mut r = root;
            let mut nr = nr;
            while r.height > 1 && nr == 1 {
                let node = self.read_node(r.block.0, r.height - 1)?;
                let child = node.entry(&self.media, 0)?.block;
                let child = self.read_node(child, r.height - 2)?;
                ctx.ledger.release(Extent::new(r.block, 1));
                r = Root {
                    block: child.block,
                    height: r.height - 1,
                };
                nr = child.nr;
            }
            Some(r)
        };
        let word = new_root.map_or(0, |r| r.pack());
        if word != root.pack() {
            tx.store_u64(root_off, word)?;
        }
        Ok(count)
    }
}

impl<M: Media, A: BlockAllocator> FileMapping for ExtentTree<M, A> {
    type File = ExtentFile;

    fn kind(&self) -> MappingKind {
        MappingKind::Extent
    }

    fn open_file(&self, id: FileId) -> Result<ExtentFile> {
        Root::unpack(self.media.load_u64(id.root)?, id.root)?;
        Ok(ExtentFile {
            id,
            lock: RwLock::new(()),
            cursor: Mutex::new(None),
        })
    }

    fn lookup(&self, file: &ExtentFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        let _g = file.lock.read().unwrap_or_else(|e| e.into_inner());
        self.lookup_locked(file, lblk, lblk.saturating_add(len), out)
    }

    fn insert(&self, file: &ExtentFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        let data = self.map_range(file, lblk, len, Data::Allocate)?;
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

    fn insert_at(&self, file: &ExtentFile, run: Run) -> Result<()> {
        self.map_range(file, run.lblk, run.len, Data::Given(run.extent()))
            .map(drop)
    }

    fn replace_many(&self, file: &ExtentFile, runs: &[Run]) -> Result<u64> {
        replace_many_in_place(
            &self.media,
            &*self.alloc,
            |ledger, rest| {
                let _g = file.lock.write().unwrap_or_else(|e| e.into_inner());
                self.overwrite_in_place(file, runs, ledger, rest)
            },
            |rest| self.replace_batched(file, rest),
        )
    }

    fn remove(&self, file: &ExtentFile, lblk: u64, len: u64) -> Result<u64> {
        if len == 0 {
            return Ok(0);
        }
        let b = lblk.saturating_add(len);
        let _g = file.lock.write().unwrap_or_else(|e| e.into_inner());
        let Some(root) = self.root(file)? else {
            return Ok(0);
        };
        self.transact(file, OpCtx::default(), |tx, ctx| {
            self.remove_tx(tx, ctx, file.id.root, root, lblk, b)
        })
    }

    fn replace(&self, file: &ExtentFile, run: Run) -> Result<u64> {
        if run.len == 0 {
            return Ok(0);
        }
        let b = self.replace_end(run)?;
        let _g = file.lock.write().unwrap_or_else(|e| e.into_inner());
        let root = self.root(file)?;
        let entries = leaf_entries(run.lblk, &[run.extent()]);
        self.transact(file, OpCtx::default(), |tx, ctx| {
            self.replace_tx(tx, ctx, file.id.root, root, run.lblk, b, entries)
        })
    }

    fn remove_file(&self, file: &ExtentFile) -> Result<()> {
        let _g = file.lock.write().unwrap_or_else(|e| e.into_inner());
        let Some(root) = self.root(file)? else {
            return Ok(());
        };
        let mut ctx = OpCtx::default();
        self.release_subtree(root.block.0, root.height - 1, &mut ctx)?;
        self.media.store_u64_persist(file.id.root, 0)?;
        self.invalidate(file);
        ctx.ledger.finish_committed(&*self.alloc)
    }

    fn owned_blocks(&self, file: &ExtentFile, visit: &mut dyn FnMut(Extent)) -> Result<()> {
        let _g = file.lock.read().unwrap_or_else(|e| e.into_inner());
        let Some(root) = self.root(file)? else {
            return Ok(());
        };
        self.walk(
            root.block.0,
            root.height - 1,
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
