//! A byte-vector model of one regular file.

/// The content a file must have: every byte, holes as zeros.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model(pub Vec<u8>);

impl Model {
    /// `pwrite(buf, off)`.
    pub fn write(&mut self, buf: &[u8], off: u64) {
        let off = off as usize;
        if self.0.len() < off + buf.len() {
            self.0.resize(off + buf.len(), 0);
        }
        self.0[off..off + buf.len()].copy_from_slice(buf);
    }

    /// `ftruncate(size)`.
    pub fn set_len(&mut self, size: u64) {
        self.0.resize(size as usize, 0);
    }

    /// `fallocate(mode 0 or KEEP_SIZE)`: contents unchanged, the size grows unless kept.
    pub fn allocate(&mut self, off: u64, len: u64, keep_size: bool) {
        let end = (off + len) as usize;
        if !keep_size && end > self.0.len() {
            self.0.resize(end, 0);
        }
    }

    /// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: the range (clamped to the file) reads as zeros.
    pub fn punch(&mut self, off: u64, len: u64) {
        let end = (off.saturating_add(len)).min(self.0.len() as u64) as usize;
        let off = (off as usize).min(end);
        self.0[off..end].fill(0);
    }
}
