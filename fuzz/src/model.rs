//! An in-memory file tree with the POSIX semantics of pmfs's path API, the oracle of the
//! `ops_vs_model` target.
//!
//! Objects are kept in one map from path (a list of components) to node; the root is the
//! empty path and always exists. Regular files have an identity so that hard links share
//! content. Symbolic links all point at a path that never exists (`/zz/none`), so following
//! one always ends in `NotFound`: the model need not resolve links, and the engine's
//! following code still runs on every path that crosses one.
//!
//! Each operation predicts either success or the *set* of errors that apply. When several
//! conditions fail at once, POSIX does not fix which error wins, so the engine may return any
//! error of the set; it must fail exactly when the set is not empty.

use std::collections::BTreeMap;

use pmfs::Error;

/// Where every symbolic link of the model points.
pub const SYMLINK_TARGET: &str = "/zz/none";

/// A path as a list of components; the root is empty.
pub type Path = Vec<String>;

/// A node of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    File(u32),
    Symlink,
}

/// The errors the model predicts (the errno of each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Errno {
    /// `ENOENT`.
    NotFound,
    /// `EEXIST`.
    Exists,
    /// `ENOTDIR`.
    NotDir,
    /// `EISDIR`.
    IsDir,
    /// `ENOTEMPTY`.
    NotEmpty,
    /// `EINVAL`.
    Invalid,
    /// `EPERM`.
    Perm,
    /// `EBUSY`.
    Busy,
}

impl Errno {
    /// The model's name for an engine error; `None` for errors the model never predicts
    /// (corruption, I/O, out of space), which are failures of the target by themselves.
    pub fn of(e: &Error) -> Option<Errno> {
        Some(match e {
            Error::NotFound => Errno::NotFound,
            Error::AlreadyExists => Errno::Exists,
            Error::NotADirectory => Errno::NotDir,
            Error::IsADirectory => Errno::IsDir,
            Error::DirectoryNotEmpty => Errno::NotEmpty,
            Error::InvalidArgument(_) => Errno::Invalid,
            Error::NotPermitted(_) => Errno::Perm,
            Error::Busy => Errno::Busy,
            _ => return None,
        })
    }
}

/// A prediction: success, or the errors any of which the engine may return.
pub type Expect<T = ()> = Result<T, Vec<Errno>>;

fn fail<T>(e: Errno) -> Expect<T> {
    Err(vec![e])
}

/// What a path names, as the engine's metadata reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stat {
    /// A directory with its link count (2 plus its subdirectories).
    Dir { nlink: u64 },
    /// A regular file with its size and link count.
    File { len: u64, nlink: u64 },
    /// A symbolic link with the length of its target.
    Symlink { len: u64 },
}

/// One object of a whole-tree snapshot.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Obj {
    /// A directory.
    Dir,
    /// A regular file: content and link count.
    File(Vec<u8>, u64),
    /// A symbolic link and its target.
    Symlink(String),
}

/// A whole tree: absolute path (`/a/b`) to object.
pub type Snapshot = BTreeMap<String, Obj>;

/// `rename` flags of the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenameMode {
    /// Replace an existing target.
    Replace,
    /// Fail if the target exists.
    NoReplace,
    /// Swap source and target.
    Exchange,
}

/// The model tree.
#[derive(Clone, Debug, Default)]
pub struct Model {
    nodes: BTreeMap<Path, Node>,
    files: BTreeMap<u32, Vec<u8>>,
    next_file: u32,
}

/// The absolute path string of `p`.
pub fn path_str(p: &[String]) -> String {
    if p.is_empty() {
        "/".to_owned()
    } else {
        p.iter().map(|c| format!("/{c}")).collect()
    }
}

fn is_strict_prefix(a: &[String], b: &[String]) -> bool {
    a.len() < b.len() && b.starts_with(a)
}

impl Model {
    /// An empty tree (just the root).
    pub fn new() -> Model {
        Model::default()
    }

