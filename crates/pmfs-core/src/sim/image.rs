//! [`ImageRegion`]: a [`Media`] over a borrowed crash image, so a checker can open and
//! recover a structure on it without copying the whole region.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::line::{LINE, LineBytes};
use crate::error::{Error, Result};
use crate::layout::PmOff;
use crate::pm::Media;

/// A [`Media`] that reads a borrowed image and keeps its own writes in a private sparse
/// overlay of cache lines.
///
/// Made for checkers: `ImageRegion::new(cp.image)` costs nothing, where copying the image into
/// a [`HeapRegion`](crate::pm::HeapRegion) costs a pass over the whole region per crash
/// image. Recovery may write (repair) freely; the image itself is never changed. Flushes and
/// fences only check their arguments: there is no durability to track (use a
/// [`SimRegion::from_image`](super::SimRegion::from_image) to explore crashes during recovery).
/// Bounds and alignment errors are those of every [`Media`].
pub struct ImageRegion<'a> {
    base: &'a [u8],
    overlay: Mutex<HashMap<u64, LineBytes>>,
}

impl<'a> ImageRegion<'a> {
    /// A region whose content is `image`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `image` is empty, like every region.
    pub fn new(image: &'a [u8]) -> Result<ImageRegion<'a>> {
        if image.is_empty() {
            return Err(Error::InvalidArgument("empty region"));
        }
        Ok(ImageRegion {
            base: image,
            overlay: Mutex::new(HashMap::new()),
        })
    }

    /// The current content: the image with every write applied.
    pub fn image(&self) -> Vec<u8> {
        let mut img = self.base.to_vec();
        for (&line, bytes) in self.lock().iter() {
            let a = line as usize * LINE;
            let n = LINE.min(img.len() - a);
            img[a..a + n].copy_from_slice(&bytes[..n]);
        }
        img
    }

    /// Number of lines written to (the size of the overlay).
    pub fn written_lines(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, LineBytes>> {
        // The map is consistent between statements; a panic elsewhere does not break it.
        self.overlay.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check(&self, off: PmOff, len: u64) -> Result<()> {
        match off.0.checked_add(len) {
            Some(end) if end <= self.base.len() as u64 => Ok(()),
            _ => Err(Error::OutOfBounds {
                off,
                len,
                size: self.base.len() as u64,
            }),
        }
    }

    fn check_word(&self, off: PmOff) -> Result<()> {
        if !off.is_aligned(8) {
            return Err(Error::Unaligned(off));
        }
        self.check(off, 8)
    }

    /// Calls `f` on every line piece of `[off, off + len)`: (line index, start in line,
    /// start in the range, length).
    fn pieces(off: u64, len: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut pos = off;
        let end = off + len;
        while pos < end {
            let line = pos / LINE as u64;
            let n = (end.min((line + 1) * LINE as u64) - pos) as usize;
            f(line, (pos % LINE as u64) as usize, (pos - off) as usize, n);
            pos += n as u64;
        }
    }

    /// The overlay line for `line`, created from the image on first write.
    fn line_mut<'m>(
        base: &[u8],
        overlay: &'m mut HashMap<u64, LineBytes>,
        line: u64,
    ) -> &'m mut LineBytes {
        overlay.entry(line).or_insert_with(|| {
            let a = line as usize * LINE;
            let n = LINE.min(base.len() - a);
            let mut b = [0u8; LINE];
            b[..n].copy_from_slice(&base[a..a + n]);
            b
        })
    }

    fn store(&self, off: PmOff, len: u64, byte_at: impl Fn(usize) -> u8) -> Result<()> {
        self.check(off, len)?;
        let mut ov = self.lock();
        Self::pieces(off.0, len, |line, at, from, n| {
            let l = Self::line_mut(self.base, &mut ov, line);
            for i in 0..n {
                l[at + i] = byte_at(from + i);
            }
        });
        Ok(())
    }

    fn word(&self, ov: &HashMap<u64, LineBytes>, off: PmOff) -> u64 {
        let a = off.0 as usize;
        let mut w = [0u8; 8];
        match ov.get(&(off.0 / LINE as u64)) {
            Some(l) => w.copy_from_slice(&l[a % LINE..a % LINE + 8]),
            None => w.copy_from_slice(&self.base[a..a + 8]),
        }
        u64::from_le_bytes(w)
    }
}

impl fmt::Debug for ImageRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageRegion")
            .field("size", &self.base.len())
            .field("written_lines", &self.written_lines())
            .finish()
    }
}

