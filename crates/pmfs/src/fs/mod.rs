//! The engine behind [`Volume`](crate::Volume): mkfs, mount with recovery, the caches of
//! directories and open inodes, and the shared helpers of the namespace and data operations.
//! The data path (per-file logs, copy-on-write, digest) is in [`data`].
//!
//! # Mount
//!
//! After a clean close (mount-state word `CLEAN`) mounting reads the superblock, scans the
//! inode table to rebuild the inode free list and, for a volatile allocator, rebuilds the
//! allocator from the blocks of the live inodes and of their logs (one pass over the table on
//! the hashed structures, whatever the number of files). Every regular file's log is
//! repaired (`log::recover`: pins, flags and a tail beyond a hole) and its digest holder reset,
//! then digested (a clean close digested them all already, so this finds nothing unless a
//! data-only client died). On HashFS, the log blocks that no log names any more are freed:
//! blocks that a compaction retired in a data-only client killed before it freed them or handed
//! them on (one scan of the table). Orphans are freed: files unlinked while a data-only client
//! had them open or mapped, which the owner could not free at their last close. Directories are
//! loaded lazily on first use.
//!
//! A read-write mount of an older format version upgrades the volume once the journal is rolled
//! back (step 2 below): a volume older than [`format::MAPPED_END_VERSION`] first gets every
//! regular file's `MAPPED_END` raised to its size, then both superblock copies get the new
//! version.
//!
//! After a crash the mount also:
//! 1. lets the mapping structure recover its own half-done operations;
//! 2. rolls back every armed journal transaction;
//! 3. repairs every file log as above, then rebuilds the allocator from the live inodes'
//!    mappings, their log blocks and the data blocks of their undigested log entries (plus
//!    inodes a journal cleanup will release);
//! 4. digests every log (applying its committed entries to the mapping in log order, which
//!    frees the blocks they replace) and compacts it; on HashFS, drops the staged slots of
//!    writes that never committed;
//! 5. loads every live directory in repair mode (undoes half-done inserts, redoes half-done
//!    removals, drops entries whose inode is dead);
//! 6. runs the journal cleanups (trims beyond end of file, releases never-live inodes) and
//!    marks the journal idle;
//! 7. frees orphans: live inodes without links (open-but-unlinked files of the crashed run,
//!    and removals that zeroed the link count before the crash), as every read-write mount
//!    does;
//! 8. rebuilds the inode free list.
//!
//! The checker recovers a crashed volume the same way on a shadow of it
//! ([`fsck::check`](crate::fsck::check)), leaving out what a mount collects and the check
//! counts: step 7 and the dropping of staged slots in step 4.

pub(crate) mod data;
pub(crate) mod ns;
pub(crate) mod path;
pub(crate) mod used;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, PmOff};
use pmfs_core::pm::{Media, MediaExt, ShadowRegion};
use pmfs_core::traits::{BlockAllocator, Extent, FileId, MappingKind, Run};

use crate::dir::{Dir, LoadMode, RepairStats};
use crate::error::{Error, Result};
use crate::format::{
    self, Geometry, MOUNT_STATE_OFF, Options, ROOT_INO, STATE_CLEAN, STATE_DIRTY, SbSource,
};
use crate::hash::FastMap;
use crate::inode::{Handle, InodeRaw, InodeTable, Kind, LIVE, field, flag};
use crate::journal::{Cleanup, Journal};
use crate::mapping::{MapFile, Mapper};
use crate::parts::{self, FreeCount, Opening, Pm, Stager};

use self::used::{InodeSet, UsedBlocks};

/// Largest file size: 2^32 blocks (the logical-block limit of the global tables) less the
/// top of a file's logical space, where HashFS keeps the file's log blocks
/// (`[LOG_LBLK_FIRST, LOG_LBLK_END)`) and every structure the extended-attribute blocks.
pub(crate) const MAX_FILE_SIZE: u64 = pmfs_mapping::hashfs::LOG_LBLK_FIRST * BLOCK_SIZE;
const _: () = assert!(pmfs_mapping::hashfs::LOG_LBLK_END <= crate::xattr::XATTR_LBLK);
/// Most hard links an inode may have.
pub(crate) const MAX_LINKS: u64 = 65_000;
/// HashFS files freed together by one scan of the table (see [`Fs::defer_release`]): one per
/// this many slots of the table, so that each removal's share of the scans is the same on a
/// volume of any size, within [`RELEASE_BATCH_MIN`] and [`RELEASE_BATCH_MAX`].
const SLOTS_PER_RELEASE: u64 = 1024;
const RELEASE_BATCH_MIN: u64 = 64;
const RELEASE_BATCH_MAX: u64 = 4096;
/// A batch of deferred HashFS files is also freed once they hold this share of the table
/// (`slots / DEFERRED_SHARE` blocks): slots of deleted files are as full as live ones to the
/// walks of linear probing, so a table that kept gigabytes of them made every insert crawl
/// long before it ran out of space (`fallocate -l 200M` on a 1 GiB volume, after four such
/// files were deleted: 2.1-2.5 s instead of 14-87 ms). Each scan still frees at least this
/// many blocks, a few hundred bytes of table read per block.
const DEFERRED_SHARE: u64 = 32;
pub(crate) const LOCK_STRIPES: usize = 1024;

/// How many deferred files one scan of a HashFS table of `slots` slots frees.
fn release_batch_len(slots: u64) -> u64 {
    (slots / SLOTS_PER_RELEASE).clamp(RELEASE_BATCH_MIN, RELEASE_BATCH_MAX)
}

/// HashFS files whose release waits for a batch ([`Fs::defer_release`]).
#[derive(Debug, Default)]
struct Deferred {
    files: Vec<Handle>,
    /// The blocks below their sizes or mapped ends when they were deferred.
    blocks: u64,
}

/// What mounting found and repaired.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MountReport {
    /// The volume had been closed cleanly (the fast path was taken).
    pub clean: bool,
    /// The primary superblock was damaged and the backup was used (and copied back).
    pub used_backup_superblock: bool,
    /// Journal transactions rolled back.
    pub journal_rolled_back: u32,
    /// Journal cleanups run (trims, releases).
    pub journal_cleanups: u32,
    /// Half-done directory insertions undone.
    pub undone_inserts: u32,
    /// Half-done directory removals completed.
    pub redone_removes: u32,
    /// Directory entries dropped because their inode was dead.
    pub dropped_entries: u32,
    /// Directory pages a crash left mapped and not yet counted in the directory's size,
    /// initialised and published.
    pub dir_pages_published: u32,
    /// Orphan inodes freed.
    pub orphans_freed: u32,
    /// HashFS slots that were tombstones on no entry's walk and became empty.
    pub tombstones_purged: u64,
    /// HashFS log blocks that no file's log named any more, freed: a compaction retired them
    /// in a process that was killed before it freed them, or a file's first log was being
    /// made when its process was killed.
    pub log_blocks_freed: u64,
    /// Dead inodes that the cuckoo or HashFS table still maps blocks to, which only damage
    /// leaves: their numbers are kept out of use, as a new file given one would find those
    /// blocks mapped, until `fsck` releases them. The trees hang from the inode's root word,
    /// which a new file's record zeroes, so they have none.
    pub dead_inodes_withheld: u32,
}

impl MountReport {
    /// Whether mounting repaired or freed anything (a clean mount may still have freed log
    /// blocks or purged tombstones).
    pub fn did_anything(&self) -> bool {
        self.used_backup_superblock || self.counts().any(|(n, _)| n != 0)
    }

    /// The counts, each with what it counts.
    fn counts(&self) -> impl Iterator<Item = (u64, &'static str)> {
        [
            (
                u64::from(self.journal_rolled_back),
                "journal transactions rolled back",
            ),
            (u64::from(self.journal_cleanups), "journal cleanups run"),
            (
                u64::from(self.undone_inserts),
                "directory insertions undone",
            ),
            (
                u64::from(self.redone_removes),
                "directory removals completed",
            ),
            (
                u64::from(self.dropped_entries),
                "entries of dead inodes dropped",
            ),
            (
                u64::from(self.dir_pages_published),
                "directory pages published",
            ),
            (u64::from(self.orphans_freed), "orphan inodes freed"),
            (self.tombstones_purged, "hash tombstones purged"),
            (self.log_blocks_freed, "unlinked log blocks freed"),
            (
                u64::from(self.dead_inodes_withheld),
                "dead inodes that still map blocks kept out of use (fsck --repair releases them)",
            ),
        ]
        .into_iter()
    }
}

