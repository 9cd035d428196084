//! The error type of the engine and its conversion to `io::Error` with the matching errno.

use std::io;

use pmfs_core::layout::PmOff;

/// Result alias used throughout pmfs.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a file-system call can fail with.
///
/// Every variant has an errno ([`Error::errno`]); `impl From<Error> for io::Error` builds an
/// `io::Error` whose `raw_os_error()` is that errno, so frontends can reply with it directly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A path component does not exist (`ENOENT`).
    #[error("no such file or directory")]
    NotFound,
    /// The target name exists already (`EEXIST`).
    #[error("file exists")]
    AlreadyExists,
    /// A path component used as a directory is not one (`ENOTDIR`).
    #[error("not a directory")]
    NotADirectory,
    /// The operation needs a non-directory but found a directory (`EISDIR`).
    #[error("is a directory")]
    IsADirectory,
    /// A directory to remove or replace still has entries (`ENOTEMPTY`).
    #[error("directory not empty")]
    DirectoryNotEmpty,
    /// A name is longer than 255 bytes (`ENAMETOOLONG`).
    #[error("file name too long")]
    NameTooLong,
    /// No free block, inode or journal space (`ENOSPC`).
    #[error("no space left on volume")]
    NoSpace,
    /// An argument is outside what the call accepts (`EINVAL`).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The operation is not allowed on this kind of object, e.g. a hard link to a directory
    /// (`EPERM`).
    #[error("operation not permitted: {0}")]
    NotPermitted(&'static str),
    /// Too many symbolic links were met while resolving a path (`ELOOP`).
    #[error("too many levels of symbolic links")]
    FilesystemLoop,
    /// The inode has the maximum number of links (`EMLINK`).
    #[error("too many links")]
    TooManyLinks,
    /// A write or `set_len` beyond the largest supported file size (`EFBIG`).
    #[error("file too large")]
    FileTooLarge,
    /// The handle was not opened for this kind of access (`EBADF`).
    #[error("bad file handle: {0}")]
    BadHandle(&'static str),
    /// The volume was opened read-only (`EROFS`).
    #[error("read-only volume")]
    ReadOnly,
    /// The object is in use, e.g. the root directory as a rename source (`EBUSY`).
    #[error("resource busy")]
    Busy,
    /// Another process (or another `Volume` of this one) owns the pool: it holds the owner
    /// lock, an exclusive `flock` on the pool file (`EBUSY`). Use [`Volume::attach`] for a
    /// data-only client of a pool that is owned elsewhere.
    ///
    /// [`Volume::attach`]: crate::Volume::attach
    #[error("pool is in use by another owner (mounted?)")]
    PoolInUse,
    /// The volume was not closed cleanly and the process that owned it is gone: it awaits
    /// the recovery of a read-write mount, and a data-only client
    /// ([`Volume::attach`](crate::Volume::attach)) may not work on it (`EUCLEAN`).
    #[error(
        "the volume was not closed cleanly and its owner is gone; a read-write mount recovers it"
    )]
    NeedsRecovery,
    /// Media content violates an invariant (`EUCLEAN`). `what` names the structure, `at` the
    /// offset in the region.
    #[error("corrupt {what} at {at}")]
    Corrupt {
        /// The structure that failed validation.
        what: &'static str,
        /// Where in the region it lives.
        at: PmOff,
    },
    /// A store the media refused left work that only recovery does (a journal slot not
    /// retired, a half-done directory update, a lock, a claimed slot, a file's tail or its
    /// digest cursor not released): the session takes no more changes, and the clean
    /// unmount leaves the volume unclean, for the next read-write mount to recover (`EIO`).
    #[error(
        "a failed store left {0} to recovery; the volume takes no changes until the next \
         read-write mount recovers it"
    )]
    LeftForRecovery(&'static str),
    /// The volume needs a feature this build does not have (`EOPNOTSUPP`).
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// An operating-system error, e.g. from creating the pool file.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl Error {
    /// The errno a POSIX frontend should reply with.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::AlreadyExists => libc::EEXIST,
            Error::NotADirectory => libc::ENOTDIR,
            Error::IsADirectory => libc::EISDIR,
            Error::DirectoryNotEmpty => libc::ENOTEMPTY,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::NoSpace => libc::ENOSPC,
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::NotPermitted(_) => libc::EPERM,
            Error::FilesystemLoop => libc::ELOOP,
            Error::TooManyLinks => libc::EMLINK,
            Error::FileTooLarge => libc::EFBIG,
            Error::BadHandle(_) => libc::EBADF,
            Error::ReadOnly => libc::EROFS,
            Error::Busy | Error::PoolInUse => libc::EBUSY,
            Error::Corrupt { .. } | Error::NeedsRecovery => EUCLEAN,
            Error::LeftForRecovery(_) => libc::EIO,
            Error::Unsupported(_) => libc::EOPNOTSUPP,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

#[cfg(target_os = "linux")]
const EUCLEAN: i32 = libc::EUCLEAN;
#[cfg(not(target_os = "linux"))]
const EUCLEAN: i32 = libc::EIO;

impl From<pmfs_core::Error> for Error {
    fn from(e: pmfs_core::Error) -> Self {
        match e {
            pmfs_core::Error::Corrupt { what, at } => Error::Corrupt { what, at },
            // An access outside the region or a misaligned atomic is only reachable through
            // offsets derived from media content: the media is damaged.
            pmfs_core::Error::OutOfBounds { off, .. } => Error::Corrupt {
                what: "reference outside the region",
                at: off,
            },
            pmfs_core::Error::Unaligned(at) => Error::Corrupt {
                what: "misaligned reference",
                at,
            },
            pmfs_core::Error::NoSpace => Error::NoSpace,
            pmfs_core::Error::ReadOnly => Error::ReadOnly,
            pmfs_core::Error::InvalidArgument(what) => Error::InvalidArgument(what),
            pmfs_core::Error::Unsupported(what) => Error::Unsupported(what),
            pmfs_core::Error::Io(e) => Error::Io(e),
            pmfs_core::Error::PoolNotFound(_) => Error::NotFound,
            pmfs_core::Error::PoolExists(_) => Error::AlreadyExists,
            pmfs_core::Error::PoolTooSmall { .. } => {
                Error::InvalidArgument("pool size below the minimum")
            }
            pmfs_core::Error::PoolSizeUnaligned { .. } => {
                Error::InvalidArgument("pool size is not a whole number of blocks")
            }
            // What the caller learns is what stopped the digest; the engine marks the session
            // (`Fs::digest`).
            pmfs_core::Error::DigestCursorHeld { cause, .. } => Error::from(*cause),
            other => Error::Io(std::io::Error::other(other)),
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Io(e) => e,
            other => io::Error::from_raw_os_error(other.errno()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_carry_the_errno() {
        let cases = [
            (Error::NotFound, libc::ENOENT, io::ErrorKind::NotFound),
            (
                Error::AlreadyExists,
                libc::EEXIST,
                io::ErrorKind::AlreadyExists,
            ),
            (
                Error::NotADirectory,
                libc::ENOTDIR,
                io::ErrorKind::NotADirectory,
            ),
            (
                Error::IsADirectory,
                libc::EISDIR,
                io::ErrorKind::IsADirectory,
            ),
            (
                Error::DirectoryNotEmpty,
                libc::ENOTEMPTY,
                io::ErrorKind::DirectoryNotEmpty,
            ),
            (Error::NoSpace, libc::ENOSPC, io::ErrorKind::StorageFull),
            (
                Error::ReadOnly,
                libc::EROFS,
                io::ErrorKind::ReadOnlyFilesystem,
            ),
        ];
        for (err, errno, kind) in cases {
            let io: io::Error = err.into();
            assert_eq!(io.raw_os_error(), Some(errno));
            assert_eq!(io.kind(), kind);
        }
        let corrupt: io::Error = Error::Corrupt {
            what: "x",
            at: PmOff(8),
        }
        .into();
        assert_eq!(corrupt.raw_os_error(), Some(EUCLEAN));
        let name: io::Error = Error::NameTooLong.into();
        assert_eq!(name.raw_os_error(), Some(libc::ENAMETOOLONG));
    }

    #[test]
    fn media_errors_map_to_engine_errors() {
        let e: Error = pmfs_core::Error::OutOfBounds {
            off: PmOff(1),
            len: 2,
            size: 3,
        }
        .into();
        assert!(matches!(e, Error::Corrupt { .. }));
        let e: Error = pmfs_core::Error::NoSpace.into();
        assert!(matches!(e, Error::NoSpace));
    }
}
