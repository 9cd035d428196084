//! # pmfs
//!
//! The pmfs file-system engine and its `std::fs`-like embedding API.
//!
//! This crate owns the volume format (superblock, inode table, journal area), directories,
//! the undo journal, recovery, fsck and the data path of files, and dispatches at run time to
//! the file-mapping structure and block allocator chosen at mkfs. It reaches persistent
//! memory only through pmfs-core's [`Media`](pmfs_core::pm::Media) and knows nothing about
//! FUSE or the preload library, which sit on top of it.
//!
//! ```
//! use std::sync::Arc;
//! use pmfs::{MappingKind, Options, Volume};
//!
//! let media = Arc::new(pmfs_core::pm::HeapRegion::new(16 << 20)?);
//! let vol = Volume::format(media, &Options::with_mapping(MappingKind::HashFs))?;
//! vol.create_dir("/docs")?;
//! vol.write("/docs/hello.txt", b"hello, persistent memory")?;
//! vol.rename("/docs/hello.txt", "/docs/greeting.txt")?;
//! assert_eq!(vol.read("/docs/greeting.txt")?, b"hello, persistent memory");
//! # Ok::<(), pmfs::Error>(())
//! ```
//!
//! ## Design in one paragraph
//!
//! Inodes are fixed 128-byte records with generation numbers. Directories are CFFS dentry
//! pages ([`dir`](crate) module docs): create, mkdir, symlink, unlink and rmdir are log-free
//! sequences of ordered 8-byte stores whose half-done states recovery detects from
//! mismatched prev/next distances. Operations that change several objects — rename, link,
//! unlink of an inode that keeps other links, truncate, attribute changes — run under a
//! fine-grained per-CPU undo journal (FLEX's JDD). Free space, directory indexes and inode
//! free lists live in DRAM and are rebuilt at mount. Every call is durable and atomic on
//! return; see [`Volume`] for the API and [`fsck`] for the checker.
#![forbid(unsafe_code)]

mod api;
mod codec;
mod dir;
mod error;
mod format;
mod fs;
pub mod fsck;
mod hash;
mod inode;
mod journal;
pub mod kernel_pages;
mod mapping;
mod overlay;
mod parts;
mod xattr;

pub use api::Volume;
pub use api::client::{Client, FileMap, MapPiece};
pub use api::file::{File, OpenOptions};
pub use api::ino::{
    Attr, AttrChange, HashSlots, Ino, NodeEntry, NodeKind, OpenMode, OpenNode, Owner, SeekTarget,
    SetTime, Usage,
};
pub use api::types::{
    DirEntry, FileTimes, FileType, Metadata, Permissions, ReadDir, RenameFlags, StatFs, VolumeInfo,
};
pub use error::{Error, Result};
pub use format::{AllocatorKind, FORMAT_VERSION, Options};
pub use fs::MountReport;
pub use fs::data::{KernelPagesRequest, MapPin};
pub use pmfs_core::traits::MappingKind;
pub use xattr::{XATTR_NAME_MAX, XattrSet};