/// What mounting repaired and freed, as one line (`nothing repaired` if nothing); counts of
/// zero are left out.
///
/// ```
/// let r = pmfs::MountReport {
///     journal_rolled_back: 1,
///     orphans_freed: 2,
///     ..Default::default()
/// };
/// assert_eq!(
///     r.to_string(),
///     "1 journal transactions rolled back, 2 orphan inodes freed"
/// );
/// ```
impl std::fmt::Display for MountReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.did_anything() {
            return f.write_str("nothing repaired");
        }
        let mut sep = "";
        if self.used_backup_superblock {
            f.write_str("the superblock restored from its backup")?;
            sep = ", ";
        }
        for (n, what) in self.counts().filter(|&(n, _)| n != 0) {
            write!(f, "{sep}{n} {what}")?;
            sep = ", ";
        }
        Ok(())
    }
}

/// The engine. Shared by the [`Volume`](crate::Volume) and every open file.
pub(crate) struct Fs {
    media: Pm,
    pub geo: Geometry,
    pub map: Arc<dyn Mapper>,
    pub alloc: Option<Arc<dyn BlockAllocator>>,
    /// Where copy-on-write blocks and log blocks come from.
    pub stage: Stager,
    /// The log state of every inode open in this process that has a log.
    pub(crate) logs: Mutex<FastMap<u32, Arc<data::Shared>>>,
    /// This process's id as a digest holder.
    pub holder: u32,
    /// HashFS files waiting to be freed by one scan of the table ([`Fs::defer_release`]).
    releasing: Mutex<Deferred>,
    /// Whether `releasing` holds any file (read without its lock).
    releasing_any: AtomicBool,
    /// Holders of words of this pool found alive, and when ([`Fs::holder_alive`]).
    alive_seen: Mutex<FastMap<u32, std::time::Instant>>,
    /// Counts of the mapped blocks of files with holes ([`Fs::mapped_blocks`]), with what
    /// they were counted at.
    pub(crate) blocks_seen: Mutex<FastMap<u32, (data::Counted, u64)>>,
    free_count: FreeCount,
    pub inodes: InodeTable,
    pub journal: Journal,
    dirs: RwLock<FastMap<u32, Arc<Dir>>>,
    /// The root directory (never removed), kept out of the cache lookup of every path.
    root_dir: OnceLock<Arc<Dir>>,
    /// Open handles per inode, and whether the inode lost its last link while open.
    opens: Mutex<FastMap<u32, (u32, bool)>>,
    /// Files whose log pins (or mapped-mode count) outlived this owner's last close, or kept
    /// them from being freed once unlinked, while other processes were attached: they may be
    /// dead processes' ([`Fs::collect_dead_pins`]).
    dead_pins_pending: Mutex<FastMap<u32, Handle>>,
    pub(crate) ilocks: Box<[RwLock<()>]>,
    /// Serialises operations that change the shape of the tree (rename, rmdir), so loops
    /// cannot be created and directory locks are always taken in a consistent order.
    pub tree_lock: Mutex<()>,
    clock: AtomicI64,
    pub root: Handle,
    dir_mode: LoadMode,
    pub read_only: bool,
    /// A data-only client of a pool another process owns ([`Fs::attach`]).
    pub client: bool,
    /// How a client has the kernel drop its pages of a file it updated
    /// ([`Client::on_kernel_pages`](crate::Client::on_kernel_pages)).
    pub(crate) kernel_pages: OnceLock<data::DropKernelPages>,
    closed: AtomicBool,
    /// What a log-free operation that failed part way left on the media for recovery to
    /// finish (see [`writable`](Fs::writable)).
    left: OnceLock<&'static str>,
    pub report: MountReport,
    /// The owner lock of the pool file when the volume was opened by path; released when the
    /// engine is dropped, after its clean close.
    pub owner_lock: OnceLock<std::fs::File>,
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("geo", &self.geo)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

fn wall_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A live inode found by the mount scan.
#[derive(Clone, Copy, Debug)]
struct LiveInode {
    h: Handle,
    kind: Kind,
}

impl Fs {
    /// The media.
    pub fn m(&self) -> &dyn Media {
        &*self.media
    }

    /// The media as a shareable handle.
    pub fn media(&self) -> &Pm {
        &self.media
    }

    /// A timestamp in ns since the epoch that never goes backwards on this volume (CFFS
    /// §V.C.1: directory times are recovered as the largest entry time).
    pub fn now(&self) -> i64 {
        let t = wall_ns();
        self.clock.fetch_max(t, Ordering::Relaxed).max(t)
    }

    /// [`now`](Fs::now) from the kernel's coarse clock (a tick, a few milliseconds, behind
    /// the fine one, and a fraction of its cost): the modification times of data writes, as
    /// the kernel's own file systems stamp them.
    pub fn now_coarse(&self) -> i64 {
        use nix::time::{ClockId, clock_gettime};
        let Ok(t) = clock_gettime(ClockId::CLOCK_REALTIME_COARSE) else {
            return self.now();
        };
        let t = t.tv_sec() * 1_000_000_000 + t.tv_nsec();
        self.clock.fetch_max(t, Ordering::Relaxed).max(t)
    }

    /// The mapping identity of inode `ino`.
    pub fn file_id(&self, ino: u32) -> FileId {
        FileId {
            ino: u64::from(ino),
            root: self.inodes.field(ino, field::ROOT),
        }
    }

    /// The lock guarding the fields and data of inode `ino` (striped).
    pub fn ilock(&self, ino: u32) -> &RwLock<()> {
        &self.ilocks[ino as usize % LOCK_STRIPES]
    }

    /// Formats `media` and mounts the new volume.
    pub fn format(media: Pm, opts: &Options) -> Result<Fs> {
        let now = wall_ns();
        let mut opts = opts.clone();
        if opts.mapping == MappingKind::HashFs {
            let cap = pmfs_mapping::hashfs::MAX_INO + 1;
            opts.inodes = Some(opts.inodes.unwrap_or(media.blocks() / 4).min(cap));
        }
        let geo = Geometry::plan(
            &opts,
            media.blocks(),
            |d| parts::alloc_meta_blocks(opts.mapping, opts.allocator, d),
            |d| parts::map_meta_blocks(opts.mapping, d),
            now,
        )?;
        let m = &*media;
        // Everything but the superblock first: a crash during mkfs leaves no valid volume.
        format::new_rendezvous(m)?;
        format::record_owner(m)?;
        m.store_u64(MOUNT_STATE_OFF, STATE_DIRTY)?;
        m.persist(MOUNT_STATE_OFF, 8)?;
        m.fill_nt(
            geo.inode_start.offset(),
            geo.inode_count * crate::inode::INODE_SIZE,
            0,
        )?;
        Journal::format(m, &geo)?;
        m.fence();
        let parts = parts::build(&media, &geo, Opening::Format)?;
        let inodes = InodeTable::new(geo);
        let root = Handle {
            ino: ROOT_INO,
            generation: 1,
        };
        let rec = InodeRaw::new(root, Kind::Dir, 0o755, now, root);
        inodes.write_body(m, ROOT_INO, &rec)?;
        m.fence();
        inodes.store(m, ROOT_INO, field::STATE, root.live_state())?;
        m.fence();
        format::write_superblocks(m, &geo)?;
        inodes.set_free((ROOT_INO + 1..geo.inode_count as u32).collect());
        let mut fs = Fs::assemble(media, geo, parts, inodes, root, LoadMode::Clean, false);
        fs.clock.store(now, Ordering::Relaxed);
        fs.report.clean = true;
        fs.forget_left_tails();
        Ok(fs)
    }

