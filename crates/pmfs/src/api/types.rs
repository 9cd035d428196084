//! Value types of the embedding API, shaped like their `std::fs` counterparts.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::Result;
use crate::fs::Fs;
use crate::inode::{Handle, Kind};

pub(crate) fn to_system_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

pub(crate) fn from_system_time(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

/// The type of a file: regular file, directory or symbolic link (like `std::fs::FileType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileType(pub(crate) Kind);

impl FileType {
    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.0 == Kind::Dir
    }

    /// Whether this is a regular file.
    pub fn is_file(&self) -> bool {
        self.0 == Kind::File
    }

    /// Whether this is a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.0 == Kind::Symlink
    }
}

/// Permission bits of a file (like `std::fs::Permissions` with `PermissionsExt`).
///
/// pmfs stores the bits but does not enforce them: an embedding application has a single
/// identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Permissions {
    pub(crate) mode: u32,
}

impl Permissions {
    /// Permissions from POSIX mode bits (only the low 12 bits are kept).
    pub fn from_mode(mode: u32) -> Self {
        Self {
            mode: mode & 0o7777,
        }
    }

    /// The POSIX permission bits.
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// Whether no write bit is set.
    pub fn readonly(&self) -> bool {
        self.mode & 0o222 == 0
    }

    /// Clears (or sets the owner's) write bits.
    pub fn set_readonly(&mut self, readonly: bool) {
        if readonly {
            self.mode &= !0o222;
        } else {
            self.mode |= 0o200;
        }
    }
}

/// Metadata of a file (like `std::fs::Metadata` with the `MetadataExt` accessors).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    pub(crate) kind: Kind,
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) nlink: u64,
    pub(crate) size: u64,
    pub(crate) atime: i64,
    pub(crate) mtime: i64,
    pub(crate) ctime: i64,
    pub(crate) btime: i64,
    pub(crate) ino: u64,
    pub(crate) generation: u32,
}

impl Metadata {
    /// The file type.
    pub fn file_type(&self) -> FileType {
        FileType(self.kind)
    }

    /// Whether this is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == Kind::Dir
    }

    /// Whether this is a regular file.
    pub fn is_file(&self) -> bool {
        self.kind == Kind::File
    }

    /// Whether this is a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.kind == Kind::Symlink
    }

    /// Size in bytes (a directory's size is its number of dentry pages times 4096; a
    /// symbolic link's is the length of its target).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        self.size
    }

    /// The permission bits.
    pub fn permissions(&self) -> Permissions {
        Permissions::from_mode(self.mode)
    }

    /// The full POSIX mode (type and permission bits).
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// Owner user id (stored, 0 unless set by a frontend).
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Owner group id.
    pub fn gid(&self) -> u32 {
        self.gid
    }

    /// Number of hard links (for a directory: 2 plus its subdirectories).
    pub fn nlink(&self) -> u64 {
        self.nlink
    }

    /// The inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// The generation of the inode number (changes each time the number is reused).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Last modification time.
    pub fn modified(&self) -> Result<SystemTime> {
        Ok(to_system_time(self.mtime))
    }

    /// Last access time (pmfs updates it only through `set_times`).
    pub fn accessed(&self) -> Result<SystemTime> {
        Ok(to_system_time(self.atime))
    }

    /// Creation time.
    pub fn created(&self) -> Result<SystemTime> {
        Ok(to_system_time(self.btime))
    }

    /// Last status change time, in ns since the epoch.
    pub fn ctime_ns(&self) -> i64 {
        self.ctime
    }

    /// Last modification time, in ns since the epoch.
    pub fn mtime_ns(&self) -> i64 {
        self.mtime
    }

    /// Last access time, in ns since the epoch.
    pub fn atime_ns(&self) -> i64 {
        self.atime
    }
}

/// Access and modification times to set (like `std::fs::FileTimes`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileTimes {
    pub(crate) accessed: Option<SystemTime>,
    pub(crate) modified: Option<SystemTime>,
}

