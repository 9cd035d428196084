//! Pool files: creating them, opening them under the owner lock, and turning what can go wrong
//! into one-line errors.
//!
//! # The owner lock
//! Whoever formats, repairs or serves a pool holds an exclusive `flock` on the pool file for as
//! long as it works on it; whoever only reads it to check or inspect it (`fsck` without
//! `--repair`, `info`) holds a shared one, which other readers may hold at the same time. The
//! lock is advisory: it keeps two pmfs processes from owning one pool, and readers from a pool
//! that a process writes, and dies with its holder, so a killed daemon never leaves a stale
//! lock. A daemon serving a pool read-only holds it exclusively too: a data client finds the
//! daemon of a mount that did not record itself in the pool as the one holder of the pool's
//! exclusive lock (`/proc/locks`), and a reader beside it would be taken for it.
//!
//! # Attached data clients
//! A mounted pool shows up in `/proc/self/mountinfo` as type `fuse.pmfs` with the pool file's
//! absolute path as its source, and `st_ino` of every file on the mount is the engine's
//! [`Ino`](pmfs::Ino) of the file. That is all a data client (the preload library) needs to
//! find a file's data in the pool. It opens the pool file itself, with its own credentials:
//! the kernel's permission check on the pool file is the whole trust decision, so a client
//! gets no more than the pool file's mode and owner allow. `mkfs` creates pools with mode
//! 0600.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pmfs::{Options, Volume};
use pmfs_core::pm::{Media, PmRegion, ReadOnlyRegion};

use crate::error::{Error, Result};

/// Smallest pool `mkfs` makes.
pub const MIN_POOL: u64 = 8 << 20;

/// An open pool file whose owner lock this process holds.
#[derive(Debug)]
pub struct Pool {
    path: PathBuf,
    /// Holds the owner lock until the pool is dropped.
    file: File,
    /// Opened for reading only: [`media`](Pool::media) maps it without write access.
    read_only: bool,
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

/// How a pool is opened: for what access, under which kind of owner lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    /// Read and write, under the exclusive lock.
    Write,
    /// Read only, under a shared lock.
    Read,
    /// Read only, under the exclusive lock.
    ReadExclusive,
}

