//! A proptest state machine: random namespace and data operations run against the volume and
//! against an in-memory file-tree model, for all four mapping kinds. Every result (success or
//! errno) and, after every operation, the whole namespace must match. Sequences close and
//! reopen the volume, and reopen it as if after a crash, in the middle.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use pmfs::{Error, MappingKind, OpenOptions, RenameFlags, Volume};
use pmfs_core::pm::Media;
use proptest::prelude::*;

use common::{KINDS, Obj, Snapshot, crash_copy, fresh, remount, snapshot};

const NAMES: [&str; 6] = [
    "a",
    "b",
    "c",
    "dd",
    "eee",
    "a-much-longer-name-for-the-entry",
];

#[derive(Clone, Debug)]
enum Op {
    Create {
        dir: u8,
        name: u8,
        len: u16,
    },
    Mkdir {
        dir: u8,
        name: u8,
    },
    Symlink {
        dir: u8,
        name: u8,
        target: u8,
    },
    Unlink {
        obj: u8,
    },
    Rmdir {
        obj: u8,
    },
    Rename {
        from: u8,
        dir: u8,
        name: u8,
        flags: u8,
    },
    Link {
        from: u8,
        dir: u8,
        name: u8,
    },
    Write {
        file: u8,
        off: u16,
        len: u16,
        byte: u8,
    },
    Truncate {
        file: u8,
        len: u16,
    },
    Reopen,
    CrashReopen,
}

fn op() -> impl Strategy<Value = Op> {
    let i = any::<u8>;
    prop_oneof![
        6 => (i(), i(), 0u16..9000).prop_map(|(dir, name, len)| Op::Create { dir, name, len }),
        3 => (i(), i()).prop_map(|(dir, name)| Op::Mkdir { dir, name }),
        1 => (i(), i(), i()).prop_map(|(dir, name, target)| Op::Symlink { dir, name, target }),
        3 => i().prop_map(|obj| Op::Unlink { obj }),
        2 => i().prop_map(|obj| Op::Rmdir { obj }),
        4 => (i(), i(), i(), 0u8..3).prop_map(|(from, dir, name, flags)| Op::Rename {
            from,
            dir,
            name,
            flags
        }),
        2 => (i(), i(), i()).prop_map(|(from, dir, name)| Op::Link { from, dir, name }),
        3 => (i(), 0u16..20_000, 0u16..6000, i()).prop_map(|(file, off, len, byte)| Op::Write {
            file,
            off,
            len,
            byte
        }),
        2 => (i(), 0u16..20_000).prop_map(|(file, len)| Op::Truncate { file, len }),
        1 => Just(Op::Reopen),
        1 => Just(Op::CrashReopen),
    ]
}

/// What a path names in the model. Files and symbolic links carry the identity of their
/// inode: hard links share it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Ent {
    Dir,
    File(u64),
    Symlink(u64, String),
}

/// The model: path -> entry, and the content of each file (shared by its hard links).
#[derive(Clone, Debug, Default)]
struct Model {
    paths: BTreeMap<String, Ent>,
    files: HashMap<u64, Vec<u8>>,
    next: u64,
}

/// An error kind both sides report, by errno.
type Outcome = Result<(), i32>;

fn errno(e: Error) -> i32 {
    std::io::Error::from(e).raw_os_error().unwrap_or(-1)
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn parent_of(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) => "/",
        Some(i) => &path[..i],
        None => "/",
    }
}

impl Model {
    fn new() -> Model {
        let mut m = Model::default();
        m.paths.insert("/".into(), Ent::Dir);
        m
    }