impl FileTimes {
    /// Times that change nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the access time.
    pub fn set_accessed(mut self, t: SystemTime) -> Self {
        self.accessed = Some(t);
        self
    }

    /// Sets the modification time.
    pub fn set_modified(mut self, t: SystemTime) -> Self {
        self.modified = Some(t);
        self
    }
}

/// Flags of [`Volume::rename_with`](crate::Volume::rename_with) (Linux `renameat2`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RenameFlags {
    /// Fail with `AlreadyExists` instead of replacing an existing target (`RENAME_NOREPLACE`).
    pub noreplace: bool,
    /// Atomically swap source and target, which must both exist (`RENAME_EXCHANGE`).
    pub exchange: bool,
}

/// File-system statistics (like `statvfs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Block size in bytes.
    pub block_size: u64,
    /// Data blocks of the volume.
    pub total_blocks: u64,
    /// Free data blocks.
    pub free_blocks: u64,
    /// Inodes of the volume.
    pub total_inodes: u64,
    /// Free inodes.
    pub free_inodes: u64,
    /// Longest file name, in bytes.
    pub name_max: u64,
}

/// One entry of a directory listing (like `std::fs::DirEntry`).
#[derive(Debug)]
pub struct DirEntry {
    pub(crate) fs: Arc<Fs>,
    pub(crate) dir_path: String,
    pub(crate) name: Vec<u8>,
    pub(crate) kind: Kind,
    pub(crate) h: Handle,
}

impl DirEntry {
    /// The entry's name.
    pub fn file_name(&self) -> OsString {
        OsString::from(String::from_utf8_lossy(&self.name).into_owned())
    }

    /// The full path of the entry (the listed directory's path joined with the name).
    pub fn path(&self) -> PathBuf {
        let mut p = self.dir_path.trim_end_matches('/').to_owned();
        p.push('/');
        p.push_str(&String::from_utf8_lossy(&self.name));
        PathBuf::from(p)
    }

    /// The entry's type, known without reading its inode.
    pub fn file_type(&self) -> Result<FileType> {
        Ok(FileType(self.kind))
    }

    /// The inode number.
    pub fn ino(&self) -> u64 {
        u64::from(self.h.ino)
    }

    /// The entry's metadata; symbolic links are not followed (like std).
    pub fn metadata(&self) -> Result<Metadata> {
        self.fs.stat(self.h)
    }
}

/// An iterator over a directory listing taken when [`Volume::read_dir`](crate::Volume::read_dir)
/// was called (like `std::fs::ReadDir`). Entries come in on-media order.
#[derive(Debug)]
pub struct ReadDir {
    pub(crate) entries: std::vec::IntoIter<DirEntry>,
}

impl Iterator for ReadDir {
    type Item = Result<DirEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        self.entries.next().map(Ok)
    }
}

/// Where the regions of a volume are (byte offsets), for tools and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeInfo {
    /// The mapping structure.
    pub mapping: pmfs_core::traits::MappingKind,
    /// The allocator.
    pub allocator: crate::AllocatorKind,
    /// Total size in bytes.
    pub size: u64,
    /// First journal slot.
    pub journal_offset: u64,
    /// Number of journal slots (one block each).
    pub journal_slots: u32,
    /// Start of the inode table.
    pub inode_table_offset: u64,
    /// Inode records (inode `n` lives at `inode_table_offset + n * inode_size`).
    pub inode_count: u64,
    /// Size of one inode record.
    pub inode_size: u64,
    /// Start of the mapping region.
    pub mapping_offset: u64,
    /// Start of the data region (2 MiB aligned).
    pub data_offset: u64,
    /// Size of the data region in bytes.
    pub data_size: u64,
    /// Volume identifier chosen at mkfs.
    pub volume_id: u64,
    /// The volume's format version: as found on a read-only mount, [`FORMAT_VERSION`]
    /// once mounted for writing (which upgrades older volumes).
    ///
    /// [`FORMAT_VERSION`]: crate::FORMAT_VERSION
    pub format_version: u32,
}
