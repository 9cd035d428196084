//! Access by inode number, for frontends that name objects the way the kernel does (FUSE):
//! look a name up in a directory inode, get and set the attributes of an inode, open an inode,
//! list a directory inode with resumable positions.
//!
//! Objects are named by [`Ino`]: the inode number together with the generation of its current
//! incarnation. A stale `Ino` (the object was removed, maybe the number reused) fails with
//! [`Error::NotFound`] instead of reaching the new object. Permission checks and ownership
//! policy (who may chown, which group a new file gets) belong to the frontend: the engine
//! stores what it is told.
//!
//! Every call is atomic and durable on return, like the path API, except
//! [`set_attr`](Volume::set_attr), which applies its changes one after the other (each of them
//! atomic).

use std::sync::Arc;

use pmfs_core::layout::BLOCK_SIZE;
use pmfs_core::traits::Run;

use super::Volume;
use super::types::{Metadata, RenameFlags};
use crate::dir::Dir;
use crate::error::{Error, Result};
use crate::fs::data::Node;
use crate::fs::path::check_name;
use crate::fs::{Fs, MAX_FILE_SIZE, ns};
use crate::inode::{GID_WORD, Handle, InodeRaw, Kind, field};
use crate::parts::Stager;

const BS: u64 = BLOCK_SIZE;

/// An inode number with the generation of one incarnation, packed as
/// `generation << 32 | number`. Stable across remounts; never reused by another object (a
/// reused number comes with a new generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(u64);

impl Ino {
    /// The packed value.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// An `Ino` from its packed value (not checked until used).
    pub fn from_raw(raw: u64) -> Ino {
        Ino(raw)
    }

    /// The inode number (index in the inode table).
    pub fn number(self) -> u32 {
        self.0 as u32
    }

    /// The generation of the incarnation.
    pub fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }

    pub(crate) fn handle(self) -> Handle {
        Handle::from_word(self.0)
    }

    fn of(h: Handle) -> Ino {
        Ino(h.word())
    }
}

/// The type of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NodeKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix domain socket.
    Socket,
    /// A character device node.
    CharDevice,
    /// A block device node.
    BlockDevice,
}

impl NodeKind {
    fn of(k: Kind) -> NodeKind {
        match k {
            Kind::File => NodeKind::File,
            Kind::Dir => NodeKind::Dir,
            Kind::Symlink => NodeKind::Symlink,
            Kind::Fifo => NodeKind::Fifo,
            Kind::Socket => NodeKind::Socket,
            Kind::CharDevice => NodeKind::CharDevice,
            Kind::BlockDevice => NodeKind::BlockDevice,
        }
    }

    fn kind(self) -> Kind {
        match self {
            NodeKind::File => Kind::File,
            NodeKind::Dir => Kind::Dir,
            NodeKind::Symlink => Kind::Symlink,
            NodeKind::Fifo => Kind::Fifo,
            NodeKind::Socket => Kind::Socket,
            NodeKind::CharDevice => Kind::CharDevice,
            NodeKind::BlockDevice => Kind::BlockDevice,
        }
    }

    /// The POSIX file-type bits (`S_IFREG`, `S_IFDIR`, ...).
    pub fn mode_bits(self) -> u32 {
        self.kind().mode_bits()
    }
}

/// The attributes of an inode (what `stat` reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// The object.
    pub ino: Ino,
    /// Its type.
    pub kind: NodeKind,
    /// Permission bits, including set-user-ID, set-group-ID and sticky (`mode & 0o7777`).
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links (for a directory: 2 plus its subdirectories).
    pub nlink: u64,
    /// Size in bytes.
    pub size: u64,
    /// Space the object occupies, in 512-byte units: for a regular file the data blocks it
    /// maps (holes are not counted, blocks allocated past the end of file are), taking in a
    /// write when it is digested (at the latest at the writer's last close); whole blocks up
    /// to the size for a directory, one block for a symbolic link.
    pub blocks: u64,
    /// Access time, ns since the epoch.
    pub atime: i64,
    /// Modification time, ns since the epoch.
    pub mtime: i64,
    /// Status change time, ns since the epoch.
    pub ctime: i64,
    /// Creation time, ns since the epoch.
    pub btime: i64,
    /// Device number of a device node (0 otherwise).
    pub rdev: u64,
}

impl Attr {
    /// The set-ID bits of a regular file that a write, a truncation or a change of owner
    /// clears, as Linux's VFS does: set-user-ID, and set-group-ID when group-execute is set
    /// (without it the bit marks mandatory locking, not a privilege). 0 for other objects.
    pub fn privilege_bits(&self) -> u32 {
        if self.kind != NodeKind::File {
            return 0;
        }
        file_privilege_bits(self.perm)
    }
}