    fn assemble(
        media: Pm,
        geo: Geometry,
        parts: parts::Parts,
        inodes: InodeTable,
        root: Handle,
        dir_mode: LoadMode,
        read_only: bool,
    ) -> Fs {
        Fs {
            media,
            journal: Journal::new(&geo),
            geo,
            map: parts.map,
            alloc: parts.alloc,
            stage: parts.stage,
            logs: Mutex::new(FastMap::default()),
            holder: std::process::id(),
            alive_seen: Mutex::new(FastMap::default()),
            blocks_seen: Mutex::new(FastMap::default()),
            releasing: Mutex::new(Deferred::default()),
            releasing_any: AtomicBool::new(false),
            free_count: parts.free,
            inodes,
            dirs: RwLock::new(FastMap::default()),
            root_dir: OnceLock::new(),
            opens: Mutex::new(FastMap::default()),
            dead_pins_pending: Mutex::new(FastMap::default()),
            ilocks: (0..LOCK_STRIPES).map(|_| RwLock::new(())).collect(),
            tree_lock: Mutex::new(()),
            clock: AtomicI64::new(0),
            root,
            dir_mode,
            read_only,
            client: false,
            kernel_pages: OnceLock::new(),
            closed: AtomicBool::new(false),
            left: OnceLock::new(),
            report: MountReport::default(),
            owner_lock: OnceLock::new(),
        }
    }

    /// Whether an undo record may name `off`: only words of the inode table and of the data
    /// region (directory pages) are ever journaled.
    fn journaled_word_ok(geo: &Geometry, off: PmOff) -> bool {
        let inodes = geo.inode_start.offset().0
            ..geo.inode_start.offset().0 + geo.inode_count * crate::inode::INODE_SIZE;
        let data = geo.data_start.offset().0..(geo.data_start + geo.data_blocks).offset().0;
        off.0.is_multiple_of(8) && (inodes.contains(&off.0) || data.contains(&off.0))
    }

    /// Mounts the volume on `media`, recovering from a crash if it was not closed cleanly.
    /// A read-only mount of such a volume recovers it in memory
    /// ([`recover_in_memory`](Fs::recover_in_memory)) and leaves `media` as it was.
    pub fn mount(media: Pm, read_only: bool) -> Result<Fs> {
        Fs::mount_collecting(media, read_only, true)
    }

    /// Recovers the volume on `media`, which was not closed cleanly, on a [`ShadowRegion`]
    /// over it, which keeps what recovery writes in memory, and closes it there cleanly.
    /// Returns the shadow, which holds the volume as its next read-write mount will leave it,
    /// and what that recovery did. `collect` frees orphans and staged blocks too, as a mount
    /// does; the checker leaves them, to count them.
    pub fn recover_in_memory(media: Pm, collect: bool) -> Result<(Pm, MountReport)> {
        let shadow: Pm = Arc::new(ShadowRegion::new(media)?);
        let fs = Fs::mount_collecting(shadow.clone(), false, collect)?;
        fs.shutdown()?;
        Ok((shadow, fs.report))
    }

    /// [`mount`](Fs::mount); `collect` frees orphans and drops staged blocks.
    fn mount_collecting(media: Pm, read_only: bool, collect: bool) -> Result<Fs> {
        let m = &*media;
        let (mut geo, src) = format::read_superblock(m)?;
        let state = m.load_u64(MOUNT_STATE_OFF)?;
        let clean = state == STATE_CLEAN;
        if read_only && !clean {
            let (shadow, report) = Fs::recover_in_memory(media, true)?;
            let mut fs = Fs::mount_collecting(shadow, true, true)?;
            fs.report = report;
            return Ok(fs);
        }
        let mut report = MountReport {
            clean,
            used_backup_superblock: src == SbSource::Backup,
            ..MountReport::default()
        };
        // A read-only mount writes nothing, not even the tokens of a HashFS free count.
        let how = if read_only {
            Opening::Inspect
        } else {
            Opening::Open
        };
        let parts = parts::build(&media, &geo, how)?;
        if !clean {
            parts.map.recover()?;
        }
        if !read_only {
            format::new_rendezvous(m)?;
            format::record_owner(m)?;
            m.store_u64(MOUNT_STATE_OFF, STATE_DIRTY)?;
            m.persist(MOUNT_STATE_OFF, 8)?;
        }
        let inodes = InodeTable::new(geo);
        let journal = Journal::new(&geo);
        let mut hash_owners = None;
        let recovered = if clean {
            if let Some(at) = journal.first_busy(m)? {
                return Err(Error::Corrupt {
                    what: "journal busy on a cleanly closed volume",
                    at,
                });
            }
            crate::journal::Recovered::default()
        } else {
            journal.recover(m, |off| Fs::journaled_word_ok(&geo, off))?
        };
        report.journal_rolled_back = recovered.rolled_back as u32;
        if !read_only {
            if geo.version < format::FORMAT_VERSION {
                // The inode words as the journal's rollback left them, before anything takes
                // them for bounds; a crash before the new version is written repeats this.
                if geo.version < format::MAPPED_END_VERSION {
                    Fs::bound_mapped_ends(m, &inodes)?;
                }
                // What this build may write (log `GROW` entries) needs the newer version:
                // older code must refuse the volume rather than find damage.
                geo.version = format::FORMAT_VERSION;
                format::restore_backup(m, &geo)?;
                format::restore_primary(m, &geo)?;
            } else if src == SbSource::Backup {
                format::restore_primary(m, &geo)?;
            }
            // The owner is alone with the table until this returns (its lock keeps other
            // owners out, and clients attach through it later): empty the tombstones no walk
            // needs, before the log digest below walks for blocks that have no version yet.
            // The pass notes which inodes own blocks.
            if let Stager::Hash(t) = &parts.stage {
                let mut owning = InodeSet::new(geo.inode_count);
                report.tombstones_purged = t.purge_exclusive(&mut |ino| owning.insert(ino))?;
                hash_owners = Some(owning);
            }
        }

        // Scan the inode table.
        let mut live = Vec::new();
        let mut root_gen = None;
        inodes.scan(m, |ino, r| {
            if ino == 0 || !r.is_live() {
                return Ok(());
            }
            let kind = r.kind().ok_or(Error::Corrupt {
                what: "inode mode",
                at: geo.inode_off(ino),
            })?;
            let h = Handle {
                ino,
                generation: r.generation(),
            };
            if ino == ROOT_INO {
                if kind != Kind::Dir {
                    return Err(Error::Corrupt {
                        what: "root inode is not a directory",
                        at: geo.inode_off(ino),
                    });
                }
                root_gen = Some(r.generation());
            }
            live.push(LiveInode { h, kind });
            Ok(())
        })?;
        let root = Handle {
            ino: ROOT_INO,
            generation: root_gen.ok_or(Error::Corrupt {
                what: "root inode not live",
                at: geo.inode_off(ROOT_INO),
            })?,
        };
        let mut fs = Fs::assemble(
            media.clone(),
            geo,
            parts,
            inodes,
            root,
            if clean {
                LoadMode::Clean
            } else {
                LoadMode::Repair
            },
            read_only,
        );
        fs.journal = journal;

        // File logs: repair what a crash left (a tail beyond a hole, pins, a dead digest
        // holder) before anything reads them. No process maps a file, writes one in place or
        // holds its tail any more, and no kernel caches its pages: every file leaves mapped
        // mode, every tail is free.
        let logged: Vec<u32> = if read_only {
            Vec::new()
        } else {
            let mut v = Vec::new();
            for l in live.iter().filter(|l| l.kind == Kind::File) {
                for word in [field::MAPS, field::TAIL] {
                    let at = fs.inodes.field(l.h.ino, word);
                    if m.load_u64(at)? != 0 {
                        m.store_u64(at, 0)?;
                        m.persist(at, 8)?;
                    }
                }
                fs.inodes.clear_flags(m, l.h.ino, flag::KERNEL_CACHED)?;
                let root = fs.inodes.field(l.h.ino, field::LOG);
                if m.load_u64(root)? != 0 {
                    pmfs_core::log::recover(m, root)?;
                    pmfs_core::log::reset_holder(m, fs.inodes.field(l.h.ino, field::DIGEST))?;
                    v.push(l.h.ino);
                }
            }
            fs.forget_left_tails();
            v
        };

        // Dead inodes the table still maps blocks to (see `MountReport::dead_inodes_withheld`),
        // but for those whose release was under way at the crash: recovery finishes it.
        let releasing: Vec<u32> = recovered
            .cleanups
            .iter()
            .filter_map(|c| match *c {
                Cleanup::ReleaseIfDead { inode } => Some(inode.ino),
                _ => None,
            })
            .collect();
        let mut withheld = HashSet::new();
        if let Some(mut owning) = hash_owners {
            for l in &live {
                owning.remove(u64::from(l.h.ino));
            }
            for &ino in &releasing {
                owning.remove(u64::from(ino));
            }
            withheld.extend(owning.iter().filter(|&ino| ino != 0));
        }
        let inode_count = fs.inodes.count();
        // The allocator: rebuild unless it is persistent and was closed cleanly.
        if let Some(alloc) = &fs.alloc
            && (!clean || !parts::alloc_is_persistent(geo.allocator))
        {
            let mut used = UsedBlocks::new(geo.data_extent());
            for &ino in &logged {
                fs.log_used(ino, &mut used)?;
            }
            if read_only {
                // Closed cleanly, so every log is digested and owns only its own blocks
                // (opening one, as `log_used` does, would write its pin count).
                for l in live.iter().filter(|l| l.kind == Kind::File) {
                    let root = fs.inodes.field(l.h.ino, field::LOG);
                    if m.load_u64(root)? != 0 {
                        Fs::log_blocks_used(m, root, &mut used)?;
                    }
                }
            }
            // The live inodes, and those whose release was under way at the crash.
            let mut owners: Vec<u32> = live.iter().map(|l| l.h.ino).collect();
            owners.extend(releasing.iter().copied());
            owners.sort_unstable();
            owners.dedup();
            // An entry whose digest was under way at the crash names blocks the mapping
            // reports too: the set takes them twice.
            let mut marked = Ok(());
            fs.owned_by(
                &owners,
                &mut |e| {
                    if marked.is_ok() {
                        marked = used.mark(e);
                    }
                },
                &mut |ino| {
                    if let Ok(ino) = u32::try_from(ino)
                        && ino != 0
                        && u64::from(ino) < inode_count
                    {
                        withheld.insert(ino);
                    }
                },
            )?;
            marked?;
            alloc.rebuild(&mut used.extents())?;
        }

        let t0 = wall_ns();
        fs.clock.store(t0, Ordering::Relaxed);
        for &ino in &logged {
            fs.digest_at_mount(ino)?;
        }
        if !read_only && let Stager::Hash(t) = &fs.stage {
            // Staged versions of writes that never committed (every committed one is
            // digested now, which promoted its slots).
            if collect {
                t.sweep_staged()?;
            }
            // Log blocks that no log names: retired by a compaction whose process was killed
            // before it freed them or handed them on (see `pmfs_core::log`), or taken for a
            // file's first log by a process killed before it published the log.
            let mut named: HashMap<u64, HashSet<BlockNo>> = HashMap::new();
            for &ino in &logged {
                let used = named.entry(u64::from(ino)).or_default();
                let root = fs.inodes.field(ino, field::LOG);
                pmfs_core::log::owned_blocks(m, root, &mut |b| {
                    used.insert(b);
                })?;
            }
            let mut logless = InodeSet::new(geo.inode_count);
            for l in live.iter().filter(|l| l.kind == Kind::File) {
                if !named.contains_key(&u64::from(l.h.ino)) {
                    logless.insert(u64::from(l.h.ino));
                }
            }
            report.log_blocks_freed =
                t.free_unnamed_log_blocks(&|ino, b| match named.get(&ino) {
                    Some(used) => !used.contains(&b),
                    None => logless.contains(ino),
                })?;
        }
        if !clean {
            fs.recover(&live, &recovered.cleanups, &mut report)?;
        }
        if !read_only && collect {
            fs.free_orphans(&live, &mut report)?;
        }
        report.dead_inodes_withheld = withheld.len() as u32;
        fs.rebuild_free_list(&withheld)?;
        fs.report = report;
        Ok(fs)
    }

