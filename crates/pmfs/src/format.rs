//! The volume format: superblock (with a backup copy), geometry of the regions, the mount
//! state word and mkfs.
//!
//! ```text
//! block 0            superblock (crc32c) + mount-state word at byte 1024
//! block 1            backup superblock (same bytes as the primary's first 256)
//! journal            `journal_slots` blocks, one per-CPU undo-journal slot each
//! inode table        `inode_count` records of 128 bytes
//! allocator region   persistent state of the block allocator (empty for volatile ones)
//! mapping region     global state of the file-mapping structure (tables of cuckoo/HashFS)
//! data region        starts on a 2 MiB boundary, runs to the end of the volume
//! ```
//!
//! Everything in the superblock is fixed at mkfs. The only word of block 0 that changes while
//! mounted is the mount-state word (clean / dirty), stored outside the checksummed part so one
//! atomic store flips it.

use pmfs_core::layout::{BLOCK_SIZE, BlockNo, HUGE_PAGE, PmOff, crc32c};
use pmfs_core::pm::{Media, MediaExt};
use pmfs_core::traits::MappingKind;

use crate::codec::{get32, get64, put32, put64};
use crate::error::{Error, Result};
use crate::inode::INODE_SIZE;

/// "PMFS" "VOL1" as a little-endian word.
pub(crate) const SB_MAGIC: u64 = u64::from_le_bytes(*b"PMFSVOL1");
/// Format version written by this build. Version 2 added special files (FIFOs, sockets,
/// device nodes with their device number) and extended attributes, which version-1 code
/// would read as damaged inodes and blocks past end of file. Version 3 added the log's
/// `GROW` entries, which version-2 code would read as damaged logs. Version 4 added the
/// HashFS slot state *purging* (a tombstone being emptied while the volume is in use), which
/// version-3 code would read as a damaged slot after a crash. Version 5 formats HashFS
/// tables that hash clusters of eight blocks (table format version 2), which version-4 code
/// refuses to open; a version-4 volume keeps its table's per-block hash when upgraded.
/// Version 6 gave a log's head word a count of mapping pins and two flags (bits 39..48: see
/// `pmfs_core::log::HeadWord`), which version-5 code would read as part of a damaged head
/// block number. Version 7 keeps the free-slot counts of HashFS tables by chunk (the chunk
/// words of `pmfs_mapping::hashfs`), which version-6 code, zeroing only the table's one
/// free-count word, would leave stale for a version-7 process beside it.
pub const FORMAT_VERSION: u32 = 7;
/// The oldest version this build mounts; mounting one for writing upgrades it to
/// [`FORMAT_VERSION`] (everything it holds reads the same).
pub(crate) const OLDEST_VERSION: u32 = 2;
/// The version from which every regular file's `MAPPED_END` word bounds the logical blocks
/// its mapping maps, so that truncations, `SEEK_DATA` and block counts need not look past
/// it however large the file's size. Version-2 volumes made before the copy-on-write data
/// path map blocks below the size past that word: a mount for writing raises the word to
/// the size before it upgrades them, and a read-only mount takes the size as the bound.
pub(crate) const MAPPED_END_VERSION: u32 = 3;
/// Offset of the mount-state word in block 0.
pub(crate) const MOUNT_STATE_OFF: PmOff = PmOff(1024);
/// Offset in block 0 of the owner's rendezvous word: a random word stored at each read-write
/// mount, which names the owner's socket for data clients ([`crate::kernel_pages`]), so that
/// only processes that may read the pool know it.
pub(crate) const RENDEZVOUS_OFF: PmOff = PmOff(1032);
/// Offset in block 0 of the owner record: the process id (a word) and the start time (the
/// next word, `/proc/<pid>/stat` field 22) of the process that mounted the volume read-write,
/// stored at each such mount and cleared when it closes the volume cleanly
/// ([`recorded_owner`]).
pub(crate) const OWNER_OFF: PmOff = PmOff(1040);
/// Mount-state value after a clean close.
pub(crate) const STATE_CLEAN: u64 = u64::from_le_bytes(*b"CLEAN\0\0\0");
/// Mount-state value while mounted read-write (or after a crash).
pub(crate) const STATE_DIRTY: u64 = u64::from_le_bytes(*b"DIRTY\0\0\0");
/// Block of the backup superblock.
const BACKUP_BLOCK: BlockNo = BlockNo(1);
/// Blocks per 2 MiB huge page.
const HUGE_BLOCKS: u64 = HUGE_PAGE / BLOCK_SIZE;
/// The root directory's inode number.
pub(crate) const ROOT_INO: u32 = 1;

