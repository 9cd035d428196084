//! The FUSE file system: fuser's [`Filesystem`] over a [`Volume`], by inode number.
//!
//! This module is plumbing: it turns requests into calls of the engine's inode-number API,
//! engine results into replies, and engine errors into errno ([`errno`], the only place that
//! does). What it decides itself is what FUSE leaves to a file system:
//!
//! - **Node ids.** The kernel's node id of an object is its [`Ino`] (inode number and
//!   generation in one word), except the root, which FUSE calls 1. A node id therefore never
//!   names a later object that reuses the inode number: such requests fail with `ENOENT`.
//!   `st_ino` is the node id too, stable across remounts.
//! - **Ownership of new objects.** Owner is the caller; the group is the caller's, or the
//!   directory's when the directory is set-group-ID (new subdirectories inherit the bit). A
//!   caller outside the new file's group loses a requested set-group-ID bit.
//! - **Permissions.** The mount uses `default_permissions`: the kernel checks modes, sticky
//!   directories, who may chown/chmod/utime, and clears set-user-ID/set-group-ID bits on
//!   write and chown (it sends the mode change). [`access`](Filesystem::access) answers from
//!   the same mode bits, with the caller's supplementary groups.
//! - **Caching.** Attributes of regular files are cached for `attr_timeout` (default 0:
//!   every `stat` asks, so sizes and times written by data clients that bypass the kernel
//!   are never stale), those of everything else as long as names (see `PmfsFs::attr_ttl`),
//!   names for `entry_timeout` (default 1 s: only the daemon changes names, and the kernel keeps
//!   its own name cache exact), and so is the absence of a name (a negative entry: the
//!   kernel turns it into the new name when a file is created through the mount, which is
//!   the only way names change; `sqlite3` looks for its journal and WAL files before every
//!   transaction). The kernel keeps a file's pages from one open to the next and drops
//!   them when it sees mtime or size change (`FUSE_AUTO_INVAL_DATA`). Reads and writes for
//!   the kernel mark the file as cached by it first ([`OpenNode::kernel_caches`]), so that a
//!   data client's write, which the kernel does not see, moves the mtime: the next open or
//!   read through the kernel then drops the pages it holds. Kernel mappings fetch no
//!   attributes: the client also asks the daemon to have the kernel drop them
//!   (`FUSE_NOTIFY_INVAL_INODE`, [`pmfs::kernel_pages`], served by a thread of `mount`).
//! - **Requests declined for good.** OPEN, FLUSH, FSYNC, FSYNCDIR and OPENDIR are answered
//!   `ENOSYS`, which the kernel takes as "succeed without asking from now on": every update
//!   is durable when it returns, and neither files nor directory listings need per-open
//!   state, so `open`, `close`, `fsync` and `opendir` cost no round trip (`sqlite3` does all
//!   of them per transaction). Once it has had an OPEN declined, the kernel sends no RELEASE
//!   either. CREATE is declined too: the kernel then makes files with MKNOD, whose reply
//!   lets it keep the new name for `entry_timeout`, and opens them like any other file.
//! - **Files by node id.** With no opens, the kernel's reads and writes name a file by its
//!   node id alone (file handle 0). The daemon serves them through one engine handle per
//!   regular file the kernel knows (`Known`), and that handle is what keeps a file alive
//!   while the kernel has it open after its last name went: the kernel counts every reply
//!   that gives it a node id, and forgets them all (FORGET) only once it drops the inode,
//!   which it does only when no open description has it. An `O_TRUNC` open truncates with
//!   a SETATTR (no `FUSE_ATOMIC_O_TRUNC`, which would leave the truncation to the OPEN).
//! - **Set-ID bits are the daemon's.** With `FUSE_HANDLE_KILLPRIV_V2` the daemon clears
//!   set-user-ID and set-group-ID (with group-execute) where the kernel's VFS would: flagged
//!   writes, changes of owner, truncations (O_TRUNC opens included), fallocate and copies by
//!   callers other than root. In exchange the kernel stops asking for `security.capability`
//!   before every write (it asks once per inode, and still removes file capabilities itself).
//! - **Appends go to the real end.** A WRITE on an `O_APPEND` description appends at the
//!   size the file has, not at the offset the kernel chose from the size it cached, which a
//!   preload client may have changed since. (So `pwritev2(RWF_NOAPPEND)` on such a
//!   description appends too, and `RWF_APPEND` on another one writes at the kernel's size.)
//! - **Copies stay in the daemon.** COPY_FILE_RANGE (what `cp` and `cat` use between files
//!   on the mount) is one request that the daemon serves with the engine's
//!   [`OpenNode::copy_range`], instead of the kernel's fallback of a READ and a WRITE request
//!   per piece.
//! - **Concurrency.** fuser runs several event-loop threads, each with its own cloned
//!   `/dev/fuse` descriptor; handlers run on them concurrently (the engine is `Sync`). On a
//!   mount with a poll window every handler first tells the [poller](crate::poll), which
//!   keeps one of those threads polling for the next request.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use pmfs::{
    Attr, AttrChange, Ino, NodeKind, OpenMode, OpenNode, Owner, SeekTarget, SetTime, Volume,
    XattrSet,
};