/// [`Attr::privilege_bits`] of a regular file with permission bits `perm`.
pub(crate) fn file_privilege_bits(perm: u32) -> u32 {
    const S_ISUID: u32 = 0o4000;
    const SGID_XGRP: u32 = 0o2010;
    let sgid = if perm & SGID_XGRP == SGID_XGRP {
        0o2000
    } else {
        0
    };
    perm & S_ISUID | sgid
}

/// Owner and group of a new object.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// A time to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    /// The volume's current time (`UTIME_NOW`).
    Now,
    /// This time, ns since the epoch.
    At(i64),
}

/// Attribute changes for [`Volume::set_attr`]; `None` leaves an attribute alone
/// (`UTIME_OMIT` for the times).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttrChange {
    /// New permission bits (`& 0o7777`).
    pub perm: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (regular files).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<SetTime>,
    /// New modification time.
    pub mtime: Option<SetTime>,
}

/// One entry of [`Volume::list_dir`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeEntry {
    /// The entry's name.
    pub name: Vec<u8>,
    /// The object it names.
    pub ino: Ino,
    /// The object's type.
    pub kind: NodeKind,
    /// The entry's position in the directory: positions grow in listing order, and an
    /// entry keeps its position for as long as it exists, so a listing can be resumed after
    /// any position even when entries were added or removed meanwhile.
    pub pos: u64,
}

/// How to open an inode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenMode {
    /// Reads allowed.
    pub read: bool,
    /// Writes allowed.
    pub write: bool,
    /// Truncate to length 0 (needs `write`).
    pub truncate: bool,
}

/// An open regular file, named by inode. While it lives the file stays readable and writable
/// even when its last name is removed; dropping the last handle of an unlinked file frees it.
#[derive(Debug)]
pub struct OpenNode {
    fs: Arc<Fs>,
    node: Node,
    mode: OpenMode,
}

fn dead(_: Error) -> Error {
    Error::NotFound
}

impl Volume {
    /// The root directory.
    pub fn root(&self) -> Ino {
        Ino::of(self.fs.root)
    }

    /// The live record of `ino`, or `NotFound` when `ino` is stale or out of range.
    fn live(&self, ino: Ino) -> Result<(Handle, InodeRaw)> {
        let h = ino.handle();
        if h.ino == 0 || u64::from(h.ino) >= self.fs.inodes.count() {
            return Err(Error::NotFound);
        }
        let rec = self.fs.inodes.read(self.fs.m(), h.ino)?;
        if rec.state != h.live_state() || self.fs.is_released(h) {
            return Err(Error::NotFound);
        }
        Ok((h, rec))
    }

    /// The DRAM state of directory `ino`.
    fn dir_of(&self, ino: Ino) -> Result<Arc<Dir>> {
        let (h, rec) = self.live(ino)?;
        if rec.kind() != Some(Kind::Dir) {
            return Err(Error::NotADirectory);
        }
        let d = self.fs.dir(h).map_err(|e| match e {
            Error::Corrupt { .. } if self.live(ino).is_err() => Error::NotFound,
            e => e,
        })?;
        if d.inner.read().unwrap_or_else(|e| e.into_inner()).dead {
            return Err(Error::NotFound);
        }
        Ok(d)
    }

    fn attr_of(&self, h: Handle) -> Result<Attr> {
        attr_of(&self.fs, h)
    }

    /// Notes that the kernel holds no pages of regular file `ino` any more: call it right
    /// before having the kernel drop them (`FUSE_NOTIFY_INVAL_INODE`), when a data-only client
    /// asks through [`crate::kernel_pages`]. Until the kernel reads the file again, clients'
    /// updates of it ask for nothing.
    ///
    /// # Errors
    /// [`Error::NotFound`] unless `ino` is a live regular file; [`Error::Unsupported`] on a
    /// client or a read-only volume; media errors.
    pub fn forget_kernel_pages(&self, ino: Ino) -> Result<()> {
        let (h, rec) = self.live(ino)?;
        if rec.kind() != Some(Kind::File) {
            return Err(Error::NotFound);
        }
        self.fs.forget_kernel_pages(h)
    }

