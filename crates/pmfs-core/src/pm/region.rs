//! [`PmRegion`]: a pool file mapped into the process, the [`Media`](super::Media) pmfs runs on.
//!
//! # Mapping
//! The file is mapped shared and read-write at an address aligned to 2 MiB (a reserved,
//! inaccessible anonymous range is mapped first, the file is mapped over its aligned part with
//! `MAP_FIXED`, and the rest of the reservation is released), so that the kernel can back the
//! region with huge pages: PMD-sized DAX mappings on a DAX file system, transparent huge pages
//! on tmpfs where `MADV_HUGEPAGE` is honoured.
//!
//! # MAP_SYNC and "real PM"
//! The region first asks for `MAP_SHARED_VALIDATE | MAP_SYNC`. The kernel grants it only for a
//! DAX mapping of a file on persistent memory (ext4/xfs mounted `-o dax` on a pmem device),
//! and then guarantees that the file system's metadata for every page the process writes is
//! durable before the write fault returns. From then on, a user-space flush and fence make
//! stores durable without any system call: that is what [`PmRegion::is_pmem`] calls *real
//! PM*. Any other file system (tmpfs, ext4 without DAX, ...) rejects the flag with
//! `EOPNOTSUPP` (old kernels: `EINVAL`); the region falls back to a plain `MAP_SHARED` mapping
//! and reports `is_pmem() == false`. Such a mapping runs exactly the same instructions (the
//! flushes write lines back to the page cache's DRAM, so tests and benchmarks exercise the
//! real code paths), and its stores survive a crash of the process, but surviving power loss
//! needs [`PmRegion::msync`] (and on tmpfs is impossible).
//!
//! # Backends
//! [`Backend::Mmap`] maps with `mmap(2)` directly and uses the run-time dispatched primitives
//! of [`persist`]. [`Backend::Libpmem`] (cargo feature `libpmem`) maps with
//! libpmem's `pmem_map_file` and routes flush, fence, non-temporal copy/fill and persist
//! through libpmem, for comparison; its `is_pmem` is libpmem's verdict.
//!
//! A pool file must not be truncated by others while mapped: touching a page past the end of
//! the file raises `SIGBUS`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use super::persist::{self, CopyKind, FlushKind};
use super::procs::DevIno;
use super::raw::RawRegion;
use crate::error::{Error, Result};
use crate::layout::{BLOCK_SIZE, HUGE_PAGE, PmOff};

/// The smallest pool: one block.
pub const MIN_POOL_SIZE: u64 = BLOCK_SIZE;

/// How a [`PmRegion`] maps its file and issues its persistence instructions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// `mmap(2)` with `MAP_SYNC` when possible, pmfs's own dispatched primitives.
    #[default]
    Mmap,
    /// libpmem's `pmem_map_file` and its primitives. Needs the `libpmem` cargo feature;
    /// without it, opening a region with this backend fails with [`Error::Unsupported`].
    Libpmem,
}

/// A pool file mapped into the process, implementing [`Media`](super::Media).
///
/// Several `PmRegion`s, in this or other processes, may map the same file: they share its
/// bytes (the mapping is `MAP_SHARED`).
#[derive(Debug)]
pub struct PmRegion {
    /// Bounds-checked view of the mapping; rebuilt by `grow`.
    raw: RawRegion,
    /// Owns the mapping; declared after `raw`, which points into it.
    map: Map,
    file: File,
    /// The pool file's identity, taken when it was mapped: the descriptor in `file` is only
    /// needed to grow the pool, and a program that shares the descriptor table (a preload
    /// client) may close its number and give it to another file.
    id: DevIno,
    path: PathBuf,
    map_sync: bool,
    huge_pages: bool,
}

#[derive(Debug)]
enum Map {
    Mmap(MmapArea),
    #[cfg(feature = "libpmem")]
    Libpmem(pmem::Mapping),
}

impl Map {
    fn base(&self) -> *mut u8 {
        match self {
            Map::Mmap(m) => m.base,
            #[cfg(feature = "libpmem")]
            Map::Libpmem(m) => m.as_ptr(),
        }
    }

    fn is_libpmem(&self) -> bool {
        !matches!(self, Map::Mmap(_))
    }
}