use crate::poll::Poller;

/// Largest attribute value the kernel passes (`XATTR_SIZE_MAX`).
const XATTR_SIZE_MAX: usize = 65536;
const S_ISGID: u32 = 0o2000;

/// How long the kernel may cache what the daemon tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Attributes (`attr_timeout`).
    pub attr: Duration,
    /// Names (`entry_timeout`).
    pub entry: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            attr: Duration::ZERO,
            entry: Duration::from_secs(1),
        }
    }
}

/// The attributes of a negative entry: node id 0, which tells the kernel the name does not
/// exist (the rest is ignored).
const NO_ENTRY: FileAttr = FileAttr {
    ino: INodeNo(0),
    size: 0,
    blocks: 0,
    atime: UNIX_EPOCH,
    mtime: UNIX_EPOCH,
    ctime: UNIX_EPOCH,
    crtime: UNIX_EPOCH,
    kind: FileType::RegularFile,
    perm: 0,
    nlink: 0,
    uid: 0,
    gid: 0,
    rdev: 0,
    blksize: 4096,
    flags: 0,
};

/// The errno for an engine error (the one conversion point).
pub fn errno(e: &pmfs::Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

fn file_type(k: NodeKind) -> FileType {
    match k {
        NodeKind::File => FileType::RegularFile,
        NodeKind::Dir => FileType::Directory,
        NodeKind::Symlink => FileType::Symlink,
        NodeKind::Fifo => FileType::NamedPipe,
        NodeKind::Socket => FileType::Socket,
        NodeKind::CharDevice => FileType::CharDevice,
        NodeKind::BlockDevice => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// `FS_IOC_FSGETXATTR` and `FS_IOC_FSSETXATTR` (linux/fs.h): the inode flags in the form XFS
/// introduced, with a project id, as a `struct fsxattr` of 28 bytes.
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;
/// The size of `struct fsxattr`, the largest answer [`inode_flags_request`] gives.
const FSXATTR_SIZE: usize = 28;

/// The answer to ioctl `cmd` with argument `arg` on a file or directory: the number of zero
/// bytes it reads back, or the errno. The kernel asks the daemon for the inode flags `lsattr`
/// shows and `chattr` sets (append-only, immutable, no-dump and the like: `FS_IOC_GETFLAGS`
/// and `FS_IOC_SETFLAGS`, or their XFS form). pmfs keeps none: reading them answers none,
/// setting none (what `chattr -i` of a file without the flag asks) succeeds, and setting any
/// fails with `EOPNOTSUPP`, as on a tmpfs before Linux 6.0. Nothing else is a request pmfs
/// knows (`ENOTTY`, which `isatty` reads as "not a terminal").
fn inode_flags_request(cmd: u32, arg: &[u8]) -> Result<usize, Errno> {
    let zero = |at: std::ops::Range<usize>| arg.get(at).is_some_and(|b| b.iter().all(|&x| x == 0));
    match cmd {
        // An int, whatever the request's number says.
        c if c == libc::FS_IOC_GETFLAGS as u32 => Ok(size_of::<libc::c_int>()),
        c if c == libc::FS_IOC_SETFLAGS as u32 => {
            if zero(0..4) {
                Ok(0)
            } else {
                Err(Errno::EOPNOTSUPP)
            }
        }
        FS_IOC_FSGETXATTR => Ok(FSXATTR_SIZE),
        // The flags (bytes 0..4) and the project id (12..16); the extent size hints mean
        // nothing without the flags that enable them.
        FS_IOC_FSSETXATTR => {
            if zero(0..4) && zero(12..16) {
                Ok(0)
            } else {
                Err(Errno::EOPNOTSUPP)
            }
        }
        _ => Err(Errno::ENOTTY),
    }
}

fn node_kind(mode: u32) -> Option<NodeKind> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => Some(NodeKind::File),
        libc::S_IFIFO => Some(NodeKind::Fifo),
        libc::S_IFSOCK => Some(NodeKind::Socket),
        libc::S_IFCHR => Some(NodeKind::CharDevice),
        libc::S_IFBLK => Some(NodeKind::BlockDevice),
        _ => None,
    }
}

/// The supplementary groups of process `pid` (from `/proc`), empty if it is gone.
fn groups_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

fn in_group(req: &Request, gid: u32) -> bool {
    req.gid() == gid || groups_of(req.pid()).contains(&gid)
}

/// The file system a `pmfs mount` daemon serves.
#[derive(Debug)]
pub struct PmfsFs {
    vol: Volume,
    root: Ino,
    ttl: Timeouts,
    /// The regular files whose node ids the kernel holds.
    known: Mutex<HashMap<Ino, Known>>,
    /// The poll window's switch, on a mount with one (`-o poll`).
    poller: Option<Arc<Poller>>,
}

/// A regular file whose node id the kernel holds (see the module documentation).
#[derive(Debug, Default)]
struct Known {
    /// Replies that gave the kernel the node id, less the ones it forgot. Counted before
    /// the reply goes out, so the kernel cannot forget one first; a reply that does not
    /// reach the kernel leaves one too many, which only keeps the handle open until the
    /// mount ends.
    lookups: u64,
    /// The handle the kernel's requests go through: opened at the first of them, or before
    /// the file loses a name (if that was its last, the handle keeps it alive), and closed
    /// when the kernel forgets the file.
    node: Option<Arc<OpenNode>>,
}

impl PmfsFs {
    /// A file system serving `vol`.
    pub fn new(vol: Volume, ttl: Timeouts) -> PmfsFs {
        PmfsFs {
            root: vol.root(),
            vol,
            ttl,
            known: Mutex::new(HashMap::new()),
            poller: None,
        }
    }

    /// The file system with a poll window: every request starts one (see [`crate::poll`]).
    pub fn with_poller(mut self, poller: Arc<Poller>) -> PmfsFs {
        self.poller = Some(poller);
        self
    }

    /// Called first by every request handler.
    fn busy(&self) {
        if let Some(p) = &self.poller {
            p.request();
        }
    }

    fn ino(&self, n: INodeNo) -> Ino {
        if n == INodeNo::ROOT {
            self.root
        } else {
            Ino::from_raw(n.0)
        }
    }

    fn node_id(&self, ino: Ino) -> INodeNo {
        if ino == self.root {
            INodeNo::ROOT
        } else {
            INodeNo(ino.raw())
        }
    }

    /// How long the kernel may cache the attributes of an object of kind `kind`. A regular
    /// file's size and times change behind the kernel's back (preload clients write it in
    /// userspace), so they are never cached (`attr_timeout`, default 0). Everything else
    /// changes only through the mount, and the kernel drops what it cached of a directory
    /// whenever it creates or removes an entry there: those attributes are cached as long
    /// as names (`entry_timeout`, when longer). Directories matter most: with
    /// `default_permissions` the kernel checks search permission on every directory of
    /// every path it walks, and asks for attributes it may not cache each time.
    fn attr_ttl(&self, kind: NodeKind) -> Duration {
        match kind {
            NodeKind::File => self.ttl.attr,
            _ => self.ttl.attr.max(self.ttl.entry),
        }
    }

    fn attr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: self.node_id(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: time(a.atime),
            mtime: time(a.mtime),
            ctime: time(a.ctime),
            crtime: time(a.btime),
            kind: file_type(a.kind),
            perm: a.perm as u16,
            nlink: u32::try_from(a.nlink).unwrap_or(u32::MAX),
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev as u32,
            blksize: 4096,
            flags: 0,
        }
    }

    fn entry(&self, reply: ReplyEntry, r: pmfs::Result<Attr>) {
        match r {
            Ok(a) => {
                self.told(&a);
                reply.entry_with_ttls(
                    &self.attr_ttl(a.kind),
                    &self.ttl.entry,
                    &self.attr(&a),
                    Generation(u64::from(a.ino.generation())),
                )
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn known_files(&self) -> MutexGuard<'_, HashMap<Ino, Known>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a reply that gives the kernel `a`'s node id, if `a` is a regular file
    /// ([`Known::lookups`]).
    fn told(&self, a: &Attr) {
        if a.kind == NodeKind::File {
            self.known_files().entry(a.ino).or_default().lookups += 1;
        }
    }

    /// The handle through which the kernel's requests on regular file `ino` go
    /// ([`Known::node`]), opened at the first one. A file the kernel names without a count
    /// here (which it should not do) keeps its handle until the kernel forgets it.
    fn file(&self, ino: INodeNo) -> Result<Arc<OpenNode>, Errno> {
        let ino = self.ino(ino);
        let mut known = self.known_files();
        if let Some(node) = known.get(&ino).and_then(|k| k.node.clone()) {
            return Ok(node);
        }
        let node = Arc::new(self.open_for_kernel(ino).map_err(|e| errno(&e))?);
        known.entry(ino).or_default().node = Some(node.clone());
        Ok(node)
    }

    /// The handle of `ino` for the kernel's requests, if it is open ([`Known::node`]).
    fn kernel_handle(&self, ino: Ino) -> Option<Arc<OpenNode>> {
        self.known_files().get(&ino).and_then(|k| k.node.clone())
    }

    /// A handle of `ino` for the kernel's requests: reads and writes, whatever the access
    /// mode of the kernel's open description (the kernel checked it), and reads alone on a
    /// read-only volume.
    fn open_for_kernel(&self, ino: Ino) -> pmfs::Result<OpenNode> {
        let mode = OpenMode {
            read: true,
            write: true,
            truncate: false,
        };
        match self.vol.open_ino(ino, mode) {
            Err(pmfs::Error::ReadOnly) => self.vol.open_ino(
                ino,
                OpenMode {
                    write: false,
                    ..mode
                },
            ),
            r => r,
        }
    }

    /// Before `name` in `parent` goes: if it names a regular file the kernel knows, opens
    /// the file's handle for the kernel ([`Known::node`]), which keeps the file alive while
    /// the kernel may still have it open, should the name be its last.
    fn keep_for_kernel(&self, parent: Ino, name: &[u8]) -> pmfs::Result<()> {
        let a = match self.vol.lookup(parent, name) {
            Ok(a) if a.kind == NodeKind::File => a,
            // The removal itself reports what is wrong with the name.
            _ => return Ok(()),
        };
        let mut known = self.known_files();
        if let Some(k) = known.get_mut(&a.ino)
            && k.node.is_none()
        {
            k.node = Some(Arc::new(self.open_for_kernel(a.ino)?));
        }
        Ok(())
    }

    /// After a request on `f` was answered: lets go of the file's log if a data client has
    /// it open too ([`OpenNode::let_go_of_log`]), so that the client can free the log blocks
    /// its compactions retire while the kernel keeps the file open (a `tail -f` of a file a
    /// program under the library writes). The next request opens the log again. A failure
    /// (of the digest before the close) is met again by the next digest of the log; the
    /// request itself has been answered.
    fn served(f: &OpenNode) {
        let _ = f.let_go_of_log();
    }

    /// Owner, group and permission bits of an object `req` creates in `parent`.
    fn new_owner(
        &self,
        req: &Request,
        parent: Ino,
        mode: u32,
        umask: u32,
        dir: bool,
    ) -> pmfs::Result<(Owner, u32)> {
        let p = self.vol.getattr(parent)?;
        let mut perm = mode & 0o7777 & !umask;
        let gid = if p.perm & S_ISGID != 0 {
            if dir {
                perm |= S_ISGID;
            }
            p.gid
        } else {
            req.gid()
        };
        if !dir && perm & S_ISGID != 0 && req.uid() != 0 && !in_group(req, gid) {
            perm &= !S_ISGID;
        }
        Ok((
            Owner {
                uid: req.uid(),
                gid,
            },
            perm,
        ))
    }

    /// Clears the set-ID bits ([`Attr::privilege_bits`]) of `ino` if it is a regular file, as a
    /// write, a truncation or a change of owner does. Under `FUSE_HANDLE_KILLPRIV_V2` this is
    /// the daemon's job: the kernel flags the writes (`FUSE_WRITE_KILL_SUIDGID`) of callers
    /// without `CAP_FSETID`, and sends changes of owner and truncations (those of O_TRUNC
    /// opens too) without clearing anything. (It still removes `security.capability` itself.)
    fn kill_suid_sgid(&self, ino: Ino) -> pmfs::Result<()> {
        let Some(perm) = self.without_privileges(ino)? else {
            return Ok(());
        };
        let change = AttrChange {
            perm: Some(perm),
            ..AttrChange::default()
        };
        self.vol.set_attr(ino, change, None).map(drop)
    }

    /// The permission bits of `ino` without its [`Attr::privilege_bits`], if it has any.
    fn without_privileges(&self, ino: Ino) -> pmfs::Result<Option<u32>> {
        let a = self.vol.getattr(ino)?;
        let bits = a.privilege_bits();
        Ok((bits != 0).then_some(a.perm & !bits))
    }

    fn list(
        &self,
        ino: Ino,
        offset: u64,
        mut add: impl FnMut(u64, Ino, NodeKind, &[u8]) -> bool,
    ) -> pmfs::Result<()> {
        // Offsets: 1 after ".", 2 after "..", entry position + 3 after an entry.
        if offset == 0 && add(1, ino, NodeKind::Dir, b".") {
            return Ok(());
        }
        if offset <= 1 {
            let parent = self.vol.parent_of(ino)?;
            if add(2, parent, NodeKind::Dir, b"..") {
                return Ok(());
            }
        }
        let mut after = offset.checked_sub(3);
        loop {
            let batch = self.vol.list_dir(ino, after, 128)?;
            if batch.is_empty() {
                return Ok(());
            }
            for e in &batch {
                if add(e.pos + 3, e.ino, e.kind, &e.name) {
                    return Ok(());
                }
                after = Some(e.pos);
            }
        }
    }
}

impl Filesystem for PmfsFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_AUTO_INVAL_DATA
            // Not FUSE_ATOMIC_O_TRUNC: the kernel would leave an O_TRUNC open's truncation
            // to the OPEN, which it does not send.
            | InitFlags::FUSE_PARALLEL_DIROPS
            // The daemon clears set-ID bits itself (`kill_suid_sgid`). Without this the
            // kernel asks for `security.capability` before every write, a second round trip
            // per write; with it the kernel asks once per inode and remembers the answer.
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        let _ = config.add_capabilities(wanted & config.capabilities());
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.busy();
        match self.vol.lookup(self.ino(parent), name.as_bytes()) {
            // Node id 0 with a timeout: the kernel caches that the name does not exist.
            Err(e) if e.errno() == libc::ENOENT && !self.ttl.entry.is_zero() => {
                reply.entry_with_ttls(&Duration::ZERO, &self.ttl.entry, &NO_ENTRY, Generation(0))
            }
            r => self.entry(reply, r),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.busy();
        let ino = self.ino(ino);
        let gone = {
            let mut known = self.known_files();
            match known.get_mut(&ino) {
                Some(k) if k.lookups > nlookup => {
                    k.lookups -= nlookup;
                    None
                }
                Some(_) => known.remove(&ino),
                None => None,
            }
        };
        // Closing the handle frees an unlinked file: not under the lock.
        drop(gone);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.busy();
        let ino = self.ino(ino);
        // Every open asks first (the attributes of regular files are not cached), and the
        // daemon is not told of closes: this is where it looks for what killed data clients
        // left on the file, before the caller goes on to use it. Its own handle of the log
        // goes first if another process has the log open. A failure (of the media) is met
        // again by the next look, or by the next mount.
        if let Some(f) = self.kernel_handle(ino) {
            Self::served(&f);
        }
        let _ = self.vol.look_for_dead_pins(ino);
        // The kernel's handle of an unlinked file keeps it alive: its attributes stay
        // readable.
        match self.vol.getattr(ino) {
            Ok(a) => reply.attr(&self.attr_ttl(a.kind), &self.attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.busy();
        let set = |t: TimeOrNow| match t {
            TimeOrNow::Now => SetTime::Now,
            TimeOrNow::SpecificTime(t) => SetTime::At(ns(t)),
        };
        let mut change = AttrChange {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(set),
            mtime: mtime.map(set),
        };
        let ino = self.ino(ino);
        // A truncation goes through the kernel's handle of the file if it has one.
        let via = self.kernel_handle(ino);
        // A change of owner clears the set-ID bits of a regular file whoever makes it; a
        // truncation when its caller lacks CAP_FSETID (the kernel's FATTR_KILL_SUIDGID, which
        // fuser does not pass on; uid 0 stands for the capability). An explicit mode wins.
        let owner = uid.is_some() || gid.is_some();
        if change.perm.is_none() && (owner || (size.is_some() && req.uid() != 0)) {
            match self.without_privileges(ino) {
                Ok(perm) => change.perm = perm,
                Err(e) => return reply.error(errno(&e)),
            }
        }
        match self.vol.set_attr(ino, change, via.as_deref()) {
            Ok(a) => reply.attr(&self.attr_ttl(a.kind), &self.attr(&a)),
            Err(e) => reply.error(errno(&e)),
        }
        if let Some(f) = via {
            Self::served(&f);
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.busy();
        match self.vol.readlink(self.ino(ino)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.busy();
        let Some(kind) = node_kind(mode) else {
            return reply.error(Errno::EINVAL);
        };
        let parent = self.ino(parent);
        let r = self
            .new_owner(req, parent, mode, umask, false)
            .and_then(|(owner, perm)| {
                self.vol
                    .mknod(parent, name.as_bytes(), kind, perm, owner, u64::from(rdev))
            });
        self.entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.busy();
        let parent = self.ino(parent);
        let r = self
            .new_owner(req, parent, mode, umask, true)
            .and_then(|(owner, perm)| self.vol.mkdir(parent, name.as_bytes(), perm, owner));
        self.entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.busy();
        let parent = self.ino(parent);
        let r = self
            .keep_for_kernel(parent, name.as_bytes())
            .and_then(|()| self.vol.unlink_at(parent, name.as_bytes()));
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.busy();
        match self.vol.rmdir_at(self.ino(parent), name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.busy();
        let parent = self.ino(parent);
        let r = self
            .new_owner(req, parent, 0o777, 0, false)
            .and_then(|(owner, _)| {
                self.vol.symlink_at(
                    parent,
                    link_name.as_bytes(),
                    target.as_os_str().as_bytes(),
                    owner,
                )
            });
        self.entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.busy();
        let known = RenameFlags::RENAME_NOREPLACE | RenameFlags::RENAME_EXCHANGE;
        if !known.contains(flags) {
            return reply.error(Errno::EINVAL);
        }
        let flags = pmfs::RenameFlags {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        let newparent = self.ino(newparent);
        let r = self
            .keep_for_kernel(newparent, newname.as_bytes())
            .and_then(|()| {
                self.vol.rename_at(
                    self.ino(parent),
                    name.as_bytes(),
                    newparent,
                    newname.as_bytes(),
                    flags,
                )
            });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.busy();
        let r = self
            .vol
            .link_at(self.ino(ino), self.ino(newparent), newname.as_bytes());
        self.entry(reply, r);
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.busy();
        // Files need no per-open state (see the module documentation): ENOSYS lets the
        // kernel open them without asking (FUSE_NO_OPEN_SUPPORT), and close them without a
        // RELEASE. It then truncates for O_TRUNC with a SETATTR, which clears the set-ID
        // bits of a caller without CAP_FSETID as any truncation does.
        reply.error(Errno::ENOSYS);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.busy();
        let f = match self.file(ino) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let mut buf = vec![0u8; size as usize];
        match f.read_for_kernel(&mut buf, offset) {
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => reply.error(errno(&e)),
        }
        Self::served(&f);
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.busy();
        let f = match self.file(ino) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        // The kernel keeps the pages of whole-page writes.
        if let Err(e) = f.kernel_caches() {
            return reply.error(errno(&e));
        }
        if write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            && let Err(e) = self.kill_suid_sgid(f.ino())
        {
            return reply.error(errno(&e));
        }
        // On an O_APPEND description the kernel puts the write at the size it last saw, which
        // is stale when a preload client grew the file since: append at the real end instead.
        let r = if flags.0 & libc::O_APPEND != 0 {
            f.append(data).map(|_| data.len())
        } else {
            f.write_at(data, offset)
        };
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
        Self::served(&f);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.busy();
        // Nothing is buffered (every write is durable when it returns) and locks stay with
        // the kernel, so `close` has nothing to ask: ENOSYS makes the kernel stop sending
        // FLUSH for the rest of the mount, a round trip saved on every close.
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.busy();
        // Every write and attribute change is durable when it returns, and the kernel writes
        // its dirty pages (shared mappings) back before it asks: ENOSYS tells it that fsync
        // needs no round trip here, from now on.
        reply.error(Errno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.busy();
        // Listings go by node id and offset and need no per-open state: ENOSYS lets the
        // kernel open directories without asking (FUSE_NO_OPENDIR_SUPPORT), and then it
        // sends no RELEASEDIR either. A directory removed meanwhile fails at READDIR.
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.busy();
        let r = self.list(self.ino(ino), offset, |next, ino, kind, name| {
            reply.add(
                self.node_id(ino),
                next,
                file_type(kind),
                OsStr::from_bytes(name),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.busy();
        let dir = self.ino(ino);
        let r = self.list(dir, offset, |next, ino, _, name| {
            match self.vol.getattr(ino) {
                Ok(a) => {
                    let full = reply.add(
                        self.node_id(ino),
                        next,
                        OsStr::from_bytes(name),
                        &self.attr_ttl(a.kind),
                        &self.attr(&a),
                        Generation(u64::from(ino.generation())),
                    );
                    // The kernel counts every entry it gets (but "." and "..", which are
                    // not regular files).
                    if !full {
                        self.told(&a);
                    }
                    full
                }
                // Removed since the listing was taken: skip it.
                Err(_) => false,
            }
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.busy();
        // Name changes are durable when they return (see `fsync`).
        reply.error(Errno::ENOSYS);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.busy();
        match self.vol.statfs() {
            Ok(s) => reply.statfs(
                s.total_blocks,
                s.free_blocks,
                s.free_blocks,
                s.total_inodes,
                s.free_inodes,
                s.block_size as u32,
                s.name_max as u32,
                s.block_size as u32,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        self.busy();
        let name = name.as_bytes();
        if let Err(e) = check_xattr_name(name) {
            return reply.error(e);
        }
        if value.len() > XATTR_SIZE_MAX {
            return reply.error(Errno::E2BIG);
        }
        let how = match flags {
            0 => XattrSet::Any,
            libc::XATTR_CREATE => XattrSet::Create,
            libc::XATTR_REPLACE => XattrSet::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        match self.vol.set_xattr(self.ino(ino), name, value, how) {
            Ok(true) => reply.ok(),
            Ok(false) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.busy();
        let name = name.as_bytes();
        if let Err(e) = check_xattr_name(name) {
            return reply.error(e);
        }
        match self.vol.get_xattr(self.ino(ino), name) {
            Ok(Some(v)) => sized(reply, size, &v),
            Ok(None) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.busy();
        match self.vol.list_xattr(self.ino(ino)) {
            Ok(names) => {
                let mut buf = Vec::new();
                for n in names {
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                sized(reply, size, &buf);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.busy();
        let name = name.as_bytes();
        if let Err(e) = check_xattr_name(name) {
            return reply.error(e);
        }
        match self.vol.remove_xattr(self.ino(ino), name) {
            Ok(true) => reply.ok(),
            Ok(false) => reply.error(Errno::NO_XATTR),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        self.busy();
        match inode_flags_request(cmd, in_data) {
            Ok(out) => {
                let zeros = [0u8; FSXATTR_SIZE];
                reply.ioctl(0, &zeros[..out.min(out_size as usize)]);
            }
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        self.busy();
        let a = match self.vol.getattr(self.ino(ino)) {
            Ok(a) => a,
            Err(e) => return reply.error(errno(&e)),
        };
        if may_access(req, &a, mask) {
            reply.ok();
        } else {
            reply.error(Errno::EACCES);
        }
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        self.busy();
        // ENOSYS makes the kernel create files with MKNOD from now on, and then open them as
        // any other (OPEN is declined too). The reason is the name's lifetime: a CREATE
        // reply gives name and attributes one, which must be the attributes' (none: see
        // `attr_ttl`), so the kernel would look the new name up again at its next use (the
        // `unlink` of a `sqlite3` journal, the `rename` of a file saved under a temporary
        // name). A MKNOD reply keeps the name for `entry_timeout`.
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.busy();
        let f = match self.file(ino) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        let zero = libc::FALLOC_FL_ZERO_RANGE;
        let zero_keep = zero | libc::FALLOC_FL_KEEP_SIZE;
        if ![0, libc::FALLOC_FL_KEEP_SIZE, punch, zero, zero_keep].contains(&mode) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        // The kernel's attempt to clear the set-ID bits before a fallocate reaches the daemon
        // as nothing under FUSE_HANDLE_KILLPRIV_V2; the request carries no flag either.
        if req.uid() != 0
            && let Err(e) = self.kill_suid_sgid(f.ino())
        {
            return reply.error(errno(&e));
        }
        let r = match mode {
            0 => f.allocate(offset, length, false),
            libc::FALLOC_FL_KEEP_SIZE => f.allocate(offset, length, true),
            m if m == zero => f.zero_range(offset, length, false),
            m if m == zero_keep => f.zero_range(offset, length, true),
            _ => f.punch_hole(offset, length),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
        Self::served(&f);
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.busy();
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let (src, dst) = match (self.file(ino_in), self.file(ino_out)) {
            (Ok(src), Ok(dst)) => (src, dst),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        // Like fallocate: the kernel's attempt to clear set-ID bits before the copy reaches
        // the daemon as nothing, and the request carries no flag.
        if req.uid() != 0
            && let Err(e) = self.kill_suid_sgid(dst.ino())
        {
            return reply.error(errno(&e));
        }
        // The reply counts bytes in 32 bits; the caller asks again for the rest.
        let len = len.min(u64::from(u32::MAX) & !(pmfs_core::layout::BLOCK_SIZE - 1));
        match src.copy_range(offset_in, &dst, offset_out, len) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
        Self::served(&src);
        Self::served(&dst);
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.busy();
        let f = match self.file(ino) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let target = match whence {
            libc::SEEK_DATA => SeekTarget::Data,
            libc::SEEK_HOLE => SeekTarget::Hole,
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match f.seek(offset, target) {
            Ok(Some(o)) => reply.offset(o as i64),
            Ok(None) => reply.error(Errno::ENXIO),
            Err(e) => reply.error(errno(&e)),
        }
        Self::served(&f);
    }
}

/// Attribute namespaces the volume stores (POSIX ACLs in `system.` are not supported).
fn check_xattr_name(name: &[u8]) -> Result<(), Errno> {
    if name.len() > pmfs::XATTR_NAME_MAX {
        return Err(Errno::ERANGE);
    }
    let ok = [&b"user."[..], b"trusted.", b"security."]
        .iter()
        .any(|ns| name.starts_with(ns) && name.len() > ns.len());
    if ok { Ok(()) } else { Err(Errno::EOPNOTSUPP) }
}

/// Replies with `data`, or with its size when the caller asked for the size (`size == 0`).
fn sized(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if data.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(data);
    }
}

/// Whether `req`'s caller may access `a` as `mask` asks (`access(2)` rules).
fn may_access(req: &Request, a: &Attr, mask: AccessFlags) -> bool {
    let want = (mask.bits() & 7) as u32;
    if req.uid() == 0 {
        // Root may read and write anything, and execute what anybody may execute.
        return want & 1 == 0 || a.kind == NodeKind::Dir || a.perm & 0o111 != 0;
    }
    let bits = if req.uid() == a.uid {
        a.perm >> 6
    } else if in_group(req, a.gid) {
        a.perm >> 3
    } else {
        a.perm
    } & 7;
    bits & want == want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_namespaces_and_name_lengths_are_checked() {
        assert_eq!(check_xattr_name(b"user.a"), Ok(()));
        assert_eq!(check_xattr_name(b"trusted.x"), Ok(()));
        assert_eq!(check_xattr_name(b"security.selinux"), Ok(()));
        assert_eq!(check_xattr_name(b"user."), Err(Errno::EOPNOTSUPP));
        assert_eq!(
            check_xattr_name(b"system.posix_acl_access"),
            Err(Errno::EOPNOTSUPP)
        );
        assert_eq!(check_xattr_name(b"plain"), Err(Errno::EOPNOTSUPP));
        let long = [b"user.".as_slice(), &[b'x'; 251]].concat();
        assert_eq!(check_xattr_name(&long), Err(Errno::ERANGE));
    }

    #[test]
    fn modes_times_and_errors_convert_at_the_edge() {
        assert_eq!(node_kind(libc::S_IFIFO | 0o644), Some(NodeKind::Fifo));
        assert_eq!(node_kind(libc::S_IFCHR), Some(NodeKind::CharDevice));
        assert_eq!(node_kind(libc::S_IFDIR), None);
        for t in [0i64, 1, -1, 1_700_000_000_123_456_789, -86_400_000_000_001] {
            assert_eq!(ns(time(t)), t);
        }
        assert_eq!(errno(&pmfs::Error::NotFound), Errno::ENOENT);
        assert_eq!(errno(&pmfs::Error::DirectoryNotEmpty), Errno::ENOTEMPTY);
        assert_eq!(errno(&pmfs::Error::NoSpace), Errno::ENOSPC);
    }
}