    /// What the owner does when the kernel asks about regular file `ino` (FUSE's GETATTR,
    /// which comes with every open and `stat` of the file): if other processes pin the file's
    /// log or keep it in mapped mode, clears what they hold when only dead processes can hold
    /// it (no data client is attached; see `Fs::clear_dead_pins`), or notes the file for
    /// [`collect_dead_pins`](Volume::collect_dead_pins). A program killed under the preload
    /// library leaves its pins behind, and with them the blocks its file's compactions retire
    /// and a mapped mode without atomic writes; the owner's last close of the file looks too,
    /// but a daemon that is not told of opens and closes keeps its handle of the file for as
    /// long as the kernel knows it. Two loads while nothing else holds the file; nothing for
    /// other objects, on a client or on a read-only volume.
    ///
    /// # Errors
    /// [`Error::NotFound`] unless `ino` is live; media errors.
    pub fn look_for_dead_pins(&self, ino: Ino) -> Result<()> {
        let (h, rec) = self.live(ino)?;
        if rec.kind() != Some(Kind::File) || self.fs.client || self.fs.read_only {
            return Ok(());
        }
        self.fs.look_for_dead_pins(h)
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let (h, _) = self.live(ino)?;
        self.attr_of(h).map_err(|e| match e {
            Error::NotFound | Error::Corrupt { .. } if self.live(ino).is_err() => Error::NotFound,
            e => e,
        })
    }