/// A shared file mapping made with `mmap(2)`, unmapped on drop.
#[derive(Debug)]
struct MmapArea {
    base: *mut u8,
    len: usize,
}

// SAFETY: the area is process-wide memory that stays mapped until `drop`; it is only
// accessed through `RawRegion`, whose `Media` contract leaves coordination of overlapping
// accesses to the caller's protocol.
unsafe impl Send for MmapArea {}
// SAFETY: as above; `&MmapArea` only exposes the base address and `madvise`.
unsafe impl Sync for MmapArea {}

impl MmapArea {
    /// Maps `len` bytes of `file` at a 2 MiB-aligned address. Returns the mapping and whether
    /// `MAP_SYNC` was granted.
    fn map(file: &File, len: usize) -> io::Result<(Self, bool)> {
        let align = HUGE_PAGE as usize;
        let len = len.next_multiple_of(page_size());
        let reserve_len = len
            .checked_add(align)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        // SAFETY: a fresh anonymous, inaccessible reservation; no existing memory is touched.
        let reserve = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reserve == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let reserve = reserve.cast::<u8>();
        let head = reserve.addr().next_multiple_of(align) - reserve.addr();
        // SAFETY: `head < align`, so the aligned address and `len` bytes after it lie inside
        // the reservation.
        let want = unsafe { reserve.add(head) };
        let fd = file.as_raw_fd();
        let map_at = |flags: libc::c_int| {
            // SAFETY: MAP_FIXED replaces only pages of our own reservation (`want..want+len`),
            // which nothing else uses.
            unsafe {
                libc::mmap(
                    want.cast(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    flags | libc::MAP_FIXED,
                    fd,
                    0,
                )
            }
        };
        // A MAP_FIXED mapping that the file system rejects may already have unmapped the
        // range it was to replace (ext4 and xfs without DAX refuse MAP_SYNC only in their
        // mmap hook): another thread's mapping could then land in the hole, and a second
        // MAP_FIXED attempt would clobber it. So MAP_SYNC is probed first with a mapping of
        // one page wherever the kernel puts it, and the reservation is mapped over once.
        let map_sync = sync_supported(fd);
        let base = map_at(if map_sync {
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC
        } else {
            libc::MAP_SHARED
        });
        if base == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: releases the head and tail of our reservation. The middle is left alone:
            // the failed call may have unmapped it, and whatever is there now may be another
            // thread's (at worst an inaccessible range of our reservation stays reserved).
            unsafe {
                if head != 0 {
                    libc::munmap(reserve.cast(), head);
                }
                let tail = reserve_len - head - len;
                if tail != 0 {
                    libc::munmap(reserve.add(head + len).cast(), tail);
                }
            }
            return Err(e);
        }
        let tail = reserve_len - head - len;
        // SAFETY: the unused head and tail of the reservation are ours and hold nothing.
        unsafe {
            if head != 0 {
                libc::munmap(reserve.cast(), head);
            }
            if tail != 0 {
                libc::munmap(reserve.add(head + len).cast(), tail);
            }
        }
        Ok((
            Self {
                base: base.cast(),
                len,
            },
            map_sync,
        ))
    }

    /// Asks for transparent huge pages; returns whether the kernel accepted the advice.
    fn advise_huge(&self) -> bool {
        // SAFETY: advice on our own mapping; it does not change its contents.
        unsafe { libc::madvise(self.base.cast(), self.len, libc::MADV_HUGEPAGE) == 0 }
    }

    /// Allocates and faults in the file's pages behind `[from, to)` of the mapping
    /// (`MADV_POPULATE_WRITE`); falls back to `posix_fallocate` where the kernel does not know
    /// the advice.
    fn populate(&self, file: &File, from: u64, to: u64) -> Result<()> {
        debug_assert!(from <= to && to <= self.len as u64);
        // SAFETY: advice on a range of our own mapping; populating writes no bytes.
        let r = unsafe {
            libc::madvise(
                self.base.add(from as usize).cast(),
                (to - from) as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) => allocate(file, from, to),
            // The file system is full (the fault would raise SIGBUS) or memory ran out.
            Some(libc::EFAULT | libc::ENOMEM | libc::ENOSPC) => Err(Error::NoSpace),
            _ => Err(e.into()),
        }
    }
}

