//! A file's log blocks as a [`BlockAllocator`]: single blocks claimed in the HashFS table by
//! CAS, keyed `(ino, lblk)` with `lblk` in a reserved range of the file's logical space.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use pmfs_core::layout::BlockNo;
use pmfs_core::pm::Media;
// The claim's fence comes from the facade (loom models it); the key sequence stays std.
use pmfs_core::sync::atomic::fence_after_rmw;
use pmfs_core::traits::{AllocHint, BlockAllocator, Extent, Run};
use pmfs_core::{Error, Result};

use super::slot::{Key, Slot, TOMBSTONE};
use super::{HashFs, LBLK_LIMIT, MAX_INO};

/// One past the last logical block of the log range. The top 16 logical blocks of a file
/// (`[LOG_LBLK_END, 2^32)`) are left to the engine (its extended-attribute blocks).
pub const LOG_LBLK_END: u64 = LBLK_LIMIT - 16;
/// First logical block of the log range: a file's data must stay below it.
pub const LOG_LBLK_FIRST: u64 = LOG_LBLK_END - LOG_SPAN;
/// Size of the log range (a power of two): far more log blocks than a file ever holds, so a
/// randomly chosen key of the range is almost always unused.
const LOG_SPAN: u64 = 1 << 20;
/// Keys tried by one allocation before it reports [`Error::NoSpace`].
const MAX_TRIES: u32 = 1 << 12;
/// Odd step of the sequence of candidate keys (a permutation of the range).
const STEP: u64 = 0x9e37_79b9_7f4a_7c15;

/// The log-block allocator of one file (see [`HashFs::log_blocks`]).
pub struct LogBlocks<M> {
    table: Arc<HashFs<M>>,
    ino: u64,
    next: AtomicU64,
}

impl<M> std::fmt::Debug for LogBlocks<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogBlocks")
            .field("ino", &self.ino)
            .finish_non_exhaustive()
    }
}

fn in_log_range(lblk: u64) -> bool {
    (LOG_LBLK_FIRST..LOG_LBLK_END).contains(&lblk)
}

impl<M: Media> HashFs<M> {
    /// The allocator of the log blocks of file `ino`: one block per allocation, claimed in
    /// this table by CAS under a key `(ino, lblk)` with `lblk` in
    /// `[LOG_LBLK_FIRST, LOG_LBLK_END)`, without any DRAM lock, so several processes sharing
    /// the pool may allocate for the same file at once. The blocks are the file's:
    /// [`owned_blocks`](pmfs_core::traits::FileMapping::owned_blocks) reports them and
    /// [`remove_file`](pmfs_core::traits::FileMapping::remove_file) frees them. An `ino`
    /// above [`MAX_INO`] makes every allocation fail with [`Error::InvalidArgument`].
    pub fn log_blocks(self: &Arc<Self>, ino: u64) -> LogBlocks<M> {
        let start = RandomState::new().hash_one(ino);
        LogBlocks {
            table: Arc::clone(self),
            ino,
            next: AtomicU64::new(start),
        }
    }
}

impl<M: Media> HashFs<M> {
    /// Frees every log block `b` of a file `ino` for which `unnamed(ino, b)` holds: for the
    /// caller, a block that the file's log no longer uses (its chain and segment blocks), such
    /// as one a compaction retired in a process that was killed before it could free it or
    /// hand it on. One scan of the whole table; exclusive use (mount time). Returns how many
    /// blocks were freed.
    pub fn free_unnamed_log_blocks(&self, unnamed: &dyn Fn(u64, BlockNo) -> bool) -> Result<u64> {
        self.tombstone_where(|i, s| match s {
            Slot::Committed(k) if in_log_range(k.lblk) => unnamed(k.ino, self.data.start + i),
            _ => false,
        })
    }
}

impl<M: Media> LogBlocks<M> {
    /// The slot index of block `b` if it is one of this file's log blocks.
    fn log_slot(&self, b: BlockNo) -> Result<u64> {
        let t = &*self.table;
        let run = Run {
            lblk: 0,
            pblk: b,
            len: 1,
        };
        let i = t.run_slot(&run, 0)?;
        match t.load(i)?.1 {
            Slot::Committed(k) if k.ino == self.ino && in_log_range(k.lblk) => Ok(i),
            _ => Err(Error::InvalidArgument("not a log block of this file")),
        }
    }