    fn get(&self, p: &[String]) -> Option<Node> {
        if p.is_empty() {
            Some(Node::Dir)
        } else {
            self.nodes.get(p).copied()
        }
    }

    fn children(&self, p: &[String]) -> impl Iterator<Item = (&Path, &Node)> {
        self.nodes
            .iter()
            .filter(move |(k, _)| k.len() == p.len() + 1 && k.starts_with(p))
    }

    fn links(&self, id: u32) -> u64 {
        self.nodes
            .values()
            .filter(|n| **n == Node::File(id))
            .count() as u64
    }

    /// Checks every component before the last: each must be a directory.
    fn parent_ok(&self, p: &[String]) -> Expect {
        for i in 1..p.len() {
            match self.get(&p[..i]) {
                Some(Node::Dir) => {}
                Some(Node::File(_)) => return fail(Errno::NotDir),
                // A link to the never-existing target, or nothing.
                Some(Node::Symlink) | None => return fail(Errno::NotFound),
            }
        }
        Ok(())
    }

    fn drop_unlinked(&mut self, old: Node) {
        if let Node::File(id) = old
            && self.links(id) == 0
        {
            self.files.remove(&id);
        }
    }

    /// Moves the subtree at `from` (the node and, for a directory, everything below) to `to`.
    fn move_tree(&mut self, from: &[String], to: &[String]) {
        let keys: Vec<Path> = self
            .nodes
            .keys()
            .filter(|k| k.starts_with(from))
            .cloned()
            .collect();
        let moved: Vec<(Path, Node)> = keys
            .into_iter()
            .map(|k| {
                let n = self.nodes.remove(&k).expect("key just listed");
                let mut nk = to.to_vec();
                nk.extend_from_slice(&k[from.len()..]);
                (nk, n)
            })
            .collect();
        self.nodes.extend(moved);
    }

    fn remove_tree(&mut self, p: &[String]) {
        self.nodes.retain(|k, _| !k.starts_with(p));
    }

    /// `create_dir`.
    pub fn create_dir(&mut self, p: &[String]) -> Expect {
        if p.is_empty() {
            return fail(Errno::Exists);
        }
        self.parent_ok(p)?;
        if self.get(p).is_some() {
            return fail(Errno::Exists);
        }
        self.nodes.insert(p.to_vec(), Node::Dir);
        Ok(())
    }

    /// Opens `p` for writing, creating it if `create`; the file's identity.
    fn open_write(&mut self, p: &[String], create: bool) -> Expect<u32> {
        if p.is_empty() {
            return fail(Errno::IsDir);
        }
        self.parent_ok(p)?;
        match self.get(p) {
            Some(Node::Dir) => fail(Errno::IsDir),
            Some(Node::Symlink) => fail(Errno::NotFound),
            Some(Node::File(id)) => Ok(id),
            None if create => {
                let id = self.next_file;
                self.next_file += 1;
                self.files.insert(id, Vec::new());
                self.nodes.insert(p.to_vec(), Node::File(id));
                Ok(id)
            }
            None => fail(Errno::NotFound),
        }
    }

    /// Open with write and create (no truncation), then write `data` at `off`.
    pub fn write(&mut self, p: &[String], off: u64, data: &[u8]) -> Expect {
        let id = self.open_write(p, true)?;
        if data.is_empty() {
            // Nothing written: the size stays, also for an offset past the end.
            return Ok(());
        }
        let f = self.files.get_mut(&id).expect("live file");
        let end = off as usize + data.len();
        if f.len() < end {
            f.resize(end, 0);
        }
        f[off as usize..end].copy_from_slice(data);
        Ok(())
    }

    /// Open with write (no create), then `set_len`.
    pub fn set_len(&mut self, p: &[String], size: u64) -> Expect {
        let id = self.open_write(p, false)?;
        self.files
            .get_mut(&id)
            .expect("live file")
            .resize(size as usize, 0);
        Ok(())
    }