impl Drop for MmapArea {
    fn drop(&mut self) {
        // SAFETY: exactly the range mapped in `map`; `PmRegion` drops its `RawRegion` view with
        // it and the `as_ptr` contract ends every outside use before the drop.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Whether `fd` can be mapped with `MAP_SYNC` (a DAX file on persistent memory): a one-page
/// probe mapping at an address of the kernel's choosing, unmapped again.
fn sync_supported(fd: libc::c_int) -> bool {
    let len = page_size();
    // SAFETY: a fresh mapping wherever the kernel puts it; no existing memory is touched.
    let probe = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
            fd,
            0,
        )
    };
    if probe == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: exactly the probe mapping made above, used by nothing.
    unsafe { libc::munmap(probe, len) };
    true
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(4096)
}

/// The record of a client lock ([`PmRegion::lock_as_client`]) of type `kind`: the pool file's
/// first byte, which the owner's exclusive `flock` (another kind of lock) leaves alone.
fn client_lock(kind: libc::c_int) -> libc::flock {
    // SAFETY: a plain C struct, for which zero bytes are a valid value.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = 0;
    l.l_len = 1;
    l
}

/// Checks a pool size and converts it to a mapping length.
pub(super) fn check_size(size: u64) -> Result<usize> {
    if size < MIN_POOL_SIZE {
        return Err(Error::PoolTooSmall {
            size,
            min: MIN_POOL_SIZE,
        });
    }
    if !size.is_multiple_of(BLOCK_SIZE) {
        return Err(Error::PoolSizeUnaligned {
            size,
            block: BLOCK_SIZE,
        });
    }
    usize::try_from(size)
        .ok()
        .filter(|&s| s <= isize::MAX as usize - HUGE_PAGE as usize)
        .ok_or(Error::InvalidArgument(
            "pool too large for this address space",
        ))
}

/// The step in which [`preallocate`] allocates and reports progress.
const PREALLOCATE_STEP: u64 = 64 << 20;

/// Gives the pool file `file` memory (tmpfs) or blocks (any other file system) behind
/// `[from, to)`, extending it to `to` bytes, so that stores to a mapping never fault on a full
/// file system. `progress(done)` is called after each step of at most 64 MiB with the bytes of
/// `[from, to)` done so far.
///
/// On tmpfs the memory is allocated by faulting in a temporary mapping after `MADV_HUGEPAGE`:
/// `posix_fallocate` would back the file with 4 KiB pages, and a pool read at random then pays
/// a TLB miss on nearly every block. Where the tmpfs allows transparent huge pages (mounted with
/// `huge=advise`, `always` or `within_size`, or `shmem_enabled` set to `force`) the pool gets
/// 2 MiB pages, which every later mapping of the file maps whole; else 4 KiB pages, as with
/// `posix_fallocate`.
///
/// `from` and `to` must be multiples of the block size. Fails with [`Error::NoSpace`] if the
/// file system (or memory) is full; the file may then be longer than before.
pub fn preallocate(file: &File, from: u64, to: u64, progress: &mut dyn FnMut(u64)) -> Result<()> {
    if from > to || !from.is_multiple_of(BLOCK_SIZE) || !to.is_multiple_of(BLOCK_SIZE) {
        return Err(Error::InvalidArgument(
            "preallocation needs a block-aligned range",
        ));
    }
    if from == to {
        return Ok(());
    }
    let area = if on_tmpfs(file) {
        if file.metadata()?.len() < to {
            file.set_len(to)?;
        }
        let (area, _) = MmapArea::map(file, check_size(to)?)?;
        area.advise_huge();
        Some(area)
    } else {
        None
    };
    let mut at = from;
    while at < to {
        let end = to.min((at + PREALLOCATE_STEP) / PREALLOCATE_STEP * PREALLOCATE_STEP);
        match &area {
            Some(area) => area.populate(file, at, end)?,
            None => allocate(file, at, end)?,
        }
        at = end;
        progress(at - from);
    }
    Ok(())
}

/// Makes `file` at least `[0, to)` long with real blocks behind `[from, to)`.
fn allocate(file: &File, from: u64, to: u64) -> Result<()> {
    let (off, len) = (
        libc::off_t::try_from(from).map_err(|_| Error::InvalidArgument("pool too large"))?,
        libc::off_t::try_from(to - from).map_err(|_| Error::InvalidArgument("pool too large"))?,
    );
    // SAFETY: plain system call on our open file descriptor.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), off, len) } {
        0 => Ok(()),
        libc::ENOSPC => Err(Error::NoSpace),
        // File systems without fallocate: a sparse extension.
        libc::EOPNOTSUPP | libc::EINVAL => Ok(file.set_len(to)?),
        e => Err(io::Error::from_raw_os_error(e).into()),
    }
}

