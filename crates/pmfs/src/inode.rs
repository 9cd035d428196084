//! The inode table: fixed-size records indexed by inode number, each with a generation
//! number, and the DRAM free list rebuilt at mount.
//!
//! A record is *live* when bit 63 of its state word is set; the low 32 bits hold the
//! generation of the current (or, when free, the last) incarnation. Creating a file writes
//! every other field first and sets the state word last with one 8-byte store, so a record is
//! never live with stale fields. A directory entry names an inode by its handle
//! `(generation << 32) | number`, which lets recovery tell a new incarnation from an old one.

use std::sync::Mutex;

use pmfs_core::layout::PmOff;
use pmfs_core::pm::{Media, MediaExt};

use crate::codec::{get16, get32, get64, put16, put32, put64};
use crate::error::{Error, Result};
use crate::format::Geometry;

/// Size of one inode record.
pub(crate) const INODE_SIZE: u64 = 128;
/// Version of the record layout. The device-number and extended-attribute words took
/// formerly reserved (zero) space, where zero means "none": the version did not change; the
/// superblock's format version tells old code that the words may be set.
pub(crate) const INODE_VERSION: u16 = 1;
/// The live bit of the state word.
pub(crate) const LIVE: u64 = 1 << 63;

/// Field offsets inside a record (each an 8-byte aligned word).
pub(crate) mod field {
    pub const STATE: u64 = 0;
    pub const MODE_UID: u64 = 8;
    pub const NLINK: u64 = 24;
    pub const SIZE: u64 = 32;
    pub const ATIME: u64 = 40;
    pub const MTIME: u64 = 48;
    pub const CTIME: u64 = 56;
    pub const ROOT: u64 = 72;
    pub const PARENT: u64 = 80;
    /// Regular files (which have no parent word): the process holding the file's *tail* on
    /// HashFS (see `fs::data`), 0 when free. Reset at mount.
    pub const TAIL: u64 = 80;
    pub const RDEV: u64 = 88;
    /// Regular files (which have no device number): how many mappings and in-place writers
    /// hold the file in *mapped mode* (see `fs::data`). Reset at mount.
    pub const MAPS: u64 = 88;
    pub const XATTR: u64 = 96;
    /// Regular files: the head word of the file's log (0: no log yet).
    pub const LOG: u64 = 104;
    /// Regular files: the log's digest cursor (LSN of the first entry not applied, holder).
    pub const DIGEST: u64 = 112;
    /// Regular files: above every mapped logical block (raised before a block at or past it
    /// is mapped, lowered after a truncation unmapped the blocks past the new end).
    pub const MAPPED_END: u64 = 120;
}

/// Bits of the record's flags half-word (offset 22).
pub(crate) mod flag {
    /// Regular files: a block below the end of file may be unmapped (a hole), because a
    /// write or an allocation started past the end, a truncation grew the file or a punch
    /// unmapped blocks. Set, by CAS, before such an update commits, and never cleared: a
    /// file without it maps every block below its size, so its allocated blocks are known
    /// without a lookup (see `Fs::blocks_of`).
    pub const HOLES: u16 = 1;
    /// Regular files: the kernel may hold pages of the file in its page cache, filled by reads
    /// the owner served through the kernel (a FUSE mount). Set, by CAS, before the owner reads
    /// for the kernel; cleared at the owner's last close of the file (the kernel drops the
    /// pages at the next open) and at mount. A data-only client's update, which bypasses the
    /// kernel, then moves the modification time so that the kernel drops the pages (see
    /// `Fs::reveal_to_kernel`).
    pub const KERNEL_CACHED: u16 = 2;
}

/// The record word that holds gid, version and flags.
pub(crate) const GID_WORD: u64 = 16;
/// Where the flags half-word sits in [`GID_WORD`].
const FLAGS_SHIFT: u32 = 48;

/// The flags half-word of a [`GID_WORD`] value.
pub(crate) fn flags_in(gid_word: u64) -> u16 {
    (gid_word >> FLAGS_SHIFT) as u16
}

/// POSIX file-type bits of `mode`.
pub(crate) const S_IFMT: u32 = 0o170000;
pub(crate) const S_IFREG: u32 = 0o100000;
pub(crate) const S_IFDIR: u32 = 0o040000;
pub(crate) const S_IFLNK: u32 = 0o120000;
pub(crate) const S_IFIFO: u32 = 0o010000;
pub(crate) const S_IFSOCK: u32 = 0o140000;
pub(crate) const S_IFCHR: u32 = 0o020000;
pub(crate) const S_IFBLK: u32 = 0o060000;

