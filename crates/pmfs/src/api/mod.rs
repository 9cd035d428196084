//! The embedding API: [`Volume`] mirrors the free functions of `std::fs`, [`File`] and
//! [`OpenOptions`] mirror theirs.
//!
//! Paths are absolute strings inside the volume (`"/dir/file"`). Every call is atomic and
//! durable when it returns. Errors are [`Error`]s, which convert into `io::Error` with the
//! matching errno.

pub(crate) mod client;
pub(crate) mod file;
pub(crate) mod ino;
pub(crate) mod types;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pmfs_core::pm::{Media, PmRegion, ReadOnlyRegion};
use pmfs_core::traits::MappingKind;

use self::file::{File, OpenOptions};
use self::types::{
    DirEntry, FileTimes, Metadata, Permissions, ReadDir, RenameFlags, StatFs, VolumeInfo,
    from_system_time,
};
use crate::dir::page::NAME_MAX;
use crate::error::{Error, Result};
use crate::format::{AllocatorKind, Options};
use crate::fs::path::{Existing, Follow, Target};
use crate::fs::{Fs, MountReport, ns};
use crate::inode::{Handle, Kind};

/// A mounted pmfs volume. `Send + Sync`: share it between threads by reference or `Arc`.
///
/// Dropping the last `Volume` (and the last open [`File`]) closes the volume cleanly; a
/// volume that was not closed (a crash) is recovered by the next mount.
#[derive(Debug, Clone)]
pub struct Volume {
    pub(crate) fs: Arc<Fs>,
}

impl Fs {
    /// Metadata of the live inode `h`.
    pub(crate) fn stat(&self, h: Handle) -> Result<Metadata> {
        let rec = {
            let _il = self.ilock(h.ino).read().unwrap_or_else(|e| e.into_inner());
            self.inodes
                .read_live(self.m(), h)
                .map_err(|_| Error::NotFound)?
        };
        let kind = rec.kind().ok_or(Error::Corrupt {
            what: "inode mode",
            at: self.inodes.field(h.ino, 0),
        })?;
        let mut md = Metadata {
            kind,
            mode: rec.mode,
            uid: rec.uid,
            gid: rec.gid,
            nlink: rec.nlink,
            size: rec.size,
            atime: rec.atime as i64,
            mtime: rec.mtime as i64,
            ctime: rec.ctime as i64,
            btime: rec.btime as i64,
            ino: u64::from(h.ino),
            generation: h.generation,
        };
        if kind == Kind::File {
            md.size = self.live_size(h.ino, md.size)?;
        }
        if kind == Kind::Dir {
            let d = self.dir(h)?;
            let inner = d.inner.read().unwrap_or_else(|e| e.into_inner());
            md.nlink = 2 + inner.subdirs;
            md.mtime = inner.mtime;
            md.ctime = md.ctime.max(inner.mtime);
        }
        Ok(md)
    }
}

fn split_parent<'p>(
    fs: &Fs,
    path: &'p str,
) -> Result<(Arc<crate::dir::Dir>, std::borrow::Cow<'p, [u8]>, bool)> {
    match fs.resolve(path, Follow::NoLast)? {
        Target::Dir(_) => Err(Error::AlreadyExists),
        Target::Entry {
            parent,
            name,
            want_dir,
            ..
        } => Ok((parent, name, want_dir)),
    }
}

/// Takes the owner lock of the pool file at `path`, held while the returned file is open: an
/// exclusive `flock` for an owner that writes, a shared one for a reader (`shared`), which
/// other readers may hold too.
fn owner_lock(path: &Path, shared: bool) -> Result<std::fs::File> {
    let file = std::fs::File::open(path)?;
    let locked = if shared {
        file.try_lock_shared()
    } else {
        file.try_lock()
    };
    match locked {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::PoolInUse),
        Err(std::fs::TryLockError::Error(e)) => Err(e.into()),
    }
}