/// The block allocator a volume uses, chosen at mkfs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllocatorKind {
    /// The simplest correct allocator: a volatile first-fit map of free extents, rebuilt at
    /// every mount.
    Simple,
    /// The baseline free-extent allocator over a persistent bitmap (the allocator the HashFS
    /// paper compares against).
    Baseline,
    /// The CFFS contiguity-first greedy buddy allocator: volatile, rebuilt at every mount.
    Cffs,
}

impl AllocatorKind {
    pub(crate) fn code(self) -> u32 {
        match self {
            AllocatorKind::Simple => 1,
            AllocatorKind::Baseline => 2,
            AllocatorKind::Cffs => 3,
        }
    }

    fn from_code(c: u32) -> Option<Self> {
        match c {
            1 => Some(AllocatorKind::Simple),
            2 => Some(AllocatorKind::Baseline),
            3 => Some(AllocatorKind::Cffs),
            _ => None,
        }
    }
}

pub(crate) fn mapping_code(k: MappingKind) -> u32 {
    match k {
        MappingKind::Extent => 1,
        MappingKind::Radix => 2,
        MappingKind::Cuckoo => 3,
        MappingKind::HashFs => 4,
    }
}

fn mapping_from_code(c: u32) -> Option<MappingKind> {
    match c {
        1 => Some(MappingKind::Extent),
        2 => Some(MappingKind::Radix),
        3 => Some(MappingKind::Cuckoo),
        4 => Some(MappingKind::HashFs),
        _ => None,
    }
}

/// What mkfs builds: the mapping structure, the allocator and the sizes of the fixed regions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The file-mapping structure (HashFS paper §3).
    pub mapping: MappingKind,
    /// The block allocator (default [`AllocatorKind::Cffs`], as `pmfs mkfs`: files written
    /// side by side each stay in one run, where the baseline interleaves them).
    pub allocator: AllocatorKind,
    /// Number of inodes; `None` picks one inode per 4 blocks (at least 64).
    pub inodes: Option<u64>,
    /// Number of per-CPU journal slots (at least 1).
    pub journal_slots: u32,
    /// Size of the pool file [`Volume::create`](crate::Volume::create) makes, in bytes.
    pub size: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            mapping: MappingKind::Extent,
            allocator: AllocatorKind::Cffs,
            inodes: None,
            journal_slots: 16,
            size: 256 << 20,
        }
    }
}

impl Options {
    /// The default options with another mapping structure.
    pub fn with_mapping(mapping: MappingKind) -> Self {
        Self {
            mapping,
            ..Self::default()
        }
    }
}

/// Size of the superblock record (the first bytes of blocks 0 and 1).
pub(crate) const SB_SIZE: usize = 256;

/// Byte offsets of the superblock fields.
mod sb {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const BLOCK_SIZE: usize = 12;
    pub const MAPPING: usize = 16;
    pub const ALLOCATOR: usize = 20;
    pub const JOURNAL_SLOTS: usize = 24;
    pub const ROOT_INO: usize = 28;
    pub const TOTAL_BLOCKS: usize = 32;
    pub const JOURNAL_START: usize = 40;
    pub const INODE_START: usize = 48;
    pub const INODE_COUNT: usize = 56;
    pub const ALLOC_START: usize = 64;
    pub const ALLOC_BLOCKS: usize = 72;
    pub const MAP_START: usize = 80;
    pub const MAP_BLOCKS: usize = 88;
    pub const DATA_START: usize = 96;
    pub const DATA_BLOCKS: usize = 104;
    pub const VOLUME_ID: usize = 112;
    pub const CREATED_NS: usize = 120;
    /// 128..248 reserved (zero).
    pub const CRC: usize = 248;
}

const _: () = assert!(sb::CRC + 8 == SB_SIZE);