    /// Looks `name` up in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> Result<Attr> {
        if name.len() > crate::dir::page::NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let d = self.dir_of(parent)?;
        let slot = {
            let inner = d.inner.read().unwrap_or_else(|e| e.into_inner());
            if inner.dead {
                return Err(Error::NotFound);
            }
            inner.get(name).ok_or(Error::NotFound)?
        };
        self.getattr(Ino::of(slot.h))
    }

    /// The parent of directory `dir` (the root is its own parent).
    pub fn parent_of(&self, dir: Ino) -> Result<Ino> {
        let d = self.dir_of(dir)?;
        if d.h == self.fs.root {
            return Ok(self.root());
        }
        Ok(Ino::of(d.parent()))
    }

    /// Lists directory `dir` in position order, starting after position `after` (`None`:
    /// from the start), at most `limit` entries.
    pub fn list_dir(&self, dir: Ino, after: Option<u64>, limit: usize) -> Result<Vec<NodeEntry>> {
        let d = self.dir_of(dir)?;
        let inner = d.inner.read().unwrap_or_else(|e| e.into_inner());
        if inner.dead {
            return Err(Error::NotFound);
        }
        let mut entries: Vec<NodeEntry> = inner
            .index
            .iter()
            .map(|(name, s)| NodeEntry {
                name: name.to_vec(),
                ino: Ino::of(s.h),
                kind: NodeKind::of(s.kind),
                pos: (u64::from(s.page) << 16) | u64::from(s.off),
            })
            .filter(|e| after.is_none_or(|a| e.pos > a))
            .collect();
        drop(inner);
        entries.sort_unstable_by_key(|e| e.pos);
        entries.truncate(limit);
        Ok(entries)
    }

    /// Creates the object `name` in `parent` and returns its handle; `pin` counts it as open
    /// before the directory is unlocked.
    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        parent: Ino,
        name: &[u8],
        kind: Kind,
        perm: u32,
        owner: Owner,
        rdev: u64,
        target: Option<&[u8]>,
        pin: bool,
    ) -> Result<Handle> {
        let fs = &*self.fs;
        fs.writable()?;
        check_name(name)?;
        let dir = self.dir_of(parent)?;
        let mut d = dir.inner.write().unwrap_or_else(|e| e.into_inner());
        if d.dead {
            return Err(Error::NotFound);
        }
        if d.get(name).is_some() {
            return Err(Error::AlreadyExists);
        }
        let h = fs.alloc_inode()?;
        let now = fs.now();
        let mut rec = InodeRaw::new(h, kind, perm, now, dir.h);
        rec.uid = owner.uid;
        rec.gid = owner.gid;
        rec.rdev = rdev;
        if let Some(t) = target {
            rec.size = t.len() as u64;
        }
        match fs.create_locked(&mut d, dir.h, name, kind, h, &rec, now, target) {
            Ok(()) => {
                if pin {
                    fs.open_inc(h.ino);
                }
                Ok(h)
            }
            Err(e) => {
                // The record never went live: the number can be handed out again.
                fs.inodes.release(h.ino);
                Err(e)
            }
        }
    }

    /// Creates a directory.
    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u32, owner: Owner) -> Result<Attr> {
        let h = self.make(parent, name, Kind::Dir, perm, owner, 0, None, false)?;
        self.attr_of(h)
    }

    /// Creates a regular file, FIFO, socket or device node (`kind` must not be a directory or
    /// symbolic link). `rdev` is kept for device nodes only.
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        kind: NodeKind,
        perm: u32,
        owner: Owner,
        rdev: u64,
    ) -> Result<Attr> {
        let kind = kind.kind();
        if matches!(kind, Kind::Dir | Kind::Symlink) {
            return Err(Error::InvalidArgument(
                "mknod of a directory or symbolic link",
            ));
        }
        let rdev = if matches!(kind, Kind::CharDevice | Kind::BlockDevice) {
            rdev
        } else {
            0
        };
        let h = self.make(parent, name, kind, perm, owner, rdev, None, false)?;
        self.attr_of(h)
    }

    /// Creates the symbolic link `name` in `parent` pointing at `target` (1 to 4095 bytes,
    /// no NUL).
    pub fn symlink_at(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        owner: Owner,
    ) -> Result<Attr> {
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() >= BS as usize {
            return Err(Error::NameTooLong);
        }
        if target.contains(&0) {
            return Err(Error::InvalidArgument("symbolic link target contains NUL"));
        }
        let h = self.make(
            parent,
            name,
            Kind::Symlink,
            0o777,
            owner,
            0,
            Some(target),
            false,
        )?;
        self.attr_of(h)
    }

    /// Creates a regular file and opens it (`O_CREAT`); with `exclusive` an existing name
    /// fails with `AlreadyExists`, otherwise the existing file is opened (and truncated when
    /// `mode.truncate`). Returns the attributes after the open and whether the file was
    /// created.
    pub fn create_open(
        &self,
        parent: Ino,
        name: &[u8],
        perm: u32,
        owner: Owner,
        exclusive: bool,
        mode: OpenMode,
    ) -> Result<(Attr, OpenNode, bool)> {
        for _ in 0..16 {
            match self.make(parent, name, Kind::File, perm, owner, 0, None, true) {
                Ok(h) => {
                    let node = self.node_of(
                        h,
                        OpenMode {
                            truncate: false,
                            ..mode
                        },
                    )?;
                    return Ok((self.attr_of(h)?, node, true));
                }
                Err(Error::AlreadyExists) if !exclusive => {
                    let existing = match self.lookup(parent, name) {
                        Ok(a) => a,
                        // Removed meanwhile: try to create it again.
                        Err(Error::NotFound) => continue,
                        Err(e) => return Err(e),
                    };
                    let node = match self.open_ino(existing.ino, mode) {
                        Err(Error::NotFound) => continue,
                        other => other?,
                    };
                    return Ok((self.getattr(existing.ino)?, node, false));
                }
                Err(e) => return Err(e),
            }
        }
        Err(Error::Busy)
    }

    /// Builds the open handle of `h`, which the caller already counted as open.
    fn node_of(&self, h: Handle, mode: OpenMode) -> Result<OpenNode> {
        let map = match self.fs.map.open_file(self.fs.file_id(h.ino)) {
            Ok(map) => map,
            Err(e) => {
                self.fs.open_dec(h.ino);
                return Err(e);
            }
        };
        let node = OpenNode {
            fs: self.fs.clone(),
            node: Node::with_map(h, map),
            mode,
        };
        if mode.truncate && mode.write {
            self.fs.truncate_at_open(&node.node)?;
        }
        Ok(node)
    }

    /// Opens the regular file `ino`.
    pub fn open_ino(&self, ino: Ino, mode: OpenMode) -> Result<OpenNode> {
        if mode.write || mode.truncate {
            self.fs.writable()?;
        }
        if mode.truncate && !mode.write {
            return Err(Error::InvalidArgument("truncate without write access"));
        }
        let h = ino.handle();
        {
            // Under the inode lock, so that a concurrent removal of the last name either
            // frees the inode before (we fail) or sees it open (and leaves it to us).
            let _il = self
                .fs
                .ilock(h.ino)
                .write()
                .unwrap_or_else(|e| e.into_inner());
            let (_, rec) = self.live(ino)?;
            match rec.kind() {
                Some(Kind::File) => {}
                Some(Kind::Dir) => return Err(Error::IsADirectory),
                Some(Kind::Symlink) => return Err(Error::FilesystemLoop),
                _ => return Err(Error::Unsupported("open of a special file")),
            }
            self.fs.open_inc(h.ino);
        }
        self.node_of(h, mode)
    }

    /// Removes the non-directory `name` from `parent`.
    pub fn unlink_at(&self, parent: Ino, name: &[u8]) -> Result<()> {
        let d = self.dir_of(parent)?;
        self.fs.remove(&d, name, false)
    }

    /// Removes the empty directory `name` from `parent`.
    pub fn rmdir_at(&self, parent: Ino, name: &[u8]) -> Result<()> {
        let d = self.dir_of(parent)?;
        self.fs.remove(&d, name, true)
    }

    /// Renames `parent/name` to `new_parent/new_name` (`renameat2` flags).
    pub fn rename_at(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        let sp = self.dir_of(parent)?;
        let dp = self.dir_of(new_parent)?;
        self.fs.rename(
            &sp,
            name,
            &dp,
            new_name,
            ns::RenameFlags {
                noreplace: flags.noreplace,
                exchange: flags.exchange,
            },
        )
    }

    /// Adds the name `new_parent/new_name` for the non-directory `ino`.
    pub fn link_at(&self, ino: Ino, new_parent: Ino, new_name: &[u8]) -> Result<Attr> {
        let (h, _) = self.live(ino)?;
        let d = self.dir_of(new_parent)?;
        self.fs.link(h, &d, new_name)?;
        self.attr_of(h)
    }

    /// The target of the symbolic link `ino`.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let (h, _) = self.live(ino)?;
        self.fs.read_link_of(h)
    }

    /// Changes owner and/or group of `h` (journaled with its ctime).
    fn chown(&self, h: Handle, uid: Option<u32>, gid: Option<u32>) -> Result<()> {
        let fs = &*self.fs;
        fs.writable()?;
        let m = fs.m();
        let _il = fs.ilock(h.ino).write().unwrap_or_else(|e| e.into_inner());
        let rec = fs.inodes.read_live(m, h).map_err(dead)?;
        let mode_uid = u64::from(rec.mode) | u64::from(uid.unwrap_or(rec.uid)) << 32;
        let gid_off = fs.inodes.field(h.ino, GID_WORD);
        let gid_word = (m.load_u64(gid_off)? & !0xffff_ffff) | u64::from(gid.unwrap_or(rec.gid));
        let now = fs.now();
        let mut tx = fs.journal.begin()?;
        tx.protect(fs.inodes.field(h.ino, field::MODE_UID));
        tx.protect(gid_off);
        tx.protect(fs.inodes.field(h.ino, field::CTIME));
        crate::journal::run_armed(&mut tx, m, |_| {
            fs.inodes.store(m, h.ino, field::MODE_UID, mode_uid)?;
            fs.inodes.store(m, h.ino, GID_WORD, gid_word)?;
            fs.inodes.store(m, h.ino, field::CTIME, now as u64)
        })
    }

    /// Applies `change` to `ino` and returns the new attributes. A size change goes through
    /// `via` when given (the handle the caller truncates through), else through a
    /// temporary handle. The changes are applied one by one: size, owner, permissions, times.
    pub fn set_attr(&self, ino: Ino, change: AttrChange, via: Option<&OpenNode>) -> Result<Attr> {
        let (h, rec) = self.live(ino)?;
        if let Some(size) = change.size {
            match via {
                Some(n) if n.node.h == h => n.set_len(size)?,
                _ => {
                    if rec.kind() == Some(Kind::Dir) {
                        return Err(Error::IsADirectory);
                    }
                    let n = self.open_ino(
                        ino,
                        OpenMode {
                            write: true,
                            ..OpenMode::default()
                        },
                    )?;
                    n.set_len(size)?;
                }
            }
        }
        if change.uid.is_some() || change.gid.is_some() {
            self.chown(h, change.uid, change.gid)?;
        }
        if let Some(perm) = change.perm {
            self.fs.set_mode(h, perm & 0o7777).map_err(dead)?;
        }
        if change.atime.is_some() || change.mtime.is_some() {
            let now = self.fs.now();
            let resolve = |t: SetTime| match t {
                SetTime::Now => now,
                SetTime::At(ns) => ns,
            };
            self.fs
                .set_times(h, change.atime.map(resolve), change.mtime.map(resolve))?;
        }
        self.attr_of(h)
    }

    /// Orders every update before this call (every call is already durable on return).
    pub fn sync(&self) {
        self.fs.m().fence();
    }
}