/// Whether `file` lives on tmpfs, whose memory is allocated by touching the mapping.
fn on_tmpfs(file: &File) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `fstatfs` fills the buffer on success; it is read only then.
    if unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: `fstatfs` returned 0, so it initialised `st`.
    let st = unsafe { st.assume_init() };
    st.f_type == libc::TMPFS_MAGIC
}

impl PmRegion {
    /// Creates the pool file `path` with `size` bytes (zeroed, allocated) and maps it with
    /// [`Backend::Mmap`].
    ///
    /// The file's memory or blocks are allocated by [`preallocate`], which on tmpfs asks for
    /// 2 MiB pages.
    ///
    /// Fails with [`Error::PoolExists`] if the file exists, [`Error::PoolTooSmall`] or
    /// [`Error::PoolSizeUnaligned`] for a bad size, [`Error::NoSpace`] if the file system is
    /// full.
    pub fn create(path: impl AsRef<Path>, size: u64) -> Result<Self> {
        Self::create_with(path, size, Backend::Mmap)
    }

    /// Maps the existing pool file `path` with [`Backend::Mmap`].
    ///
    /// Fails with [`Error::PoolNotFound`], or [`Error::PoolTooSmall`] /
    /// [`Error::PoolSizeUnaligned`] if the file's size cannot be a pool.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, Backend::Mmap)
    }

    /// [`create`](Self::create) with a chosen backend.
    pub fn create_with(path: impl AsRef<Path>, size: u64, backend: Backend) -> Result<Self> {
        let path = path.as_ref();
        check_size(size)?;
        check_backend(backend)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => Error::PoolExists(path.to_owned()),
                _ => Error::Io(e),
            })?;
        let made = preallocate(&file, 0, size, &mut |_| {})
            .and_then(|()| Ok(DevIno::of(&file.metadata()?)))
            .and_then(|id| Self::map(file, path.to_owned(), size, id, backend));
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    /// [`open`](Self::open) with a chosen backend.
    pub fn open_with(path: impl AsRef<Path>, backend: Backend) -> Result<Self> {
        let path = path.as_ref();
        check_backend(backend)?;
        let file = open_pool_file(path, true)?;
        Self::open_file_with(file, path, backend)
    }

    /// Maps the pool file the caller opened (read-write) as `file`, with [`Backend::Mmap`];
    /// `path` names it in errors and is where [`grow`](Self::grow) finds it. The region owns
    /// the descriptor from now on, so a caller that cares which number it has (a library
    /// loaded into another program) chooses it.
    ///
    /// Fails as [`open`](Self::open) does, and with [`Error::InvalidArgument`] if `file` is
    /// not a regular file.
    pub fn open_file(file: File, path: impl AsRef<Path>) -> Result<Self> {
        Self::open_file_with(file, path.as_ref(), Backend::Mmap)
    }

    fn open_file_with(file: File, path: &Path, backend: Backend) -> Result<Self> {
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Err(Error::InvalidArgument(NOT_A_FILE));
        }
        Self::map(
            file,
            path.to_owned(),
            meta.len(),
            DevIno::of(&meta),
            backend,
        )
    }

    /// Maps `size` bytes of `file`, whose identity is `id`.
    fn map(file: File, path: PathBuf, size: u64, id: DevIno, backend: Backend) -> Result<Self> {
        let len = check_size(size)?;
        let (map, map_sync, huge_pages) = map_file(&file, &path, len, backend)?;
        // SAFETY: the mapping is at least `size` bytes, page aligned, readable and writable,
        // and lives in `map`, which the region owns and drops only together with `raw`.
        let raw = unsafe { RawRegion::new(map.base(), size) };
        Ok(Self {
            raw,
            map,
            file,
            id,
            path,
            map_sync,
            huge_pages,
        })
    }

    /// Marks the process as a data-only client of the pool for as long as this region's open
    /// file description lives: a shared open-file-description lock (`F_OFD_SETLK`) on the pool
    /// file's first byte, which the owner asks about
    /// ([`client_locks_elsewhere`](crate::pm::Media::client_locks_elsewhere)) before it takes
    /// the pins on a log for those of dead processes. The descriptor and the region's mapping
    /// both hold the description (and so do a `fork` child's copies of them): the lock goes
    /// when the process ends, not when a program closes the descriptor's number.
    ///
    /// # Errors
    /// [`Error::Io`] if the file system refuses the lock.
    pub fn lock_as_client(&self) -> Result<()> {
        let l = client_lock(libc::F_RDLCK);
        // SAFETY: a descriptor the region owns and a flock record.
        if unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_SETLK, &l) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(())
    }

    /// Grows the pool file to `new_size` bytes and maps it again (the region may move; the
    /// new bytes are zero). Growing to the current size does nothing.
    ///
    /// Fails with [`Error::InvalidArgument`] for a smaller size, [`Error::PoolSizeUnaligned`]
    /// for a size that is not whole blocks, [`Error::NoSpace`] if the file system is full.
    /// If mapping the grown file fails, the file stays grown and the region keeps its old
    /// mapping and size.
    pub fn grow(&mut self, new_size: u64) -> Result<()> {
        let old = self.raw.len();
        if new_size < old {
            return Err(Error::InvalidArgument("a pool cannot shrink"));
        }
        let len = check_size(new_size)?;
        if new_size == old {
            return Ok(());
        }
        preallocate(&self.file, old, new_size, &mut |_| {})?;
        let (map, map_sync, huge_pages) = map_file(&self.file, &self.path, len, self.backend())?;
        // SAFETY: as in `map`: the new mapping covers `new_size` bytes and is owned by `self`
        // from the next statement on. The old mapping is dropped after `raw` stops pointing
        // into it; `&mut self` rules out any concurrent access through this region.
        self.raw = unsafe { RawRegion::new(map.base(), new_size) };
        self.map = map;
        self.map_sync = map_sync;
        self.huge_pages = huge_pages;
        Ok(())
    }

    /// The pool file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The backend the region was opened with.
    pub fn backend(&self) -> Backend {
        if self.map.is_libpmem() {
            Backend::Libpmem
        } else {
            Backend::Mmap
        }
    }

    /// Whether the region is real persistent memory: flushes and fences from user space make
    /// stores durable (see the module docs). For [`Backend::Mmap`] this means the kernel
    /// granted `MAP_SYNC`; for [`Backend::Libpmem`] it is libpmem's `is_pmem` verdict (which
    /// `PMEM_IS_PMEM_FORCE=1` overrides).
    pub fn is_pmem(&self) -> bool {
        match &self.map {
            Map::Mmap(_) => self.map_sync,
            #[cfg(feature = "libpmem")]
            Map::Libpmem(m) => m.is_pmem(),
        }
    }

    /// Whether the mapping was made with `MAP_SYNC` ([`Backend::Mmap`] only; libpmem does not
    /// say how it mapped).
    pub fn map_sync(&self) -> bool {
        self.map_sync
    }

    /// Whether the kernel accepted `MADV_HUGEPAGE` for the mapping. It is asked for page-cache
    /// mappings of at least 2 MiB; DAX mappings get huge pages from the alignment alone.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// The flush instruction the region's flushes use: pmfs's dispatch for the calling
    /// thread, or for [`Backend::Libpmem`] the instruction libpmem picks from the same CPUID
    /// bits (unless its `PMEM_NO_CLWB`/`PMEM_NO_CLFLUSHOPT` variables say otherwise). In eADR
    /// mode ([`persist::needs_flush`] false) no flush is issued at all.
    pub fn flush_kind(&self) -> FlushKind {
        if self.map.is_libpmem() {
            persist::detected_path().flush
        } else {
            persist::flush_kind()
        }
    }

    /// The streaming-store kind of the region's non-temporal copies ([`Backend::Mmap`]: pmfs's
    /// dispatch for the calling thread; [`Backend::Libpmem`]: the widest the CPU has, which
    /// libpmem 1.12 also picks by default).
    pub fn copy_kind(&self) -> CopyKind {
        if self.map.is_libpmem() {
            persist::detected_path().copy
        } else {
            persist::copy_kind()
        }
    }

    /// Writes the pages covering `[off, off + len)` back to the file with `msync(MS_SYNC)`:
    /// the way to make stores survive power loss when the region is not
    /// [real PM](Self::is_pmem).
    pub fn msync(&self, off: PmOff, len: u64) -> Result<()> {
        let p = self.raw.ptr(off, len)?;
        match &self.map {
            Map::Mmap(_) => {
                let start = p.addr() & !(page_size() - 1);
                let end = p.addr() + len as usize;
                // SAFETY: `start` rounds `p` down to its page, which still lies in the mapping
                // (the mapping is page aligned); `p..p+len` was bounds-checked.
                let page = unsafe { p.sub(p.addr() - start) };
                // SAFETY: the page range lies inside our shared file mapping.
                if unsafe { libc::msync(page.cast(), end - start, libc::MS_SYNC) } != 0 {
                    return Err(io::Error::last_os_error().into());
                }
                Ok(())
            }
            #[cfg(feature = "libpmem")]
            // SAFETY: `p..p+len` was bounds-checked inside the libpmem mapping.
            Map::Libpmem(_) => Ok(unsafe { pmem::msync(p, len as usize) }?),
        }
    }

    /// The address of byte 0 of the region: the one raw escape hatch out of pmfs-core, meant
    /// for mapping pool bytes straight into an application (the preload `mmap` path).
    ///
    /// # Safety
    /// The pointer is valid for reads and writes of [`size`](super::Media::size) bytes until
    /// the region is dropped or [grown](Self::grow) (a grow may move the mapping); the caller
    /// must stop using it before either. Because other threads and processes may write the
    /// same bytes at any time, the caller must not create Rust references (`&`/`&mut`) into
    /// it, only use raw-pointer, volatile or atomic accesses, and must follow the
    /// [persistence model](super::Media): stores are durable only after a flush of their
    /// lines and a fence (or a non-temporal store and a fence). Bytes written through the
    /// pointer are still subject to every on-media invariant the file system relies on.
    pub unsafe fn as_ptr(&self) -> *mut u8 {
        self.raw.base()
    }
}