    /// Raises every live regular file's `MAPPED_END` word to its size in blocks, so that the
    /// word bounds its mapped blocks as [`format::MAPPED_END_VERSION`] promises: a volume
    /// older than that may map blocks below the size past the word. Durable when it returns.
    fn bound_mapped_ends(m: &dyn Media, inodes: &InodeTable) -> Result<()> {
        inodes.scan(m, |ino, r| {
            if ino == 0 || !r.is_live() || r.kind() != Some(Kind::File) {
                return Ok(());
            }
            let blocks = r.size.div_ceil(BLOCK_SIZE).min(MAX_FILE_SIZE / BLOCK_SIZE);
            if inodes.load(m, ino, field::MAPPED_END)? < blocks {
                inodes.store(m, ino, field::MAPPED_END, blocks)?;
            }
            Ok(())
        })?;
        m.fence();
        Ok(())
    }

    /// Opens the volume for the checker: nothing is recovered and nothing is written.
    /// Returns which superblock copy was used and whether the volume was closed cleanly.
    pub fn open_for_check(media: Pm) -> Result<(Fs, SbSource, bool)> {
        let m = &*media;
        let (geo, src) = format::read_superblock(m)?;
        let clean = m.load_u64(MOUNT_STATE_OFF)? == STATE_CLEAN;
        let parts = parts::build(&media, &geo, Opening::Inspect)?;
        let inodes = InodeTable::new(geo);
        let root = Handle {
            ino: ROOT_INO,
            generation: inodes.load(m, ROOT_INO, field::STATE)? as u32,
        };
        let fs = Fs::assemble(media, geo, parts, inodes, root, LoadMode::Clean, true);
        Ok((fs, src, clean))
    }

    /// Opens `media` as a data-only client of a HashFS pool that another process owns: no
    /// recovery, no allocator, nothing written but file data and logs (see
    /// [`Volume::attach`](crate::Volume::attach)).
    pub fn attach(media: Pm) -> Result<Fs> {
        let m = &*media;
        let (geo, _) = format::read_superblock(m)?;
        if geo.mapping != MappingKind::HashFs {
            return Err(Error::Unsupported(
                "attaching to a volume whose mapping structure is not HashFS",
            ));
        }
        if geo.version < format::FORMAT_VERSION {
            return Err(Error::Unsupported(
                "attaching to a volume of an older format (its owner runs an older build)",
            ));
        }
        // A volume whose owner died awaits the recovery of the next read-write mount (its
        // journal may hold a transaction to roll back, its logs repairs): a client works on
        // it only beside a live owner. A read-only mount of it recovers it in memory and
        // leaves the pool as it was, which a client must not take for the volume.
        if m.load_u64(MOUNT_STATE_OFF)? != STATE_CLEAN && !format::owner_runs(m)? {
            return Err(Error::NeedsRecovery);
        }
        let parts = parts::build(&media, &geo, Opening::Open)?;
        let inodes = InodeTable::new(geo);
        let root = Handle {
            ino: ROOT_INO,
            generation: inodes.load(m, ROOT_INO, field::STATE)? as u32,
        };
        let mut fs = Fs::assemble(media, geo, parts, inodes, root, LoadMode::Clean, false);
        fs.client = true;
        fs.clock.store(wall_ns(), Ordering::Relaxed);
        Ok(fs)
    }