    /// Tries to make `key` a log block: claims a slot for it as tentative, then walks the
    /// key's whole chain for another slot of the same key (committed, or tentative from a
    /// concurrent claimer). The claim and the walk are separated by a sequentially consistent
    /// fence, so of two concurrent claimers of one key at least one sees the other (once a
    /// claim is sealed no slot between the key's home and the claimed slot is empty, so the
    /// walk of the claimer that finishes its seal last reaches the other's slot); whoever
    /// sees another gives its slot back. The
    /// survivor flips its slot to committed.
    fn try_claim(&self, key: Key) -> Result<Option<u64>> {
        let t = &*self.table;
        let home = t.home(super::simd::file_seed(key.ino, t.salt), key.lblk);
        if t.probe(home, key.committed())?.is_some() {
            return Ok(None);
        }
        let i = t.claim(home, key.tentative())?.ok_or(Error::NoSpace)?;
        fence_after_rmw();
        let mut j = home;
        let mut clash = false;
        for _ in 0..t.slots {
            let (w, s) = t.load(j)?;
            if s == Slot::Empty {
                break;
            }
            if j != i && (w == key.committed() || w == key.tentative()) {
                clash = true;
                break;
            }
            j = if j + 1 == t.slots { 0 } else { j + 1 };
        }
        if clash {
            // Our own tentative claim: nobody else writes it. A crash before it is given back
            // leaves a tentative slot, which recovery drops; so does a failed store here.
            if let Err(e) = t.give_back(i) {
                t.intents.owe();
                return Err(e);
            }
            return Ok(None);
        }
        t.commit_claimed(i, key)?;
        Ok(Some(i))
    }
}

impl<M: Media> BlockAllocator for LogBlocks<M> {
    fn alloc(&self, want: u64, _hint: AllocHint) -> Result<Extent> {
        if self.ino > MAX_INO {
            return Err(Error::InvalidArgument(
                "inode number too large for a global table",
            ));
        }
        if want == 0 {
            return Err(Error::InvalidArgument("allocation of zero blocks"));
        }
        for _ in 0..MAX_TRIES {
            let x = self.next.fetch_add(STEP, Ordering::Relaxed);
            let key = Key::new(self.ino, LOG_LBLK_FIRST + (x & (LOG_SPAN - 1)));
            if let Some(i) = self.try_claim(key)? {
                return Ok(Extent::new(self.table.data.start + i, 1));
            }
        }
        Err(Error::NoSpace)
    }

    /// Frees log blocks of this file: every block of `ext` must be one, else
    /// [`Error::InvalidArgument`] and nothing changes. Durable when it returns.
    fn free(&self, ext: Extent) -> Result<()> {
        let t = &*self.table;
        let mut slots = Vec::with_capacity(ext.len as usize);
        for k in 0..ext.len {
            let i = self.log_slot(ext.start + k)?;
            slots.push((i, t.media.load_u64(t.slot_off(i))?));
        }
        let mut freed = Vec::with_capacity(slots.len());
        for &(i, w) in &slots {
            if t.media.cas_u64(t.slot_off(i), w, TOMBSTONE)?.is_ok() {
                freed.push(i);
            }
        }
        t.settle_freed(&freed)?;
        if freed.len() != slots.len() {
            return Err(Error::InvalidArgument("log block freed twice"));
        }
        Ok(())
    }

    /// Free slots of the whole table (a full scan; 0 if the table cannot be read).
    fn free_blocks(&self) -> u64 {
        self.table.free_blocks().unwrap_or(0)
    }

    /// Slots of the whole table.
    fn total_blocks(&self) -> u64 {
        self.table.slots
    }

    /// This file's log blocks: every committed slot keyed in its log range (a scan of the
    /// whole table, read in bulk). The log sweeps those that its chain no longer names.
    fn outstanding(&self) -> Result<Option<Vec<BlockNo>>> {
        let t = &*self.table;
        let mut out = Vec::new();
        t.for_each_slot(false, |i, _, s| {
            if let Slot::Committed(k) = s
                && k.ino == self.ino
                && in_log_range(k.lblk)
            {
                out.push(t.data.start + i);
            }
            Ok(())
        })?;
        Ok(Some(out))
    }