/// Where [`OpenNode::seek`] looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekTarget {
    /// The next byte that lies in a mapped block (`SEEK_DATA`).
    Data,
    /// The next byte that lies in a hole or at end of file (`SEEK_HOLE`).
    Hole,
}

/// The largest piece [`OpenNode::copy_range`] reads and writes at a time.
const COPY_CHUNK: u64 = 1 << 20;

/// How many blocks a `SEEK_HOLE` looks up at once, at most.
const SEEK_CHUNK: u64 = 4096;

/// How many blocks a `SEEK_HOLE` looks up first; each further lookup doubles, up to
/// [`SEEK_CHUNK`]. On the hashed mappings a lookup costs a probe per block, so a seek that
/// lands on what it looks for answers after a few probes instead of a whole chunk's.
/// (`SEEK_DATA` asks the mapping for its first mapped block instead: see
/// [`first_mapped`](pmfs_core::traits::FileMapping::first_mapped).)
const SEEK_FIRST: u64 = 16;

impl OpenNode {
    /// An open handle of `h`, which the caller already counted as open (a client's open).
    pub(crate) fn build(fs: Arc<Fs>, h: Handle, mode: OpenMode) -> Result<OpenNode> {
        let map = match fs.map.open_file(fs.file_id(h.ino)) {
            Ok(map) => map,
            Err(e) => {
                fs.open_dec(h.ino);
                return Err(e);
            }
        };
        Ok(OpenNode {
            fs,
            node: Node::with_map(h, map),
            mode,
        })
    }