    /// Steps 5 and 6 of the crash path (see the module documentation).
    fn recover(
        &self,
        live: &[LiveInode],
        cleanups: &[Cleanup],
        report: &mut MountReport,
    ) -> Result<()> {
        let m = self.m();
        let mut stats = RepairStats::default();
        for l in live.iter().filter(|l| l.kind == Kind::Dir) {
            // An earlier repair may have freed this directory (a half-done mkdir).
            if self.inodes.load(m, l.h.ino, field::STATE)? != l.h.live_state() {
                continue;
            }
            let (dir, s) = Dir::load(self, l.h, LoadMode::Repair)?;
            stats.undone_inserts += s.undone_inserts;
            stats.redone_removes += s.redone_removes;
            stats.dropped_entries += s.dropped_entries;
            stats.pages_added += s.pages_added;
            self.dirs
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(l.h.ino, Arc::new(dir));
        }
        report.undone_inserts = stats.undone_inserts;
        report.redone_removes = stats.redone_removes;
        report.dropped_entries = stats.dropped_entries;
        report.dir_pages_published = stats.pages_added;

        for &c in cleanups {
            self.run_cleanup(c)?;
            report.journal_cleanups += 1;
        }
        self.journal.reset(m)?;
        Ok(())
    }

    /// Runs the journal cleanup `c`: at mount for the slots a crash left armed, and in
    /// session when the operation that armed it fails before it is done.
    pub(crate) fn run_cleanup(&self, c: Cleanup) -> Result<()> {
        let m = self.m();
        match c {
            Cleanup::Trim { inode, upto } => {
                if self.inodes.load(m, inode.ino, field::STATE)? == inode.live_state() {
                    let size = self.inodes.load(m, inode.ino, field::SIZE)?;
                    let from = size.div_ceil(BLOCK_SIZE);
                    if from < upto {
                        let f = self.map.open_file(self.file_id(inode.ino))?;
                        self.map.remove(&f, from, upto - from)?;
                    }
                }
            }
            Cleanup::PunchIf {
                inode,
                from,
                len,
                edge,
                pblk,
            } => self.finish_punch(inode, from, len, edge, pblk)?,
            Cleanup::ReleaseIfDead { inode } => {
                if self.inodes.load(m, inode.ino, field::STATE)? & LIVE == 0 {
                    let f = self.map.open_file(self.file_id(inode.ino))?;
                    self.map.remove_file(&f)?;
                }
            }
        }
        Ok(())
    }

    /// Frees the orphans among `live`: inodes without links. At mount nothing has a file open,
    /// so they are garbage whether the volume was closed cleanly or not: open-but-unlinked
    /// files of a crashed run, removals that zeroed the link count before a crash, and files
    /// unlinked while another process pinned them (a data-only client's open file or mapping),
    /// which the owner's last close had to leave.
    fn free_orphans(&self, live: &[LiveInode], report: &mut MountReport) -> Result<()> {
        let mut orphans = Vec::new();
        for l in live {
            if l.h.ino == ROOT_INO {
                continue;
            }
            let rec = self.inodes.read(self.m(), l.h.ino)?;
            if rec.state == l.h.live_state() && rec.nlink == 0 {
                orphans.push(l.h);
            }
        }
        self.free_whole(&orphans)?;
        report.orphans_freed += orphans.len() as u32;
        Ok(())
    }

    /// Frees the inodes `hs` ([`free_inode`](Fs::free_inode)) with every block they map: those
    /// of an orphan may lie anywhere in its logical range (past its end and its mapped end
    /// too: a free that a crash cut short zeroed that word first). On the hashed structures
    /// freeing one whole is a pass over the table (200 orphans of a 1 GiB pool took 1.7 s on
    /// the cuckoo table), so they share one: on the cuckoo table a pass finds the runs of
    /// all, and each is freed by removing those alone; on HashFS they are freed as one batch
    /// ([`Release::Batch`]).
    pub(crate) fn free_whole(&self, hs: &[Handle]) -> Result<()> {
        let mut runs: FastMap<u64, Vec<Run>> = FastMap::default();
        let by_pass = hs.len() > 1 && self.map.kind() == MappingKind::Cuckoo && {
            let ids: HashSet<u64> = hs.iter().map(|h| u64::from(h.ino)).collect();
            self.map.visit_all(&mut |id, run| {
                if ids.contains(&id) {
                    runs.entry(id).or_default().push(run);
                }
            })?
        };
        for &h in hs {
            let release = if by_pass {
                Release::Runs(runs.get(&u64::from(h.ino)).map_or(&[][..], |r| &r[..]))
            } else {
                Release::Batch
            };
            self.free_inode(h, None, release)?;
        }
        self.release_deferred()
    }

    /// Makes every dead inode but those of `withheld` free for new files.
    fn rebuild_free_list(&self, withheld: &HashSet<u32>) -> Result<()> {
        let mut free = Vec::new();
        self.inodes.scan(self.m(), |ino, r| {
            if ino > ROOT_INO && !r.is_live() && !withheld.contains(&ino) {
                free.push(ino);
            }
            Ok(())
        })?;
        self.inodes.set_free(free);
        Ok(())
    }

    /// The DRAM state of directory `h`, loading it on first use.
    pub fn dir(&self, h: Handle) -> Result<Arc<Dir>> {
        if let Some(d) = self
            .dirs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&h.ino)
            && d.h == h
        {
            return Ok(d.clone());
        }
        let (d, _) = Dir::load(self, h, self.dir_mode)?;
        let mut w = self.dirs.write().unwrap_or_else(|e| e.into_inner());
        match w.get(&h.ino) {
            Some(e) if e.h == h => Ok(e.clone()),
            _ => {
                let d = Arc::new(d);
                w.insert(h.ino, d.clone());
                Ok(d)
            }
        }
    }

