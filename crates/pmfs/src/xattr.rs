//! Extended attributes, stored in the volume.
//!
//! All attributes of an inode live in one block, at one of two logical blocks of the inode's
//! own mapping placed past the largest file size ([`XATTR_LBLK`] and the one after it). The
//! inode's xattr word names the current one:
//!
//! ```text
//! bits  0..2   current slot + 1 (0: the inode has no attributes)
//! bits 16..32  length of the encoded attributes in bytes
//! bits 32..64  crc32c of those bytes
//! ```
//!
//! The block holds the attributes back to back, each as `name length (u8)`, `value length
//! (u16, little-endian)`, name, value. A change writes the complete new set into the *other*
//! slot's block (mapping it on first use), fences, and then switches the word (journaled with
//! the ctime): a crash leaves either the old or the new set, never a mix. The blocks belong to
//! the inode like its data blocks, so freeing the inode frees them, and the mount's allocator
//! rebuild counts them.

use pmfs_core::layout::{BLOCK_SIZE, crc32c};
use pmfs_core::pm::Media;

use crate::api::Volume;
use crate::api::ino::Ino;
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::inode::{Handle, field};
use crate::journal::run_armed;

/// First of the two logical blocks that hold an inode's extended attributes.
pub(crate) const XATTR_LBLK: u64 = (1 << 32) - XATTR_BLOCKS;
/// Logical blocks reserved for extended attributes.
pub(crate) const XATTR_BLOCKS: u64 = 2;
/// Longest attribute name.
pub const XATTR_NAME_MAX: usize = 255;

/// What [`Volume::set_xattr`] may do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrSet {
    /// Create or replace.
    #[default]
    Any,
    /// Fail with `AlreadyExists` if the attribute exists (`XATTR_CREATE`).
    Create,
    /// Only replace an existing attribute (`XATTR_REPLACE`).
    Replace,
}

type Attrs = Vec<(Vec<u8>, Vec<u8>)>;

fn encode(attrs: &Attrs) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for (n, v) in attrs {
        out.push(n.len() as u8);
        out.extend_from_slice(&(v.len() as u16).to_le_bytes());
        out.extend_from_slice(n);
        out.extend_from_slice(v);
    }
    if out.len() > BLOCK_SIZE as usize {
        return Err(Error::NoSpace);
    }
    Ok(out)
}

fn decode(b: &[u8], at: pmfs_core::layout::PmOff) -> Result<Attrs> {
    let bad = || Error::Corrupt {
        what: "extended attribute block",
        at,
    };
    let mut attrs = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let hdr = b.get(i..i + 3).ok_or_else(bad)?;
        let nl = usize::from(hdr[0]);
        let vl = usize::from(u16::from_le_bytes([hdr[1], hdr[2]]));
        let name = b.get(i + 3..i + 3 + nl).ok_or_else(bad)?;
        let value = b.get(i + 3 + nl..i + 3 + nl + vl).ok_or_else(bad)?;
        if nl == 0 {
            return Err(bad());
        }
        attrs.push((name.to_vec(), value.to_vec()));
        i += 3 + nl + vl;
    }
    Ok(attrs)
}

impl Fs {
    /// The attributes of live inode `h` and its xattr word. Needs the inode lock.
    pub(crate) fn xattrs(&self, h: Handle) -> Result<(Attrs, u64)> {
        let m = self.m();
        let word = self.inodes.load(m, h.ino, field::XATTR)?;
        if word == 0 {
            return Ok((Vec::new(), 0));
        }
        let at = self.inodes.field(h.ino, field::XATTR);
        let slot = word & 3;
        let len = (word >> 16) & 0xffff;
        if !(1..=2).contains(&slot) || len > BLOCK_SIZE {
            return Err(Error::Corrupt {
                what: "extended attribute word",
                at,
            });
        }
        let f = self.map.open_file(self.file_id(h.ino))?;
        let mut runs = Vec::with_capacity(1);
        self.map.lookup(&f, XATTR_LBLK + slot - 1, 1, &mut runs)?;
        let run = runs.first().ok_or(Error::Corrupt {
            what: "extended attribute block not mapped",
            at,
        })?;
        let mut buf = vec![0u8; len as usize];
        m.read(run.pblk.offset(), &mut buf)?;
        if crc32c(&buf) != (word >> 32) as u32 {
            return Err(Error::Corrupt {
                what: "extended attribute checksum",
                at: run.pblk.offset(),
            });
        }
        Ok((decode(&buf, run.pblk.offset())?, word))
    }

