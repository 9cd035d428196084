//! The error type of pmfs-core and of the contracts it defines.

use crate::layout::PmOff;

/// Result alias used throughout pmfs-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong below the file system.
///
/// Conversion to `errno` happens only in the frontends.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Media content violates an invariant. `what` names the structure, `at` the offset.
    #[error("corrupt {what} at {at}")]
    Corrupt {
        /// The structure that failed validation.
        what: &'static str,
        /// Where in the region it lives.
        at: PmOff,
    },
    /// An access outside the region.
    #[error("access of {len} bytes at {off} is outside the region of {size} bytes")]
    OutOfBounds {
        /// Start of the access.
        off: PmOff,
        /// Length of the access.
        len: u64,
        /// Size of the region.
        size: u64,
    },
    /// An atomic access at an offset that is not 8-byte aligned.
    #[error("atomic access at unaligned offset {0}")]
    Unaligned(PmOff),
    /// No free space left for the request.
    #[error("no space left")]
    NoSpace,
    /// A caller passed an argument outside the contract.
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// The request needs something this platform or build does not have.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// The pool file to open does not exist.
    #[error("pool file {} does not exist", .0.display())]
    PoolNotFound(std::path::PathBuf),
    /// A pool file was to be created where a file already exists.
    #[error("pool file {} already exists", .0.display())]
    PoolExists(std::path::PathBuf),
    /// A pool (or a requested pool size) below the minimum size.
    #[error("pool size {size} is below the minimum of {min} bytes")]
    PoolTooSmall {
        /// The size found or requested.
        size: u64,
        /// The minimum pool size.
        min: u64,
    },
    /// A pool size that is not a whole number of blocks.
    #[error("pool size {size} is not a multiple of the {block}-byte block size")]
    PoolSizeUnaligned {
        /// The size found or requested.
        size: u64,
        /// The block size it must be a multiple of.
        block: u64,
    },
    /// A digest stopped on `cause`, and letting its cursor go failed too: the cursor word at
    /// `at` still names this holder, so no digest of this process gets past it (each finds
    /// the cursor busy) until the holder is reset, as the next mount does.
    #[error("digest cursor at {at} left held after: {cause}")]
    DigestCursorHeld {
        /// The cursor word.
        at: PmOff,
        /// What stopped the digest.
        cause: Box<Error>,
    },
    /// A write to a region mapped read-only ([`ReadOnlyRegion`](crate::pm::ReadOnlyRegion)).
    #[error("write to a read-only region")]
    ReadOnly,
    /// An operating-system error.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