impl Volume {
    /// Creates the pool file `path` of `opts.size` bytes, formats it and mounts the volume
    /// (like `File::create_new`: fails with `AlreadyExists` if the file exists). The volume
    /// holds the pool's owner lock (see [`open`](Volume::open)).
    pub fn create(path: impl AsRef<Path>, opts: &Options) -> Result<Volume> {
        let path = path.as_ref();
        let region = PmRegion::create(path, opts.size)?;
        let lock = owner_lock(path, false)?;
        Volume::format(Arc::new(region), opts).map(|v| v.holding(lock))
    }

    /// Opens the pool file `path` and mounts its volume, recovering it if it was not closed
    /// cleanly.
    ///
    /// The volume owns the pool: it holds an exclusive `flock` on the pool file (the lock the
    /// `pmfs` command and its FUSE daemon take too) until it is closed and its last file is
    /// dropped. A pool that another owner holds fails with [`Error::PoolInUse`]: mounting it
    /// twice would run recovery under a live volume. The lock belongs to the pool file's open
    /// file description, which a child forked by another thread shares until it execs (the
    /// descriptor is close-on-exec): a volume closed and opened again meanwhile finds the pool
    /// in use.
    pub fn open(path: impl AsRef<Path>) -> Result<Volume> {
        let path = path.as_ref();
        let region = PmRegion::open(path)?;
        let lock = owner_lock(path, false)?;
        Volume::mount(Arc::new(region)).map(|v| v.holding(lock))
    }

    /// Opens the pool file `path` for reading only and mounts its volume read-only
    /// ([`mount_read_only`](Volume::mount_read_only)): the file needs no write permission, its
    /// mapping has none, and a volume that was not closed cleanly is recovered in memory.
    /// Every change fails with [`Error::ReadOnly`] (`EROFS`). The volume holds the pool's
    /// owner lock shared: other read-only volumes (and `pmfs info`, `pmfs fsck` and
    /// `pmfs mount -o ro`) may open the pool meanwhile, an owner that writes may not
    /// ([`open`](Volume::open) fails with [`Error::PoolInUse`]), and a pool such an owner
    /// holds fails here with [`Error::PoolInUse`].
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Volume> {
        let path = path.as_ref();
        let region = ReadOnlyRegion::open(path)?;
        let lock = owner_lock(path, true)?;
        Volume::mount_read_only(Arc::new(region)).map(|v| v.holding(lock))
    }

    fn holding(self, lock: std::fs::File) -> Volume {
        // A fresh engine has no lock yet, so the lock is always kept.
        let _ = self.fs.owner_lock.set(lock);
        self
    }

    /// Formats `media` as a new volume and mounts it.
    pub fn format(media: Arc<dyn Media>, opts: &Options) -> Result<Volume> {
        Ok(Volume {
            fs: Arc::new(Fs::format(media, opts)?),
        })
    }

    /// Mounts the volume on `media`, recovering it if it was not closed cleanly.
    pub fn mount(media: Arc<dyn Media>) -> Result<Volume> {
        Ok(Volume {
            fs: Arc::new(Fs::mount(media, false)?),
        })
    }

    /// Mounts the volume without writing to it. A volume that was not closed cleanly is
    /// recovered in memory: the recovery a read-write mount would run writes to a
    /// copy-on-write view of `media` ([`ShadowRegion`](pmfs_core::pm::ShadowRegion)), which
    /// keeps the blocks it changes in memory for as long as the volume is mounted. The
    /// volume then reads as the next read-write mount will leave it, while `media` stays as
    /// the crash left it, and [`mount_report`](Volume::mount_report) says what recovery did
    /// (its `clean` is false).
    pub fn mount_read_only(media: Arc<dyn Media>) -> Result<Volume> {
        Ok(Volume {
            fs: Arc::new(Fs::mount(media, true)?),
        })
    }

