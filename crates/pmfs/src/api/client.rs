//! Data-only clients of a pool another process owns ([`Volume::attach`]).

use std::path::Path;
use std::sync::Arc;

use pmfs_core::layout::BLOCK_SIZE;
use pmfs_core::pm::{Media, PmRegion};

use super::Volume;
use super::ino::{Attr, Ino, OpenMode, OpenNode, attr_of, file_privilege_bits};
use crate::error::{Error, Result};
use crate::format::MOUNT_STATE_OFF;
use crate::fs::Fs;
use crate::fs::data::MapPin;
use crate::inode::{Kind, field};

/// A data-only client of a HashFS pool that another process owns (see [`Volume::attach`]).
///
/// It opens regular files by [`Ino`] and reads, writes, resizes, allocates, punches and seeks
/// them through the same log protocol as the owner. It never changes the namespace.
#[derive(Debug)]
pub struct Client {
    fs: Arc<Fs>,
}

impl Volume {
    /// Attaches to the pool file `path` as a *data-only client*, next to the process that
    /// owns the pool (for example the FUSE daemon, which holds the pool's owner lock: attach
    /// neither takes nor needs that lock, and runs no recovery).
    ///
    /// Only HashFS volumes can be shared this way: the other mapping structures serialise
    /// updates with DRAM locks and allocate from the owner's DRAM allocator, so attaching to
    /// them fails with [`Error::Unsupported`].
    ///
    /// # Guarantees
    ///
    /// - Every data call is the same atomic, durable update as in the owner: copy-on-write
    ///   blocks staged in the HashFS table by CAS, one log entry committed by CAS at the
    ///   file's log tail (with conflict detection against every other process), then digested
    ///   into the table under the log's PM cursor word. No DRAM lock is shared with the owner.
    /// - Reads validate against the log tail: never torn, never older than a write that
    ///   returned in any process.
    /// - A client killed at any instruction blocks nobody and corrupts nothing: it leaves at
    ///   worst staged slots (dropped at the owner's next mount), a digest cursor held by a dead
    ///   process id (taken over by the next digest), and a pin on the log, which delays the
    ///   reclamation of compacted log blocks, and the freeing of the file once unlinked, until
    ///   the next mount, but only while other clients are attached; a mapping's share of the
    ///   file's mapped mode likewise. With none (no client lock on the pool file, no other
    ///   process mapping it), the owner takes the pins and shares for dead at its last close
    ///   of the file or when it looks ([`Volume::look_for_dead_pins`]), and the pins when it
    ///   frees the file; files it could not clear then wait for
    ///   [`Volume::collect_dead_pins`].
    /// - Attaching takes a shared lock on the pool file's first byte
    ///   ([`PmRegion::lock_as_client`]), held as long as the client's descriptor is open or
    ///   its mapping of the pool exists.
    ///
    /// # Limits
    ///
    /// - The namespace is the owner's: a client opens files by number only, and the owner may
    ///   unlink one meanwhile (the client's handle keeps it readable and writable; the owner
    ///   frees it only once no process has its log open, else at its next mount).
    /// - Sizes and times the owner reports come from the inode after the digest; the owner's
    ///   directory caches know nothing of the client. Times are stamped by the writer.
    /// - A hole punch with partial edge blocks *and* whole blocks is two log updates; the owner
    ///   makes the pair atomic with its journal, which a client cannot use, so a client killed
    ///   between them leaves the edges zeroed and the whole blocks still mapped.
    /// - Space the owner has yet to free is not the client's: the owner frees the blocks of
    ///   deleted files in batches (at once when its own update finds no space, or when free
    ///   space is asked of it), so a client update can fail with [`Error::NoSpace`] while the
    ///   owner holds free blocks. Such a failed update changes nothing; hand it to the owner
    ///   (the preload library sends it through the kernel to the daemon).
    /// - Process liveness for the digest cursor is judged by `/proc/<pid>`: owner and clients
    ///   must share a PID namespace.
    /// - A volume that was not closed cleanly is left to the owner that has it mounted
    ///   read-write: attaching fails with [`Error::NeedsRecovery`] unless the process the
    ///   pool records as its owner still runs (a read-only mount of such a volume recovers it
    ///   in memory only, and the pool still holds what the crash left).
    /// - The owner's mapping caches must not outlive a client's remapping: HashFS translation
    ///   caches are per file handle and checked against the table on every hit.
    pub fn attach(path: impl AsRef<Path>) -> Result<Client> {
        Self::attach_region(PmRegion::open(path)?)
    }