    /// Dirs and files (never symlinks: the model does not follow them in parents).
    fn parents(&self) -> Vec<String> {
        self.paths
            .iter()
            .filter(|(_, e)| !matches!(e, Ent::Symlink(..)))
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn objects(&self) -> Vec<String> {
        self.paths.keys().filter(|p| *p != "/").cloned().collect()
    }

    fn file_paths(&self) -> Vec<String> {
        self.paths
            .iter()
            .filter(|(_, e)| matches!(e, Ent::File(_)))
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn pick(list: &[String], i: u8) -> Option<String> {
        (!list.is_empty()).then(|| list[i as usize % list.len()].clone())
    }

    fn children(&self, dir: &str) -> Vec<String> {
        self.paths
            .keys()
            .filter(|p| *p != "/" && p.as_str() != dir && parent_of(p) == dir)
            .cloned()
            .collect()
    }

    /// The parent of a new name must be an existing directory.
    fn check_parent(&self, dir: &str) -> Outcome {
        match self.paths.get(dir) {
            Some(Ent::Dir) => Ok(()),
            Some(_) => Err(libc::ENOTDIR),
            None => Err(libc::ENOENT),
        }
    }

    fn nlink(&self, id: u64) -> u64 {
        self.paths.values().filter(|e| **e == Ent::File(id)).count() as u64
    }

    fn create(&mut self, dir: &str, name: &str, content: Vec<u8>) -> Outcome {
        self.check_parent(dir)?;
        let p = join(dir, name);
        if self.paths.contains_key(&p) {
            return Err(libc::EEXIST);
        }
        let id = self.next;
        self.next += 1;
        self.files.insert(id, content);
        self.paths.insert(p, Ent::File(id));
        Ok(())
    }

    fn add(&mut self, dir: &str, name: &str, e: Ent) -> Outcome {
        self.check_parent(dir)?;
        let p = join(dir, name);
        if self.paths.contains_key(&p) {
            return Err(libc::EEXIST);
        }
        self.paths.insert(p, e);
        Ok(())
    }

    fn unlink(&mut self, p: &str) -> Outcome {
        match self.paths.get(p) {
            None => Err(libc::ENOENT),
            Some(Ent::Dir) => Err(libc::EISDIR),
            Some(Ent::File(id)) => {
                let id = *id;
                self.paths.remove(p);
                if self.nlink(id) == 0 {
                    self.files.remove(&id);
                }
                Ok(())
            }
            Some(Ent::Symlink(..)) => {
                self.paths.remove(p);
                Ok(())
            }
        }
    }

    fn rmdir(&mut self, p: &str) -> Outcome {
        match self.paths.get(p) {
            None => Err(libc::ENOENT),
            Some(Ent::Dir) if !self.children(p).is_empty() => Err(libc::ENOTEMPTY),
            Some(Ent::Dir) => {
                self.paths.remove(p);
                Ok(())
            }
            Some(_) => Err(libc::ENOTDIR),
        }
    }

    fn link(&mut self, from: &str, dir: &str, name: &str) -> Outcome {
        let e = self.paths.get(from).cloned().ok_or(libc::ENOENT)?;
        if e == Ent::Dir {
            return Err(libc::EPERM);
        }
        self.add(dir, name, e)
    }

    /// Moves `from` (and its subtree) to `to`.
    fn move_tree(&mut self, from: &str, to: &str) {
        let prefix = format!("{from}/");
        let moved: Vec<(String, Ent)> = self
            .paths
            .iter()
            .filter(|(p, _)| *p == from || p.starts_with(&prefix))
            .map(|(p, e)| (p.clone(), e.clone()))
            .collect();
        for (p, _) in &moved {
            self.paths.remove(p);
        }
        for (p, e) in moved {
            self.paths.insert(format!("{to}{}", &p[from.len()..]), e);
        }
    }

    fn inside(path: &str, dir: &str) -> bool {
        path == dir || path.starts_with(&format!("{dir}/"))
    }

    fn rename(&mut self, from: &str, dir: &str, name: &str, flags: u8) -> Outcome {
        let s = self.paths.get(from).cloned().ok_or(libc::ENOENT)?;
        self.check_parent(dir)?;
        let to = join(dir, name);
        let t = self.paths.get(&to).cloned();
        if flags == 1 && t.is_some() {
            return Err(libc::EEXIST);
        }
        if flags == 2 && t.is_none() {
            return Err(libc::ENOENT);
        }
        // Two names of one inode (or one name): nothing to do.
        if to == from || (s != Ent::Dir && t.as_ref() == Some(&s)) {
            return Ok(());
        }
        if parent_of(from) != dir {
            if s == Ent::Dir && Model::inside(dir, from) {
                return Err(libc::EINVAL);
            }
            if flags == 2 && t == Some(Ent::Dir) && Model::inside(parent_of(from), &to) {
                return Err(libc::EINVAL);
            }
        }
        if flags == 2 {
            let tmp = "/\u{0}swap".to_owned();
            self.move_tree(from, &tmp);
            self.move_tree(&to, from);
            self.move_tree(&tmp, &to);
            return Ok(());
        }
        if let Some(t) = t {
            match (s == Ent::Dir, t == Ent::Dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                _ => {}
            }
            if t == Ent::Dir {
                if parent_of(from) == to || !self.children(&to).is_empty() {
                    return Err(libc::ENOTEMPTY);
                }
                self.paths.remove(&to);
            } else {
                self.unlink(&to).unwrap();
            }
        }
        self.move_tree(from, &to);
        Ok(())
    }

    fn write(&mut self, p: &str, off: usize, data: &[u8]) -> Outcome {
        let Some(Ent::File(id)) = self.paths.get(p) else {
            return Err(libc::ENOENT);
        };
        // A write of nothing changes nothing, not even the size (pwrite(2)).
        if data.is_empty() {
            return Ok(());
        }
        let f = self.files.get_mut(id).unwrap();
        if f.len() < off + data.len() {
            f.resize(off + data.len(), 0);
        }
        f[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn truncate(&mut self, p: &str, len: usize) -> Outcome {
        let Some(Ent::File(id)) = self.paths.get(p) else {
            return Err(libc::ENOENT);
        };
        self.files.get_mut(id).unwrap().resize(len, 0);
        Ok(())
    }

    fn snapshot(&self) -> Snapshot {
        let mut objects = BTreeMap::new();
        let mut groups: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for (p, e) in &self.paths {
            if p == "/" {
                continue;
            }
            let obj = match e {
                Ent::Dir => Obj::Dir,
                Ent::Symlink(_, t) => Obj::Symlink(t.clone()),
                Ent::File(id) => {
                    groups.entry(*id).or_default().push(p.clone());
                    Obj::File(self.files[id].clone(), self.nlink(*id))
                }
            };
            objects.insert(p.clone(), obj);
        }
        let mut links: Vec<Vec<String>> = groups.into_values().filter(|v| v.len() > 1).collect();
        links.sort();
        Snapshot { objects, links }
    }
}

fn outcome(r: pmfs::Result<()>) -> Outcome {
    r.map_err(errno)
}

fn content(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + seed * 7) as u8).collect()
}

/// Runs one operation on both sides; returns both outcomes.
fn apply(op: &Op, model: &mut Model, vol: &Volume) -> (Outcome, Outcome) {
    let parents = model.parents();
    let objects = model.objects();
    let files = model.file_paths();
    match *op {
        Op::Create { dir, name, len } => {
            let d = Model::pick(&parents, dir).unwrap();
            let n = NAMES[name as usize % NAMES.len()];
            let data = content(len as usize, name as usize);
            let want = model.create(&d, n, data.clone());
            let got = outcome(
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(vol, &join(&d, n))
                    .and_then(|f| f.write_all_at(&data, 0)),
            );
            (want, got)
        }
        Op::Mkdir { dir, name } => {
            let d = Model::pick(&parents, dir).unwrap();
            let n = NAMES[name as usize % NAMES.len()];
            (
                model.add(&d, n, Ent::Dir),
                outcome(vol.create_dir(&join(&d, n))),
            )
        }
        Op::Symlink { dir, name, target } => {
            let d = Model::pick(&parents, dir).unwrap();
            let n = NAMES[name as usize % NAMES.len()];
            let t = format!("/target/{}", NAMES[target as usize % NAMES.len()]);
            model.next += 1;
            let ent = Ent::Symlink(model.next, t.clone());
            (
                model.add(&d, n, ent),
                outcome(vol.symlink(&t, &join(&d, n))),
            )
        }
        Op::Unlink { obj } => match Model::pick(&objects, obj) {
            Some(p) => (model.unlink(&p), outcome(vol.remove_file(&p))),
            None => (Ok(()), Ok(())),
        },
        Op::Rmdir { obj } => match Model::pick(&objects, obj) {
            Some(p) => (model.rmdir(&p), outcome(vol.remove_dir(&p))),
            None => (Ok(()), Ok(())),
        },
        Op::Rename {
            from,
            dir,
            name,
            flags,
        } => match Model::pick(&objects, from) {
            Some(f) => {
                let d = Model::pick(&parents, dir).unwrap();
                let n = NAMES[name as usize % NAMES.len()];
                let fl = RenameFlags {
                    noreplace: flags == 1,
                    exchange: flags == 2,
                };
                let want = model.rename(&f, &d, n, flags);
                (want, outcome(vol.rename_with(&f, &join(&d, n), fl)))
            }
            None => (Ok(()), Ok(())),
        },
        Op::Link { from, dir, name } => match Model::pick(&objects, from) {
            Some(f) => {
                let d = Model::pick(&parents, dir).unwrap();
                let n = NAMES[name as usize % NAMES.len()];
                (
                    model.link(&f, &d, n),
                    outcome(vol.hard_link(&f, &join(&d, n))),
                )
            }
            None => (Ok(()), Ok(())),
        },
        Op::Write {
            file,
            off,
            len,
            byte,
        } => match Model::pick(&files, file) {
            Some(p) => {
                let data = vec![byte; len as usize];
                let want = model.write(&p, off as usize, &data);
                let got = outcome(
                    OpenOptions::new()
                        .write(true)
                        .open(vol, &p)
                        .and_then(|f| f.write_all_at(&data, u64::from(off))),
                );
                (want, got)
            }
            None => (Ok(()), Ok(())),
        },
        Op::Truncate { file, len } => match Model::pick(&files, file) {
            Some(p) => {
                let want = model.truncate(&p, len as usize);
                let got = outcome(
                    OpenOptions::new()
                        .write(true)
                        .open(vol, &p)
                        .and_then(|f| f.set_len(u64::from(len))),
                );
                (want, got)
            }
            None => (Ok(()), Ok(())),
        },
        Op::Reopen | Op::CrashReopen => (Ok(()), Ok(())),
    }
}

fn run(kind: MappingKind, ops: &[Op]) -> Result<(), TestCaseError> {
    let (mut vol, mut media): (Volume, Arc<dyn Media>) = fresh(kind);
    let mut model = Model::new();
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Reopen => {
                vol.close().unwrap();
                vol = remount(&media);
                prop_assert!(vol.mount_report().clean);
            }
            Op::CrashReopen => {
                let copy = crash_copy(&media);
                drop(vol);
                media = copy;
                vol = remount(&media);
                prop_assert!(!vol.mount_report().clean);
            }
            _ => {
                let (want, got) = apply(op, &mut model, &vol);
                prop_assert_eq!(got, want, "op {} {:?}", i, op);
            }
        }
        prop_assert_eq!(snapshot(&vol), model.snapshot(), "after op {} {:?}", i, op);
    }
    vol.close().unwrap();
    let report = pmfs::fsck::check(media).unwrap();
    prop_assert!(report.is_clean(), "{:#?}", report.problems);
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn extent_tree_volume_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(KINDS[0], &ops)?;
    }

    #[test]
    fn radix_tree_volume_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(KINDS[1], &ops)?;
    }

    #[test]
    fn cuckoo_volume_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(KINDS[2], &ops)?;
    }

    #[test]
    fn hashfs_volume_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(KINDS[3], &ops)?;
    }
}
