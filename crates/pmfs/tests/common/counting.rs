//! A heap region that counts the words read from it, for tests that bound the work of an
//! operation by what it reads rather than by time.

use std::sync::atomic::{AtomicU64, Ordering};

use pmfs_core::layout::PmOff;
use pmfs_core::pm::{HeapRegion, Tap, Tapped};

/// A heap region that counts the words read from it, and hands out no direct access to its
/// words (every read goes through the count).
pub type Counting = Tapped<HeapRegion, Loads>;

/// A zeroed counting region of `size` bytes.
pub fn new(size: u64) -> Counting {
    Tapped::new(HeapRegion::new(size).unwrap(), Loads::default())
}

/// A counting region with the content of `image`.
pub fn from_image(image: &[u8]) -> Counting {
    Tapped::new(HeapRegion::from_image(image).unwrap(), Loads::default())
}

/// The words loaded (a compare-and-swap loads one).
#[derive(Default)]
pub struct Loads(AtomicU64);

impl Loads {
    /// Words read so far.
    pub fn words(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
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

impl Tap for Loads {
    fn read(&self, _off: PmOff, len: u64) -> pmfs_core::Result<()> {
        self.0.fetch_add(len.div_ceil(8), Ordering::Relaxed);
        Ok(())
    }
    fn cas(&self, _off: PmOff, _current: u64) -> pmfs_core::Result<()> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