    /// [`attach`](Self::attach) to the pool file the caller opened read-write as `file` (at
    /// `path`). The client owns that descriptor and closes it when dropped, and the caller
    /// chooses its number: a library loaded into another program keeps it out of the small
    /// numbers the program uses. The client reads the file through it only while attaching,
    /// so a program that closes the number or gives it to another file changes nothing for
    /// a client that lives as long as the process.
    pub fn attach_file(file: std::fs::File, path: impl AsRef<Path>) -> Result<Client> {
        Self::attach_region(PmRegion::open_file(file, path)?)
    }

    /// A client of the volume on `media` that a [`Volume`] of this process owns (one made with
    /// [`Volume::format`] or [`Volume::mount`] over the same media): for pools kept in
    /// memory, such as the crash simulator's regions. No client lock is taken: the owner
    /// sees no other process attached.
    ///
    /// # Errors
    /// As [`attach`](Self::attach).
    pub fn attach_media(media: Arc<dyn Media>) -> Result<Client> {
        Ok(Client {
            fs: Arc::new(Fs::attach(media)?),
        })
    }

    /// The process that has the volume in the pool file `pool` mounted read-write, as the
    /// owner recorded itself at mount: its process id and start time (`/proc/<pid>/stat`
    /// field 22, which tells a reused pid apart). `None` when no owner recorded itself (the
    /// volume is closed, or was mounted read-only or by an older build). A record is only a
    /// claim: an owner that died leaves its record, so check that the process still exists
    /// with that start time. Finding the owner this way costs a read of the file, where
    /// `/proc/locks` (which names the holder of the owner's `flock`) can take the kernel
    /// milliseconds to list.
    pub fn recorded_owner(pool: &std::fs::File) -> Option<(u32, u64)> {
        crate::format::recorded_owner(pool)
    }

    fn attach_region(region: PmRegion) -> Result<Client> {
        region.lock_as_client()?;
        Ok(Client {
            fs: Arc::new(Fs::attach(Arc::new(region))?),
        })
    }
}

impl Client {
    /// A new client of the same pool through this client's mapping: what a `fork` child makes
    /// of the client it inherited. It skips what [`Volume::attach_file`] costs beyond reading
    /// the volume's geometry (opening and mapping the pool file, taking the client lock), and
    /// shares nothing else with this client, whose state in the child's copy of memory may
    /// be in the middle of a change by a parent thread that does not exist there.
    ///
    /// The client lock stays held for the new client as long as the mapping is: a mapping
    /// holds the locked open file description, and a child inherits the parent's.
    pub fn reattach(&self) -> Result<Client> {
        Ok(Client {
            fs: Arc::new(Fs::attach(self.fs.media().clone())?),
        })
    }

    /// Opens the regular file `ino`. Its log is opened (created if it has none) and pinned
    /// right away, so the owner cannot free the file while this handle lives.
    pub fn open_ino(&self, ino: Ino, mode: OpenMode) -> Result<OpenNode> {
        if mode.truncate && !mode.write {
            return Err(Error::InvalidArgument("truncate without write access"));
        }
        let h = ino.handle();
        let m = self.fs.m();
        let live = |fs: &Fs| -> Result<()> {
            let rec = fs.inodes.read(m, h.ino).map_err(|_| Error::NotFound)?;
            if rec.state != h.live_state() {
                return Err(Error::NotFound);
            }
            match rec.kind() {
                Some(Kind::File) => Ok(()),
                Some(Kind::Dir) => Err(Error::IsADirectory),
                Some(Kind::Symlink) => Err(Error::FilesystemLoop),
                _ => Err(Error::Unsupported("open of a special file")),
            }
        };
        live(&self.fs)?;
        self.fs.open_inc(h.ino);
        let node = OpenNode::build(self.fs.clone(), h, mode)?;
        self.fs.pin_log(node.node())?;
        // The owner may have freed the file before the pin: it checks pins before freeing.
        live(&self.fs)?;
        if mode.truncate {
            node.set_len(0)?;
        }
        Ok(node)
    }

