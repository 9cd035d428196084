//! A region in ordinary heap memory: volatile, for tests and tools that want
//! [`Media`](super::Media) without a file.

use super::raw::{RawRegion, media_via_raw};
use crate::error::{Error, Result};
use crate::layout::PmOff;

/// A zero-initialised, page-aligned anonymous memory region implementing
/// [`Media`](super::Media).
///
/// It runs the real persistence primitives (so benchmarks and tests exercise them) but its
/// content is lost with the process. Pages are zero-filled lazily by the kernel, so a large
/// region costs nothing until it is touched.
#[derive(Debug)]
pub struct HeapRegion {
    raw: RawRegion,
    // Owns the memory `raw` points into; declared after `raw` so it is dropped last.
    _memory: Memory,
}

#[cfg(not(miri))]
type Memory = memmap2::MmapMut;

#[cfg(miri)]
type Memory = Vec<std::sync::atomic::AtomicU64>;

impl HeapRegion {
    /// Allocates a zeroed region of `size` bytes.
    pub fn new(size: u64) -> Result<Self> {
        let bytes =
            usize::try_from(size).map_err(|_| Error::InvalidArgument("region too large"))?;
        if bytes == 0 {
            return Err(Error::InvalidArgument("empty region"));
        }
        #[cfg(not(miri))]
        let mut memory = memmap2::MmapMut::map_anon(bytes)?;
        #[cfg(not(miri))]
        let base = memory.as_mut_ptr();
        #[cfg(miri)]
        let memory: Memory = (0..bytes.div_ceil(8))
            .map(|_| std::sync::atomic::AtomicU64::new(0))
            .collect();
        #[cfg(miri)]
        let base = memory.as_ptr().cast_mut().cast::<u8>();
        // SAFETY: `base` points to `bytes` zeroed, writable bytes, page-aligned (mmap) or
        // 8-aligned (the Miri vector of words), owned by `memory`, which lives as long as
        // `raw` and is never moved out of its heap or mapping location.
        let raw = unsafe { RawRegion::new(base, size) };
        Ok(Self {
            raw,
            _memory: memory,
        })
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

    /// `copy_within_nt` directly and through a buffer (the trait's default) give the same
    /// bytes, at odd offsets and lengths on both sides of the streaming threshold and of the
    /// buffer's size, and both refuse overlapping and out-of-bounds ranges.
    #[test]
    fn copies_within_the_media() {
        let size = 64 * 1024;
        let pattern: Vec<u8> = (0..size).map(|i| (i * 7 + i / 251) as u8).collect();
        for (from, to, len) in [(0, 8192, 4096), (13, 20_001, 100), (4095, 40_000, 5000)] {
            let direct = HeapRegion::from_image(&pattern).unwrap();
            let buffered = HeapRegion::from_image(&pattern).unwrap();
            direct.copy_within_nt(PmOff(from), PmOff(to), len).unwrap();
            crate::pm::media::copy_through_buffer(&buffered, PmOff(from), PmOff(to), len).unwrap();
            direct.fence();
            let mut want = pattern.clone();
            want.copy_within(from as usize..(from + len) as usize, to as usize);
            for r in [&direct, &buffered] {
                let mut got = vec![0u8; size as usize];
                r.read(PmOff(0), &mut got).unwrap();
                assert!(got == want, "copy of {len} bytes from {from} to {to}");
            }
        }
        let r = HeapRegion::new(size).unwrap();
        for (from, to, len) in [(0, 100, 200), (300, 200, 101), (500, 500, 1)] {
            assert!(matches!(
                r.copy_within_nt(PmOff(from), PmOff(to), len),
                Err(Error::InvalidArgument(_))
            ));
            assert!(matches!(
                crate::pm::media::copy_through_buffer(&r, PmOff(from), PmOff(to), len),
                Err(Error::InvalidArgument(_))
            ));
        }
        assert!(matches!(
            r.copy_within_nt(PmOff(size - 10), PmOff(0), 11),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.copy_within_nt(PmOff(0), PmOff(size - 10), 11),
            Err(Error::OutOfBounds { .. })
        ));
        r.copy_within_nt(PmOff(0), PmOff(0), 0).unwrap();
    }
}