    /// The engine's node.
    pub(crate) fn node(&self) -> &Node {
        &self.node
    }

    /// The open object.
    pub fn ino(&self) -> Ino {
        Ino::of(self.node.h)
    }

    /// Reads at `offset`; returns how many bytes were read (0 at end of file).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        if !self.mode.read {
            return Err(Error::BadHandle("file not opened for reading"));
        }
        self.fs.read_at(&self.node, buf, offset)
    }

    /// [`read_at`](OpenNode::read_at) for a kernel that keeps what it reads in its page
    /// cache (the FUSE daemon's reads): the file is first marked as cached by the kernel
    /// ([`kernel_caches`](OpenNode::kernel_caches)).
    pub fn read_for_kernel(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        if !self.mode.read {
            return Err(Error::BadHandle("file not opened for reading"));
        }
        self.kernel_caches()?;
        self.fs.read_at(&self.node, buf, offset)
    }

    /// Marks the file as cached by the kernel, so that data-only clients, whose writes bypass
    /// the kernel, make it drop its pages: what the owner does before it reads the file for
    /// the kernel, or writes what the kernel keeps in its page cache too (FUSE writes of
    /// whole pages). Nothing for a client.
    pub fn kernel_caches(&self) -> Result<()> {
        self.fs.note_kernel_cached(self.node.h.ino)
    }

    /// Writes `buf` at `offset`; durable on return.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<usize> {
        if !self.mode.write {
            return Err(Error::BadHandle("file not opened for writing"));
        }
        self.fs.write_at(&self.node, buf, offset)
    }

    /// Copies up to `len` bytes at `offset` of this file to `to_offset` of `to` and returns
    /// how many it copied: fewer only when this file ends first, its size when the copy
    /// starts bounding it (as `copy_file_range(2)`). `to` may be this file, at a range that
    /// does not overlap the copied one ([`Error::InvalidArgument`] if it does). Holes are
    /// copied as zeros. The copy goes in pieces of at most 1 MiB, each one atomic and durable
    /// write, so a crash can leave a prefix of the copy behind (as `copy_file_range(2)` can).
    pub fn copy_range(&self, offset: u64, to: &OpenNode, to_offset: u64, len: u64) -> Result<u64> {
        if !to.mode.write {
            return Err(Error::BadHandle("file not opened for writing"));
        }
        // What the file holds when the copy starts: a copy into this file past its end must
        // not go on to copy what it wrote itself.
        let len = len.min(self.size()?.saturating_sub(offset));
        if self.ino() == to.ino() && offset.max(to_offset) < offset.min(to_offset) + len {
            return Err(Error::InvalidArgument(
                "copy between overlapping ranges of one file",
            ));
        }
        let mut buf = vec![0u8; len.min(COPY_CHUNK) as usize];
        let mut done = 0;
        while done < len {
            let want = (len - done).min(COPY_CHUNK) as usize;
            let n = self.read_at(&mut buf[..want], offset + done)?;
            if n == 0 {
                break;
            }
            to.write_at(&buf[..n], to_offset + done)?;
            done += n as u64;
        }
        Ok(done)
    }

    /// Appends `buf` at the end of the file as one atomic, durable update: the end is the size
    /// the log holds when the update commits, so appends of other handles and processes are
    /// never overwritten. Returns the offset the bytes landed at.
    pub fn append(&self, buf: &[u8]) -> Result<u64> {
        if !self.mode.write {
            return Err(Error::BadHandle("file not opened for writing"));
        }
        self.fs.append(&self.node, buf)
    }

    /// Truncates or extends the file.
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.fs.set_len(&self.node, size)
    }

    /// The file's size.
    pub fn size(&self) -> Result<u64> {
        self.fs.size_of(&self.node)
    }

    /// Orders every update before this call (every write is already durable on return).
    pub fn sync(&self) {
        self.fs.m().fence();
    }

    /// Closes this process's handle of the file's log if another process has the log open
    /// and nothing else in this process is using the handle; the next operation opens it
    /// again. A process that serves others (the FUSE daemon, after each request it served
    /// for the kernel) calls it so that a data-only client writing the file meanwhile is
    /// alone with the log: only then can the client free the log blocks its compactions
    /// retire (see `pmfs_core::log`, "Across processes"). A no-op in a data-only client.
    pub fn let_go_of_log(&self) -> Result<()> {
        self.fs.let_go_of_log(&self.node)
    }

    /// The mapped runs of logical blocks `[from, from + len)`, in order.
    fn runs(&self, from: u64, len: u64) -> Result<Vec<Run>> {
        self.fs.data_runs(&self.node, from, len)
    }

    /// The first offset at or after `offset` that holds data or starts a hole (end of file
    /// counts as a hole). `None` when `offset` is at or past end of file, or no data follows.
    pub fn seek(&self, offset: u64, target: SeekTarget) -> Result<Option<u64>> {
        let _il = self
            .fs
            .ilock(self.node.h.ino)
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let size = self.fs.size_of(&self.node)?;
        if offset >= size {
            return Ok(None);
        }
        let end_blk = size.div_ceil(BS);
        let mut blk = offset / BS;
        if target == SeekTarget::Data {
            let first = self.fs.first_data(&self.node, blk, end_blk - blk)?;
            return Ok(first.map(|l| (l * BS).max(offset)).filter(|&o| o < size));
        }
        // Past the mapping's bound only undigested entries map blocks: the rest of the file
        // is one lookup there, of the overlay alone.
        let bound = self.fs.mapped_bound(self.node.h.ino)?;
        let mut chunk = SEEK_FIRST;
        while blk < end_blk {
            let len = if blk < bound {
                chunk.min(bound - blk)
            } else {
                u64::MAX
            }
            .min(end_blk - blk);
            chunk = (chunk * 2).min(SEEK_CHUNK);
            let mut cursor = blk;
            for r in &self.runs(blk, len)? {
                if r.lblk > cursor {
                    break;
                }
                cursor = cursor.max(r.lblk + r.len);
            }
            if cursor < blk + len {
                return Ok(Some((cursor * BS).max(offset).min(size)));
            }
            blk += len;
        }
        Ok(Some(size))
    }

    /// Makes sure every block of `[offset, offset + len)` is allocated (holes get zeroed
    /// blocks) and, unless `keep_size`, that the file is at least `offset + len` long
    /// (`fallocate` modes 0 and `FALLOC_FL_KEEP_SIZE`; with KEEP_SIZE, blocks past end of
    /// file are allocated too). One atomic update.
    pub fn allocate(&self, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        if !self.mode.write {
            return Err(Error::BadHandle("file not opened for writing"));
        }
        self.fs.allocate(&self.node, offset, len, keep_size)
    }

    /// Makes `[offset, offset + len)` read as zeros, on allocated blocks, and unless
    /// `keep_size` the file at least `offset + len` long (`fallocate` with
    /// `FALLOC_FL_ZERO_RANGE`, and `FALLOC_FL_KEEP_SIZE`). One atomic update.
    pub fn zero_range(&self, offset: u64, len: u64, keep_size: bool) -> Result<()> {
        if !self.mode.write {
            return Err(Error::BadHandle("file not opened for writing"));
        }
        self.fs.zero_range(&self.node, offset, len, keep_size)
    }

    /// Deallocates `[offset, offset + len)` (clamped to the file): the range reads as zeros
    /// afterwards, the size does not change (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`).
    pub fn punch_hole(&self, offset: u64, len: u64) -> Result<()> {
        if !self.mode.write {
            return Err(Error::BadHandle("file not opened for writing"));
        }
        self.fs.punch_hole(&self.node, offset, len)
    }
}