    /// The size of file `ino` as its log says now.
    pub fn size(&self, ino: Ino) -> Result<u64> {
        self.open_ino(
            ino,
            OpenMode {
                read: true,
                ..OpenMode::default()
            },
        )?
        .size()
    }

    /// The owner's mount-state word: it changes when the owner closes the volume cleanly (an
    /// unmount) and when the volume is mounted read-write after being closed. A client that
    /// compares it with the value it saw at attach learns, at the cost of one load, that the
    /// owner it attached next to let the volume go. An owner that crashed leaves it as it was.
    pub fn owner_state(&self) -> u64 {
        self.fs.m().load_u64(MOUNT_STATE_OFF).unwrap_or(0)
    }

    /// The owner's rendezvous word, which names its socket for this client's requests
    /// ([`crate::kernel_pages::owner_address`]); [`Volume::rendezvous`] is the owner's side.
    pub fn rendezvous(&self) -> u64 {
        crate::format::rendezvous(self.fs.m())
    }

    /// Puts regular file `ino` in *mapped mode* and returns the pieces of the pool that hold
    /// its bytes `[offset, min(offset + len, size rounded up to a block))`, every hole in that
    /// range allocated first (zeroed blocks; the file's times stay as they were). `offset` must
    /// be a multiple of the block size (4096, the page size).
    ///
    /// While the returned pin (or another) lives, every process updates the file's mapped
    /// blocks *in place*: writes, hole punches and shrinking `set_len`s leave every block where
    /// it is, so a mapping of the pieces (`mmap` of the pool file) stays the file, and sees
    /// `write`s of any process as they land, as `read`s see stores into the mapping. In
    /// exchange those updates are not atomic: a reader may see one half done, and a crash may
    /// leave one torn (see the engine's data path documentation).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an unaligned `offset`; the errors of opening the file.
    pub fn map(&self, ino: Ino, offset: u64, len: u64) -> Result<FileMap> {
        self.map_with(ino, offset, len, Some(u64::MAX))
    }

    /// [`map`](Self::map) for a mapping that never stores (one of a read-only description):
    /// the holes in the range stay holes, and no piece covers them. The file's allocation is
    /// left as it was, as a read-only mapping through the kernel leaves it; the caller maps
    /// the holes' pages some other way (the kernel's mapping of the file, which reads them as
    /// zeros, and sees a block a write gives one later).
    ///
    /// # Errors
    /// As [`map`](Self::map).
    pub fn map_leaving_holes(&self, ino: Ino, offset: u64, len: u64) -> Result<FileMap> {
        self.map_with(ino, offset, len, None)
    }

    /// [`map`](Self::map), unless the holes in the range need more than `blocks` fresh
    /// blocks: then [`Error::NoSpace`], with no block allocated. Filling the holes of a large
    /// sparse file takes the space and the time of writing them (2 GiB of holes: 38 s here),
    /// which a mapping through the kernel does not.
    ///
    /// # Errors
    /// As [`map`](Self::map), and [`Error::NoSpace`] as above.
    pub fn map_filling_at_most(
        &self,
        ino: Ino,
        offset: u64,
        len: u64,
        blocks: u64,
    ) -> Result<FileMap> {
        self.map_with(ino, offset, len, Some(blocks))
    }