/// The decoded, validated geometry of a volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// The format version in the superblock.
    pub version: u32,
    pub mapping: MappingKind,
    pub allocator: AllocatorKind,
    pub total_blocks: u64,
    pub journal_start: BlockNo,
    pub journal_slots: u32,
    pub inode_start: BlockNo,
    pub inode_count: u64,
    pub alloc_start: BlockNo,
    pub alloc_blocks: u64,
    pub map_start: BlockNo,
    pub map_blocks: u64,
    pub data_start: BlockNo,
    pub data_blocks: u64,
    pub volume_id: u64,
    pub created_ns: i64,
}

fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

impl Geometry {
    /// Lays out a volume of `total_blocks` blocks. `meta_blocks` tells how many blocks the
    /// mapping structure needs for a data region of a given number of blocks.
    pub fn plan(
        opts: &Options,
        total_blocks: u64,
        alloc_blocks: impl Fn(u64) -> u64,
        map_blocks: impl Fn(u64) -> u64,
        now_ns: i64,
    ) -> Result<Geometry> {
        if opts.journal_slots == 0 || opts.journal_slots > 1024 {
            return Err(Error::InvalidArgument("journal_slots must be in 1..=1024"));
        }
        let journal_start = BlockNo(2);
        let inode_start = journal_start + u64::from(opts.journal_slots);
        let inode_count = opts
            .inodes
            .unwrap_or((total_blocks / 4).max(64))
            .clamp(2, u64::from(u32::MAX));
        let inode_blocks = div_ceil(inode_count * INODE_SIZE, BLOCK_SIZE);
        let alloc_start = inode_start + inode_blocks;
        // The data region can be at most this large; size the metadata regions for that.
        let upper = total_blocks.saturating_sub(alloc_start.0);
        let a_blocks = alloc_blocks(upper);
        let map_start = alloc_start + a_blocks;
        let m_blocks = map_blocks(upper);
        let meta_end = map_start.0 + m_blocks;
        let data_start = meta_end.div_ceil(HUGE_BLOCKS) * HUGE_BLOCKS;
        if data_start + HUGE_BLOCKS > total_blocks {
            return Err(Error::InvalidArgument(
                "volume too small for its metadata and one 2 MiB data group",
            ));
        }
        Ok(Geometry {
            version: FORMAT_VERSION,
            mapping: opts.mapping,
            allocator: opts.allocator,
            total_blocks,
            journal_start,
            journal_slots: opts.journal_slots,
            inode_start,
            inode_count,
            alloc_start,
            alloc_blocks: a_blocks,
            map_start,
            map_blocks: m_blocks,
            data_start: BlockNo(data_start),
            data_blocks: total_blocks - data_start,
            volume_id: now_ns as u64 ^ (u64::from(std::process::id()) << 40),
            created_ns: now_ns,
        })
    }

    fn encode(&self) -> [u8; SB_SIZE] {
        let mut b = [0u8; SB_SIZE];
        put64(&mut b, sb::MAGIC, SB_MAGIC);
        put32(&mut b, sb::VERSION, self.version);
        put32(&mut b, sb::BLOCK_SIZE, BLOCK_SIZE as u32);
        put32(&mut b, sb::MAPPING, mapping_code(self.mapping));
        put32(&mut b, sb::ALLOCATOR, self.allocator.code());
        put32(&mut b, sb::JOURNAL_SLOTS, self.journal_slots);
        put32(&mut b, sb::ROOT_INO, ROOT_INO);
        put64(&mut b, sb::TOTAL_BLOCKS, self.total_blocks);
        put64(&mut b, sb::JOURNAL_START, self.journal_start.0);
        put64(&mut b, sb::INODE_START, self.inode_start.0);
        put64(&mut b, sb::INODE_COUNT, self.inode_count);
        put64(&mut b, sb::ALLOC_START, self.alloc_start.0);
        put64(&mut b, sb::ALLOC_BLOCKS, self.alloc_blocks);
        put64(&mut b, sb::MAP_START, self.map_start.0);
        put64(&mut b, sb::MAP_BLOCKS, self.map_blocks);
        put64(&mut b, sb::DATA_START, self.data_start.0);
        put64(&mut b, sb::DATA_BLOCKS, self.data_blocks);
        put64(&mut b, sb::VOLUME_ID, self.volume_id);
        put64(&mut b, sb::CREATED_NS, self.created_ns as u64);
        let crc = crc32c(&b[..sb::CRC]);
        put32(&mut b, sb::CRC, crc);
        b
    }