/// The decoded inode record. On media it is 128 bytes, little-endian:
///
/// | offset | field                                           |
/// |--------|-------------------------------------------------|
/// | 0      | state: live bit 63, generation in bits 0..32    |
/// | 8      | mode (u32), uid (u32) — one word                |
/// | 16     | gid (u32), record version (u16), flags (u16)    |
/// | 24     | nlink                                           |
/// | 32     | size                                            |
/// | 40..72 | atime, mtime, ctime, btime (ns since the epoch) |
/// | 72     | mapping root word (per-file mapping structures) |
/// | 80     | parent directory handle (directories); tail holder (files) |
/// | 88     | device number (devices); mapped-mode count (files) |
/// | 96     | extended attributes: current block, length, crc |
/// | 104    | regular files: log head word (0: none)          |
/// | 112    | regular files: log digest cursor                |
/// | 120    | regular files: end of the mapped logical blocks |
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InodeRaw {
    pub state: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub version: u16,
    pub flags: u16,
    pub nlink: u64,
    pub size: u64,
    pub atime: u64,
    pub mtime: u64,
    pub ctime: u64,
    pub btime: u64,
    pub map_root: u64,
    pub parent: u64,
    pub rdev: u64,
    pub xattr: u64,
}

const O_GID: usize = 16;
const O_VERSION: usize = 20;
const O_FLAGS: usize = 22;
const O_BTIME: usize = 64;
const _: () = assert!(field::XATTR as usize + 8 <= INODE_SIZE as usize);

/// The kind of object an inode holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl Kind {
    pub fn from_mode(mode: u32) -> Option<Kind> {
        match mode & S_IFMT {
            S_IFREG => Some(Kind::File),
            S_IFDIR => Some(Kind::Dir),
            S_IFLNK => Some(Kind::Symlink),
            S_IFIFO => Some(Kind::Fifo),
            S_IFSOCK => Some(Kind::Socket),
            S_IFCHR => Some(Kind::CharDevice),
            S_IFBLK => Some(Kind::BlockDevice),
            _ => None,
        }
    }

    pub fn mode_bits(self) -> u32 {
        match self {
            Kind::File => S_IFREG,
            Kind::Dir => S_IFDIR,
            Kind::Symlink => S_IFLNK,
            Kind::Fifo => S_IFIFO,
            Kind::Socket => S_IFSOCK,
            Kind::CharDevice => S_IFCHR,
            Kind::BlockDevice => S_IFBLK,
        }
    }

    /// The code stored in directory entries.
    pub fn code(self) -> u8 {
        match self {
            Kind::File => 1,
            Kind::Dir => 2,
            Kind::Symlink => 3,
            Kind::Fifo => 4,
            Kind::Socket => 5,
            Kind::CharDevice => 6,
            Kind::BlockDevice => 7,
        }
    }

    pub fn from_code(c: u8) -> Option<Kind> {
        match c {
            1 => Some(Kind::File),
            2 => Some(Kind::Dir),
            3 => Some(Kind::Symlink),
            4 => Some(Kind::Fifo),
            5 => Some(Kind::Socket),
            6 => Some(Kind::CharDevice),
            7 => Some(Kind::BlockDevice),
            _ => None,
        }
    }
}

/// An inode number with the generation of one incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Handle {
    pub ino: u32,
    pub generation: u32,
}

impl Handle {
    pub fn word(self) -> u64 {
        (u64::from(self.generation) << 32) | u64::from(self.ino)
    }

    pub fn from_word(w: u64) -> Handle {
        Handle {
            ino: w as u32,
            generation: (w >> 32) as u32,
        }
    }

    /// The state word of this incarnation while live.
    pub fn live_state(self) -> u64 {
        LIVE | u64::from(self.generation)
    }
}

impl InodeRaw {
    /// A fresh record for a new incarnation (state word not yet live).
    pub fn new(h: Handle, kind: Kind, perm: u32, now: i64, parent: Handle) -> InodeRaw {
        let t = now as u64;
        InodeRaw {
            state: u64::from(h.generation.wrapping_sub(1)),
            mode: kind.mode_bits() | (perm & 0o7777),
            uid: 0,
            gid: 0,
            version: INODE_VERSION,
            flags: 0,
            nlink: 1,
            size: 0,
            atime: t,
            mtime: t,
            ctime: t,
            btime: t,
            map_root: 0,
            parent: if kind == Kind::Dir { parent.word() } else { 0 },
            rdev: 0,
            xattr: 0,
        }
    }

    /// Decodes a record.
    pub fn decode(b: &[u8]) -> InodeRaw {
        let f = |o: u64| get64(b, o as usize);
        InodeRaw {
            state: f(field::STATE),
            mode: get32(b, field::MODE_UID as usize),
            uid: get32(b, field::MODE_UID as usize + 4),
            gid: get32(b, O_GID),
            version: get16(b, O_VERSION),
            flags: get16(b, O_FLAGS),
            nlink: f(field::NLINK),
            size: f(field::SIZE),
            atime: f(field::ATIME),
            mtime: f(field::MTIME),
            ctime: f(field::CTIME),
            btime: get64(b, O_BTIME),
            map_root: f(field::ROOT),
            parent: f(field::PARENT),
            rdev: f(field::RDEV),
            xattr: f(field::XATTR),
        }
    }