/// Takes the owner lock on `file`: shared if `shared`, else exclusive.
fn lock(file: &File, path: &Path, shared: bool) -> Result<()> {
    let locked = if shared {
        file.try_lock_shared()
    } else {
        file.try_lock()
    };
    match locked {
        Ok(()) => Ok(()),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::new(format!(
            "{}: pool is in use by another pmfs process (is it mounted?)",
            shown(path)
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(Error::new(format!(
            "{}: cannot lock the pool: {e}",
            shown(path)
        ))),
    }
}

fn open_error(path: &Path, e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::NotFound => Error::new(format!("{}: no such pool file", shown(path))),
        io::ErrorKind::PermissionDenied => Error::new(format!(
            "{}: permission denied (the pool file must be readable and writable; `pmfs info`, \
             `pmfs fsck` and `pmfs mount -o ro` only read it)",
            shown(path)
        )),
        io::ErrorKind::IsADirectory => {
            Error::new(format!("{}: is a directory, not a pool file", shown(path)))
        }
        _ => Error::new(format!("{}: {e}", shown(path))),
    }
}

/// Describes a media error of pool `path`.
fn media_error(path: &Path, e: pmfs_core::Error) -> Error {
    match e {
        pmfs_core::Error::PoolNotFound(_) => {
            Error::new(format!("{}: no such pool file", shown(path)))
        }
        pmfs_core::Error::PoolTooSmall { .. } | pmfs_core::Error::PoolSizeUnaligned { .. } => {
            Error::new(format!("{}: not a pmfs pool ({e})", shown(path)))
        }
        pmfs_core::Error::Io(io) => open_error(path, io),
        e => Error::new(format!("{}: {e}", shown(path))),
    }
}

/// Describes an engine error met while opening or formatting the volume of pool `path`.
pub fn volume_error(path: &Path, e: pmfs::Error) -> Error {
    match e {
        pmfs::Error::Corrupt {
            what: "superblock magic",
            ..
        } => Error::new(format!("{}: not a pmfs volume (bad magic)", shown(path))),
        pmfs::Error::Unsupported("volume format version") => Error::new(format!(
            "{}: volume format version not supported by this pmfs",
            shown(path)
        )),
        e @ pmfs::Error::Corrupt { .. } => Error::new(format!(
            "{}: damaged volume ({e}); run `pmfs fsck --repair {}`",
            shown(path),
            shown(path)
        )),
        e => Error::new(format!("{}: {e}", shown(path))),
    }
}

impl Pool {
    /// Opens the existing pool `path` and takes its owner lock.
    pub fn open(path: &Path) -> Result<Pool> {
        Pool::open_with(path, Access::Write)
    }

    /// Opens the existing pool `path` for reading only (it needs no write permission) and
    /// takes its owner lock shared, which other readers may hold too; its
    /// [`media`](Pool::media) refuse every write.
    pub fn open_read_only(path: &Path) -> Result<Pool> {
        Pool::open_with(path, Access::Read)
    }

    /// Opens the existing pool `path` for reading only, as
    /// [`open_read_only`](Pool::open_read_only) does, but takes its owner lock exclusively:
    /// what a daemon serving the pool read-only does (see [the owner lock](self)).
    pub fn open_read_only_exclusive(path: &Path) -> Result<Pool> {
        Pool::open_with(path, Access::ReadExclusive)
    }

    fn open_with(path: &Path, access: Access) -> Result<Pool> {
        let read_only = access != Access::Write;
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::PermissionDenied if read_only => Error::new(format!(
                    "{}: permission denied (the pool file must be readable)",
                    shown(path)
                )),
                _ => open_error(path, e),
            })?;
        if !file.metadata().map_err(|e| open_error(path, e))?.is_file() {
            return Err(Error::new(format!("{}: not a regular file", shown(path))));
        }
        lock(&file, path, access == Access::Read)?;
        let path = path.canonicalize().map_err(|e| open_error(path, e))?;
        Ok(Pool {
            path,
            file,
            read_only,
        })
    }

    /// Creates the pool file `path` of `size` bytes (mode 0600), locked, with its space
    /// allocated. `progress(done, total)` is called as the space is allocated. `force`
    /// replaces an existing pool file that nobody owns.
    pub fn create(
        path: &Path,
        size: u64,
        force: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Pool> {
        if size < MIN_POOL {
            return Err(Error::new(format!(
                "pool size {size} is below the minimum of {} MiB",
                MIN_POOL >> 20
            )));
        }
        if !size.is_multiple_of(2 << 20) {
            return Err(Error::new(format!(
                "pool size {size} is not a multiple of 2 MiB"
            )));
        }
        if force && path.exists() {
            // Only a pool nobody owns may be replaced.
            let old = Pool::open(path)?;
            std::fs::remove_file(&old.path).map_err(|e| open_error(path, e))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => Error::new(format!(
                    "{}: file exists (use --force to replace it)",
                    shown(path)
                )),
                _ => open_error(path, e),
            })?;
        let made = lock(&file, path, false).and_then(|()| {
            pmfs_core::pm::preallocate(&file, 0, size, &mut |done| progress(done, size)).map_err(
                |e| {
                    Error::new(format!(
                        "{}: cannot allocate {size} bytes: {e}",
                        shown(path)
                    ))
                },
            )
        });
        if let Err(e) = made {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        let path = path.canonicalize().map_err(|e| open_error(path, e))?;
        Ok(Pool {
            path,
            file,
            read_only: false,
        })
    }

    /// The pool file's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The pool file's device and inode number: what names it to its data clients
    /// ([`pmfs::kernel_pages::owner_address`]).
    pub fn identity(&self) -> Result<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let m = self
            .file
            .metadata()
            .map_err(|e| open_error(&self.path, e))?;
        Ok((m.dev(), m.ino()))
    }

    /// Maps the pool file (without write access if it was opened read-only).
    pub fn media(&self) -> Result<Arc<dyn Media>> {
        let media: Arc<dyn Media> = if self.read_only {
            Arc::new(ReadOnlyRegion::open(&self.path).map_err(|e| media_error(&self.path, e))?)
        } else {
            Arc::new(PmRegion::open(&self.path).map_err(|e| media_error(&self.path, e))?)
        };
        Ok(media)
    }

    /// Formats the pool and returns the mounted volume.
    pub fn format(&self, opts: &Options) -> Result<Volume> {
        Volume::format(self.media()?, opts).map_err(|e| volume_error(&self.path, e))
    }

    /// Mounts the pool's volume (recovering it after a crash).
    pub fn mount(&self) -> Result<Volume> {
        Volume::mount(self.media()?).map_err(|e| volume_error(&self.path, e))
    }
}
