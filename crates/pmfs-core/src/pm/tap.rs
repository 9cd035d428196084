//! A region that shows each access to a [`Tap`] before it forwards it: what tests use to
//! count the words an operation reads, refuse the k-th store of an operation, or pause a
//! thread just before a chosen compare-and-swap.

use std::sync::atomic::AtomicU64;

use super::Media;
use crate::error::Result;
use crate::layout::PmOff;
use crate::pm::procs::DevIno;

/// What a [`Tapped`] region does before it forwards an access: observe it, run something
/// first, or refuse it with an error (which the caller then gets instead of the access's
/// result, the region unchanged). Every method lets the access through by default.
pub trait Tap: Send + Sync {
    /// Before `len` bytes at `off` are read: [`read`](Media::read), and
    /// [`load_u64`](Media::load_u64) with `len` 8.
    fn read(&self, _off: PmOff, _len: u64) -> Result<()> {
        Ok(())
    }

    /// Before `len` bytes at `off` are written by ordinary or non-temporal stores:
    /// [`write`](Media::write), [`write_nt`](Media::write_nt), [`fill_nt`](Media::fill_nt).
    fn write(&self, _off: PmOff, _len: u64) -> Result<()> {
        Ok(())
    }

    /// Before the word at `off` is stored ([`store_u64`](Media::store_u64)).
    fn store(&self, _off: PmOff) -> Result<()> {
        Ok(())
    }

    /// Before the word at `off` is swapped from `current` ([`cas_u64`](Media::cas_u64)).
    fn cas(&self, _off: PmOff, _current: u64) -> Result<()> {
        Ok(())
    }
}

/// `inner` with every read, write, store and compare-and-swap shown to `tap` first.
///
/// Flushes, fences and hints go straight through. The region hands out no direct access to
/// its words ([`words`](Media::words) is `None`): every load is one the tap sees. A copy
/// within the region ([`copy_within_nt`](Media::copy_within_nt)) is a read and a write.
#[derive(Debug)]
pub struct Tapped<M, T> {
    inner: M,
    tap: T,
}

impl<M: Media, T: Tap> Tapped<M, T> {
    /// `inner` seen through `tap`.
    pub fn new(inner: M, tap: T) -> Self {
        Tapped { inner, tap }
    }

    /// The tap, for its counters or switches.
    pub fn tap(&self) -> &T {
        &self.tap
    }

    /// The region underneath, whose accesses no tap sees.
    pub fn inner(&self) -> &M {
        &self.inner
    }
}

impl<M: Media, T: Tap> Media for Tapped<M, T> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
        self.tap.read(off, buf.len() as u64)?;
        self.inner.read(off, buf)
    }
    fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.tap.write(off, src.len() as u64)?;
        self.inner.write(off, src)
    }
    fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.tap.write(off, src.len() as u64)?;
        self.inner.write_nt(off, src)
    }
    fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
        self.tap.write(off, len)?;
        self.inner.fill_nt(off, len, byte)
    }
    fn copy_within_nt(&self, from: PmOff, to: PmOff, len: u64) -> Result<()> {
        self.tap.read(from, len)?;
        self.tap.write(to, len)?;
        self.inner.copy_within_nt(from, to, len)
    }
    fn flush(&self, off: PmOff, len: u64) -> Result<()> {
        self.inner.flush(off, len)
    }
    fn fence(&self) {
        self.inner.fence()
    }
    fn load_u64(&self, off: PmOff) -> Result<u64> {
        self.tap.read(off, 8)?;
        self.inner.load_u64(off)
    }
    fn words(&self, _off: PmOff, _count: u64) -> Option<&[AtomicU64]> {
        None
    }
    fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
        self.tap.store(off)?;
        self.inner.store_u64(off, val)
    }
    fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
        self.tap.cas(off, current)?;
        self.inner.cas_u64(off, current, new)
    }
    fn prefetch(&self, off: PmOff) {
        self.inner.prefetch(off)
    }
    fn prefetch_range(&self, off: PmOff, len: u64) {
        self.inner.prefetch_range(off, len)
    }
    fn needs_flush(&self) -> bool {
        self.inner.needs_flush()
    }
    fn file_id(&self) -> Option<DevIno> {
        self.inner.file_id()
    }
    fn client_locks_elsewhere(&self) -> Option<bool> {
        self.inner.client_locks_elsewhere()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::error::Error;
    use crate::pm::HeapRegion;

    /// Counts what it sees and refuses stores and swaps of word 0.
    #[derive(Default)]
    struct Seen {
        read: AtomicU64,
        written: AtomicU64,
    }

    impl Tap for Seen {
        fn read(&self, _off: PmOff, len: u64) -> Result<()> {
            self.read.fetch_add(len, Ordering::Relaxed);
            Ok(())
        }
        fn write(&self, _off: PmOff, len: u64) -> Result<()> {
            self.written.fetch_add(len, Ordering::Relaxed);
            Ok(())
        }
        fn store(&self, off: PmOff) -> Result<()> {
            match off.0 {
                0 => Err(Error::InvalidArgument("word 0")),
                _ => Ok(()),
            }
        }
        fn cas(&self, off: PmOff, _current: u64) -> Result<()> {
            self.store(off)
        }
    }

    #[test]
    fn a_tap_sees_each_access_and_a_refused_one_changes_nothing() {
        let r = Tapped::new(HeapRegion::new(4096).unwrap(), Seen::default());
        r.store_u64(PmOff(8), 5).unwrap();
        assert!(r.store_u64(PmOff(0), 1).is_err());
        assert!(r.cas_u64(PmOff(0), 0, 1).is_err());
        assert_eq!(r.cas_u64(PmOff(8), 5, 6).unwrap(), Ok(5));
        assert_eq!(r.load_u64(PmOff(0)).unwrap(), 0);
        r.write(PmOff(64), &[1; 16]).unwrap();
        r.fill_nt(PmOff(128), 64, 2).unwrap();
        r.copy_within_nt(PmOff(128), PmOff(256), 64).unwrap();
        let mut buf = [0; 8];
        r.read(PmOff(256), &mut buf).unwrap();
        assert_eq!(buf, [2; 8]);
        assert!(r.words(PmOff(0), 1).is_none());
        assert_eq!(r.inner().load_u64(PmOff(8)).unwrap(), 6);
        assert_eq!(r.tap().read.load(Ordering::Relaxed), 8 + 64 + 8);
        assert_eq!(r.tap().written.load(Ordering::Relaxed), 16 + 64 + 64);
    }
}
