//! A region in ordinary heap memory: volatile, for tests and tools that want [`Media`] without
//! a file.

use std::alloc::{Layout, alloc_zeroed, dealloc};

use super::raw::{RawRegion, media_via_raw};
use crate::error::{Error, Result};
use crate::layout::{CACHE_LINE, PmOff};

/// A zero-initialised, cache-line-aligned heap buffer implementing [`Media`](super::Media).
///
/// It runs the real persistence primitives (so benchmarks and tests exercise them) but its
/// content is lost with the process.
#[derive(Debug)]
pub struct HeapRegion {
    raw: RawRegion,
    layout: Layout,
}

impl HeapRegion {
    /// Allocates a zeroed region of `size` bytes.
    pub fn new(size: u64) -> Result<Self> {
        let bytes =
            usize::try_from(size).map_err(|_| Error::InvalidArgument("region too large"))?;
        if bytes == 0 {
            return Err(Error::InvalidArgument("empty region"));
        }
        let layout = Layout::from_size_align(bytes, CACHE_LINE as usize)
            .map_err(|_| Error::InvalidArgument("region too large"))?;
        // SAFETY: `layout` has a non-zero size.
        let base = unsafe { alloc_zeroed(layout) };
        if base.is_null() {
            return Err(Error::NoSpace);
        }
        // SAFETY: `base` is a fresh allocation of `bytes` bytes aligned to 64, freed only in
        // `drop` after `raw` is no longer used.
        let raw = unsafe { RawRegion::new(base, size) };
        Ok(Self { raw, layout })
    }

    /// A region holding a copy of `image`.
    pub fn from_image(image: &[u8]) -> Result<Self> {
        let r = Self::new(image.len() as u64)?;
        r.raw.write(PmOff(0), image)?;
        Ok(r)
    }

    fn raw(&self) -> &RawRegion {
        &self.raw
    }
}

media_via_raw!(HeapRegion);

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: `base` was allocated in `new` with exactly `self.layout`.
        unsafe { dealloc(self.raw.base(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pm::{Media, MediaExt};

    #[test]
    fn bounds_alignment_and_atomics() {
        let r = HeapRegion::new(4096).unwrap();
        r.write(PmOff(10), b"hello").unwrap();
        let mut b = [0u8; 5];
        r.read(PmOff(10), &mut b).unwrap();
        assert_eq!(&b, b"hello");
        assert!(matches!(
            r.read(PmOff(4094), &mut b),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(r.load_u64(PmOff(4)), Err(Error::Unaligned(_))));
        assert!(matches!(
            r.load_u64(PmOff(4096)),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.write(PmOff(u64::MAX), b"x"),
            Err(Error::OutOfBounds { .. })
        ));
        r.store_u64(PmOff(64), 7).unwrap();
        assert_eq!(r.cas_u64(PmOff(64), 7, 9).unwrap(), Ok(7));
        assert_eq!(r.cas_u64(PmOff(64), 7, 11).unwrap(), Err(9));
        assert_eq!(
            r.read_pod::<crate::layout::Le64>(PmOff(64)).unwrap().get(),
            9
        );
        r.fill_nt(PmOff(128), 100, 0xab).unwrap();
        r.fence();
        let mut c = [0u8; 100];
        r.read(PmOff(128), &mut c).unwrap();
        assert!(c.iter().all(|&x| x == 0xab));
    }
}
