//! Run-time dispatch over the file-mapping structure chosen at mkfs.
//!
//! [`FileMapping`] has an associated per-file type, so it is not object safe. [`Mapper`] is
//! its object-safe twin: the per-file handle is boxed as `dyn Any` and downcast back on every
//! call, which costs one type-id comparison.

use std::any::Any;
use std::fmt;

use pmfs_core::traits::{Extent, FileId, FileMapping, MappingKind, Run};

use crate::error::{Error, Result};

/// A mapping structure's DRAM handle of one file.
pub(crate) struct MapFile(Box<dyn Any + Send + Sync>);

impl fmt::Debug for MapFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MapFile")
    }
}

/// The object-safe view of a [`FileMapping`].
pub(crate) trait Mapper: Send + Sync {
    fn kind(&self) -> MappingKind;
    fn open_file(&self, id: FileId) -> Result<MapFile>;
    fn lookup(&self, f: &MapFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()>;
    fn first_mapped(&self, f: &MapFile, lblk: u64, len: u64) -> Result<Option<u64>>;
    fn prefetch(&self, f: &MapFile, lblk: u64);
    fn insert(&self, f: &MapFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()>;
    fn remove(&self, f: &MapFile, lblk: u64, len: u64) -> Result<u64>;
    fn replace_many(&self, f: &MapFile, runs: &[Run]) -> Result<u64>;
    fn remove_file(&self, f: &MapFile) -> Result<()>;
    fn owned_blocks(&self, f: &MapFile, visit: &mut dyn FnMut(Extent)) -> Result<()>;
    fn visit_all(&self, visit: &mut dyn FnMut(u64, Run)) -> Result<bool>;
    fn recover(&self) -> Result<()>;
    fn recovery_owed(&self) -> bool;
}

/// The concrete per-file handle inside `f` (for structure-specific calls such as HashFS
/// staging).
pub(crate) fn handle<T: 'static>(f: &MapFile) -> Result<&T> {
    f.0.downcast_ref::<T>().ok_or(Error::InvalidArgument(
        "file handle of another mapping structure",
    ))
}

impl<T> Mapper for T
where
    T: FileMapping,
    T::File: 'static,
{
    fn kind(&self) -> MappingKind {
        FileMapping::kind(self)
    }

    fn open_file(&self, id: FileId) -> Result<MapFile> {
        Ok(MapFile(Box::new(FileMapping::open_file(self, id)?)))
    }

    fn lookup(&self, f: &MapFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        Ok(FileMapping::lookup(self, handle(f)?, lblk, len, out)?)
    }

    fn first_mapped(&self, f: &MapFile, lblk: u64, len: u64) -> Result<Option<u64>> {
        Ok(FileMapping::first_mapped(self, handle(f)?, lblk, len)?)
    }

    fn prefetch(&self, f: &MapFile, lblk: u64) {
        if let Ok(h) = handle(f) {
            FileMapping::prefetch(self, h, lblk);
        }
    }

    fn insert(&self, f: &MapFile, lblk: u64, len: u64, out: &mut Vec<Run>) -> Result<()> {
        Ok(FileMapping::insert(self, handle(f)?, lblk, len, out)?)
    }

    fn remove(&self, f: &MapFile, lblk: u64, len: u64) -> Result<u64> {
        Ok(FileMapping::remove(self, handle(f)?, lblk, len)?)
    }

    fn replace_many(&self, f: &MapFile, runs: &[Run]) -> Result<u64> {
        Ok(FileMapping::replace_many(self, handle(f)?, runs)?)
    }

    fn remove_file(&self, f: &MapFile) -> Result<()> {
        Ok(FileMapping::remove_file(self, handle(f)?)?)
    }

    fn owned_blocks(&self, f: &MapFile, visit: &mut dyn FnMut(Extent)) -> Result<()> {
        Ok(FileMapping::owned_blocks(self, handle(f)?, visit)?)
    }

    fn visit_all(&self, visit: &mut dyn FnMut(u64, Run)) -> Result<bool> {
        Ok(FileMapping::visit_all(self, visit)?)
    }

    fn recover(&self) -> Result<()> {
        Ok(FileMapping::recover(self)?)
    }

    fn recovery_owed(&self) -> bool {
        FileMapping::recovery_owed(self)
    }
}
