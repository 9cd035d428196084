//! A pool file mapped without write access: what inspects a pool that the process may only
//! read (a file of another user, mode 0444, on a read-only file system or snapshot).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::procs::DevIno;
use super::region::{NOT_A_FILE, check_size, open_pool_file};
use crate::error::{Error, Result};
use crate::layout::PmOff;

/// A pool file opened read-only and mapped `PROT_READ`, implementing [`Media`](super::Media)
/// for readers: every store, fill, copy, compare-and-swap and flush fails with
/// [`Error::ReadOnly`] before it touches the mapping, so a caller that tries to write learns
/// it from an error rather than a fault.
///
/// The mapping is `MAP_SHARED`: a process writing the file meanwhile is seen, so readers must
/// keep writers out (pmfs's owner lock does).
#[derive(Debug)]
pub struct ReadOnlyRegion {
    map: memmap2::Mmap,
    id: DevIno,
    path: PathBuf,
}

impl ReadOnlyRegion {
    /// Opens the pool file `path` for reading only and maps it.
    ///
    /// Fails with [`Error::PoolNotFound`], [`Error::PoolTooSmall`] or
    /// [`Error::PoolSizeUnaligned`] as [`PmRegion::open`](super::PmRegion::open) does, and
    /// with [`Error::InvalidArgument`] if `path` is not a regular file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        Self::map(&open_pool_file(path, false)?, path)
    }

    fn map(file: &File, path: &Path) -> Result<Self> {
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Err(Error::InvalidArgument(NOT_A_FILE));
        }
        let len = check_size(meta.len())?;
        // SAFETY: a shared read-only mapping of a regular file. Its bytes change only if a
        // process writes the file; pmfs's readers hold the owner lock, which keeps pmfs's
        // writers out, and words are loaded atomically.
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(file)? };
        Ok(Self {
            map,
            id: super::procs::DevIno::of(&meta),
            path: path.to_owned(),
        })
    }

    /// The pool file's path, as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bounds-checks `[off, off + len)`.
    fn range(&self, off: PmOff, len: u64) -> Result<std::ops::Range<usize>> {
        let size = self.map.len() as u64;
        match off.0.checked_add(len) {
            Some(end) if end <= size => Ok(off.0 as usize..end as usize),
            _ => Err(Error::OutOfBounds { off, len, size }),
        }
    }
}

impl super::Media for ReadOnlyRegion {
    fn size(&self) -> u64 {
        self.map.len() as u64
    }

    fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
        let r = self.range(off, buf.len() as u64)?;
        buf.copy_from_slice(&self.map[r]);
        Ok(())
    }

    fn write(&self, _off: PmOff, _src: &[u8]) -> Result<()> {
        Err(Error::ReadOnly)
    }

    fn write_nt(&self, _off: PmOff, _src: &[u8]) -> Result<()> {
        Err(Error::ReadOnly)
    }

    fn fill_nt(&self, _off: PmOff, _len: u64, _byte: u8) -> Result<()> {
        Err(Error::ReadOnly)
    }

    fn copy_within_nt(&self, _from: PmOff, _to: PmOff, _len: u64) -> Result<()> {
        Err(Error::ReadOnly)
    }

    fn flush(&self, _off: PmOff, _len: u64) -> Result<()> {
        Err(Error::ReadOnly)
    }

    fn fence(&self) {}

    fn load_u64(&self, off: PmOff) -> Result<u64> {
        if !off.is_aligned(8) {
            return Err(Error::Unaligned(off));
        }
        let r = self.range(off, 8)?;
        let p = self.map[r].as_ptr().cast::<u64>().cast_mut();
        // SAFETY: `p` is 8 bytes in bounds of the live mapping, 8-byte aligned (the mapping is
        // page aligned and `off` is aligned), and only ever loaded: an atomic load of
        // read-only memory of at most the pointer's size is allowed.
        let word = unsafe { AtomicU64::from_ptr(p) };
        Ok(u64::from_le(word.load(Ordering::Acquire)))
    }

    fn store_u64(&self, _off: PmOff, _val: u64) -> Result<()> {
        Err(Error::ReadOnly)
    }

    fn cas_u64(&self, _off: PmOff, _current: u64, _new: u64) -> Result<Result<u64, u64>> {
        Err(Error::ReadOnly)
    }

    fn needs_flush(&self) -> bool {
        false
    }

    fn file_id(&self) -> Option<DevIno> {
        Some(self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pm::{Media, PmRegion};

    fn pool(tag: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("pmfs-ro-{tag}-{}.pool", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let r = PmRegion::create(&path, 2 << 20).unwrap();
        r.write(PmOff(4096), b"written before").unwrap();
        r.store_u64(PmOff(8192), 0x1234_5678).unwrap();
        path
    }

    /// The mapping the kernel lists for the pool file: its permissions column.
    fn mapping_perms(path: &Path) -> Vec<String> {
        let path = path.canonicalize().unwrap();
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| l.ends_with(path.to_str().unwrap()))
            .map(|l| l.split_whitespace().nth(1).unwrap().to_owned())
            .collect()
    }

    #[test]
    fn reads_what_the_file_holds_and_refuses_every_write() {
        let path = pool("rw");
        let r = ReadOnlyRegion::open(&path).unwrap();
        assert_eq!(
            mapping_perms(&path),
            ["r--s"],
            "one shared read-only mapping"
        );
        let mut b = [0u8; 14];
        r.read(PmOff(4096), &mut b).unwrap();
        assert_eq!(&b, b"written before");
        assert_eq!(r.load_u64(PmOff(8192)).unwrap(), 0x1234_5678);
        assert!(matches!(r.load_u64(PmOff(8193)), Err(Error::Unaligned(_))));
        let size = r.size();
        assert!(matches!(
            r.read(PmOff(size - 4), &mut b),
            Err(Error::OutOfBounds { .. })
        ));
        let o = PmOff(4096);
        assert!(matches!(r.write(o, b"x"), Err(Error::ReadOnly)));
        assert!(matches!(r.write_nt(o, b"x"), Err(Error::ReadOnly)));
        assert!(matches!(r.fill_nt(o, 8, 0), Err(Error::ReadOnly)));
        assert!(matches!(
            r.copy_within_nt(o, PmOff(0), 8),
            Err(Error::ReadOnly)
        ));
        assert!(matches!(r.store_u64(o, 1), Err(Error::ReadOnly)));
        assert!(matches!(r.cas_u64(o, 0, 1), Err(Error::ReadOnly)));
        assert!(matches!(r.persist(o, 8), Err(Error::ReadOnly)));
        r.read(PmOff(4096), &mut b).unwrap();
        assert_eq!(&b, b"written before");
        drop(r);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn opens_what_cannot_be_a_pool_with_the_errors_of_a_writable_open() {
        let dir = std::env::temp_dir().join(format!("pmfs-ro-bad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        assert!(matches!(
            ReadOnlyRegion::open(dir.join("absent")),
            Err(Error::PoolNotFound(_))
        ));
        assert!(matches!(
            ReadOnlyRegion::open(&dir),
            Err(Error::InvalidArgument(_))
        ));
        let small = dir.join("small");
        std::fs::write(&small, []).unwrap();
        assert!(matches!(
            ReadOnlyRegion::open(&small),
            Err(Error::PoolTooSmall { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
