//! Open files and the options to open them with (like `std::fs::File` / `OpenOptions`).

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Volume;
use super::types::{FileTimes, Metadata, Permissions, from_system_time};
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::fs::data::{Node, OpenReq};

/// Options to open a file with (like `std::fs::OpenOptions`).
///
/// ```
/// # use pmfs::{OpenOptions, Options, Volume};
/// # use std::sync::Arc;
/// # let media = Arc::new(pmfs_core::pm::HeapRegion::new(16 << 20)?);
/// # let vol = Volume::format(media, &Options::with_mapping(pmfs::MappingKind::HashFs))?;
/// let f = OpenOptions::new().write(true).create(true).open(&vol, "/log")?;
/// f.write_at(b"hello", 0)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    mode: u32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    /// All options off, mode 0o644 for created files.
    pub fn new() -> Self {
        Self {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            mode: 0o644,
        }
    }

    /// Open for reading.
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }

    /// Open for writing.
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }

    /// Every write goes to the end of the file (implies `write`).
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }

    /// Truncate to length 0 when opening (needs `write`).
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }

    /// Create the file if it does not exist (needs `write` or `append`).
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }

    /// Create the file, failing with `AlreadyExists` if it exists (needs `write` or
    /// `append`).
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }

    /// Permission bits of a created file (like `OpenOptionsExt::mode`).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode & 0o7777;
        self
    }

    /// Opens `path` on `vol` with these options.
    pub fn open(&self, vol: &Volume, path: &str) -> Result<File> {
        let write = self.write || self.append;
        if !self.read && !write {
            return Err(Error::InvalidArgument("open with neither read nor write"));
        }
        if (self.create || self.create_new || self.truncate) && !write {
            return Err(Error::InvalidArgument(
                "create or truncate without write access",
            ));
        }
        if self.truncate && self.append {
            return Err(Error::InvalidArgument("truncate together with append"));
        }
        let node = vol.fs.open(
            path,
            OpenReq {
                write,
                truncate: self.truncate,
                create: self.create,
                create_new: self.create_new,
                perm: self.mode,
            },
        )?;
        Ok(File {
            fs: vol.fs.clone(),
            node,
            read: self.read,
            write,
            append: self.append,
            pos: AtomicU64::new(0),
        })
    }
}

/// An open regular file (like `std::fs::File` with `FileExt`).
///
/// All operations are synchronous: when a write returns, its data and the new size are
/// durable, so [`sync_all`](File::sync_all) only orders. An unlinked file stays readable
/// and writable through its open handles until the last one is dropped, which frees it.
#[derive(Debug)]
pub struct File {
    fs: Arc<Fs>,
    node: Node,
    read: bool,
    write: bool,
    append: bool,
    pos: AtomicU64,
}

impl File {
    fn need_read(&self) -> Result<()> {
        if self.read {
            Ok(())
        } else {
            Err(Error::BadHandle("file not opened for reading"))
        }
    }

    fn need_write(&self) -> Result<()> {
        if self.write {
            Ok(())
        } else {
            Err(Error::BadHandle("file not opened for writing"))
        }
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at end of
    /// file). Holes read as zeros.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.need_read()?;
        self.fs.read_at(&self.node, buf, offset)
    }

    /// Reads exactly `buf.len()` bytes at `offset` or fails with `InvalidArgument`.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let n = self.read_at(buf, offset)?;
        if n < buf.len() {
            return Err(Error::InvalidArgument("read past end of file"));
        }
        Ok(())
    }

    /// Writes `buf` at `offset` (at the end of the file in append mode); returns
    /// `buf.len()`. Durable on return.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<usize> {
        self.need_write()?;
        if self.append {
            return self.fs.append(&self.node, buf).map(|_| buf.len());
        }
        self.fs.write_at(&self.node, buf, offset)
    }

    /// Writes all of `buf` at `offset`.
    pub fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.write_at(buf, offset).map(drop)
    }

    /// Truncates or extends the file (extension reads as zeros).
    pub fn set_len(&self, size: u64) -> Result<()> {
        self.need_write()?;
        self.fs.set_len(&self.node, size)
    }

    /// Makes everything durable. Every operation already is on return: this is a fence.
    pub fn sync_all(&self) -> Result<()> {
        self.fs.m().fence();
        Ok(())
    }

    /// Like [`sync_all`](File::sync_all).
    pub fn sync_data(&self) -> Result<()> {
        self.sync_all()
    }

    /// The file's metadata.
    pub fn metadata(&self) -> Result<Metadata> {
        self.fs.stat(self.node.h)
    }

    /// Changes the permission bits.
    pub fn set_permissions(&self, perm: Permissions) -> Result<()> {
        self.fs.set_mode(self.node.h, perm.mode)
    }

    /// Changes access and/or modification time.
    pub fn set_times(&self, times: FileTimes) -> Result<()> {
        self.fs.set_times(
            self.node.h,
            times.accessed.map(from_system_time),
            times.modified.map(from_system_time),
        )
    }

    /// Sets the modification time.
    pub fn set_modified(&self, t: std::time::SystemTime) -> Result<()> {
        self.set_times(FileTimes::new().set_modified(t))
    }

    /// Another handle to the same open file, with its own cursor.
    pub fn try_clone(&self) -> Result<File> {
        self.fs.open_inc(self.node.h.ino);
        Ok(File {
            fs: self.fs.clone(),
            node: Node::new(self.node.h),
            read: self.read,
            write: self.write,
            append: self.append,
            pos: AtomicU64::new(self.pos.load(Ordering::Relaxed)),
        })
    }
}

impl Drop for File {
    fn drop(&mut self) {
        // The last handle of an unlinked file frees it. A failure here leaves an orphan that
        // the next mount after a crash frees; nothing is lost by ignoring it.
        let _ = self.fs.release_node(&self.node);
    }
}

impl Read for &File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let pos = self.pos.load(Ordering::Relaxed);
        let n = self.read_at(buf, pos)?;
        self.pos.store(pos + n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl Write for &File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let end = if self.append {
            self.need_write()?;
            self.fs.append(&self.node, buf)? + buf.len() as u64
        } else {
            let pos = self.pos.load(Ordering::Relaxed);
            pos + File::write_at(self, buf, pos)? as u64
        };
        self.pos.store(end, Ordering::Relaxed);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for &File {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let base = match to {
            SeekFrom::Start(n) => {
                self.pos.store(n, Ordering::Relaxed);
                return Ok(n);
            }
            SeekFrom::End(d) => (self.fs.size_of(&self.node)?, d),
            SeekFrom::Current(d) => (self.pos.load(Ordering::Relaxed), d),
        };
        let new = base
            .0
            .checked_add_signed(base.1)
            .ok_or_else(|| io::Error::from(Error::InvalidArgument("seek before start")))?;
        self.pos.store(new, Ordering::Relaxed);
        Ok(new)
    }
}

impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for File {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        (&*self).seek(to)
    }
}
