//! Open files and the simple data path of this part.
//!
//! Data is written in place with non-temporal stores; new blocks are mapped through the
//! volume's mapping structure first. A write is durable when it returns, but it is not
//! crash-atomic: a crash in the middle may leave some of its blocks written (the crash-atomic
//! OCC data path replaces this). What *is* guaranteed:
//!
//! - no block is ever mapped beyond end of file after recovery: a write that maps blocks
//!   there registers a journal cleanup that trims them if the size update does not happen;
//! - bytes past end of file inside the last block are zeroed before the file grows over them,
//!   so a hole or an extension always reads as zeros;
//! - truncation is journaled (size and times roll back together), then the blocks past the
//!   new end are unmapped; a crash in between is finished by the same trim cleanup.

use std::sync::OnceLock;

use pmfs_core::layout::BLOCK_SIZE;
use pmfs_core::traits::Run;

use super::Fs;
use super::path::{Follow, Target};
use crate::error::{Error, Result};
use crate::fs::MAX_FILE_SIZE;
use crate::inode::{Handle, Kind, field};
use crate::journal::{Cleanup, run_armed};
use crate::mapping::MapFile;

/// An open inode (shared by the handles of one `File`). Its mapping handle is opened on the
/// first data access, so opening and closing without I/O (create + close) costs nothing there.
#[derive(Debug)]
pub(crate) struct Node {
    pub h: Handle,
    map: OnceLock<MapFile>,
}

impl Node {
    /// A node whose mapping handle is opened on first use.
    pub fn new(h: Handle) -> Node {
        Node {
            h,
            map: OnceLock::new(),
        }
    }

    /// A node with an already open mapping handle.
    pub fn with_map(h: Handle, map: MapFile) -> Node {
        Node {
            h,
            map: OnceLock::from(map),
        }
    }
}

/// How to open a path.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct OpenReq {
    pub write: bool,
    pub truncate: bool,
    pub create: bool,
    pub create_new: bool,
    pub perm: u32,
}

const BS: u64 = BLOCK_SIZE;

impl Fs {
    /// Opens (and maybe creates) the file at `path`. The returned node is counted as open
    /// until [`release_node`](Fs::release_node).
    pub fn open(&self, path: &str, req: OpenReq) -> Result<Node> {
        if (req.write || req.create || req.create_new || req.truncate) && self.read_only {
            return Err(Error::ReadOnly);
        }
        let follow = if req.create_new {
            Follow::NoLast
        } else {
            Follow::Last
        };
        let mut attempts = 0;
        let mut created = false;
        let h = loop {
            attempts += 1;
            if attempts > 16 {
                return Err(Error::Busy);
            }
            let (parent, name, want_dir) = match self.resolve(path, follow)? {
                Target::Dir(_) => return Err(Error::IsADirectory),
                Target::Entry {
                    parent,
                    name,
                    want_dir,
                    ..
                } => (parent, name, want_dir),
            };
            if req.create || req.create_new {
                if want_dir {
                    return Err(Error::IsADirectory);
                }
                let o = self.open_or_create(&parent, &name, req.perm, req.create_new)?;
                match o.kind {
                    Kind::File => {
                        created = o.created;
                        break o.h;
                    }
                    Kind::Dir => return Err(Error::IsADirectory),
                    // Only reachable when the link changed under us: resolve again.
                    Kind::Symlink => continue,
                    // FIFOs, sockets and device nodes have no data in the volume: the
                    // kernel serves them, the embedding API cannot.
                    _ => return Err(Error::Unsupported("open of a special file")),
                }
            }
            let d = parent.inner.read().unwrap_or_else(|e| e.into_inner());
            if d.dead {
                return Err(Error::NotFound);
            }
            let s = d.get(&name).ok_or(Error::NotFound)?;
            match s.kind {
                Kind::Dir => return Err(Error::IsADirectory),
                Kind::Symlink => continue,
                Kind::File => {}
                _ => return Err(Error::Unsupported("open of a special file")),
            }
            self.open_inc(s.h.ino);
            break s.h;
        };
        let node = Node::new(h);
        // A file this call created is empty already.
        if req.truncate
            && req.write
            && !created
            && let Err(e) = self.set_len(&node, 0)
        {
            self.release_node(&node)?;
            return Err(e);
        }
        Ok(node)
    }