    /// [`map`](Self::map), filling at most `fill` blocks of holes, or none (`None`).
    fn map_with(&self, ino: Ino, offset: u64, len: u64, fill: Option<u64>) -> Result<FileMap> {
        if !offset.is_multiple_of(BLOCK_SIZE) {
            return Err(Error::InvalidArgument("mapping at an unaligned offset"));
        }
        let node = self.open_ino(
            ino,
            OpenMode {
                read: true,
                ..OpenMode::default()
            },
        )?;
        let end = offset
            .saturating_add(len)
            .min(node.size()?.div_ceil(BLOCK_SIZE) * BLOCK_SIZE)
            .max(offset);
        let (pin, runs) = self.fs.map_file(
            node.node(),
            offset / BLOCK_SIZE,
            (end - offset) / BLOCK_SIZE,
            fill,
        )?;
        let mut pieces: Vec<MapPiece> = Vec::with_capacity(runs.len());
        for r in runs {
            let piece = MapPiece {
                file_off: r.lblk * BLOCK_SIZE,
                pool_off: r.pblk.offset().0,
                len: r.len * BLOCK_SIZE,
            };
            match pieces.last_mut() {
                Some(p)
                    if p.file_off + p.len == piece.file_off
                        && p.pool_off + p.len == piece.pool_off =>
                {
                    p.len += piece.len;
                }
                _ => pieces.push(piece),
            }
        }
        Ok(FileMap { pin, pieces, end })
    }

    /// Before a copy inside the kernel from regular file `ino` (`copy_file_range`,
    /// `sendfile`, `splice`): if some process maps the file ([`map`](Self::map)), its stores
    /// bypassed the pages the kernel may cache, so its mtime is raised (as a store into a
    /// mapping raises it on a kernel file system), which makes the kernel drop them at its
    /// next look at the attributes, or at once through [`on_kernel_pages`](Self::on_kernel_pages).
    /// Nothing happens to a file nobody maps, or whose pages the kernel never read. A pin of
    /// a writable mapping does the same ([`MapPin::stored`](crate::MapPin::stored)).
    ///
    /// # Errors
    /// Media errors.
    pub fn reveal_mapped(&self, ino: Ino) -> Result<()> {
        self.fs.reveal_mapped(ino.handle())
    }

    /// Sets what this client calls after it updated a file whose pages the kernel may cache
    /// (the owner read it for the kernel since it last had them dropped): `drop_pages` should
    /// have the owner make the kernel drop them ([`crate::kernel_pages`]) and return when
    /// that is done, so that no process reading the file through the kernel, a mapping
    /// included, sees the bytes from before the update once it returned. Called after the
    /// update is durable and its mtime raised, with no lock of this client held; from
    /// [`MapPin::stored`](crate::MapPin::stored) too, for pins taken after this was set. Set
    /// once: a second call changes nothing and returns `false`.
    pub fn on_kernel_pages(&self, drop_pages: impl Fn(Ino) + Send + Sync + 'static) -> bool {
        self.fs.kernel_pages.set(Arc::new(drop_pages)).is_ok()
    }

    /// The attributes of inode `ino` as the owner would report them (its size as the log says
    /// now): [`Error::NotFound`] unless it is live.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        if !self.is_live(ino) {
            return Err(Error::NotFound);
        }
        attr_of(&self.fs, ino.handle())
    }

    /// Serves a change of owner of regular file `ino` to `uid` and `gid` (`None`: kept), asked
    /// by a process with effective user id `caller`, when it would change nothing but the
    /// ctime: owner and group are already those, the caller may make the change (it is root,
    /// standing for `CAP_CHOWN` as in the daemon, or the file's owner), and there is nothing
    /// the change would clear (no set-user-ID bit, no set-group-ID bit with group-execute,
    /// and no extended attribute at all, so no `security.capability`). Then it raises the
    /// ctime to now, durably, and returns `true`; otherwise it changes nothing and returns
    /// `false`, and the change is the owner's to make. A change of neither id (both `None`)
    /// that may be served leaves the ctime too, as the owner's [`Volume::set_attr`] with an
    /// empty change does (POSIX leaves that call's ctime open).
    ///
    /// The answer is taken from one read of the inode: a change of owner or mode the owner
    /// makes meanwhile is ordered after this one.
    pub fn chown_unchanged(
        &self,
        ino: Ino,
        uid: Option<u32>,
        gid: Option<u32>,
        caller: u32,
    ) -> Result<bool> {
        let h = ino.handle();
        let rec = self.fs.inodes.read(self.fs.m(), h.ino)?;
        if rec.state != h.live_state() || rec.kind() != Some(Kind::File) {
            return Ok(false);
        }
        let unchanged = uid.is_none_or(|u| u == rec.uid) && gid.is_none_or(|g| g == rec.gid);
        let allowed = caller == 0 || caller == rec.uid;
        let clears = file_privilege_bits(rec.mode & 0o7777) != 0 || rec.xattr != 0;
        if !unchanged || !allowed || clears {
            return Ok(false);
        }
        if uid.is_some() || gid.is_some() {
            self.fs.touch_ctime(h.ino)?;
        }
        Ok(true)
    }

    /// Whether inode `ino` is the live regular file it names.
    pub fn is_live(&self, ino: Ino) -> bool {
        let h = ino.handle();
        self.fs
            .inodes
            .load(self.fs.m(), h.ino, field::STATE)
            .is_ok_and(|s| s == h.live_state())
    }
}