    fn decode(b: &[u8; SB_SIZE], media_blocks: u64, at: PmOff) -> Result<Geometry> {
        let bad = |what| Error::Corrupt { what, at };
        if get64(b, sb::MAGIC) != SB_MAGIC {
            return Err(bad("superblock magic"));
        }
        if get32(b, sb::CRC) != crc32c(&b[..sb::CRC]) || get32(b, sb::CRC + 4) != 0 {
            return Err(bad("superblock checksum"));
        }
        let version = get32(b, sb::VERSION);
        if !(OLDEST_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(Error::Unsupported("volume format version"));
        }
        if u64::from(get32(b, sb::BLOCK_SIZE)) != BLOCK_SIZE || get32(b, sb::ROOT_INO) != ROOT_INO {
            return Err(bad("superblock constants"));
        }
        let mapping =
            mapping_from_code(get32(b, sb::MAPPING)).ok_or(bad("superblock mapping kind"))?;
        let allocator =
            AllocatorKind::from_code(get32(b, sb::ALLOCATOR)).ok_or(bad("superblock allocator"))?;
        let g = Geometry {
            version,
            mapping,
            allocator,
            total_blocks: get64(b, sb::TOTAL_BLOCKS),
            journal_start: BlockNo(get64(b, sb::JOURNAL_START)),
            journal_slots: get32(b, sb::JOURNAL_SLOTS),
            inode_start: BlockNo(get64(b, sb::INODE_START)),
            inode_count: get64(b, sb::INODE_COUNT),
            alloc_start: BlockNo(get64(b, sb::ALLOC_START)),
            alloc_blocks: get64(b, sb::ALLOC_BLOCKS),
            map_start: BlockNo(get64(b, sb::MAP_START)),
            map_blocks: get64(b, sb::MAP_BLOCKS),
            data_start: BlockNo(get64(b, sb::DATA_START)),
            data_blocks: get64(b, sb::DATA_BLOCKS),
            volume_id: get64(b, sb::VOLUME_ID),
            created_ns: get64(b, sb::CREATED_NS) as i64,
        };
        g.validate(media_blocks)
            .map_err(|()| bad("superblock geometry"))?;
        Ok(g)
    }

    /// Checks that the regions are in order, do not overlap and fit the media.
    fn validate(&self, media_blocks: u64) -> std::result::Result<(), ()> {
        let inode_blocks = self
            .inode_count
            .checked_mul(INODE_SIZE)
            .map(|b| div_ceil(b, BLOCK_SIZE))
            .ok_or(())?;
        let ordered = [
            (self.journal_start.0, u64::from(self.journal_slots)),
            (self.inode_start.0, inode_blocks),
            (self.alloc_start.0, self.alloc_blocks),
            (self.map_start.0, self.map_blocks),
            (self.data_start.0, self.data_blocks),
        ];
        let mut cursor = 2u64;
        for (start, len) in ordered {
            if start < cursor {
                return Err(());
            }
            cursor = start.checked_add(len).ok_or(())?;
        }
        let ok = self.journal_start.0 == 2
            && (1..=1024).contains(&self.journal_slots)
            && (2..=u64::from(u32::MAX)).contains(&self.inode_count)
            && self.data_start.0.is_multiple_of(HUGE_BLOCKS)
            && self.data_blocks > 0
            && cursor == self.total_blocks
            && self.total_blocks <= media_blocks;
        if ok { Ok(()) } else { Err(()) }
    }

    /// Offset of inode `ino`'s record.
    pub fn inode_off(&self, ino: u32) -> PmOff {
        self.inode_start.offset() + u64::from(ino) * INODE_SIZE
    }

    /// Offset of journal slot `i`.
    pub fn journal_off(&self, i: u32) -> PmOff {
        (self.journal_start + u64::from(i)).offset()
    }