    /// Encodes the record.
    pub fn encode(&self) -> [u8; INODE_SIZE as usize] {
        let mut b = [0u8; INODE_SIZE as usize];
        let mut f = |o: u64, v: u64| put64(&mut b, o as usize, v);
        f(field::STATE, self.state);
        f(field::NLINK, self.nlink);
        f(field::SIZE, self.size);
        f(field::ATIME, self.atime);
        f(field::MTIME, self.mtime);
        f(field::CTIME, self.ctime);
        f(field::ROOT, self.map_root);
        f(field::PARENT, self.parent);
        f(field::RDEV, self.rdev);
        f(field::XATTR, self.xattr);
        put32(&mut b, field::MODE_UID as usize, self.mode);
        put32(&mut b, field::MODE_UID as usize + 4, self.uid);
        put32(&mut b, O_GID, self.gid);
        put16(&mut b, O_VERSION, self.version);
        put16(&mut b, O_FLAGS, self.flags);
        put64(&mut b, O_BTIME, self.btime);
        b
    }

    pub fn is_live(&self) -> bool {
        self.state & LIVE != 0
    }

    pub fn generation(&self) -> u32 {
        self.state as u32
    }

    pub fn kind(&self) -> Option<Kind> {
        Kind::from_mode(self.mode)
    }
}

/// Access to the inode table and the DRAM free list.
#[derive(Debug)]
pub(crate) struct InodeTable {
    geo: Geometry,
    free: Mutex<Vec<u32>>,
}

impl InodeTable {
    pub fn new(geo: Geometry) -> InodeTable {
        InodeTable {
            geo,
            free: Mutex::new(Vec::new()),
        }
    }

    pub fn count(&self) -> u64 {
        self.geo.inode_count
    }

    /// Offset of a field of inode `ino`.
    pub fn field(&self, ino: u32, f: u64) -> PmOff {
        self.geo.inode_off(ino) + f
    }

    fn check(&self, ino: u32) -> Result<()> {
        if ino == 0 || u64::from(ino) >= self.geo.inode_count {
            return Err(Error::Corrupt {
                what: "inode number out of range",
                at: self.geo.inode_start.offset(),
            });
        }
        Ok(())
    }

    /// Reads the record of `ino`.
    pub fn read(&self, m: &dyn Media, ino: u32) -> Result<InodeRaw> {
        self.check(ino)?;
        let b: [u8; INODE_SIZE as usize] = m.read_pod(self.geo.inode_off(ino))?;
        Ok(InodeRaw::decode(&b))
    }

    /// Reads the record of `h` and checks that this incarnation is live.
    pub fn read_live(&self, m: &dyn Media, h: Handle) -> Result<InodeRaw> {
        let r = self.read(m, h.ino)?;
        if r.state != h.live_state() {
            return Err(Error::Corrupt {
                what: "directory entry names a dead inode",
                at: self.geo.inode_off(h.ino),
            });
        }
        Ok(r)
    }

    /// Loads one 8-byte field.
    pub fn load(&self, m: &dyn Media, ino: u32, f: u64) -> Result<u64> {
        self.check(ino)?;
        Ok(m.load_u64(self.field(ino, f))?)
    }

    /// The flags half-word of `ino`.
    pub fn flags(&self, m: &dyn Media, ino: u32) -> Result<u16> {
        Ok(flags_in(self.load(m, ino, GID_WORD)?))
    }

    /// Sets flag bits `bits` of `ino` by CAS (any thread of any process may race here, and a
    /// change of group stores the word whole), flushed: durable after the next fence.
    pub fn set_flags(&self, m: &dyn Media, ino: u32, bits: u16) -> Result<()> {
        self.change_flags(m, ino, bits, true)
    }

    /// Clears flag bits `bits` of `ino` by CAS, flushed: durable after the next fence.
    pub fn clear_flags(&self, m: &dyn Media, ino: u32, bits: u16) -> Result<()> {
        self.change_flags(m, ino, bits, false)
    }

    fn change_flags(&self, m: &dyn Media, ino: u32, bits: u16, on: bool) -> Result<()> {
        self.check(ino)?;
        let at = self.field(ino, GID_WORD);
        let mask = u64::from(bits) << FLAGS_SHIFT;
        let want = if on { mask } else { 0 };
        let mut cur = m.load_u64(at)?;
        while cur & mask != want {
            match m.cas_u64(at, cur, (cur & !mask) | want)? {
                Ok(_) => {
                    m.flush(at, 8)?;
                    break;
                }
                Err(seen) => cur = seen,
            }
        }
        Ok(())
    }

