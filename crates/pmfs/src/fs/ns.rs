//! Namespace operations: create, mkdir, symlink (log-free, CFFS), unlink and rmdir (log-free
//! when the inode loses its last link, journaled otherwise), link, rename (journaled), and the
//! attribute updates.

use std::sync::{Arc, RwLockWriteGuard};

use pmfs_core::layout::BLOCK_SIZE;
use pmfs_core::pm::Media;

use super::{Fs, LOCK_STRIPES, MAX_LINKS};
use crate::dir::page::{self, F_DROPS_INODE};
use crate::dir::{Dir, DirInner, EntryWords, Slot};
use crate::error::{Error, Result};
use crate::fs::path::check_name;
use crate::inode::{Handle, InodeRaw, Kind, S_IFMT, field};
use crate::journal::{Cleanup, run_armed};

/// What [`Fs::open_or_create`] found or made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Opened {
    pub h: Handle,
    pub kind: Kind,
    pub created: bool,
}

/// Flags of [`Fs::rename`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

fn write_guard(d: &Dir) -> RwLockWriteGuard<'_, DirInner> {
    d.inner.write().unwrap_or_else(|e| e.into_inner())
}

fn live(d: &DirInner) -> Result<()> {
    if d.dead { Err(Error::NotFound) } else { Ok(()) }
}

/// Re-points an existing entry at another inode (rename over a target, exchange): handle,
/// kind, creation time and checksum change; the distances stay.
fn retarget(
    m: &dyn Media,
    w: &EntryWords,
    h: Handle,
    kind: Kind,
    now: i64,
    name: &[u8],
) -> Result<()> {
    let prev = m.load_u64(w.prev)?;
    m.store_u64(
        w.prev,
        (prev & !(0xff << 32)) | u64::from(kind.code()) << 32,
    )?;
    m.store_u64(w.handle, h.word())?;
    m.store_u64(w.ctime, now as u64)?;
    let crc = page::entry_crc(h.word(), now as u64, kind.code(), name);
    let next = m.load_u64(w.next)?;
    m.store_u64(w.next, (next & 0xffff_ffff) | u64::from(crc) << 32)?;
    m.flush(w.prev, 8)?;
    m.flush(w.handle, 16)?;
    m.flush(w.next, 8)?;
    Ok(())
}

/// Two locked directories that may be one and the same.
struct Pair<'a> {
    a: RwLockWriteGuard<'a, DirInner>,
    b: Option<RwLockWriteGuard<'a, DirInner>>,
}

impl<'a> Pair<'a> {
    /// Locks `src` and `dst` in inode order.
    fn lock(src: &'a Dir, dst: &'a Dir) -> Pair<'a> {
        if src.h == dst.h {
            return Pair {
                a: write_guard(src),
                b: None,
            };
        }
        if src.h.ino < dst.h.ino {
            let a = write_guard(src);
            let b = write_guard(dst);
            Pair { a, b: Some(b) }
        } else {
            let b = write_guard(dst);
            let a = write_guard(src);
            Pair { a, b: Some(b) }
        }
    }

    fn src(&mut self) -> &mut DirInner {
        &mut self.a
    }

    fn dst(&mut self) -> &mut DirInner {
        match &mut self.b {
            Some(g) => g,
            None => &mut self.a,
        }
    }
}

impl Fs {
    /// Opens `name` in `parent` for [`open`](Fs::open) with a create flag, under one lock of
    /// the directory: returns the existing entry (counted as open when it is a regular file)
    /// or creates a regular file (counted as open before the directory is unlocked, so nobody
    /// can unlink and free it before the caller holds it).
    pub fn open_or_create(
        &self,
        parent: &Dir,
        name: &[u8],
        perm: u32,
        exclusive: bool,
    ) -> Result<Opened> {
        self.writable()?;
        check_name(name)?;
        let mut d = write_guard(parent);
        live(&d)?;
        if let Some(s) = d.get(name) {
            if exclusive {
                return Err(Error::AlreadyExists);
            }
            if s.kind == Kind::File {
                self.open_inc(s.h.ino);
            }
            return Ok(Opened {
                h: s.h,
                kind: s.kind,
                created: false,
            });
        }
        let h = self.create_in(&mut d, parent.h, name, Kind::File, perm, None)?;
        self.open_inc(h.ino);
        Ok(Opened {
            h,
            kind: Kind::File,
            created: true,
        })
    }