    /// The mapping region as an extent.
    pub fn map_extent(&self) -> pmfs_core::traits::Extent {
        pmfs_core::traits::Extent::new(self.map_start, self.map_blocks)
    }

    /// The data region as an extent.
    pub fn data_extent(&self) -> pmfs_core::traits::Extent {
        pmfs_core::traits::Extent::new(self.data_start, self.data_blocks)
    }
}

/// Writes backup and primary superblock and makes them durable, the backup first: a volume
/// whose primary is valid has its backup too, and one with the backup alone is mounted from
/// it (which restores the primary). The mount-state word is set to dirty: mkfs finishes by a
/// clean close.
pub(crate) fn write_superblocks(media: &dyn Media, g: &Geometry) -> Result<()> {
    let sb = g.encode();
    media.write(BACKUP_BLOCK.offset(), &sb)?;
    media.persist(BACKUP_BLOCK.offset(), SB_SIZE as u64)?;
    media.write(PmOff(0), &sb)?;
    media.flush(PmOff(0), SB_SIZE as u64)?;
    media.store_u64(MOUNT_STATE_OFF, STATE_DIRTY)?;
    media.persist(MOUNT_STATE_OFF, 8)?;
    Ok(())
}

/// Which superblock copy a volume was opened from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SbSource {
    Primary,
    Backup,
}

/// Reads and validates the superblock, falling back to the backup copy. The error of the
/// primary is returned when both are bad.
pub(crate) fn read_superblock(media: &dyn Media) -> Result<(Geometry, SbSource)> {
    let blocks = media.blocks();
    if blocks < 4 {
        return Err(Error::Corrupt {
            what: "volume smaller than its superblocks",
            at: PmOff(0),
        });
    }
    let primary: [u8; SB_SIZE] = media.read_pod(PmOff(0))?;
    match Geometry::decode(&primary, blocks, PmOff(0)) {
        Ok(g) => Ok((g, SbSource::Primary)),
        Err(Error::Unsupported(w)) => Err(Error::Unsupported(w)),
        Err(first) => {
            let backup: [u8; SB_SIZE] = media.read_pod(BACKUP_BLOCK.offset())?;
            match Geometry::decode(&backup, blocks, BACKUP_BLOCK.offset()) {
                Ok(g) => Ok((g, SbSource::Backup)),
                Err(_) => Err(first),
            }
        }
    }
}

/// Rewrites the primary superblock from the geometry (after the backup was used).
pub(crate) fn restore_primary(media: &dyn Media, g: &Geometry) -> Result<()> {
    media.write(PmOff(0), &g.encode())?;
    media.persist(PmOff(0), SB_SIZE as u64)?;
    Ok(())
}

/// Whether the backup superblock equals the primary.
pub(crate) fn backup_matches(media: &dyn Media, g: &Geometry) -> Result<bool> {
    let backup: [u8; SB_SIZE] = media.read_pod(BACKUP_BLOCK.offset())?;
    Ok(backup == g.encode())
}

/// Rewrites the backup superblock from the geometry.
pub(crate) fn restore_backup(media: &dyn Media, g: &Geometry) -> Result<()> {
    media.write(BACKUP_BLOCK.offset(), &g.encode())?;
    media.persist(BACKUP_BLOCK.offset(), SB_SIZE as u64)?;
    Ok(())
}

/// The [rendezvous word](RENDEZVOUS_OFF) (0 if unreadable).
pub(crate) fn rendezvous(m: &dyn Media) -> u64 {
    m.load_u64(RENDEZVOUS_OFF).unwrap_or(0)
}

/// Stores a fresh random [rendezvous word](RENDEZVOUS_OFF) (durable after the next fence).
pub(crate) fn new_rendezvous(m: &dyn Media) -> Result<()> {
    use std::hash::{BuildHasher, RandomState};
    let word = RandomState::new().hash_one(m.load_u64(RENDEZVOUS_OFF)?);
    m.store_u64(RENDEZVOUS_OFF, word)?;
    m.flush(RENDEZVOUS_OFF, 8)?;
    Ok(())
}