    /// Stores one 8-byte field and flushes its line (durable after the next fence).
    pub fn store(&self, m: &dyn Media, ino: u32, f: u64, v: u64) -> Result<()> {
        self.check(ino)?;
        let off = self.field(ino, f);
        m.store_u64(off, v)?;
        m.flush(off, 8)?;
        Ok(())
    }

    /// Writes a whole record except its state word and flushes it (durable after the next
    /// fence). The state word is set separately when the incarnation goes live.
    pub fn write_body(&self, m: &dyn Media, ino: u32, rec: &InodeRaw) -> Result<()> {
        self.check(ino)?;
        let off = self.geo.inode_off(ino);
        m.write(off + 8, &rec.encode()[8..])?;
        m.flush(off, INODE_SIZE)?;
        Ok(())
    }

    /// Visits every record of the table in order (for the mount scan and fsck), reading the
    /// table in large chunks.
    pub fn scan(
        &self,
        m: &dyn Media,
        mut visit: impl FnMut(u32, &InodeRaw) -> Result<()>,
    ) -> Result<()> {
        const CHUNK: u64 = 2048;
        let mut buf = vec![0u8; (CHUNK * INODE_SIZE) as usize];
        let mut ino = 0u64;
        while ino < self.geo.inode_count {
            let n = CHUNK.min(self.geo.inode_count - ino);
            let bytes = &mut buf[..(n * INODE_SIZE) as usize];
            m.read(self.geo.inode_off(ino as u32), bytes)?;
            for (i, rec) in bytes.chunks_exact(INODE_SIZE as usize).enumerate() {
                visit(ino as u32 + i as u32, &InodeRaw::decode(rec))?;
            }
            ino += n;
        }
        Ok(())
    }

    /// Replaces the free list: every number in `free`, handed out lowest first.
    pub fn set_free(&self, mut free: Vec<u32>) {
        free.sort_unstable_by(|a, b| b.cmp(a));
        *self.lock() = free;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u32>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a free inode number and returns the handle of its next incarnation.
    pub fn alloc(&self, m: &dyn Media) -> Result<Handle> {
        let ino = self.lock().pop().ok_or(Error::NoSpace)?;
        match self.load(m, ino, field::STATE) {
            Ok(state) if state & LIVE == 0 => {
                let generation = (state as u32).wrapping_add(1).max(1);
                Ok(Handle { ino, generation })
            }
            Ok(_) => Err(Error::Corrupt {
                what: "free-listed inode is live",
                at: self.geo.inode_off(ino),
            }),
            Err(e) => {
                self.release(ino);
                Err(e)
            }
        }
    }

    /// Returns a number to the free list (its record must be free on media).
    pub fn release(&self, ino: u32) {
        self.lock().push(ino);
    }

    /// Number of free inodes.
    pub fn free_count(&self) -> u64 {
        self.lock().len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Options;
    use pmfs_core::pm::HeapRegion;

    #[test]
    fn handles_round_trip_and_generations_advance() {
        let h = Handle {
            ino: 7,
            generation: 9,
        };
        assert_eq!(Handle::from_word(h.word()), h);
        let opts = Options {
            inodes: Some(100),
            ..Options::default()
        };
        let g = Geometry::plan(&opts, 2048, |_| 0, |_| 0, 0).unwrap();
        let m = HeapRegion::new(2048 * 4096).unwrap();
        let t = InodeTable::new(g);
        t.set_free(vec![5, 3, 4]);
        let a = t.alloc(&m).unwrap();
        assert_eq!(
            a,
            Handle {
                ino: 3,
                generation: 1
            }
        );
        let rec = InodeRaw::new(a, Kind::File, 0o644, 11, a);
        t.write_body(&m, 3, &rec).unwrap();
        t.store(&m, 3, field::STATE, a.live_state()).unwrap();
        assert_eq!(t.read_live(&m, a).unwrap().kind(), Some(Kind::File));
        // Free it again and allocate: the generation moves on.
        t.store(&m, 3, field::STATE, u64::from(a.generation))
            .unwrap();
        t.release(3);
        assert_eq!(
            t.alloc(&m).unwrap(),
            Handle {
                ino: 3,
                generation: 2
            }
        );
        assert!(t.read_live(&m, a).is_err());
        let mut live = 0;
        t.scan(&m, |_, r| {
            live += usize::from(r.is_live());
            Ok(())
        })
        .unwrap();
        assert_eq!(live, 0);
        assert!(matches!(t.read(&m, 100), Err(Error::Corrupt { .. })));
    }
}