    /// `remove_file`.
    pub fn remove_file(&mut self, p: &[String]) -> Expect {
        if p.is_empty() {
            return fail(Errno::IsDir);
        }
        self.parent_ok(p)?;
        match self.get(p) {
            None => fail(Errno::NotFound),
            Some(Node::Dir) => fail(Errno::IsDir),
            Some(n) => {
                self.nodes.remove(p);
                self.drop_unlinked(n);
                Ok(())
            }
        }
    }

    /// `remove_dir`.
    pub fn remove_dir(&mut self, p: &[String]) -> Expect {
        if p.is_empty() {
            return fail(Errno::Busy);
        }
        self.parent_ok(p)?;
        match self.get(p) {
            None => fail(Errno::NotFound),
            Some(Node::Dir) if self.children(p).next().is_some() => fail(Errno::NotEmpty),
            Some(Node::Dir) => {
                self.nodes.remove(p);
                Ok(())
            }
            Some(_) => fail(Errno::NotDir),
        }
    }

    /// `rename_with`.
    pub fn rename(&mut self, from: &[String], to: &[String], mode: RenameMode) -> Expect {
        if from.is_empty() {
            return fail(Errno::Busy);
        }
        self.parent_ok(from)?;
        if to.is_empty() {
            return fail(Errno::Busy);
        }
        self.parent_ok(to)?;
        let Some(s) = self.get(from) else {
            return fail(Errno::NotFound);
        };
        let t = self.get(to);
        let mut errs = Vec::new();
        match (mode, t) {
            (RenameMode::NoReplace, Some(_)) => errs.push(Errno::Exists),
            (RenameMode::Exchange, None) => errs.push(Errno::NotFound),
            _ => {}
        }
        let same = from == to || matches!((s, t), (Node::File(a), Some(Node::File(b))) if a == b);
        if errs.is_empty() && same {
            // Two names of one object: nothing to do.
            return Ok(());
        }
        if is_strict_prefix(from, to) {
            errs.push(Errno::Invalid);
        }
        if is_strict_prefix(to, from) {
            errs.push(if mode == RenameMode::Exchange {
                Errno::Invalid
            } else {
                Errno::NotEmpty
            });
        }
        if mode != RenameMode::Exchange
            && let Some(t) = t
        {
            match (s, t) {
                (Node::Dir, Node::Dir) if self.children(to).next().is_some() => {
                    errs.push(Errno::NotEmpty)
                }
                (Node::Dir, Node::Dir) => {}
                (Node::Dir, _) => errs.push(Errno::NotDir),
                (_, Node::Dir) => errs.push(Errno::IsDir),
                _ => {}
            }
        }
        if !errs.is_empty() {
            errs.sort();
            errs.dedup();
            return Err(errs);
        }
        match (mode, t) {
            (RenameMode::Exchange, _) => {
                let tmp = vec!["\u{0}swap".to_owned()];
                self.move_tree(from, &tmp);
                self.move_tree(to, from);
                self.move_tree(&tmp, to);
            }
            (_, Some(old)) => {
                self.remove_tree(to);
                self.drop_unlinked(old);
                self.move_tree(from, to);
            }
            (_, None) => self.move_tree(from, to),
        }
        Ok(())
    }

    /// `hard_link(original, link)`.
    pub fn hard_link(&mut self, orig: &[String], link: &[String]) -> Expect {
        if orig.is_empty() {
            return fail(Errno::Perm);
        }
        self.parent_ok(orig)?;
        let n = match self.get(orig) {
            None => return fail(Errno::NotFound),
            Some(Node::Dir) => return fail(Errno::Perm),
            Some(n) => n,
        };
        if link.is_empty() {
            return fail(Errno::Exists);
        }
        self.parent_ok(link)?;
        if self.get(link).is_some() {
            return fail(Errno::Exists);
        }
        self.nodes.insert(link.to_vec(), n);
        Ok(())
    }