pub(super) const NOT_A_FILE: &str = "a pool must be a regular file";

/// Opens the existing pool file `path` for reading, and for writing if `write`: a missing
/// file is [`Error::PoolNotFound`], a directory [`Error::InvalidArgument`].
pub(super) fn open_pool_file(path: &Path, write: bool) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => Error::PoolNotFound(path.to_owned()),
            io::ErrorKind::IsADirectory => Error::InvalidArgument(NOT_A_FILE),
            _ => Error::Io(e),
        })
}

const NO_LIBPMEM: &str = "the libpmem backend needs pmfs-core's `libpmem` feature";

fn check_backend(backend: Backend) -> Result<()> {
    match backend {
        Backend::Mmap => Ok(()),
        Backend::Libpmem if cfg!(feature = "libpmem") => Ok(()),
        Backend::Libpmem => Err(Error::Unsupported(NO_LIBPMEM)),
    }
}

/// Maps `len` bytes of `file` with `backend`: the mapping, whether `MAP_SYNC` was granted,
/// whether huge pages were advised.
fn map_file(file: &File, path: &Path, len: usize, backend: Backend) -> Result<(Map, bool, bool)> {
    match backend {
        Backend::Mmap => {
            let (area, map_sync) = MmapArea::map(file, len)?;
            let huge = !map_sync && area.len >= HUGE_PAGE as usize && area.advise_huge();
            Ok((Map::Mmap(area), map_sync, huge))
        }
        #[cfg(feature = "libpmem")]
        Backend::Libpmem => {
            let _ = file;
            let m = pmem::Mapping::open(path)?;
            if m.len() < len {
                return Err(Error::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "pool file shrank while being mapped",
                )));
            }
            Ok((Map::Libpmem(m), false, false))
        }
        #[cfg(not(feature = "libpmem"))]
        Backend::Libpmem => {
            let _ = (file, path);
            Err(Error::Unsupported(NO_LIBPMEM))
        }
    }
}