    /// Replaces the attributes of `h` (see the module documentation). Needs the inode lock.
    fn store_xattrs(&self, h: Handle, attrs: &Attrs, old_word: u64) -> Result<()> {
        let m: &dyn Media = self.m();
        let bytes = encode(attrs)?;
        let new_word = if attrs.is_empty() {
            0
        } else {
            let slot = if old_word & 3 == 1 { 2 } else { 1 };
            let lblk = XATTR_LBLK + slot - 1;
            let f = self.map.open_file(self.file_id(h.ino))?;
            let mut runs = Vec::with_capacity(1);
            self.map.lookup(&f, lblk, 1, &mut runs)?;
            if runs.is_empty() {
                self.map.insert(&f, lblk, 1, &mut runs)?;
            }
            let pblk = runs
                .first()
                .ok_or(Error::InvalidArgument("mapping returned no run"))?
                .pblk;
            m.write_nt(pblk.offset(), &bytes)?;
            m.fence();
            slot | (bytes.len() as u64) << 16 | u64::from(crc32c(&bytes)) << 32
        };
        let now = self.now();
        let mut tx = self.journal.begin()?;
        tx.protect(self.inodes.field(h.ino, field::XATTR));
        tx.protect(self.inodes.field(h.ino, field::CTIME));
        run_armed(&mut tx, m, |_| {
            self.inodes.store(m, h.ino, field::XATTR, new_word)?;
            self.inodes.store(m, h.ino, field::CTIME, now as u64)
        })?;
        if new_word == 0 {
            // No attributes left: give the blocks back.
            let f = self.map.open_file(self.file_id(h.ino))?;
            self.map.remove(&f, XATTR_LBLK, XATTR_BLOCKS)?;
        }
        Ok(())
    }
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::InvalidArgument("empty attribute name"));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

impl Volume {
    fn live_handle(&self, ino: Ino) -> Result<Handle> {
        let h = Handle::from_word(ino.raw());
        if h.ino == 0 || u64::from(h.ino) >= self.fs.inodes.count() {
            return Err(Error::NotFound);
        }
        if self.fs.inodes.load(self.fs.m(), h.ino, field::STATE)? != h.live_state() {
            return Err(Error::NotFound);
        }
        Ok(h)
    }

    /// The value of attribute `name` of `ino`, `None` if it has none.
    pub fn get_xattr(&self, ino: Ino, name: &[u8]) -> Result<Option<Vec<u8>>> {
        check_name(name)?;
        let _il = self
            .fs
            .ilock(ino.number())
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let h = self.live_handle(ino)?;
        let (attrs, _) = self.fs.xattrs(h)?;
        Ok(attrs.into_iter().find(|(n, _)| n == name).map(|(_, v)| v))
    }

    /// The names of the attributes of `ino`, in the order they were first set.
    pub fn list_xattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let _il = self
            .fs
            .ilock(ino.number())
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let h = self.live_handle(ino)?;
        let (attrs, _) = self.fs.xattrs(h)?;
        Ok(attrs.into_iter().map(|(n, _)| n).collect())
    }

    /// Sets attribute `name` of `ino` to `value`. Returns `false` (and changes nothing) when
    /// `how` is [`XattrSet::Replace`] and the attribute does not exist. All attributes of an
    /// inode share one block: a set that would not fit fails with `NoSpace`.
    pub fn set_xattr(&self, ino: Ino, name: &[u8], value: &[u8], how: XattrSet) -> Result<bool> {
        check_name(name)?;
        if value.len() > usize::from(u16::MAX) {
            return Err(Error::NoSpace);
        }
        self.fs.writable()?;
        let _il = self
            .fs
            .ilock(ino.number())
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let h = self.live_handle(ino)?;
        let (mut attrs, word) = self.fs.xattrs(h)?;
        match (attrs.iter_mut().find(|(n, _)| n == name), how) {
            (Some(_), XattrSet::Create) => return Err(Error::AlreadyExists),
            (None, XattrSet::Replace) => return Ok(false),
            (Some((_, v)), _) => *v = value.to_vec(),
            (None, _) => attrs.push((name.to_vec(), value.to_vec())),
        }
        self.fs.store_xattrs(h, &attrs, word)?;
        Ok(true)
    }

    /// Removes attribute `name` of `ino`; returns whether it existed.
    pub fn remove_xattr(&self, ino: Ino, name: &[u8]) -> Result<bool> {
        check_name(name)?;
        self.fs.writable()?;
        let _il = self
            .fs
            .ilock(ino.number())
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let h = self.live_handle(ino)?;
        let (mut attrs, word) = self.fs.xattrs(h)?;
        let before = attrs.len();
        attrs.retain(|(n, _)| n != name);
        if attrs.len() == before {
            return Ok(false);
        }
        self.fs.store_xattrs(h, &attrs, word)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmfs_core::layout::PmOff;

    #[test]
    fn attribute_sets_round_trip_and_damage_is_corrupt() {
        let attrs: Attrs = vec![
            (b"user.a".to_vec(), b"1".to_vec()),
            (b"user.empty".to_vec(), Vec::new()),
            (b"security.x".to_vec(), vec![7u8; 300]),
        ];
        let b = encode(&attrs).unwrap();
        assert_eq!(decode(&b, PmOff(0)).unwrap(), attrs);
        assert!(matches!(
            decode(&b[..b.len() - 1], PmOff(0)),
            Err(Error::Corrupt { .. })
        ));
        let big: Attrs = vec![(b"user.big".to_vec(), vec![0u8; BLOCK_SIZE as usize])];
        assert!(matches!(encode(&big), Err(Error::NoSpace)));
    }
}