    /// Makes exactly `used` this file's log blocks (at mount, from the log's own account of
    /// its blocks): every other log block of the file is freed, which reclaims blocks a
    /// crash left behind between a log's compaction and its free. Every block of `used` must
    /// be a log block of this file, else [`Error::Corrupt`] and nothing changes. Scans the
    /// whole table; exclusive use (mount time).
    fn rebuild(&self, used: &mut dyn Iterator<Item = Extent>) -> Result<()> {
        let t = &*self.table;
        let mut keep = HashSet::new();
        for e in used {
            for k in 0..e.len {
                let i = self.log_slot(e.start + k).map_err(|_| Error::Corrupt {
                    what: "log block not owned by the file",
                    at: (e.start + k).offset(),
                })?;
                keep.insert(i);
            }
        }
        let mut freed = Vec::new();
        for i in 0..t.slots {
            let (w, s) = t.load(i)?;
            if let Slot::Committed(k) = s
                && k.ino == self.ino
                && in_log_range(k.lblk)
                && !keep.contains(&i)
                && t.media.cas_u64(t.slot_off(i), w, TOMBSTONE)?.is_ok()
            {
                freed.push(i);
            }
        }
        t.settle_freed(&freed)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use pmfs_core::layout::{BLOCK_SIZE, PmOff};
    use pmfs_core::pm::HeapRegion;
    use pmfs_core::traits::{FileId, FileMapping};

    use super::*;

    fn table(slots: u64) -> Arc<HashFs<Arc<HeapRegion>>> {
        let meta = Extent::new(BlockNo(1), HashFs::<HeapRegion>::meta_blocks(slots));
        let data = Extent::new(meta.end(), slots);
        let r = Arc::new(HeapRegion::new(data.end().0 * BLOCK_SIZE).unwrap());
        Arc::new(HashFs::format_with_salt(r, meta, data, 9).unwrap())
    }

    #[test]
    fn log_blocks_are_the_files_and_go_with_it() {
        let t = table(64);
        let (a, b) = (t.log_blocks(5), t.log_blocks(6));
        let got: Vec<_> = (0..10)
            .map(|_| a.alloc(4, AllocHint::metadata()).unwrap())
            .collect();
        let other = b.alloc(1, AllocHint::metadata()).unwrap();
        assert!(got.iter().all(|e| e.len == 1));
        let mut distinct: Vec<_> = got.iter().map(|e| e.start).collect();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 10);
        assert_eq!(a.total_blocks(), 64);
        assert_eq!(a.free_blocks(), 64 - 11);
        let f = t
            .open_file(FileId {
                ino: 5,
                root: PmOff(0),
            })
            .unwrap();
        let mut owned = Vec::new();
        t.owned_blocks(&f, &mut |e| owned.push(e)).unwrap();
        assert_eq!(owned.iter().map(|e| e.len).sum::<u64>(), 10);
        // Data lookups below the log range see none of them.
        let mut runs = Vec::new();
        t.lookup(&f, 0, LOG_LBLK_FIRST, &mut runs).unwrap();
        assert!(runs.is_empty());
        // Freeing another file's block, or a block twice, is refused.
        assert!(matches!(a.free(other), Err(Error::InvalidArgument(_))));
        a.free(got[0]).unwrap();
        assert!(matches!(a.free(got[0]), Err(Error::InvalidArgument(_))));
        // Rebuild keeps exactly the given blocks.
        a.rebuild(&mut got[1..4].iter().copied()).unwrap();
        owned.clear();
        t.owned_blocks(&f, &mut |e| owned.push(e)).unwrap();
        assert_eq!(owned.len(), 3);
        assert!(matches!(
            a.rebuild(&mut std::iter::once(other)),
            Err(Error::Corrupt { .. })
        ));
        t.remove_file(&f).unwrap();
        assert_eq!(a.free_blocks(), 63);
        assert!(matches!(
            t.log_blocks(MAX_INO + 1).alloc(1, AllocHint::metadata()),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn the_files_log_blocks_are_reported_and_unnamed_ones_freed() {
        let t = table(64);
        let (a, b) = (t.log_blocks(5), t.log_blocks(6));
        let mut mine: Vec<BlockNo> = (0..5)
            .map(|_| a.alloc(1, AllocHint::metadata()).unwrap().start)
            .collect();
        let theirs = b.alloc(1, AllocHint::metadata()).unwrap().start;
        // A data block of the same file is not a log block.
        let f = t
            .open_file(FileId {
                ino: 5,
                root: PmOff(0),
            })
            .unwrap();
        t.insert(&f, 0, 1, &mut Vec::new()).unwrap();
        mine.sort();
        let mut reported = a.outstanding().unwrap().unwrap();
        reported.sort();
        assert_eq!(reported, mine);
        assert_eq!(b.outstanding().unwrap().unwrap(), vec![theirs]);
        let kept = HashSet::from([mine[0], mine[3]]);
        assert_eq!(
            t.free_unnamed_log_blocks(&|ino, b| ino == 5 && !kept.contains(&b))
                .unwrap(),
            3
        );
        let mut left = a.outstanding().unwrap().unwrap();
        left.sort();
        assert_eq!(left, vec![mine[0], mine[3]]);
        assert_eq!(
            b.outstanding().unwrap().unwrap(),
            vec![theirs],
            "not named: untouched"
        );
    }

    #[test]
    fn a_full_table_has_no_log_block() {
        let t = table(8);
        let a = t.log_blocks(1);
        for _ in 0..8 {
            a.alloc(1, AllocHint::metadata()).unwrap();
        }
        assert!(matches!(
            a.alloc(1, AllocHint::metadata()),
            Err(Error::NoSpace)
        ));
        assert_eq!(t.occupancy().unwrap().tentative, 0);
    }

    #[test]
    fn threads_claiming_one_key_end_with_one_owner() {
        let t = table(256);
        let key = Key::new(7, LOG_LBLK_FIRST + 3);
        for _ in 0..50 {
            let wins: Vec<_> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2)
                    .map(|_| s.spawn(|| t.log_blocks(7).try_claim(key).unwrap()))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let mut holders = 0;
            for i in 0..t.slots {
                if t.media.load_u64(t.slot_off(i)).unwrap() == key.committed() {
                    holders += 1;
                }
            }
            assert!(holders <= 1, "{holders} slots hold one key: {wins:?}");
            assert_eq!(holders, wins.iter().flatten().count());
            if let Some(i) = wins.iter().flatten().next() {
                t.media.store_u64(t.slot_off(*i), TOMBSTONE).unwrap();
            }
        }
        assert_eq!(t.occupancy().unwrap().tentative, 0);
    }
}