    /// Forgets the DRAM state of a removed directory.
    pub fn forget_dir(&self, ino: u32) {
        self.dirs
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ino);
    }

    /// The root directory.
    pub fn root_dir(&self) -> Result<Arc<Dir>> {
        if let Some(d) = self.root_dir.get() {
            return Ok(d.clone());
        }
        let d = self.dir(self.root)?;
        Ok(self.root_dir.get_or_init(|| d).clone())
    }

    /// Counts an open handle of `ino`.
    pub fn open_inc(&self, ino: u32) {
        self.opens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(ino)
            .or_insert((0, false))
            .0 += 1;
    }

    /// Drops an open handle of `ino`; returns how many remain.
    pub fn open_dec(&self, ino: u32) -> u32 {
        self.release_open(ino).0
    }

    /// Drops an open handle of `ino`; returns how many remain and whether the inode lost its
    /// last link while open (the last close must free it).
    pub fn release_open(&self, ino: u32) -> (u32, bool) {
        let mut o = self.opens.lock().unwrap_or_else(|e| e.into_inner());
        match o.get_mut(&ino) {
            Some((n, orphan)) if *n > 1 => {
                *n -= 1;
                (*n, *orphan)
            }
            Some(&mut (_, orphan)) => {
                o.remove(&ino);
                (0, orphan)
            }
            None => (0, false),
        }
    }

    /// Whether `ino` has open handles.
    pub fn is_open(&self, ino: u32) -> bool {
        self.opens
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&ino)
    }

    /// Frees incarnation `h`, which just lost its last link, unless it is open: then it
    /// becomes an orphan that its last close frees. Call with the inode's lock held.
    pub fn drop_unlinked(&self, h: Handle, map: Option<&MapFile>) -> Result<()> {
        {
            let mut o = self.opens.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(e) = o.get_mut(&h.ino) {
                e.1 = true;
                return Ok(());
            }
        }
        self.free_inode(h, map, Release::Bounded)
    }

    /// Clears the pins on the log of regular file `ino` and its mapped-mode count, if only
    /// processes that died can have left them, after this process let go of its own handles
    /// of the log. A program killed under the preload library leaves its pins on the files it
    /// had open, and its mappings' shares of mapped mode on the files it mapped; without this,
    /// the blocks a later writer's compactions retire, and the file once deleted, stayed
    /// allocated, and a mapped file stayed in mapped mode (its writes not atomic), until the
    /// next mount. They are taken to be dead when
    /// - this process holds none ([`pins_here`](pmfs_core::log::pins_here)) but the handle
    ///   this takes, and no share of mapped mode for a write in progress;
    /// - no other open file description of the pool holds a client lock (every data-only
    ///   client takes one when it attaches,
    ///   [`lock_as_client`](pmfs_core::pm::PmRegion::lock_as_client)), and no other process
    ///   whose mappings can be read maps the pool: a live client whose pin is in the head word
    ///   still holds its lock, unless its program closed that descriptor, and still maps the
    ///   pool then, and a live mapper maps the pool as long as its pin lasts.
    ///
    /// Only a client that is not a preload client (which reaches a file through a kernel
    /// descriptor, and maps it through one first, which keeps the file open here while it is
    /// mapped), whose program closed the pool descriptor and hides its mappings (not
    /// dumpable), escapes all three.
    ///
    /// The look and the clearing run with a handle of the log open, which the clearing keeps
    /// (its pin stays, the others go, by a CAS from the head word read before the look: a pin
    /// taken since, by a client that attached after the look or a thread of this process,
    /// makes it fail, and everything stays), and the log is digested before the handle closes.
    /// A log without pins is taken to be digested (see [`Fs::live_size`]), and the pins were
    /// what kept the writes the dead processes committed and never digested in view. The word
    /// gets the orphans flag too: the next handle alone with the log sweeps the blocks the
    /// dead processes' compactions retired. The count goes to zero by a CAS from the value
    /// read after the pins were cleared, and only if this process holds no other pin and no
    /// share then: a mapper or writer of this process counts itself before it raises the
    /// count, and one of another process would have had to attach after the look, and so
    /// pin the log after the clearing, which the value read then would include.
    ///
    /// Returns the head word left once the handle closed, if the pins were cleared and none
    /// was taken since.
    pub(crate) fn clear_dead_pins(
        &self,
        ino: u32,
        f: &MapFile,
    ) -> Result<Option<pmfs_core::log::HeadWord>> {
        let m = self.m();
        let root = self.inodes.field(ino, field::LOG);
        // Nothing to look at while another client is attached (the common case): spare the
        // handle and the scan of other processes' mappings.
        if pmfs_core::log::pins_here(root) != 0 || m.client_locks_elsewhere() != Some(false) {
            return Ok(None);
        }
        let shared = data::Shared::new(self.open_log(ino)?, 0, 0);
        let cleared = self.clear_dead_pins_holding(ino, root, f, &shared);
        let closed = shared.log.close();
        let cleared = cleared?;
        closed?;
        if !cleared {
            return Ok(None);
        }
        let hw = pmfs_core::log::HeadWord(m.load_u64(root)?);
        Ok((hw.pins() == 0).then_some(hw))
    }

    /// [`clear_dead_pins`](Fs::clear_dead_pins) while this process holds `s`, its handle of
    /// the log at `root`; returns whether it cleared the pins.
    fn clear_dead_pins_holding(
        &self,
        ino: u32,
        root: PmOff,
        f: &MapFile,
        s: &data::Shared,
    ) -> Result<bool> {
        let m = self.m();
        let hw = pmfs_core::log::HeadWord(m.load_u64(root)?);
        let others_here = || pmfs_core::log::pins_here(root) > 1 || data::map_holds_here();
        if others_here()
            || m.client_locks_elsewhere() != Some(false)
            || m.file_id()
                .is_none_or(pmfs_core::pm::procs::mapped_elsewhere)
        {
            return Ok(false);
        }
        let cleared = match (hw.opens(), hw.map_pins()) {
            (1, 0) => hw,
            _ => hw.with_opens(1).with_map_pins(0).with_orphans(),
        };
        if m.cas_u64(root, hw.0, cleared.0)?.is_err() {
            return Ok(false);
        }
        let maps = self.inodes.field(ino, field::MAPS);
        let count = m.load_u64(maps)?;
        if count != 0 && !others_here() {
            // Like every change of the count, not flushed: mount resets it.
            let _ = m.cas_u64(maps, count, 0)?;
        }
        self.digest(ino, s, f)?;
        Ok(true)
    }

    /// Notes incarnation `h` for [`collect_dead_pins`](Fs::collect_dead_pins): the pins on its
    /// log kept the owner from clearing them at its last close, or from freeing it.
    pub(crate) fn pend_dead_pins(&self, h: Handle) {
        if !self.client {
            self.dead_pins_pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(h.ino, h);
        }
    }

    /// Clears the pins the files noted by [`pend_dead_pins`](Fs::pend_dead_pins) still have
    /// once no data client is attached any more (see
    /// [`clear_dead_pins`](Fs::clear_dead_pins)), and frees those of them that were unlinked
    /// once their log has no pin (a client that kept one past its unlink closed it) or only
    /// dead ones: a program killed while another one ran under the library left pins that
    /// nothing else looks at again before the next mount. Unlinked files this process has
    /// open again are left to their last close. Returns how many files it cleared or freed.
    /// Cheap while nothing is noted or a client is attached.
    pub fn collect_dead_pins(&self) -> Result<usize> {
        let pending: Vec<Handle> = {
            let p = self
                .dead_pins_pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if p.is_empty() {
                return Ok(0);
            }
            p.values().copied().collect()
        };
        let mut cleared = 0;
        for h in pending {
            let settled = {
                let _il = self.ilock(h.ino).write().unwrap_or_else(|e| e.into_inner());
                self.collect_dead_pins_of(h)?
            };
            match settled {
                Collected::Cleared | Collected::Nothing => {
                    cleared += usize::from(matches!(settled, Collected::Cleared));
                    let mut p = self
                        .dead_pins_pending
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    if p.get(&h.ino) == Some(&h) {
                        p.remove(&h.ino);
                    }
                }
                Collected::Kept => {}
            }
        }
        Ok(cleared)
    }

    /// [`collect_dead_pins`](Fs::collect_dead_pins) for incarnation `h`, under its inode lock.
    fn collect_dead_pins_of(&self, h: Handle) -> Result<Collected> {
        let m = self.m();
        let rec = self.inodes.read(m, h.ino)?;
        if rec.state != h.live_state() || rec.kind() != Some(Kind::File) {
            return Ok(Collected::Nothing);
        }
        let root = self.inodes.field(h.ino, field::LOG);
        let hw = pmfs_core::log::HeadWord(m.load_u64(root)?);
        // No log: nothing pins it (an unlinked file whose log words are cleared is freed, or
        // waits in the batch of deferred releases).
        if hw.head().is_none() {
            return Ok(Collected::Nothing);
        }
        let pinned = self.held_by_others(h.ino, hw)?;
        if pinned && m.client_locks_elsewhere() != Some(false) {
            return Ok(Collected::Kept);
        }
        if rec.nlink == 0 {
            if self.is_open(h.ino) {
                return Ok(Collected::Nothing);
            }
            // Freed (its log words cleared first) unless a live process can have it open
            // (then noted again).
            self.free_inode(h, None, Release::Bounded)?;
            return Ok(match m.load_u64(root)? {
                0 => Collected::Cleared,
                _ => Collected::Kept,
            });
        }
        if !pinned {
            return Ok(Collected::Nothing);
        }
        let f = self.map.open_file(self.file_id(h.ino))?;
        if self.clear_dead_pins(h.ino, &f)?.is_none() {
            return Ok(Collected::Kept);
        }
        Ok(Collected::Cleared)
    }

    /// Frees the blocks of incarnation `h` (what `release` says) and makes its record free. A
    /// no-op if `h` is not live.
    ///
    /// A regular file's log is digested first; if another process still has the log open
    /// (its pin count in the head word), nothing is freed: the inode stays an orphan, which
    /// the owner's next look frees once the pins are gone
    /// ([`collect_dead_pins`](Fs::collect_dead_pins)), or else the next mount, and whoever
    /// holds the log digests it. Pins that only dead processes can have left are cleared
    /// instead, and the log digested then ([`clear_dead_pins`](Fs::clear_dead_pins)); a
    /// handle opened in this process after the look keeps it too.
    pub fn free_inode(&self, h: Handle, map: Option<&MapFile>, release: Release<'_>) -> Result<()> {
        let m = self.m();
        let rec = self.inodes.read(m, h.ino)?;
        if rec.state != h.live_state() {
            return Ok(());
        }
        let owned;
        let f = match map {
            Some(f) => f,
            None => {
                owned = self.map.open_file(self.file_id(h.ino))?;
                &owned
            }
        };
        let root = self.inodes.field(h.ino, field::LOG);
        let has_log = rec.kind() == Some(Kind::File) && m.load_u64(root)? != 0;
        let mut log_blocks: Vec<Extent> = Vec::new();
        let mut held = 0;
        if has_log {
            let mut hw = pmfs_core::log::HeadWord(m.load_u64(root)?);
            // A pinned log is digested by the clearing below, if it clears.
            if hw.pins() == 0 {
                let shared = data::Shared::new(self.open_log(h.ino)?, 0, 0);
                let digested = self.digest(h.ino, &shared, f);
                shared.log.close()?;
                digested?;
                hw = pmfs_core::log::HeadWord(m.load_u64(root)?);
            }
            if hw.pins() != 0 {
                match self.clear_dead_pins(h.ino, f)? {
                    Some(cleared) => hw = cleared,
                    None => {
                        self.pend_dead_pins(h);
                        return Ok(());
                    }
                }
            }
            if matches!(self.stage, Stager::Alloc(_)) {
                pmfs_core::log::owned_blocks(m, root, &mut |b| log_blocks.push(Extent::new(b, 1)))?;
            }
            held = self.mapped_bound(h.ino)?;
            // The log words go first: a crash after this leaks the log blocks until the
            // allocator is rebuilt (HashFS: remove_file below frees them), never a log whose
            // blocks were reused. The head word by a CAS from the unpinned word: a handle
            // opened meanwhile (a thread of this process reading the log) keeps the file.
            if m.cas_u64(root, hw.0, 0)?.is_err() {
                return Ok(());
            }
            m.flush(root, 8)?;
            for w in [field::DIGEST, field::MAPPED_END] {
                self.inodes.store(m, h.ino, w, 0)?;
            }
            m.fence();
        }
        if let Stager::Hash(t) = &self.stage {
            match release {
                Release::Batch => {
                    if rec.kind() == Some(Kind::Dir) {
                        self.forget_dir(h.ino);
                    }
                    return self.defer_release(h, held, None);
                }
                Release::Bounded if has_log => {
                    return self.defer_release(h, held, Some(t.data().len));
                }
                _ => {}
            }
        }
        // The blocks of a file with a log lie below its mapped bound; those of other inodes
        // below their end.
        let bound = if has_log {
            held
        } else {
            rec.size.div_ceil(BLOCK_SIZE)
        };
        match release {
            Release::Runs(runs) => {
                for r in runs {
                    self.map.remove(f, r.lblk, r.len)?;
                }
            }
            Release::Bounded
                if matches!(self.map.kind(), MappingKind::HashFs | MappingKind::Cuckoo)
                    && bound <= MAX_FILE_SIZE / BLOCK_SIZE =>
            {
                // A global table has no per-file structure to free: removing the blocks below
                // the bound and the extended-attribute blocks avoids a pass over the table.
                if bound > 0 {
                    self.map.remove(f, 0, bound)?;
                }
                self.map
                    .remove(f, crate::xattr::XATTR_LBLK, crate::xattr::XATTR_BLOCKS)?;
            }
            _ => self.map.remove_file(f)?,
        }
        if let Some(a) = &self.alloc {
            for e in log_blocks {
                a.free(e)?;
            }
        }
        self.inodes
            .store(m, h.ino, field::STATE, u64::from(h.generation))?;
        m.fence();
        if rec.kind() == Some(Kind::Dir) {
            self.forget_dir(h.ino);
        }
        self.inodes.release(h.ino);
        Ok(())
    }

    /// Frees HashFS file `h`, whose log words are cleared, in a later batch. Its blocks lie
    /// anywhere in the table, and not only those its size, its mapped end and its log chain
    /// name: a compaction that ran while other processes had the log open leaves the blocks it
    /// retired to whoever frees the file. Only a scan of the whole table finds them all, so
    /// the files are freed a batch at a time by one scan: once the batch has
    /// [`release_batch_len`] files, a number growing with the table ([`SLOTS_PER_RELEASE`]:
    /// with a batch of 64 files, unlinking the rollback journal of each sqlite3 transaction
    /// cost 94 µs on a 1 GiB pool, and more in proportion on larger ones), or once its files
    /// hold a [`DEFERRED_SHARE`] of the table's `slots`
    /// ([`release_deferred`](Fs::release_deferred)); also when a write finds no space, when
    /// free space is asked for, and at unmount. Until then the inode stays live without a
    /// link, an orphan: nobody can open it, its number is not reused, and after a crash the
    /// mount frees it as it frees every orphan. `held`: the blocks below `h`'s
    /// [mapped bound](Fs::mapped_bound) (its log blocks aside). Without `slots` the batch is
    /// left to the caller's [`release_deferred`](Fs::release_deferred), however large.
    fn defer_release(&self, h: Handle, held: u64, slots: Option<u64>) -> Result<()> {
        let mut pending = self.releasing.lock().unwrap_or_else(|e| e.into_inner());
        pending.files.push(h);
        pending.blocks = pending.blocks.saturating_add(held);
        self.releasing_any.store(true, Ordering::Release);
        if let Some(slots) = slots
            && (pending.files.len() as u64 >= release_batch_len(slots)
                || pending.blocks >= slots / DEFERRED_SHARE)
        {
            self.release_batch(&mut pending, false)?;
        }
        Ok(())
    }

    /// A free inode number for a new file, after freeing the deferred files when none is left
    /// ([`defer_release`](Fs::defer_release) keeps their numbers until then).
    pub(crate) fn alloc_inode(&self) -> Result<Handle> {
        match self.inodes.alloc(self.m()) {
            Err(Error::NoSpace) => {
                self.release_deferred()?;
                self.inodes.alloc(self.m())
            }
            r => r,
        }
    }

    /// Frees the files whose release was deferred ([`defer_release`](Fs::defer_release)).
    pub fn release_deferred(&self) -> Result<()> {
        let mut pending = self.releasing.lock().unwrap_or_else(|e| e.into_inner());
        self.release_batch(&mut pending, false).map(drop)
    }

    /// Frees the deferred files, if any. With `count`, the free blocks are counted in the
    /// same pass over the HashFS table, and returned.
    fn release_batch(&self, pending: &mut Deferred, count: bool) -> Result<Option<u64>> {
        let Stager::Hash(t) = &self.stage else {
            return Ok(None);
        };
        if pending.files.is_empty() {
            return Ok(None);
        }
        let inos: HashSet<u64> = pending.files.iter().map(|h| u64::from(h.ino)).collect();
        let free = if count {
            Some(t.remove_files_and_count(&inos)?)
        } else {
            t.remove_files(&inos)?;
            None
        };
        let m = self.m();
        for h in &pending.files {
            self.inodes
                .store(m, h.ino, field::STATE, u64::from(h.generation))?;
        }
        m.fence();
        for h in pending.files.drain(..) {
            self.inodes.release(h.ino);
        }
        pending.blocks = 0;
        self.releasing_any.store(false, Ordering::Release);
        Ok(free)
    }

    /// Whether incarnation `h` is freed already, though its release is deferred
    /// ([`defer_release`](Fs::defer_release)): nothing may reach it by number any more.
    pub(crate) fn is_released(&self, h: Handle) -> bool {
        self.releasing_any.load(Ordering::Acquire)
            && self
                .releasing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .files
                .contains(&h)
    }

    /// Recovery of a hole punch whose edge copy committed but whose unmapping may not have:
    /// commits the unmapping (again: unmapping is idempotent) and digests it.
    fn finish_punch(&self, inode: Handle, from: u64, len: u64, edge: u64, pblk: u64) -> Result<()> {
        let m = self.m();
        if self.inodes.load(m, inode.ino, field::STATE)? != inode.live_state()
            || m.load_u64(self.inodes.field(inode.ino, field::LOG))? == 0
        {
            return Ok(());
        }
        let f = self.map.open_file(self.file_id(inode.ino))?;
        let mut runs = Vec::with_capacity(1);
        self.map.lookup(&f, edge, 1, &mut runs)?;
        if runs.first().map(|r| r.pblk.0 + (edge - r.lblk)) != Some(pblk) {
            return Ok(());
        }
        let log = self.open_log(inode.ino)?;
        let shared = data::Shared::new(log, 0, 0);
        let done = shared
            .log
            .prepare(&pmfs_core::log::Entry::Punch { lblk: from, len })
            .and_then(|p| p.commit())
            .map_err(Error::from)
            .and_then(|_| self.digest(inode.ino, &shared, &f));
        shared.log.close()?;
        done
    }

    /// Calls `visit` with the blocks the mappings of inodes `inos` own: in one pass over the
    /// table on the structures that keep all files in one
    /// ([`visit_all`](pmfs_core::traits::FileMapping::visit_all)), by a walk of each file's
    /// structure on the others. The pass also shows `others` each inode number not in `inos`
    /// that the table maps blocks to, once per run. For exclusive use (mount, fsck).
    pub(crate) fn owned_by(
        &self,
        inos: &[u32],
        visit: &mut dyn FnMut(Extent),
        others: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let wanted: HashSet<u64> = inos.iter().map(|&i| u64::from(i)).collect();
        let global = self.map.visit_all(&mut |ino, r| {
            if wanted.contains(&ino) {
                visit(r.extent());
            } else {
                others(ino);
            }
        })?;
        if !global {
            for &ino in inos {
                let f = self.map.open_file(self.file_id(ino))?;
                self.map.owned_blocks(&f, visit)?;
            }
        }
        Ok(())
    }

    /// Adds the blocks inode `ino`'s log holds to `used`: its own blocks and the data blocks
    /// of the entries not digested yet (mount, before the allocator rebuild).
    fn log_used(&self, ino: u32, used: &mut UsedBlocks) -> Result<()> {
        Fs::log_blocks_used(self.m(), self.inodes.field(ino, field::LOG), used)?;
        let log = self.open_log(ino)?;
        let from = log.digested(self.inodes.field(ino, field::DIGEST))?;
        let collected = (|| -> Result<()> {
            for item in log.iter_from_lsn(from)? {
                if let (_, pmfs_core::log::Entry::Write { runs, .. }) = item? {
                    for r in runs.iter() {
                        used.mark(Extent::new(r.pblk, r.len))?;
                    }
                }
            }
            Ok(())
        })();
        log.close()?;
        collected
    }

    /// Marks the blocks of the log whose root word is at `root`.
    fn log_blocks_used(m: &dyn Media, root: PmOff, used: &mut UsedBlocks) -> Result<()> {
        let mut blocks = Vec::new();
        pmfs_core::log::owned_blocks(m, root, &mut |b| blocks.push(b))?;
        for b in blocks {
            used.mark(Extent::new(b, 1))?;
        }
        Ok(())
    }

    /// Digests inode `ino`'s log and drops its applied blocks (mount).
    fn digest_at_mount(&self, ino: u32) -> Result<()> {
        let f = self.map.open_file(self.file_id(ino))?;
        let log = self.open_log(ino)?;
        let shared = data::Shared::new(log, 0, 0);
        let done = self.digest(ino, &shared, &f).and_then(|()| {
            shared
                .log
                .compact_applied(self.inodes.field(ino, field::DIGEST))
                .map(drop)
                .map_err(Error::from)
        });
        shared.log.close()?;
        done
    }

    /// Free data blocks, once the deferred files are freed (on a volume that takes changes).
    pub fn free_blocks(&self) -> Result<u64> {
        if self.writable().is_ok() {
            let mut pending = self.releasing.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(free) = self.release_batch(&mut pending, true)? {
                return Ok(free);
            }
        }
        (self.free_count)()
    }

    /// Whether the volume takes changes: not when mounted read-only (`EROFS`), nor once a
    /// failed store left work that only recovery does (`EIO`): a change after it could write
    /// over a word that recovery restores, or reuse a journal slot that recovery needs.
    pub(crate) fn writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if self.journal.left_to_recovery() {
            return Err(Error::LeftForRecovery("a journal slot"));
        }
        if self.map.recovery_owed() {
            return Err(Error::LeftForRecovery("mapping work"));
        }
        if let Some(what) = self.left.get() {
            return Err(Error::LeftForRecovery(what));
        }
        Ok(())
    }

    /// `r`, after marking the session as left to recovery when it is an error: for the steps
    /// of a log-free operation after its first change reached the media, whose failure
    /// leaves a half-done operation that only the next mount's repair resolves.
    pub(crate) fn or_leave<T>(&self, what: &'static str, r: Result<T>) -> Result<T> {
        if r.is_err() {
            let _ = self.left.set(what);
        }
        r
    }

    /// Writes back DRAM-only state (directory modification times).
    pub fn sync_metadata(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        let m = self.m();
        let dirs: Vec<Arc<Dir>> = self
            .dirs
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for d in dirs {
            let mut inner = d.inner.write().unwrap_or_else(|e| e.into_inner());
            if inner.mtime_dirty && !inner.dead {
                self.inodes
                    .store(m, d.h.ino, field::MTIME, inner.mtime as u64)?;
                inner.mtime_dirty = false;
            }
        }
        m.fence();
        Ok(())
    }

    /// Clean unmount: write back DRAM state and mark the volume clean. Idempotent. A volume
    /// left to recovery ([`writable`](Fs::writable)) stays unclean, as a crash would leave it.
    pub fn shutdown(&self) -> Result<()> {
        if self.read_only || self.client || self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let m = self.m();
        if let Err(e) = self.writable() {
            // Left to recovery: the volume stays as a crash now would leave it.
            format::clear_owner(m)?;
            m.fence();
            return Err(e);
        }
        self.release_deferred()?;
        // Batch removals on a table with room reclaim each freed slot online, which keeps the
        // tombstones whose run ends in a live entry: the unmount empties those no walk needs,
        // so that the next mount's purge finds none.
        if let Stager::Hash(t) = &self.stage {
            t.reclaim_all()?;
        }
        self.sync_metadata()?;
        if let Some(a) = &self.alloc {
            a.flush_caches();
            a.sync()?;
        }
        format::clear_owner(m)?;
        m.fence();
        // A journal slot an operation could not retire or mapping work a failed store left
        // is for recovery to finish: the volume stays unclean for the next mount.
        self.writable()?;
        if self.journal.first_busy(m)?.is_some() {
            return Err(Error::LeftForRecovery("a journal slot"));
        }
        m.store_u64(MOUNT_STATE_OFF, STATE_CLEAN)?;
        m.persist(MOUNT_STATE_OFF, 8)?;
        Ok(())
    }
}