impl super::Media for PmRegion {
    fn size(&self) -> u64 {
        self.raw.len()
    }

    fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
        self.raw.read(off, buf)
    }

    fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.raw.write(off, src)
    }

    fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
        match &self.map {
            Map::Mmap(_) => self.raw.write_nt(off, src),
            #[cfg(feature = "libpmem")]
            Map::Libpmem(_) => {
                let p = self.raw.ptr(off, src.len() as u64)?;
                // SAFETY: `p..p+len` is bounds-checked inside the live mapping; `src` is a
                // caller buffer outside it.
                unsafe { pmem::memcpy_nodrain(p, src) };
                Ok(())
            }
        }
    }

    fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
        match &self.map {
            Map::Mmap(_) => self.raw.fill_nt(off, len, byte),
            #[cfg(feature = "libpmem")]
            Map::Libpmem(_) => {
                let p = self.raw.ptr(off, len)?;
                // SAFETY: `p..p+len` is bounds-checked inside the live mapping.
                unsafe { pmem::memset_nodrain(p, byte, len as usize) };
                Ok(())
            }
        }
    }

    fn copy_within_nt(&self, from: PmOff, to: PmOff, len: u64) -> Result<()> {
        match &self.map {
            Map::Mmap(_) => self.raw.copy_within_nt(from, to, len),
            #[cfg(feature = "libpmem")]
            Map::Libpmem(_) => super::media::copy_through_buffer(self, from, to, len),
        }
    }

    fn flush(&self, off: PmOff, len: u64) -> Result<()> {
        match &self.map {
            Map::Mmap(_) => self.raw.flush(off, len),
            #[cfg(feature = "libpmem")]
            Map::Libpmem(_) => {
                let p = self.raw.ptr(off, len)?;
                if persist::needs_flush() {
                    // SAFETY: the range is bounds-checked inside the live mapping.
                    unsafe { pmem::flush(p, len as usize) };
                }
                Ok(())
            }
        }
    }

    fn fence(&self) {
        match &self.map {
            Map::Mmap(_) => persist::fence(),
            #[cfg(feature = "libpmem")]
            Map::Libpmem(_) => pmem::drain(),
        }
    }

    fn load_u64(&self, off: PmOff) -> Result<u64> {
        self.raw.load_u64(off)
    }

    fn words(&self, off: PmOff, count: u64) -> Option<&[AtomicU64]> {
        self.raw.words(off, count)
    }

    fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
        self.raw.store_u64(off, val)
    }

    fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
        self.raw.cas_u64(off, current, new)
    }

    fn prefetch(&self, off: PmOff) {
        self.raw.prefetch(off)
    }

    fn prefetch_range(&self, off: PmOff, len: u64) {
        self.raw.prefetch_range(off, len)
    }

    fn needs_flush(&self) -> bool {
        persist::needs_flush()
    }

    fn file_id(&self) -> Option<DevIno> {
        Some(self.id)
    }

    fn client_locks_elsewhere(&self) -> Option<bool> {
        let mut l = client_lock(libc::F_WRLCK);
        // SAFETY: a descriptor the region owns and a flock record to fill.
        let r = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_GETLK, &mut l) };
        (r == 0).then_some(l.l_type != libc::F_UNLCK as libc::c_short)
    }

    fn persist(&self, off: PmOff, len: u64) -> Result<()> {
        match &self.map {
            Map::Mmap(_) => {
                self.raw.flush(off, len)?;
                persist::fence();
                Ok(())
            }
            #[cfg(feature = "libpmem")]
            Map::Libpmem(_) => {
                let p = self.raw.ptr(off, len)?;
                if persist::needs_flush() {
                    // SAFETY: the range is bounds-checked inside the live mapping.
                    unsafe { pmem::persist(p, len as usize) };
                } else {
                    pmem::drain();
                }
                Ok(())
            }
        }
    }

    fn write_persist(&self, off: PmOff, src: &[u8]) -> Result<()> {
        match &self.map {
            Map::Mmap(_) => {
                self.raw.write_nt(off, src)?;
                persist::fence();
                Ok(())
            }
            #[cfg(feature = "libpmem")]
            Map::Libpmem(_) => {
                let p = self.raw.ptr(off, src.len() as u64)?;
                // SAFETY: `p..p+len` is bounds-checked inside the live mapping; `src` is a
                // caller buffer outside it.
                unsafe { pmem::memcpy_persist(p, src) };
                Ok(())
            }
        }
    }
}

#[cfg(all(test, not(miri)))]
mod tests;