    /// `symlink(SYMLINK_TARGET, link)`.
    pub fn symlink(&mut self, link: &[String]) -> Expect {
        if link.is_empty() {
            return fail(Errno::Exists);
        }
        self.parent_ok(link)?;
        if self.get(link).is_some() {
            return fail(Errno::Exists);
        }
        self.nodes.insert(link.to_vec(), Node::Symlink);
        Ok(())
    }

    /// `read`: the whole content of a file.
    pub fn read(&self, p: &[String]) -> Expect<Vec<u8>> {
        if p.is_empty() {
            return fail(Errno::IsDir);
        }
        self.parent_ok(p)?;
        match self.get(p) {
            None | Some(Node::Symlink) => fail(Errno::NotFound),
            Some(Node::Dir) => fail(Errno::IsDir),
            Some(Node::File(id)) => Ok(self.files[&id].clone()),
        }
    }

    fn stat_node(&self, p: &[String], n: Node) -> Stat {
        match n {
            Node::Dir => Stat::Dir {
                nlink: 2 + self.children(p).filter(|(_, c)| **c == Node::Dir).count() as u64,
            },
            Node::File(id) => Stat::File {
                len: self.files[&id].len() as u64,
                nlink: self.links(id),
            },
            Node::Symlink => Stat::Symlink {
                len: SYMLINK_TARGET.len() as u64,
            },
        }
    }

    /// `metadata` (`follow`) or `symlink_metadata`.
    pub fn stat(&self, p: &[String], follow: bool) -> Expect<Stat> {
        self.parent_ok(p)?;
        match self.get(p) {
            None => fail(Errno::NotFound),
            Some(Node::Symlink) if follow => fail(Errno::NotFound),
            Some(n) => Ok(self.stat_node(p, n)),
        }
    }

    /// `read_dir`: the sorted names.
    pub fn read_dir(&self, p: &[String]) -> Expect<Vec<String>> {
        self.parent_ok(p)?;
        match self.get(p) {
            None | Some(Node::Symlink) => fail(Errno::NotFound),
            Some(Node::File(_)) => fail(Errno::NotDir),
            Some(Node::Dir) => Ok(self
                .children(p)
                .map(|(k, _)| k.last().expect("non-root").clone())
                .collect()),
        }
    }

    /// The whole tree.
    pub fn snapshot(&self) -> Snapshot {
        self.nodes
            .iter()
            .map(|(k, n)| {
                let obj = match *n {
                    Node::Dir => Obj::Dir,
                    Node::File(id) => Obj::File(self.files[&id].clone(), self.links(id)),
                    Node::Symlink => Obj::Symlink(SYMLINK_TARGET.to_owned()),
                };
                (path_str(k), obj)
            })
            .collect()
    }
}

/// The whole tree of a mounted volume, in the model's terms. Fails on any error: a volume
/// the engine reports consistent must be walkable.
pub fn snapshot_volume(vol: &pmfs::Volume) -> Result<Snapshot, String> {
    let mut out = Snapshot::new();
    let mut stack = vec!["/".to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = vol
            .read_dir(&dir)
            .map_err(|e| format!("read_dir {dir}: {e}"))?;
        for e in entries {
            let e = e.map_err(|e| format!("read_dir {dir}: {e}"))?;
            let name = e
                .file_name()
                .into_string()
                .map_err(|n| format!("name {n:?}"))?;
            let path = if dir == "/" {
                format!("/{name}")
            } else {
                format!("{dir}/{name}")
            };
            let md = vol
                .symlink_metadata(&path)
                .map_err(|e| format!("symlink_metadata {path}: {e}"))?;
            let obj = if md.is_dir() {
                stack.push(path.clone());
                Obj::Dir
            } else if md.is_symlink() {
                let t = vol
                    .read_link(&path)
                    .map_err(|e| format!("read_link {path}: {e}"))?;
                Obj::Symlink(t.to_string_lossy().into_owned())
            } else {
                let data = vol.read(&path).map_err(|e| format!("read {path}: {e}"))?;
                Obj::File(data, md.nlink())
            };
            out.insert(path, obj);
        }
    }
    Ok(out)
}