/// A range of a file in mapped mode: the pin that keeps it there and the pool pieces that
/// hold its bytes (see [`Client::map`]).
#[derive(Debug)]
pub struct FileMap {
    pin: MapPin,
    pieces: Vec<MapPiece>,
    end: u64,
}

impl FileMap {
    /// The pieces, in file order, each contiguous in the pool; contiguous in the file too but
    /// where [`map_leaving_holes`](Client::map_leaving_holes) left a hole.
    pub fn pieces(&self) -> &[MapPiece] {
        &self.pieces
    }

    /// Where in the file the mapped range ends: the end asked for, or the file's size rounded
    /// up to a block if that comes first (pages past it are no part of the file).
    pub fn end(&self) -> u64 {
        self.end
    }

    /// The pin alone, to keep for as long as the pieces are mapped.
    pub fn into_pin(self) -> MapPin {
        self.pin
    }
}

/// Bytes `[file_off, file_off + len)` of a file live at `[pool_off, pool_off + len)` of the
/// pool file. Offsets and lengths are multiples of the block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapPiece {
    /// Offset in the file.
    pub file_off: u64,
    /// Offset in the pool file.
    pub pool_off: u64,
    /// Bytes.
    pub len: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MappingKind, Options};

    fn pool(name: &str, mapping: MappingKind) -> std::path::PathBuf {
        let path = std::env::temp_dir().join(format!("pmfs-{}-{name}.pool", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let opts = Options {
            inodes: Some(256),
            journal_slots: 4,
            size: 16 << 20,
            ..Options::with_mapping(mapping)
        };
        Volume::create(&path, &opts).unwrap().close().unwrap();
        path
    }

    #[test]
    fn a_client_writes_what_the_owner_reads_and_back() {
        let path = pool("client", MappingKind::HashFs);
        let owner = Volume::open(&path).unwrap();
        owner.write("/f", &[1u8; 5000]).unwrap();
        let ino = owner.lookup(owner.root(), b"f").unwrap().ino;
        let client = Volume::attach(&path).unwrap();
        let rw = OpenMode {
            read: true,
            write: true,
            truncate: false,
        };
        let f = client.open_ino(ino, rw).unwrap();
        let mut buf = vec![0u8; 5000];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 5000);
        assert!(buf.iter().all(|&b| b == 1));
        f.write_at(&[2u8; 100], 4990).unwrap();
        assert_eq!(f.size().unwrap(), 5090);
        assert_eq!(client.size(ino).unwrap(), 5090);
        let mounted = client.owner_state();
        let seen = owner.read("/f").unwrap();
        assert_eq!(seen.len(), 5090);
        assert!(seen[..4990].iter().all(|&b| b == 1));
        assert!(seen[4990..].iter().all(|&b| b == 2));
        // The owner writes; the client's open handle reads it.
        owner.write("/f", &[3u8; 10]).unwrap();
        let mut small = vec![0u8; 20];
        assert_eq!(f.read_at(&mut small, 0).unwrap(), 10);
        assert_eq!(&small[..10], &[3u8; 10]);
        drop(f);
        assert_eq!(client.owner_state(), mounted);
        owner.close().unwrap();
        assert_ne!(
            client.owner_state(),
            mounted,
            "a clean close changes the word"
        );
        drop(client);
        let report = crate::fsck::check(Arc::new(PmRegion::open(&path).unwrap())).unwrap();
        assert!(report.is_clean(), "{:#?}", report.problems);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn appends_of_a_client_and_the_owner_land_one_after_the_other() {
        let path = pool("append", MappingKind::HashFs);
        let owner = Volume::open(&path).unwrap();
        owner.write("/f", b"head").unwrap();
        let ino = owner.lookup(owner.root(), b"f").unwrap().ino;
        let write_only = OpenMode {
            write: true,
            ..OpenMode::default()
        };
        let client = Volume::attach(&path).unwrap();
        let c = client.open_ino(ino, write_only).unwrap();
        let o = owner.open_ino(ino, write_only).unwrap();
        assert_eq!(c.append(b"-client").unwrap(), 4);
        assert_eq!(o.append(b"-owner").unwrap(), 11);
        assert_eq!(c.append(&[b'x'; 5000]).unwrap(), 17);
        let read_only = OpenMode {
            read: true,
            ..OpenMode::default()
        };
        assert!(matches!(
            client.open_ino(ino, read_only).unwrap().append(b"no"),
            Err(Error::BadHandle(_))
        ));
        drop((c, o, client));
        let seen = owner.read("/f").unwrap();
        assert_eq!(&seen[..17], b"head-client-owner");
        assert_eq!(seen.len(), 5017);
        assert!(seen[17..].iter().all(|&b| b == b'x'));
        owner.close().unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn attaching_to_a_volume_whose_owner_died_waits_for_its_recovery() {
        let path = pool("dead-owner", MappingKind::HashFs);
        let owner = Volume::open(&path).unwrap();
        owner.write("/f", b"kept").unwrap();
        let ino = owner.lookup(owner.root(), b"f").unwrap().ino;
        // The owner runs: a client attaches.
        drop(Volume::attach(&path).unwrap());
        // The pool as a killed owner leaves it: mounted, its record naming a process that no
        // longer runs (a start time no process of this id has).
        let image = std::fs::read(&path).unwrap();
        let crashed = path.with_extension("crashed");
        std::fs::write(&crashed, &image).unwrap();
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&crashed)
                .unwrap();
            let start = pmfs_core::pm::procs::start_time(std::process::id()).unwrap();
            f.write_all_at(&(start + 1).to_le_bytes(), crate::format::OWNER_OFF.0 + 8)
                .unwrap();
        }
        owner.close().unwrap();
        assert!(matches!(
            Volume::attach(&crashed),
            Err(Error::NeedsRecovery)
        ));
        // A read-only mount recovers it in memory and leaves it as it was.
        let ro = Volume::mount_read_only(Arc::new(PmRegion::open(&crashed).unwrap())).unwrap();
        assert!(!ro.mount_report().clean);
        assert_eq!(ro.read("/f").unwrap(), b"kept");
        ro.close().unwrap();
        assert!(matches!(
            Volume::attach(&crashed),
            Err(Error::NeedsRecovery)
        ));
        // Recovered and closed: a client may attach again.
        Volume::open(&crashed).unwrap().close().unwrap();
        let client = Volume::attach(&crashed).unwrap();
        let mut buf = [0u8; 8];
        let read = OpenMode {
            read: true,
            ..OpenMode::default()
        };
        assert_eq!(
            client
                .open_ino(ino, read)
                .unwrap()
                .read_at(&mut buf, 0)
                .unwrap(),
            4
        );
        assert_eq!(&buf[..4], b"kept");
        drop(client);
        std::fs::remove_file(&crashed).unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn attaching_needs_hashfs() {
        let path = pool("extent", MappingKind::Extent);
        assert!(matches!(Volume::attach(&path), Err(Error::Unsupported(_))));
        std::fs::remove_file(&path).unwrap();
    }
}