    /// Closes the volume cleanly. If files are still open, the volume stays mounted until the
    /// last of them is dropped, and closes then.
    pub fn close(self) -> Result<()> {
        match Arc::try_unwrap(self.fs) {
            Ok(fs) => fs.shutdown(),
            Err(shared) => {
                shared.sync_metadata()?;
                Ok(())
            }
        }
    }

    /// Looks again at the files whose log pins, held by data clients ([`Volume::attach`]),
    /// kept this owner from clearing them at its last close of the file or from freeing the
    /// file once unlinked. It frees such an unlinked file once no client has its log open any
    /// more (the client closed it: before, it stayed allocated until the next mount), and
    /// clears the pins killed clients left once no client is attached at all (then they are
    /// all dead). A client killed (`SIGKILL`, a crash) never gives back its pins; the owner
    /// takes them for dead by itself at its last close of such a file, when it looks
    /// ([`Volume::look_for_dead_pins`]), or when it frees it, if no other client is attached
    /// then. If one is, the pins stay, and so do the log blocks that later writers of the
    /// file retire, and the file itself once unlinked, until the next mount, unless the owner
    /// calls this later (the FUSE daemon does every second).
    /// Returns how many files it cleared or freed. Cheap while there is nothing to look at or
    /// a client is attached.
    ///
    /// # Errors
    /// Media errors.
    pub fn collect_dead_pins(&self) -> Result<usize> {
        self.fs.collect_dead_pins()
    }

    /// The rendezvous word of this mount: a random word stored in the pool at each
    /// read-write mount, with which the owner names its socket for data clients
    /// ([`crate::kernel_pages::owner_address`]), so that only processes that may read the
    /// pool know it ([`Client::rendezvous`](crate::Client::rendezvous)).
    pub fn rendezvous(&self) -> u64 {
        crate::format::rendezvous(self.fs.m())
    }

    /// What the mount found and repaired.
    pub fn mount_report(&self) -> MountReport {
        self.fs.report
    }

    /// The mapping structure chosen at mkfs.
    pub fn mapping(&self) -> MappingKind {
        self.fs.geo.mapping
    }

    /// The allocator chosen at mkfs.
    pub fn allocator(&self) -> AllocatorKind {
        self.fs.geo.allocator
    }

    /// Where the regions of the volume are.
    pub fn info(&self) -> VolumeInfo {
        let g = &self.fs.geo;
        VolumeInfo {
            mapping: g.mapping,
            allocator: g.allocator,
            size: g.total_blocks * pmfs_core::layout::BLOCK_SIZE,
            journal_offset: g.journal_start.offset().0,
            journal_slots: g.journal_slots,
            inode_table_offset: g.inode_start.offset().0,
            inode_count: g.inode_count,
            inode_size: crate::inode::INODE_SIZE,
            mapping_offset: g.map_start.offset().0,
            data_offset: g.data_start.offset().0,
            data_size: g.data_blocks * pmfs_core::layout::BLOCK_SIZE,
            volume_id: g.volume_id,
            format_version: g.version,
        }
    }

    /// The media the volume lives on.
    pub fn media(&self) -> &Arc<dyn Media> {
        self.fs.media()
    }

    /// Opens a file for reading (like `File::open`).
    pub fn open_file(&self, path: &str) -> Result<File> {
        OpenOptions::new().read(true).open(self, path)
    }

