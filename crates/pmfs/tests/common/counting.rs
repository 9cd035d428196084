//! A heap region that counts the words read from it, for tests that bound the work of an
//! operation by what it reads rather than by time.

use std::sync::atomic::{AtomicU64, Ordering};

use pmfs_core::layout::PmOff;
use pmfs_core::pm::{HeapRegion, Media};

/// A heap region that counts the words read from it, and hands out no direct access to its
/// words (every read goes through the count).
pub struct Counting {
    inner: HeapRegion,
    words: AtomicU64,
}

impl Counting {
    /// A zeroed region of `size` bytes.
    pub fn new(size: u64) -> Self {
        Self::of(HeapRegion::new(size).unwrap())
    }

    /// A region with the content of `image`.
    pub fn from_image(image: &[u8]) -> Self {
        Self::of(HeapRegion::from_image(image).unwrap())
    }

    fn of(inner: HeapRegion) -> Self {
        Counting {
            inner,
            words: AtomicU64::new(0),
        }
    }

    /// Words read so far.
    pub fn words(&self) -> u64 {
        self.words.load(Ordering::Relaxed)
    }

    /// Runs `op` and checks that it loaded fewer than `limit` words.
    pub fn costs<T>(&self, limit: u64, what: &str, op: impl FnOnce() -> T) -> T {
        let before = self.words();
        let out = op();
        let loaded = self.words() - before;
        assert!(loaded < limit, "{what}: {loaded} words loaded");
        out
    }
}

impl Media for Counting {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&self, off: PmOff, buf: &mut [u8]) -> pmfs_core::Result<()> {
        self.words
            .fetch_add((buf.len() as u64).div_ceil(8), Ordering::Relaxed);
        self.inner.read(off, buf)
    }
    fn write(&self, off: PmOff, src: &[u8]) -> pmfs_core::Result<()> {
        self.inner.write(off, src)
    }
    fn write_nt(&self, off: PmOff, src: &[u8]) -> pmfs_core::Result<()> {
        self.inner.write_nt(off, src)
    }
    fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> pmfs_core::Result<()> {
        self.inner.fill_nt(off, len, byte)
    }
    fn flush(&self, off: PmOff, len: u64) -> pmfs_core::Result<()> {
        self.inner.flush(off, len)
    }
    fn fence(&self) {
        self.inner.fence()
    }
    fn load_u64(&self, off: PmOff) -> pmfs_core::Result<u64> {
        self.words.fetch_add(1, Ordering::Relaxed);
        self.inner.load_u64(off)
    }
    fn store_u64(&self, off: PmOff, val: u64) -> pmfs_core::Result<()> {
        self.inner.store_u64(off, val)
    }
    fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> pmfs_core::Result<Result<u64, u64>> {
        self.words.fetch_add(1, Ordering::Relaxed);
        self.inner.cas_u64(off, current, new)
    }
}
