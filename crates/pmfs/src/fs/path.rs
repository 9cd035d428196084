//! Path resolution.
//!
//! Paths are absolute, `/`-separated byte strings like `/a/b`. Empty components and `.` are
//! skipped, `..` goes to the parent (the root's parent is the root). Names longer than 255
//! bytes fail with `NameTooLong`; a NUL byte fails with `InvalidArgument`.
//!
//! Symbolic links are followed the way the kernel does for the std call being mirrored: in
//! every intermediate component, and in the last component only when the caller asks
//! ([`Follow::Last`]: `open`, `metadata`, `read_dir`, `set_permissions`, `set_times`). Relative
//! targets are resolved from the link's directory, absolute ones from the volume root. More
//! than 40 links in one resolution fail with `FilesystemLoop`.

use std::borrow::Cow;
use std::sync::Arc;

use super::Fs;
use crate::dir::page::NAME_MAX;
use crate::dir::{Dir, Slot};
use crate::error::{Error, Result};
use crate::inode::Kind;

const MAX_SYMLINKS: u32 = 40;

/// Whether a symbolic link in the last component is followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Follow {
    Last,
    NoLast,
}

/// What a path names.
#[derive(Debug)]
pub(crate) enum Target<'p> {
    /// A directory reached without a final name (`/`, a trailing `.` or `..`).
    Dir(Arc<Dir>),
    /// An entry (maybe missing) of a directory.
    Entry {
        parent: Arc<Dir>,
        name: Cow<'p, [u8]>,
        slot: Option<Slot>,
        /// The path ended with `/`: the target must be a directory.
        want_dir: bool,
    },
}

/// Checks a single name for create-like operations.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(Error::InvalidArgument("invalid file name"));
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(Error::InvalidArgument("file name contains '/' or NUL"));
    }
    Ok(())
}

fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

/// The components still to resolve: those of symbolic-link targets being expanded (a stack,
/// next one last), then the rest of the path itself.
struct Comps<'p> {
    path: &'p [u8],
    pos: usize,
    expanded: Vec<Vec<u8>>,
}

impl<'p> Comps<'p> {
    fn next(&mut self) -> Option<Cow<'p, [u8]>> {
        if let Some(c) = self.expanded.pop() {
            return Some(Cow::Owned(c));
        }
        while self.path.get(self.pos) == Some(&b'/') {
            self.pos += 1;
        }
        if self.pos >= self.path.len() {
            return None;
        }
        let start = self.pos;
        while self.path.get(self.pos).is_some_and(|&b| b != b'/') {
            self.pos += 1;
        }
        Some(Cow::Borrowed(&self.path[start..self.pos]))
    }

    fn is_empty(&self) -> bool {
        self.expanded.is_empty() && self.path[self.pos..].iter().all(|&b| b == b'/')
    }

    /// Puts a link target's components in front of the remaining ones.
    fn expand(&mut self, target: &[u8]) {
        for c in components(target).rev() {
            self.expanded.push(c.to_vec());
        }
    }
}

impl Fs {
    /// Resolves `path` (see the module documentation).
    pub fn resolve<'p>(&self, path: &'p str, follow: Follow) -> Result<Target<'p>> {
        let bytes = path.as_bytes();
        if bytes.first() != Some(&b'/') {
            return Err(Error::InvalidArgument("path must be absolute"));
        }
        if bytes.contains(&0) {
            return Err(Error::InvalidArgument("path contains NUL"));
        }
        let want_dir = bytes.len() > 1 && bytes.ends_with(b"/");
        let mut comps = Comps {
            path: bytes,
            pos: 0,
            expanded: Vec::new(),
        };
        let mut cur = self.root_dir()?;
        let mut links = 0u32;
        while let Some(comp) = comps.next() {
            let last = comps.is_empty();
            match &*comp {
                b"." => {}
                b".." => {
                    if cur.inner.read().unwrap_or_else(|e| e.into_inner()).dead {
                        return Err(Error::NotFound);
                    }
                    cur = self.dir(cur.parent())?;
                }
                name => {
                    if name.len() > NAME_MAX {
                        return Err(Error::NameTooLong);
                    }
                    let slot = {
                        let d = cur.inner.read().unwrap_or_else(|e| e.into_inner());
                        if d.dead {
                            return Err(Error::NotFound);
                        }
                        d.get(name)
                    };
                    let follow_this = !last || follow == Follow::Last;
                    match slot {
                        Some(s) if s.kind == Kind::Symlink && follow_this => {
                            links += 1;
                            if links > MAX_SYMLINKS {
                                return Err(Error::FilesystemLoop);
                            }
                            let target = self.read_link_of(s.h)?;
                            if target.first() == Some(&b'/') {
                                cur = self.root_dir()?;
                            }
                            if last && target.iter().all(|&b| b == b'/') {
                                // A link to "/": the root itself.
                                return Ok(Target::Dir(cur));
                            }
                            comps.expand(&target);
                            continue;
                        }
                        Some(s) if !last => {
                            if s.kind != Kind::Dir {
                                return Err(Error::NotADirectory);
                            }
                            cur = self.dir(s.h)?;
                        }
                        None if !last => return Err(Error::NotFound),
                        _ => {
                            if want_dir && slot.is_some_and(|s| s.kind != Kind::Dir) {
                                return Err(Error::NotADirectory);
                            }
                            return Ok(Target::Entry {
                                parent: cur,
                                name: comp,
                                slot,
                                want_dir,
                            });
                        }
                    }
                }
            }
            if last {
                return Ok(Target::Dir(cur));
            }
        }
        Ok(Target::Dir(cur))
    }

    /// Resolves `path` to an existing object: its directory (when it is one) or its entry.
    pub fn resolve_existing(&self, path: &str, follow: Follow) -> Result<Existing> {
        match self.resolve(path, follow)? {
            Target::Dir(d) => Ok(Existing::Dir(d)),
            Target::Entry { slot: Some(s), .. } => Ok(Existing::Entry { slot: s }),
            Target::Entry { slot: None, .. } => Err(Error::NotFound),
        }
    }
}

/// An existing object named by a path.
#[derive(Debug)]
pub(crate) enum Existing {
    /// A directory reached without a final name.
    Dir(Arc<Dir>),
    /// An entry of a directory.
    Entry { slot: Slot },
}

impl Existing {
    /// The inode handle and kind.
    pub fn handle(&self) -> (crate::inode::Handle, Kind) {
        match self {
            Existing::Dir(d) => (d.h, Kind::Dir),
            Existing::Entry { slot, .. } => (slot.h, slot.kind),
        }
    }
}