/// What [`Fs::free_inode`] releases of the blocks the mapping holds for an inode.
#[derive(Clone, Copy, Debug)]
pub enum Release<'a> {
    /// The blocks below the mapped bound of a file with a log and below the end of other
    /// inodes, and the extended-attribute blocks: on the hashed structures, where freeing
    /// everything is a pass over the table, what a file that was never cut short by a crash
    /// maps. HashFS files with a log go to the next batch release instead, which scans.
    Bounded,
    /// Everything (recovery and repair, where blocks past the end of file may exist).
    Everything,
    /// These runs, which a pass over the table found to be all the inode maps.
    Runs(&'a [Run]),
    /// Everything, and on HashFS in a batch: the inode joins the files whose release is
    /// deferred ([`defer_release`](Fs::defer_release)), and its caller frees them all with
    /// one pass over the table ([`release_deferred`](Fs::release_deferred)). Elsewhere as
    /// [`Everything`](Release::Everything).
    Batch,
}

/// What [`Fs::collect_dead_pins`] did with one file.
enum Collected {
    /// Its pins were cleared (and it was freed if unlinked).
    Cleared,
    /// It needs nothing any more, or is left to the owner's last close of it.
    Nothing,
    /// Its pins may still be a live process's: looked at again next time.
    Kept,
}

impl Drop for Fs {
    fn drop(&mut self) {
        // Errors cannot be reported from drop; the volume then stays marked dirty and the
        // next mount recovers, which is always safe.
        let _ = self.shutdown();
    }
}