    /// Creates a file, directory or symbolic link `name` in `parent` (CFFS log-free create).
    pub fn create(
        &self,
        parent: &Dir,
        name: &[u8],
        kind: Kind,
        perm: u32,
        symlink_target: Option<&[u8]>,
    ) -> Result<Handle> {
        self.writable()?;
        check_name(name)?;
        let mut d = write_guard(parent);
        live(&d)?;
        if d.get(name).is_some() {
            return Err(Error::AlreadyExists);
        }
        self.create_in(&mut d, parent.h, name, kind, perm, symlink_target)
    }

    /// Allocates an inode and creates `name` in the locked directory `d`.
    fn create_in(
        &self,
        d: &mut DirInner,
        owner: Handle,
        name: &[u8],
        kind: Kind,
        perm: u32,
        symlink_target: Option<&[u8]>,
    ) -> Result<Handle> {
        let h = self.alloc_inode()?;
        let now = self.now();
        let mut rec = InodeRaw::new(h, kind, perm, now, owner);
        if let Some(t) = symlink_target {
            rec.size = t.len() as u64;
        }
        match self.create_locked(d, owner, name, kind, h, &rec, now, symlink_target) {
            Ok(()) => Ok(h),
            Err(e) => {
                // The record never went live: the number can be handed out again.
                self.inodes.release(h.ino);
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_locked(
        &self,
        d: &mut DirInner,
        owner: Handle,
        name: &[u8],
        kind: Kind,
        h: Handle,
        rec: &InodeRaw,
        now: i64,
        symlink_target: Option<&[u8]>,
    ) -> Result<()> {
        let m = self.m();
        self.inodes.write_body(m, h.ino, rec)?;
        // A symbolic link's target goes to a data block before the inode is live; a journal
        // cleanup releases that block if the create does not complete.
        let Some(target) = symlink_target else {
            return self.link_created(d, owner, name, kind, h, now, None);
        };
        let mut t = self.journal.begin()?;
        t.cleanup(Cleanup::ReleaseIfDead { inode: h });
        t.arm(m)?;
        let linked = self.link_created(d, owner, name, kind, h, now, Some(target));
        if linked.is_err() {
            if self.writable().is_err() {
                // The transaction, dropped armed, leaves its cleanup to recovery too.
                return linked;
            }
            // What recovery would do after a crash here: the caller reuses the inode number.
            self.run_cleanup(Cleanup::ReleaseIfDead { inode: h })?;
        }
        t.finish(m)?;
        linked
    }

    /// The part of [`create_locked`](Fs::create_locked) after the inode body is written: the
    /// symbolic link's block, then the entry in two log-free steps.
    #[allow(clippy::too_many_arguments)]
    fn link_created(
        &self,
        d: &mut DirInner,
        owner: Handle,
        name: &[u8],
        kind: Kind,
        h: Handle,
        now: i64,
        symlink_target: Option<&[u8]>,
    ) -> Result<()> {
        let m = self.m();
        if let Some(target) = symlink_target {
            let f = self.map.open_file(self.file_id(h.ino))?;
            let mut runs = Vec::with_capacity(1);
            self.map.insert(&f, 0, 1, &mut runs)?;
            let pblk = runs
                .first()
                .ok_or(Error::InvalidArgument("mapping returned no run"))?
                .pblk;
            let mut block = vec![0u8; BLOCK_SIZE as usize];
            block[..target.len()].copy_from_slice(target);
            m.write_nt(pblk.offset(), &block)?;
        }
        let ins = d.prepare_insert(self, owner, name, kind, h, true, now)?;
        // Step 1: new entry, inode body and Y.prev durable together.
        d.link_prev(m, &ins)?;
        m.fence();
        // Step 2: X.next and the inode's live state. A failure leaves a half-done insert,
        // which the next mount undoes.
        let linked = d
            .link_next(m, &ins)
            .and_then(|()| self.inodes.store(m, h.ino, field::STATE, h.live_state()));
        self.or_leave("a half-done directory insert", linked)?;
        m.fence();
        d.finish_insert(&ins, name, kind, h);
        d.touch(now);
        Ok(())
    }

    /// Removes `name` from `parent`; `want_dir` selects rmdir semantics.
    pub fn remove(&self, parent: &Dir, name: &[u8], want_dir: bool) -> Result<()> {
        self.writable()?;
        if name == b"." {
            return Err(Error::InvalidArgument("cannot remove '.'"));
        }
        if name == b".." {
            return Err(Error::DirectoryNotEmpty);
        }
        // rmdir takes the tree lock: it locks a second directory (the child).
        let _tree = want_dir.then(|| self.tree_lock.lock().unwrap_or_else(|e| e.into_inner()));
        let m = self.m();
        let mut d = write_guard(parent);
        live(&d)?;
        let s = d.get(name).ok_or(Error::NotFound)?;
        let child = match (want_dir, s.kind == Kind::Dir) {
            (true, false) => return Err(Error::NotADirectory),
            (false, true) => return Err(Error::IsADirectory),
            (true, true) => Some(self.dir(s.h)?),
            (false, false) => None,
        };
        let mut child_guard = child.as_deref().map(write_guard);
        if let Some(c) = &child_guard
            && !c.index.is_empty()
        {
            return Err(Error::DirectoryNotEmpty);
        }
        let _il = self
            .ilock(s.h.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let rec = self.inodes.read_live(m, s.h)?;
        let nlink = rec.nlink;
        let now = self.now();
        let r = d.plan_remove(m, &s)?;
        if s.kind != Kind::Dir && nlink > 1 {
            // The inode survives: link count and entry change together under the journal.
            let mut tx = self.journal.begin()?;
            for w in [r.words()[0], r.words()[1]] {
                tx.protect(w);
            }
            let nl = self.inodes.field(s.h.ino, field::NLINK);
            let ct = self.inodes.field(s.h.ino, field::CTIME);
            tx.protect(nl);
            tx.protect(ct);
            run_armed(&mut tx, m, |_| {
                d.unlink_prev(m, &r, 0, now)?;
                d.unlink_next(m, &r)?;
                self.inodes.store(m, s.h.ino, field::NLINK, nlink - 1)?;
                self.inodes.store(m, s.h.ino, field::CTIME, now as u64)
            })?;
            d.finish_remove(&r, name);
            d.touch(now);
            return Ok(());
        }
        // Last link: CFFS log-free unlink. Step 1 flags the removal and zeroes the link count.
        d.unlink_prev(m, &r, F_DROPS_INODE, now)?;
        // From here on the removal is decided: a failure leaves a half-done removal, which
        // the next mount completes, and the session shows it done.
        let unlinked = (|| {
            self.inodes.store(m, s.h.ino, field::NLINK, 0)?;
            m.fence();
            d.unlink_next(m, &r)?;
            // An inode without blocks that nobody holds open is freed by the same fence as
            // step 2: a crash between leaves either a half-done removal whose inode is already
            // free (completed without touching it) or an orphan (freed at mount).
            let blockless = rec.size == 0
                && rec.map_root == 0
                && rec.xattr == 0
                && (s.kind != Kind::File || self.inodes.load(m, s.h.ino, field::LOG)? == 0);
            let quick = blockless && !self.is_open(s.h.ino);
            if quick {
                self.inodes
                    .store(m, s.h.ino, field::STATE, u64::from(s.h.generation))?;
            }
            m.fence();
            Ok(quick)
        })();
        d.finish_remove(&r, name);
        d.touch(now);
        if let Some(c) = &mut child_guard {
            c.dead = true;
        }
        let quick = self.or_leave("a half-done directory removal", unlinked)?;
        let dropped = if quick {
            self.inodes.release(s.h.ino);
            Ok(())
        } else {
            self.drop_unlinked(s.h, child_guard.as_ref().map(|c| &c.map))
        };
        self.or_leave("an unlinked inode to free", dropped)?;
        if let Some(c) = &child {
            self.forget_dir(c.h.ino);
        }
        Ok(())
    }

    /// Adds the name `name` in `parent` for the existing non-directory `target`.
    pub fn link(&self, target: Handle, parent: &Dir, name: &[u8]) -> Result<()> {
        self.writable()?;
        check_name(name)?;
        let m = self.m();
        let mut d = write_guard(parent);
        live(&d)?;
        if d.get(name).is_some() {
            return Err(Error::AlreadyExists);
        }
        let _il = self
            .ilock(target.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let rec = self
            .inodes
            .read_live(m, target)
            .map_err(|_| Error::NotFound)?;
        let kind = rec.kind().ok_or(Error::Corrupt {
            what: "inode mode",
            at: self.inodes.field(target.ino, 0),
        })?;
        if kind == Kind::Dir {
            return Err(Error::NotPermitted("hard link to a directory"));
        }
        let nlink = rec.nlink;
        if nlink == 0 {
            return Err(Error::NotFound);
        }
        if nlink >= MAX_LINKS {
            return Err(Error::TooManyLinks);
        }
        let now = self.now();
        let ins = d.prepare_insert(self, parent.h, name, kind, target, false, now)?;
        let mut tx = self.journal.begin()?;
        for w in ins.words() {
            tx.protect(w);
        }
        tx.protect(self.inodes.field(target.ino, field::NLINK));
        tx.protect(self.inodes.field(target.ino, field::CTIME));
        run_armed(&mut tx, m, |_| {
            d.link_prev(m, &ins)?;
            d.link_next(m, &ins)?;
            self.inodes.store(m, target.ino, field::NLINK, nlink + 1)?;
            self.inodes.store(m, target.ino, field::CTIME, now as u64)
        })?;
        d.finish_insert(&ins, name, kind, target);
        d.touch(now);
        Ok(())
    }

    /// Whether directory `anc` is `d` or one of its ancestors. Needs the tree lock.
    fn is_ancestor(&self, anc: Handle, d: &Dir) -> Result<bool> {
        let mut cur = d.h;
        let mut steps = 0u64;
        loop {
            if cur == anc {
                return Ok(true);
            }
            if cur == self.root {
                return Ok(false);
            }
            steps += 1;
            if steps > self.inodes.count() {
                return Err(Error::Corrupt {
                    what: "directory parent chain loops",
                    at: self.inodes.field(d.h.ino, field::PARENT),
                });
            }
            cur = self.dir(cur)?.parent();
        }
    }

    /// Renames `sp/sname` to `dp/dname` (journaled).
    pub fn rename(
        &self,
        sp: &Arc<Dir>,
        sname: &[u8],
        dp: &Arc<Dir>,
        dname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.writable()?;
        for n in [sname, dname] {
            if n == b"." || n == b".." {
                return Err(Error::Busy);
            }
        }
        check_name(sname)?;
        check_name(dname)?;
        if flags.noreplace && flags.exchange {
            return Err(Error::InvalidArgument(
                "RENAME_NOREPLACE with RENAME_EXCHANGE",
            ));
        }
        let _tree = self.tree_lock.lock().unwrap_or_else(|e| e.into_inner());
        let same = sp.h == dp.h;
        let mut pair = if same {
            Pair {
                a: write_guard(sp),
                b: None,
            }
        } else {
            Pair::lock(sp, dp)
        };
        live(pair.src())?;
        live(pair.dst())?;
        let s = pair.src().get(sname).ok_or(Error::NotFound)?;
        let t = pair.dst().get(dname);
        if flags.noreplace && t.is_some() {
            return Err(Error::AlreadyExists);
        }
        if flags.exchange && t.is_none() {
            return Err(Error::NotFound);
        }
        if let Some(t) = t
            && t.h == s.h
        {
            // Two names of one inode (or the same name): POSIX says do nothing.
            return Ok(());
        }
        if !same {
            if s.kind == Kind::Dir && self.is_ancestor(s.h, dp)? {
                return Err(Error::InvalidArgument("rename of a directory into itself"));
            }
            if flags.exchange
                && let Some(t) = t
                && t.kind == Kind::Dir
                && self.is_ancestor(t.h, sp)?
            {
                return Err(Error::InvalidArgument("rename of a directory into itself"));
            }
        }
        let now = self.now();
        if flags.exchange {
            let t = t.ok_or(Error::NotFound)?;
            return self.rename_exchange(&mut pair, same, sp, s, sname, dp, t, dname, now);
        }
        match t {
            Some(t) => self.rename_replace(&mut pair, same, sp, dp, s, sname, t, dname, now),
            None => self.rename_move(&mut pair, same, dp, s, sname, dname, now),
        }
    }

    /// Moved directories point at their new parent (media word and DRAM).
    fn parent_word(&self, h: Handle) -> pmfs_core::layout::PmOff {
        self.inodes.field(h.ino, field::PARENT)
    }

    #[allow(clippy::too_many_arguments)]
    fn rename_move(
        &self,
        pair: &mut Pair<'_>,
        same: bool,
        dp: &Dir,
        s: Slot,
        sname: &[u8],
        dname: &[u8],
        now: i64,
    ) -> Result<()> {
        let m = self.m();
        let moved_dir = (s.kind == Kind::Dir && !same)
            .then(|| self.dir(s.h))
            .transpose()?;
        let ins = pair
            .dst()
            .prepare_insert(self, dp.h, dname, s.kind, s.h, false, now)?;
        let r0 = pair.src().plan_remove(m, &s)?;
        let mut tx = self.journal.begin()?;
        for w in ins.words().into_iter().chain(r0.words()) {
            tx.protect(w);
        }
        tx.protect(self.inodes.field(s.h.ino, field::CTIME));
        if moved_dir.is_some() {
            tx.protect(self.parent_word(s.h));
        }
        let r = run_armed(&mut tx, m, |_| {
            pair.dst().link_prev(m, &ins)?;
            pair.dst().link_next(m, &ins)?;
            let r = pair.src().plan_remove(m, &s)?;
            pair.src().unlink_prev(m, &r, 0, now)?;
            pair.src().unlink_next(m, &r)?;
            self.inodes.store(m, s.h.ino, field::CTIME, now as u64)?;
            if moved_dir.is_some() {
                self.inodes.store(m, s.h.ino, field::PARENT, dp.h.word())?;
            }
            Ok(r)
        })?;
        pair.dst().finish_insert(&ins, dname, s.kind, s.h);
        pair.src().finish_remove(&r, sname);
        pair.src().touch(now);
        pair.dst().touch(now);
        if let Some(md) = moved_dir {
            md.set_parent(dp.h);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn rename_replace(
        &self,
        pair: &mut Pair<'_>,
        same: bool,
        sp: &Dir,
        dp: &Dir,
        s: Slot,
        sname: &[u8],
        t: Slot,
        dname: &[u8],
        now: i64,
    ) -> Result<()> {
        let m = self.m();
        match (s.kind == Kind::Dir, t.kind == Kind::Dir) {
            (true, false) => return Err(Error::NotADirectory),
            (false, true) => return Err(Error::IsADirectory),
            _ => {}
        }
        if t.h == sp.h {
            // The target is the source's own parent, which still holds the source.
            return Err(Error::DirectoryNotEmpty);
        }
        let target_dir = (t.kind == Kind::Dir).then(|| self.dir(t.h)).transpose()?;
        let mut target_guard = target_dir.as_deref().map(write_guard);
        if let Some(g) = &target_guard
            && !g.index.is_empty()
        {
            return Err(Error::DirectoryNotEmpty);
        }
        let moved_dir = (s.kind == Kind::Dir && !same)
            .then(|| self.dir(s.h))
            .transpose()?;
        let _locks = self.lock_inodes(&[s.h.ino, t.h.ino]);
        let trec = self.inodes.read_live(m, t.h)?;
        let t_nlink = if t.kind == Kind::Dir {
            0
        } else {
            trec.nlink.saturating_sub(1)
        };
        let tw = pair.dst().entry_words(m, &t)?;
        let r0 = pair.src().plan_remove(m, &s)?;
        let mut tx = self.journal.begin()?;
        for w in [tw.prev, tw.handle, tw.ctime, tw.next]
            .into_iter()
            .chain(r0.words())
        {
            tx.protect(w);
        }
        for f in [field::NLINK, field::CTIME] {
            tx.protect(self.inodes.field(t.h.ino, f));
        }
        tx.protect(self.inodes.field(s.h.ino, field::CTIME));
        if moved_dir.is_some() {
            tx.protect(self.parent_word(s.h));
        }
        let r = run_armed(&mut tx, m, |_| {
            retarget(m, &tw, s.h, s.kind, now, dname)?;
            let r = pair.src().plan_remove(m, &s)?;
            pair.src().unlink_prev(m, &r, 0, now)?;
            pair.src().unlink_next(m, &r)?;
            self.inodes.store(m, t.h.ino, field::NLINK, t_nlink)?;
            self.inodes.store(m, t.h.ino, field::CTIME, now as u64)?;
            self.inodes.store(m, s.h.ino, field::CTIME, now as u64)?;
            if moved_dir.is_some() {
                self.inodes.store(m, s.h.ino, field::PARENT, dp.h.word())?;
            }
            Ok(r)
        })?;
        {
            let dst = pair.dst();
            if t.kind == Kind::Dir {
                dst.subdirs -= 1;
            }
            if s.kind == Kind::Dir {
                dst.subdirs += 1;
            }
            dst.index.insert(
                dname.into(),
                Slot {
                    kind: s.kind,
                    h: s.h,
                    ..t
                },
            );
            dst.touch(now);
        }
        pair.src().finish_remove(&r, sname);
        pair.src().touch(now);
        if let Some(md) = moved_dir {
            md.set_parent(dp.h);
        }
        if let Some(g) = &mut target_guard {
            g.dead = true;
        }
        if t_nlink == 0 {
            self.drop_unlinked(t.h, target_guard.as_ref().map(|g| &g.map))?;
        }
        drop(target_guard);
        if let Some(td) = target_dir {
            self.forget_dir(td.h.ino);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn rename_exchange(
        &self,
        pair: &mut Pair<'_>,
        same: bool,
        sp: &Dir,
        s: Slot,
        sname: &[u8],
        dp: &Dir,
        t: Slot,
        dname: &[u8],
        now: i64,
    ) -> Result<()> {
        let m = self.m();
        let moved = |x: &Slot| -> Result<Option<Arc<Dir>>> {
            (x.kind == Kind::Dir && !same)
                .then(|| self.dir(x.h))
                .transpose()
        };
        let (s_dir, t_dir) = (moved(&s)?, moved(&t)?);
        let sw = pair.src().entry_words(m, &s)?;
        let tw = pair.dst().entry_words(m, &t)?;
        let mut tx = self.journal.begin()?;
        for w in [
            sw.prev, sw.handle, sw.ctime, sw.next, tw.prev, tw.handle, tw.ctime, tw.next,
        ] {
            tx.protect(w);
        }
        for h in [s.h, t.h] {
            tx.protect(self.inodes.field(h.ino, field::CTIME));
        }
        if s_dir.is_some() {
            tx.protect(self.parent_word(s.h));
        }
        if t_dir.is_some() {
            tx.protect(self.parent_word(t.h));
        }
        run_armed(&mut tx, m, |_| {
            retarget(m, &sw, t.h, t.kind, now, sname)?;
            retarget(m, &tw, s.h, s.kind, now, dname)?;
            for h in [s.h, t.h] {
                self.inodes.store(m, h.ino, field::CTIME, now as u64)?;
            }
            if s_dir.is_some() {
                self.inodes.store(m, s.h.ino, field::PARENT, dp.h.word())?;
            }
            if t_dir.is_some() {
                self.inodes.store(m, t.h.ino, field::PARENT, sp.h.word())?;
            }
            Ok(())
        })?;
        let src_slot = Slot {
            kind: t.kind,
            h: t.h,
            ..s
        };
        let dst_slot = Slot {
            kind: s.kind,
            h: s.h,
            ..t
        };
        pair.src().index.insert(sname.into(), src_slot);
        pair.dst().index.insert(dname.into(), dst_slot);
        if !same {
            let sd = i64::from(t.kind == Kind::Dir) - i64::from(s.kind == Kind::Dir);
            pair.src().subdirs = pair.src().subdirs.wrapping_add_signed(sd);
            pair.dst().subdirs = pair.dst().subdirs.wrapping_add_signed(-sd);
        }
        pair.src().touch(now);
        pair.dst().touch(now);
        if let Some(d) = s_dir {
            d.set_parent(dp.h);
        }
        if let Some(d) = t_dir {
            d.set_parent(sp.h);
        }
        Ok(())
    }

    /// Write-locks the inode stripes of `inos` in a deadlock-free (ascending) order.
    fn lock_inodes(&self, inos: &[u32]) -> Vec<std::sync::RwLockWriteGuard<'_, ()>> {
        let mut stripes: Vec<usize> = inos.iter().map(|&i| i as usize % LOCK_STRIPES).collect();
        stripes.sort_unstable();
        stripes.dedup();
        stripes
            .into_iter()
            .map(|s| self.ilocks[s].write().unwrap_or_else(|e| e.into_inner()))
            .collect()
    }

    /// Changes the permission bits of `h` (journaled with its ctime).
    pub fn set_mode(&self, h: Handle, perm: u32) -> Result<()> {
        self.writable()?;
        let m = self.m();
        let _il = self.ilock(h.ino).write().unwrap_or_else(|e| e.into_inner());
        let rec = self.inodes.read_live(m, h).map_err(|_| Error::NotFound)?;
        let mode = (rec.mode & S_IFMT) | (perm & 0o7777);
        let word = u64::from(mode) | u64::from(rec.uid) << 32;
        let now = self.now();
        let mut tx = self.journal.begin()?;
        tx.protect(self.inodes.field(h.ino, field::MODE_UID));
        tx.protect(self.inodes.field(h.ino, field::CTIME));
        run_armed(&mut tx, m, |_| {
            self.inodes.store(m, h.ino, field::MODE_UID, word)?;
            self.inodes.store(m, h.ino, field::CTIME, now as u64)
        })
    }

    /// Sets access and modification times of `h` (journaled with its ctime).
    pub fn set_times(&self, h: Handle, atime: Option<i64>, mtime: Option<i64>) -> Result<()> {
        self.writable()?;
        let m = self.m();
        let dir = self
            .inodes
            .read_live(m, h)
            .map_err(|_| Error::NotFound)?
            .kind()
            == Some(Kind::Dir);
        let dir = if dir { Some(self.dir(h)?) } else { None };
        let mut dguard = dir.as_deref().map(write_guard);
        let _il = self.ilock(h.ino).write().unwrap_or_else(|e| e.into_inner());
        self.inodes.read_live(m, h).map_err(|_| Error::NotFound)?;
        let now = self.now();
        let mut tx = self.journal.begin()?;
        for f in [field::ATIME, field::MTIME, field::CTIME] {
            tx.protect(self.inodes.field(h.ino, f));
        }
        run_armed(&mut tx, m, |_| {
            if let Some(a) = atime {
                self.inodes.store(m, h.ino, field::ATIME, a as u64)?;
            }
            if let Some(t) = mtime {
                self.inodes.store(m, h.ino, field::MTIME, t as u64)?;
            }
            self.inodes.store(m, h.ino, field::CTIME, now as u64)
        })?;
        if let (Some(g), Some(t)) = (&mut dguard, mtime) {
            g.mtime = t;
            g.mtime_dirty = false;
        }
        Ok(())
    }

    /// The target of symbolic link `h`.
    pub fn read_link_of(&self, h: Handle) -> Result<Vec<u8>> {
        let m = self.m();
        let _il = self.ilock(h.ino).read().unwrap_or_else(|e| e.into_inner());
        let rec = self.inodes.read_live(m, h).map_err(|_| Error::NotFound)?;
        if rec.kind() != Some(Kind::Symlink) {
            return Err(Error::InvalidArgument("not a symbolic link"));
        }
        let len = rec.size;
        if len == 0 || len >= BLOCK_SIZE {
            return Err(Error::Corrupt {
                what: "symbolic link length",
                at: self.inodes.field(h.ino, field::SIZE),
            });
        }
        let f = self.map.open_file(self.file_id(h.ino))?;
        let mut runs = Vec::with_capacity(1);
        self.map.lookup(&f, 0, 1, &mut runs)?;
        let run = runs.first().ok_or(Error::Corrupt {
            what: "symbolic link without target block",
            at: self.inodes.field(h.ino, 0),
        })?;
        let mut buf = vec![0u8; len as usize];
        m.read(run.pblk.offset(), &mut buf)?;
        if buf.contains(&0) {
            // A create refuses such a target: damage, which a caller must not take for a
            // shorter one.
            return Err(Error::Corrupt {
                what: "NUL byte in a symbolic link's target",
                at: run.pblk.offset(),
            });
        }
        Ok(buf)
    }
}