    /// Creates or truncates a file and opens it for writing (like `File::create`).
    pub fn create_file(&self, path: &str) -> Result<File> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(self, path)
    }

    /// Reads a whole file (like `std::fs::read`).
    pub fn read(&self, path: &str) -> Result<Vec<u8>> {
        let f = self.open_file(path)?;
        let len = usize::try_from(f.metadata()?.len()).map_err(|_| Error::FileTooLarge)?;
        let mut buf = vec![0u8; len];
        let n = f.read_at(&mut buf, 0)?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Replaces a file's content (like `std::fs::write`).
    pub fn write(&self, path: &str, contents: &[u8]) -> Result<()> {
        let f = self.create_file(path)?;
        f.write_all_at(contents, 0)
    }

    /// Metadata of `path`, following a final symbolic link (like `std::fs::metadata`).
    pub fn metadata(&self, path: &str) -> Result<Metadata> {
        let (h, _) = self.fs.resolve_existing(path, Follow::Last)?.handle();
        self.fs.stat(h)
    }

    /// Metadata of `path` itself, not following a final symbolic link.
    pub fn symlink_metadata(&self, path: &str) -> Result<Metadata> {
        let (h, _) = self.fs.resolve_existing(path, Follow::NoLast)?.handle();
        self.fs.stat(h)
    }

    /// Whether `path` exists (following symbolic links), like `Path::try_exists`.
    pub fn exists(&self, path: &str) -> Result<bool> {
        match self.fs.resolve_existing(path, Follow::Last) {
            Ok(_) => Ok(true),
            Err(Error::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates a directory (like `std::fs::create_dir`).
    pub fn create_dir(&self, path: &str) -> Result<()> {
        let (parent, name, _) = split_parent(&self.fs, path)?;
        self.fs
            .create(&parent, &name, Kind::Dir, 0o755, None)
            .map(drop)
    }

    /// Creates a directory and all missing parents (like `std::fs::create_dir_all`).
    pub fn create_dir_all(&self, path: &str) -> Result<()> {
        if !path.starts_with('/') {
            return Err(Error::InvalidArgument("path must be absolute"));
        }
        let mut prefix = String::with_capacity(path.len());
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            prefix.push('/');
            prefix.push_str(comp);
            match self.create_dir(&prefix) {
                Ok(()) => {}
                Err(Error::AlreadyExists) => {
                    if !self.metadata(&prefix)?.is_dir() {
                        return Err(Error::NotADirectory);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Lists a directory (like `std::fs::read_dir`), in on-media order.
    pub fn read_dir(&self, path: &str) -> Result<ReadDir> {
        let dir = match self.fs.resolve_existing(path, Follow::Last)? {
            Existing::Dir(d) => d,
            Existing::Entry { slot, .. } if slot.kind == Kind::Dir => self.fs.dir(slot.h)?,
            Existing::Entry { .. } => return Err(Error::NotADirectory),
        };
        let inner = dir.inner.read().unwrap_or_else(|e| e.into_inner());
        if inner.dead {
            return Err(Error::NotFound);
        }
        let mut entries: Vec<(u32, u16, DirEntry)> = inner
            .index
            .iter()
            .map(|(name, s)| {
                (
                    s.page,
                    s.off,
                    DirEntry {
                        fs: self.fs.clone(),
                        dir_path: path.to_owned(),
                        name: name.to_vec(),
                        kind: s.kind,
                        h: s.h,
                    },
                )
            })
            .collect();
        entries.sort_unstable_by_key(|e| (e.0, e.1));
        Ok(ReadDir {
            entries: entries
                .into_iter()
                .map(|e| e.2)
                .collect::<Vec<_>>()
                .into_iter(),
        })
    }

    /// Removes a file or symbolic link (like `std::fs::remove_file`).
    pub fn remove_file(&self, path: &str) -> Result<()> {
        match self.fs.resolve(path, Follow::NoLast)? {
            Target::Dir(_) => Err(Error::IsADirectory),
            Target::Entry { parent, name, .. } => self.fs.remove(&parent, &name, false),
        }
    }

    /// Removes an empty directory (like `std::fs::remove_dir`).
    pub fn remove_dir(&self, path: &str) -> Result<()> {
        match self.fs.resolve(path, Follow::NoLast)? {
            Target::Dir(d) if d.h == self.fs.root => Err(Error::Busy),
            Target::Dir(_) => Err(Error::InvalidArgument("cannot remove '.' or '..'")),
            Target::Entry { parent, name, .. } => self.fs.remove(&parent, &name, true),
        }
    }

    /// Renames `from` to `to`, replacing `to` if it exists (like `std::fs::rename`).
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.rename_with(from, to, RenameFlags::default())
    }

    /// Renames with `renameat2` flags: `noreplace` or `exchange`.
    pub fn rename_with(&self, from: &str, to: &str, flags: RenameFlags) -> Result<()> {
        let (sp, sname) = match self.fs.resolve(from, Follow::NoLast)? {
            Target::Dir(_) => return Err(Error::Busy),
            Target::Entry { parent, name, .. } => (parent, name),
        };
        let (dp, dname) = match self.fs.resolve(to, Follow::NoLast)? {
            Target::Dir(_) => return Err(Error::Busy),
            Target::Entry { parent, name, .. } => (parent, name),
        };
        self.fs.rename(
            &sp,
            &sname,
            &dp,
            &dname,
            ns::RenameFlags {
                noreplace: flags.noreplace,
                exchange: flags.exchange,
            },
        )
    }

    /// Creates the hard link `link` to the file `original` (like `std::fs::hard_link`;
    /// `original` is not followed if it is a symbolic link, as on Linux).
    pub fn hard_link(&self, original: &str, link: &str) -> Result<()> {
        let (h, kind) = self.fs.resolve_existing(original, Follow::NoLast)?.handle();
        if kind == Kind::Dir {
            return Err(Error::NotPermitted("hard link to a directory"));
        }
        let (parent, name, _) = split_parent(&self.fs, link)?;
        self.fs.link(h, &parent, &name)
    }

    /// Creates the symbolic link `link` pointing at `original` (like
    /// `std::os::unix::fs::symlink`). The target is stored as given (1 to 4095 bytes).
    pub fn symlink(&self, original: &str, link: &str) -> Result<()> {
        let target = original.as_bytes();
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() >= pmfs_core::layout::BLOCK_SIZE as usize {
            return Err(Error::NameTooLong);
        }
        if target.contains(&0) {
            return Err(Error::InvalidArgument("symbolic link target contains NUL"));
        }
        let (parent, name, _) = split_parent(&self.fs, link)?;
        self.fs
            .create(&parent, &name, Kind::Symlink, 0o777, Some(target))
            .map(drop)
    }

    /// The target of a symbolic link (like `std::fs::read_link`).
    pub fn read_link(&self, path: &str) -> Result<PathBuf> {
        let (h, kind) = self.fs.resolve_existing(path, Follow::NoLast)?.handle();
        if kind != Kind::Symlink {
            return Err(Error::InvalidArgument("not a symbolic link"));
        }
        let t = self.fs.read_link_of(h)?;
        Ok(PathBuf::from(String::from_utf8_lossy(&t).into_owned()))
    }

    /// Changes the permission bits of `path`, following symbolic links (like
    /// `std::fs::set_permissions`).
    pub fn set_permissions(&self, path: &str, perm: Permissions) -> Result<()> {
        let (h, _) = self.fs.resolve_existing(path, Follow::Last)?.handle();
        self.fs.set_mode(h, perm.mode)
    }

    /// Sets access and/or modification time of `path`, following symbolic links.
    pub fn set_times(&self, path: &str, times: FileTimes) -> Result<()> {
        let (h, _) = self.fs.resolve_existing(path, Follow::Last)?.handle();
        self.fs.set_times(
            h,
            times.accessed.map(from_system_time),
            times.modified.map(from_system_time),
        )
    }

    /// File-system statistics.
    pub fn statfs(&self) -> Result<StatFs> {
        Ok(StatFs {
            block_size: pmfs_core::layout::BLOCK_SIZE,
            total_blocks: self.fs.geo.data_blocks,
            free_blocks: self.fs.free_blocks()?,
            total_inodes: self.fs.geo.inode_count - 1,
            free_inodes: self.fs.inodes.free_count(),
            name_max: NAME_MAX as u64,
        })
    }
}