impl Media for ImageRegion<'_> {
    fn size(&self) -> u64 {
        self.base.len() as u64
    }

    fn read(&self, off: PmOff, buf: &mut [u8]) -> Result<()> {
        self.check(off, buf.len() as u64)?;
        let a = off.0 as usize;
        buf.copy_from_slice(&self.base[a..a + buf.len()]);
        let ov = self.lock();
        if !ov.is_empty() {
            Self::pieces(off.0, buf.len() as u64, |line, at, from, n| {
                if let Some(l) = ov.get(&line) {
                    buf[from..from + n].copy_from_slice(&l[at..at + n]);
                }
            });
        }
        Ok(())
    }

    fn write(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.store(off, src.len() as u64, |i| src[i])
    }

    fn write_nt(&self, off: PmOff, src: &[u8]) -> Result<()> {
        self.store(off, src.len() as u64, |i| src[i])
    }

    fn fill_nt(&self, off: PmOff, len: u64, byte: u8) -> Result<()> {
        self.store(off, len, |_| byte)
    }

    fn flush(&self, off: PmOff, len: u64) -> Result<()> {
        self.check(off, len)
    }

    fn fence(&self) {}

    fn load_u64(&self, off: PmOff) -> Result<u64> {
        self.check_word(off)?;
        Ok(self.word(&self.lock(), off))
    }

    fn store_u64(&self, off: PmOff, val: u64) -> Result<()> {
        self.check_word(off)?;
        let bytes = val.to_le_bytes();
        self.store(off, 8, |i| bytes[i])
    }

    fn cas_u64(&self, off: PmOff, current: u64, new: u64) -> Result<Result<u64, u64>> {
        self.check_word(off)?;
        let mut ov = self.lock();
        let actual = self.word(&ov, off);
        if actual != current {
            return Ok(Err(actual));
        }
        let l = Self::line_mut(self.base, &mut ov, off.0 / LINE as u64);
        let at = (off.0 % LINE as u64) as usize;
        l[at..at + 8].copy_from_slice(&new.to_le_bytes());
        Ok(Ok(current))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_image_and_keeps_writes_private() {
        let img: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
        let r = ImageRegion::new(&img).unwrap();
        let mut b = [0u8; 10];
        r.read(PmOff(60), &mut b).unwrap();
        assert_eq!(b, [60, 61, 62, 63, 64, 65, 66, 67, 68, 69]);
        r.write(PmOff(62), &[0xaa; 4]).unwrap();
        r.fill_nt(PmOff(190), 10, 0xbb).unwrap();
        r.read(PmOff(60), &mut b).unwrap();
        assert_eq!(b, [60, 61, 0xaa, 0xaa, 0xaa, 0xaa, 66, 67, 68, 69]);
        assert_eq!(r.written_lines(), 4);
        let now = r.image();
        assert_eq!(now[62..66], [0xaa; 4]);
        assert_eq!(now[190..200], [0xbb; 10]);
        assert_eq!(now[100], 100);
        assert_eq!(img[62], 62, "the image is untouched");
    }

    #[test]
    fn atomics_and_errors_like_every_region() {
        let img = vec![0u8; 128];
        let r = ImageRegion::new(&img).unwrap();
        r.store_u64(PmOff(64), 7).unwrap();
        assert_eq!(r.cas_u64(PmOff(64), 7, 9).unwrap(), Ok(7));
        assert_eq!(r.cas_u64(PmOff(64), 7, 11).unwrap(), Err(9));
        assert_eq!(r.load_u64(PmOff(64)).unwrap(), 9);
        assert_eq!(r.cas_u64(PmOff(8), 0, 3).unwrap(), Ok(0));
        assert_eq!(r.load_u64(PmOff(8)).unwrap(), 3);
        assert!(matches!(r.load_u64(PmOff(4)), Err(Error::Unaligned(_))));
        assert!(matches!(
            r.load_u64(PmOff(128)),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.write(PmOff(120), &[0; 9]),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.flush(PmOff(u64::MAX), 2),
            Err(Error::OutOfBounds { .. })
        ));
        r.persist(PmOff(0), 128).unwrap();
        assert!(matches!(
            ImageRegion::new(&[]),
            Err(Error::InvalidArgument(_))
        ));
    }
}