    /// Drops one open handle; frees the inode when it was the last handle of an unlinked
    /// file.
    pub fn release_node(&self, n: &Node) -> Result<()> {
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let (left, orphan) = self.release_open(n.h.ino);
        if left > 0 || !orphan || self.read_only {
            return Ok(());
        }
        let rec = self.inodes.read(self.m(), n.h.ino)?;
        if rec.state == n.h.live_state() && rec.nlink == 0 {
            self.free_inode(n.h, n.map.get(), false)?;
        }
        Ok(())
    }

    /// The mapping handle of `n`, opened on first use.
    pub fn node_map<'n>(&self, n: &'n Node) -> Result<&'n MapFile> {
        if let Some(m) = n.map.get() {
            return Ok(m);
        }
        let opened = self.map.open_file(self.file_id(n.h.ino))?;
        Ok(n.map.get_or_init(|| opened))
    }

    /// The file's size.
    pub fn size_of(&self, n: &Node) -> Result<u64> {
        self.inodes.load(self.m(), n.h.ino, field::SIZE)
    }

    fn zero(&self, off: pmfs_core::layout::PmOff, len: u64) -> Result<()> {
        if len > 0 {
            self.m().fill_nt(off, len, 0)?;
        }
        Ok(())
    }

    /// Zeroes the bytes past end of file in the last block up to `upto` (exclusive, clamped
    /// to the block end), if that block is mapped.
    fn zero_past_eof(&self, n: &Node, size: u64, upto: u64) -> Result<()> {
        if size.is_multiple_of(BS) || upto <= size {
            return Ok(());
        }
        let blk = size / BS;
        let end = upto.min((blk + 1) * BS);
        let mut runs = Vec::with_capacity(1);
        self.map.lookup(self.node_map(n)?, blk, 1, &mut runs)?;
        if let Some(r) = runs.first() {
            self.zero(r.pblk.offset() + size % BS, end - size)?;
        }
        Ok(())
    }

    /// Reads at `off`; returns the bytes read (0 at or past end of file).
    pub fn read_at(&self, n: &Node, buf: &mut [u8], off: u64) -> Result<usize> {
        let _il = self
            .ilock(n.h.ino)
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let size = self.size_of(n)?;
        if off >= size || buf.is_empty() {
            return Ok(0);
        }
        let len = (buf.len() as u64).min(size - off);
        let end = off + len;
        let first = off / BS;
        let last = (end - 1) / BS;
        let mut runs = Vec::new();
        self.map
            .lookup(self.node_map(n)?, first, last - first + 1, &mut runs)?;
        let out = &mut buf[..len as usize];
        out.fill(0);
        for r in &runs {
            let rs = r.lblk * BS;
            let re = (r.lblk + r.len) * BS;
            let s = rs.max(off);
            let e = re.min(end);
            if s < e {
                let phys = r.pblk.offset() + (s - rs);
                self.m()
                    .read(phys, &mut out[(s - off) as usize..(e - off) as usize])?;
            }
        }
        Ok(len as usize)
    }

    /// Writes `buf` at `off` (see the module documentation).
    pub fn write_at(&self, n: &Node, buf: &[u8], off: u64) -> Result<usize> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let end = off
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Error::FileTooLarge)?;
        let m = self.m();
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let size = self.size_of(n)?;
        let eof_blocks = size.div_ceil(BS);
        let first = off / BS;
        let last = (end - 1) / BS;
        if off > size {
            self.zero_past_eof(n, size, off)?;
        }
        let mut runs = Vec::new();
        self.map
            .lookup(self.node_map(n)?, first, last - first + 1, &mut runs)?;
        let mut holes = Vec::new();
        let mut cursor = first;
        for r in &runs {
            if r.lblk > cursor {
                holes.push((cursor, r.lblk - cursor));
            }
            cursor = r.lblk + r.len;
        }
        if cursor <= last {
            holes.push((cursor, last + 1 - cursor));
        }
        let mut tx = None;
        if holes.iter().any(|&(s, l)| s + l > eof_blocks) {
            let mut t = self.journal.begin();
            t.cleanup(Cleanup::Trim {
                inode: n.h,
                upto: last + 1,
            });
            t.arm(m)?;
            tx = Some(t);
        }
        let mut fresh: Vec<Run> = Vec::new();
        for &(s, l) in &holes {
            if let Err(e) = self.map.insert(self.node_map(n)?, s, l, &mut fresh) {
                for r in &fresh {
                    self.map.remove(self.node_map(n)?, r.lblk, r.len)?;
                }
                if let Some(t) = tx {
                    t.finish(m)?;
                }
                return Err(e);
            }
        }
        // Parts of fresh blocks that the write does not cover must read as zeros.
        for r in &fresh {
            let rs = r.lblk * BS;
            let re = (r.lblk + r.len) * BS;
            if rs < off {
                self.zero(r.pblk.offset(), (off - rs).min(re - rs))?;
            }
            if re > end {
                let from = end.max(rs);
                self.zero(r.pblk.offset() + (from - rs), re - from)?;
            }
        }
        runs.extend(fresh);
        for r in &runs {
            let rs = r.lblk * BS;
            let re = (r.lblk + r.len) * BS;
            let s = rs.max(off);
            let e = re.min(end);
            if s < e {
                let phys = r.pblk.offset() + (s - rs);
                m.write_nt(phys, &buf[(s - off) as usize..(e - off) as usize])?;
            }
        }
        m.fence();
        let now = self.now() as u64;
        if end > size {
            self.inodes.store(m, n.h.ino, field::SIZE, end)?;
        }
        self.inodes.store(m, n.h.ino, field::MTIME, now)?;
        self.inodes.store(m, n.h.ino, field::CTIME, now)?;
        m.fence();
        if let Some(t) = tx {
            t.finish(m)?;
        }
        Ok(buf.len())
    }

    /// Truncates or extends the file to `len` bytes.
    pub fn set_len(&self, n: &Node, len: u64) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly);
        }
        if len > MAX_FILE_SIZE {
            return Err(Error::FileTooLarge);
        }
        let m = self.m();
        let _il = self
            .ilock(n.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let size = self.size_of(n)?;
        let now = self.now() as u64;
        if len >= size {
            self.zero_past_eof(n, size, len)?;
            m.fence();
            self.inodes.store(m, n.h.ino, field::SIZE, len)?;
            self.inodes.store(m, n.h.ino, field::MTIME, now)?;
            self.inodes.store(m, n.h.ino, field::CTIME, now)?;
            m.fence();
            return Ok(());
        }
        // Shrink: size and times under the journal, then unmap past the new end; the trim
        // cleanup finishes the unmapping after a crash.
        let old_blocks = size.div_ceil(BS);
        let new_blocks = len.div_ceil(BS);
        let mut tx = self.journal.begin();
        for f in [field::SIZE, field::MTIME, field::CTIME] {
            tx.protect(self.inodes.field(n.h.ino, f));
        }
        tx.cleanup(Cleanup::Trim {
            inode: n.h,
            upto: old_blocks,
        });
        run_armed(&mut tx, m, |_| {
            self.inodes.store(m, n.h.ino, field::SIZE, len)?;
            self.inodes.store(m, n.h.ino, field::MTIME, now)?;
            self.inodes.store(m, n.h.ino, field::CTIME, now)
        })?;
        if old_blocks > new_blocks {
            self.map
                .remove(self.node_map(n)?, new_blocks, old_blocks - new_blocks)?;
        }
        tx.finish(m)
    }
}