impl Drop for OpenNode {
    fn drop(&mut self) {
        // The last handle of an unlinked file frees it. A failure leaves an orphan that the
        // next mount after a crash frees; nothing is lost by ignoring it here.
        let _ = self.fs.release_node(&self.node);
    }
}

/// What the objects of a volume occupy, for `pmfs info`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// Regular files.
    pub files: u64,
    /// Directories (the root included).
    pub dirs: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// FIFOs, sockets and device nodes.
    pub special: u64,
    /// Inodes that carry extended attributes.
    pub with_xattrs: u64,
    /// Sum of the regular files' sizes.
    pub file_bytes: u64,
    /// Data blocks mapped by regular files.
    pub file_blocks: u64,
    /// Physically contiguous runs those blocks form.
    pub file_extents: u64,
    /// Layout score of the regular files (HashFS paper §4.1, from Smith and Seltzer): the
    /// fraction of blocks that directly follow their file's previous block; 1.0 means every
    /// file is one contiguous run.
    pub layout_score: f64,
    /// The slots of the global HashFS table (`None` on the other mapping structures).
    pub hash_slots: Option<HashSlots>,
}

/// The slots of a HashFS volume's global table, each one data block of the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HashSlots {
    /// Slots never used, or emptied again: a lookup that misses stops at the first one.
    pub empty: u64,
    /// Freed slots that still lengthen the walks of lookups and claims past them.
    pub tombstones: u64,
    /// Slots that hold a block: mapped, staged for a new version, or claimed by an
    /// unfinished insert.
    pub in_use: u64,
}