/// Records this process as the volume's owner ([`OWNER_OFF`]), or clears the record if its
/// start time cannot be read. Not flushed: the record matters only while the process lives,
/// and other processes read it through the file's pages.
pub(crate) fn record_owner(m: &dyn Media) -> Result<()> {
    let pid = std::process::id();
    match pmfs_core::pm::procs::start_time(pid) {
        Some(start) => {
            m.store_u64(OWNER_OFF, u64::from(pid))?;
            m.store_u64(OWNER_OFF + 8, start)?;
            Ok(())
        }
        None => clear_owner(m),
    }
}

/// Whether the process that recorded itself as the volume's owner ([`OWNER_OFF`]) still runs:
/// a process with its id and start time exists.
pub(crate) fn owner_runs(m: &dyn Media) -> Result<bool> {
    let pid = m.load_u64(OWNER_OFF)?;
    let start = m.load_u64(OWNER_OFF + 8)?;
    Ok(start != 0
        && u32::try_from(pid)
            .ok()
            .filter(|&p| p != 0)
            .and_then(pmfs_core::pm::procs::start_time)
            == Some(start))
}

/// Clears the owner record ([`OWNER_OFF`]): the volume is closed.
pub(crate) fn clear_owner(m: &dyn Media) -> Result<()> {
    m.store_u64(OWNER_OFF, 0)?;
    m.store_u64(OWNER_OFF + 8, 0)?;
    Ok(())
}

/// The owner record of the pool file `pool` ([`OWNER_OFF`]): the process id and start time
/// of the process that has the volume mounted read-write, if one recorded itself. A record is
/// only a claim: the process may have died since (then its start time no longer matches, or
/// it does not exist), and owners of older builds record nothing.
pub(crate) fn recorded_owner(pool: &std::fs::File) -> Option<(u32, u64)> {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 16];
    pool.read_exact_at(&mut b, OWNER_OFF.0).ok()?;
    let pid = u32::try_from(get64(&b, 0)).ok()?;
    let start = get64(&b, 8);
    (pid != 0 && start != 0).then_some((pid, start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmfs_core::pm::HeapRegion;

    fn plan(blocks: u64) -> Geometry {
        Geometry::plan(&Options::default(), blocks, |_| 3, |n| n / 512, 7).unwrap()
    }

    #[test]
    fn geometry_is_ordered_and_data_is_huge_page_aligned() {
        let g = plan(8192);
        assert_eq!(g.data_start.0 % 512, 0);
        assert_eq!(g.data_start.0 + g.data_blocks, 8192);
        assert!(g.validate(8192).is_ok());
        assert!(g.validate(8191).is_err());
        assert!(matches!(
            Geometry::plan(&Options::default(), 600, |_| 0, |_| 0, 0),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn superblock_round_trips_and_backup_takes_over() {
        let m = HeapRegion::new(8192 * 4096).unwrap();
        let g = plan(8192);
        write_superblocks(&m, &g).unwrap();
        assert_eq!(read_superblock(&m).unwrap(), (g, SbSource::Primary));
        // Damage one byte of the primary: the backup is used.
        m.write(PmOff(40), &[0xff]).unwrap();
        assert_eq!(read_superblock(&m).unwrap(), (g, SbSource::Backup));
        assert!(backup_matches(&m, &g).unwrap());
        // Damage the backup too: the primary's error is reported.
        m.write(BACKUP_BLOCK.offset() + 40, &[0xff]).unwrap();
        assert!(matches!(
            read_superblock(&m),
            Err(Error::Corrupt {
                what: "superblock checksum",
                ..
            })
        ));
        restore_primary(&m, &g).unwrap();
        assert!(!backup_matches(&m, &g).unwrap());
        restore_backup(&m, &g).unwrap();
        assert!(backup_matches(&m, &g).unwrap());
    }

    #[test]
    fn geometry_beyond_media_is_corrupt() {
        let m = HeapRegion::new(8192 * 4096).unwrap();
        let g = plan(8192);
        write_superblocks(&m, &g).unwrap();
        let small = HeapRegion::new(4096 * 4096).unwrap();
        let mut img = vec![0u8; 8192];
        m.read(PmOff(0), &mut img).unwrap();
        small.write(PmOff(0), &img).unwrap();
        assert!(matches!(
            read_superblock(&small),
            Err(Error::Corrupt {
                what: "superblock geometry",
                ..
            })
        ));
    }
}