impl Volume {
    /// Walks every live inode and measures what it occupies. `progress(done, total)` is
    /// called as the walk proceeds over the inode table.
    pub fn usage(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<Usage> {
        let fs = &*self.fs;
        let m = fs.m();
        let mut live = Vec::new();
        fs.inodes.scan(m, |ino, r| {
            if ino != 0 && r.is_live() {
                live.push((ino, r.kind(), r.size, r.xattr));
            }
            Ok(())
        })?;
        let total = live.len() as u64;
        let mut u = Usage::default();
        let mut files: Vec<Vec<pmfs_core::traits::Extent>> = Vec::new();
        for (i, (ino, kind, size, xattr)) in live.into_iter().enumerate() {
            progress(i as u64, total);
            u.with_xattrs += u64::from(xattr != 0);
            match kind {
                Some(Kind::File) => {}
                Some(Kind::Dir) => {
                    u.dirs += 1;
                    continue;
                }
                Some(Kind::Symlink) => {
                    u.symlinks += 1;
                    continue;
                }
                _ => {
                    u.special += 1;
                    continue;
                }
            }
            u.files += 1;
            u.file_bytes += size;
            let f = fs.map.open_file(fs.file_id(ino))?;
            // Below the mapped bound: the blocks allocated past the end of file count too.
            let blocks = fs.mapped_bound(ino)?.min(MAX_FILE_SIZE / BS);
            let mut extents: Vec<pmfs_core::traits::Extent> = Vec::new();
            let mut runs = Vec::new();
            fs.map.lookup(&f, 0, blocks, &mut runs)?;
            runs.sort_unstable_by_key(|r| r.lblk);
            for r in runs {
                u.file_blocks += r.len;
                match extents.last_mut() {
                    Some(e) if e.start.0 + e.len == r.pblk.0 => e.len += r.len,
                    _ => extents.push(pmfs_core::traits::Extent::new(r.pblk, r.len)),
                }
            }
            u.file_extents += extents.len() as u64;
            files.push(extents);
        }
        progress(total, total);
        u.layout_score = pmfs_alloc::aging::layout_score(&files);
        if let Stager::Hash(t) = &fs.stage {
            let o = t.occupancy()?;
            u.hash_slots = Some(HashSlots {
                empty: o.empty,
                tombstones: o.tombstones,
                in_use: o.tentative + o.committed + o.staged,
            });
        }
        Ok(u)
    }
}

/// The attributes of live incarnation `h` (the inode API's and a client's `getattr`).
pub(crate) fn attr_of(fs: &Fs, h: Handle) -> Result<Attr> {
    let md: Metadata = fs.stat(h)?;
    let rdev = fs.inodes.load(fs.m(), h.ino, field::RDEV)?;
    let blocks = match md.kind {
        Kind::File => fs.blocks_of(h, md.size)?,
        Kind::Dir => md.size.div_ceil(BS),
        Kind::Symlink => 1,
        _ => 0,
    } * (BS / 512);
    Ok(Attr {
        ino: Ino::of(h),
        kind: NodeKind::of(md.kind),
        perm: md.mode & 0o7777,
        uid: md.uid,
        gid: md.gid,
        nlink: md.nlink,
        size: md.size,
        blocks,
        atime: md.atime,
        mtime: md.mtime,
        ctime: md.ctime,
        btime: md.btime,
        rdev: if matches!(md.kind, Kind::CharDevice | Kind::BlockDevice) {
            rdev
        } else {
            0
        },
    })
}
