//! Which devices are pmfs mounts: `fuse.pmfs` mounts, as `statmount(2)` or the lines of
//! `/proc/self/mountinfo` tell.
//!
//! A FUSE file system's files carry an anonymous device number (major 0) that is the
//! mount's, so a regular file is a pmfs file exactly when its `st_dev` is the device of a
//! `fuse.pmfs` mount. Devices are learnt lazily, the answer remembered either way in fixed
//! tables of atomics (no allocation, no lock a `fork` could leave held): the first file on an
//! anonymous device the library has not seen yet asks `statmount` about its mount (by the
//! unique mount id `statx` gave with the device; two system calls), and where the kernel
//! cannot tell (an older kernel, a FUSE mount without a subtype, a very long pool path)
//! reads mountinfo again, which also finds mounts made after the program started. Reading
//! mountinfo costs 40–130 µs on the test host, the first time in a process the most. Real
//! block devices (major ≠ 0) are never FUSE mounts and are answered without asking anything.
//!
//! Only one thread learns at a time; a thread that finds another one at it answers "not
//! pmfs" for now, which is always safe: such a file just takes the kernel path.

use core::cell::UnsafeCell;
use core::ffi::{CStr, c_int};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// How many pmfs mounts a process can tell apart.
pub(crate) const MAX_PMFS: usize = 16;
/// How many other anonymous devices are remembered as "not pmfs".
const MAX_OTHER: usize = 64;

/// Devices of the pmfs mounts found so far; the first `PMFS_LEN` are valid.
static PMFS: [AtomicU64; MAX_PMFS] = [const { AtomicU64::new(0) }; MAX_PMFS];
/// The pool file of each of them (the mount's source), NUL-terminated; written before the
/// entry is published through `PMFS_LEN` and never changed afterwards.
static POOLS: [PoolPath; MAX_PMFS] =
    [const { PoolPath(UnsafeCell::new([0; POOL_PATH_MAX])) }; MAX_PMFS];
const POOL_PATH_MAX: usize = 4096;

struct PoolPath(UnsafeCell<[u8; POOL_PATH_MAX]>);

// SAFETY: each path is written once, by the thread holding `SCANNING`, before its entry is
// published (release store of `PMFS_LEN`); readers only read published entries.
unsafe impl Sync for PoolPath {}
static PMFS_LEN: AtomicUsize = AtomicUsize::new(0);
/// The unique mount id of each pmfs mount learnt through `statmount` (0: learnt from
/// mountinfo), for [`still_mounted`]; written before its entry is published.
static MOUNT_IDS: [AtomicU64; MAX_PMFS] = [const { AtomicU64::new(0) }; MAX_PMFS];
/// Anonymous devices found not to be pmfs mounts; the first `OTHER_LEN` are valid.
static OTHER: [AtomicU64; MAX_OTHER] = [const { AtomicU64::new(0) }; MAX_OTHER];
static OTHER_LEN: AtomicUsize = AtomicUsize::new(0);
/// Held by the thread learning what a device is (`statmount`, or reading mountinfo).
static SCANNING: AtomicBool = AtomicBool::new(false);

/// The index of the pmfs mount with device `dev`, if it is one; `mnt_id` gives the unique id
/// of its mount (`STATX_MNT_ID_UNIQUE`) if it can, asked only for a device not seen before.
pub(crate) fn pmfs_mount_of(dev: u64, mnt_id: impl FnOnce() -> Option<u64>) -> Option<usize> {
    if let Some(i) = find(&PMFS, &PMFS_LEN, dev) {
        return Some(i);
    }
    if libc::major(dev) != 0 || find(&OTHER, &OTHER_LEN, dev).is_some() {
        return None;
    }
    if SCANNING
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return None;
    }
    if mnt_id()
        .and_then(|id| learn_from_statmount(id, dev))
        .is_none()
    {
        rescan();
    }
    let found = find(&PMFS, &PMFS_LEN, dev);
    if found.is_none() {
        push(&OTHER, &OTHER_LEN, dev);
    }
    SCANNING.store(false, Ordering::Release);
    found
}

/// How many mounts' [`MountFacts`] are remembered.
const MAX_KNOWN: usize = 64;
/// Unique ids of the mounts whose facts are known, in the first `KNOWN_LEN` slots (a slot
/// reads 0, which is no mount's id, until its facts are stored; a full table takes no more).
static KNOWN: [AtomicU64; MAX_KNOWN] = [const { AtomicU64::new(0) }; MAX_KNOWN];
/// The facts of each, stored before its id: [`FACTS_TOLD`] if `statmount` told them,
/// [`FACTS_EXACT`] if the mount answers exactly, and its reused id in the low 32 bits.
static FACTS: [AtomicU64; MAX_KNOWN] = [const { AtomicU64::new(0) }; MAX_KNOWN];
static KNOWN_LEN: AtomicUsize = AtomicUsize::new(0);
const FACTS_TOLD: u64 = 1 << 33;
const FACTS_EXACT: u64 = 1 << 32;

/// What the library needs to know of a mount to answer `stat` and `statx` from its own path
/// walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MountFacts {
    /// The mount answers a `statx` with `AT_STATX_DONT_SYNC` exactly as it answers `stat`: its
    /// file system keeps every attribute in the kernel's inode, and `stat` asks nobody else
    /// (not FUSE, where it asks the daemon, nor a network file system, nor overlayfs, which
    /// asks the file systems under it).
    pub exact: bool,
    /// The mount's id as mountinfo and `statx` without `STATX_MNT_ID_UNIQUE` give it (such
    /// ids are reused once a mount is gone).
    pub old_id: u32,
}

/// The facts of the mount with unique id `id`: asked once per mount with `statmount` (Linux
/// 6.8; `None` where it does not answer). Unique ids are never reused, so the facts hold as
/// long as the process lives. Takes no lock: threads asking about a new mount at once each
/// ask the kernel, and may each remember the answer.
pub(crate) fn mount_facts(id: u64) -> Option<MountFacts> {
    let word = match find(&KNOWN, &KNOWN_LEN, id) {
        Some(i) => FACTS[i].load(Ordering::Relaxed),
        None => learn_facts(id),
    };
    (word & FACTS_TOLD != 0).then_some(MountFacts {
        exact: word & FACTS_EXACT != 0,
        old_id: word as u32,
    })
}

/// Asks `statmount` for the facts of mount `id` and remembers them; returns their word (0,
/// nothing told, once the table is full: the calls then go to the kernel).
fn learn_facts(id: u64) -> u64 {
    if KNOWN_LEN.load(Ordering::Relaxed) >= MAX_KNOWN {
        return 0;
    }
    let wanted = SB_BASIC | MNT_BASIC;
    let mut out = [0u8; 512];
    let told = statmount(id, wanted, &mut out).is_ok();
    // struct statmount: mask at byte 8, sb_magic at 24, mnt_id_old at 56.
    let u64_at = |o: usize| u64::from_ne_bytes(out[o..o + 8].try_into().unwrap_or_default());
    let word = if told && u64_at(8) & wanted == wanted {
        let exact = if LOCAL_MAGICS.contains(&u64_at(24)) {
            FACTS_EXACT
        } else {
            0
        };
        FACTS_TOLD
            | exact
            | u64::from(u32::from_ne_bytes(
                out[56..60].try_into().unwrap_or_default(),
            ))
    } else {
        0
    };
    let i = KNOWN_LEN.fetch_add(1, Ordering::Relaxed);
    if let (Some(k), Some(f)) = (KNOWN.get(i), FACTS.get(i)) {
        f.store(word, Ordering::Relaxed);
        k.store(id, Ordering::Release);
    }
    word
}

/// Superblock magic numbers (`linux/magic.h`) of the file systems whose `getattr` answers from
/// the kernel's inode alone, whatever the sync type: disk and memory file systems, and the
/// kernel's own.
const LOCAL_MAGICS: [u64; 20] = [
    0xEF53,      // ext2, ext3, ext4
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0xF2F5_2010, // f2fs
    0x4d44,      // msdos, vfat
    0x7371_7368, // squashfs
    0xE0F5_E1E2, // erofs
    0x9660,      // iso9660
    0x0102_1994, // tmpfs, devtmpfs
    0x8584_58f6, // ramfs
    0x9584_58f6, // hugetlbfs
    0x9fa0,      // proc
    0x6265_6572, // sysfs
    0x1cd1,      // devpts
    0x6367_7270, // cgroup2
    0x1980_0202, // mqueue
    0x6462_6720, // debugfs
    0x7472_6163, // tracefs
    0x6E73_6673, // nsfs
    0xcafe_4a11, // bpf
];

/// The unique id of the mount a `statx` answer is about, if it reports one.
pub(crate) fn unique_mount_id(stx: &libc::statx) -> Option<u64> {
    (stx.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0).then_some(stx.stx_mnt_id)
}

/// What [`identify`] found a mount to be.
enum Mount<'a> {
    /// A pmfs mount of this pool file.
    Pmfs(&'a [u8]),
    /// Not a pmfs mount.
    Other,
}

/// The buffer `statmount` fills: the fixed part, then the strings. Kept small (calls made in
/// signal handlers run on their stack): a longer pool path makes the kernel answer
/// `EOVERFLOW`, and mountinfo is read instead.
const STATMOUNT_BUF: usize = 1024;

/// Records what `statmount` says mount `id` (device `dev`) is; `None` if it does not tell.
/// Not inlined: its buffer is off the stack before mountinfo is read with a larger one.
#[inline(never)]
fn learn_from_statmount(id: u64, dev: u64) -> Option<()> {
    let mut buf = [0u8; STATMOUNT_BUF];
    match identify(id, dev, &mut buf)? {
        Mount::Pmfs(pool) => record(dev, id, |slot| {
            if let Some(slot) = slot.get_mut(..pool.len()) {
                slot.copy_from_slice(pool);
            }
        }),
        Mount::Other => {}
    }
    Some(())
}

/// `statmount(2)` (Linux 6.8): what to report.
const SB_BASIC: u64 = 0x1;
const MNT_BASIC: u64 = 0x2;
const FS_SUBTYPE: u64 = 0x100;
const SB_SOURCE: u64 = 0x200;

/// Asks `statmount(2)` for `wanted` of the mount with unique id `id`, into `out`; the errno
/// if it fails (`ENOENT`: no such mount in this process's namespace, as once it was
/// unmounted or detached). `errno` is kept.
fn statmount(id: u64, wanted: u64, out: &mut [u8]) -> Result<(), c_int> {
    const SYS_STATMOUNT: libc::c_long = 457;
    // struct mnt_id_req, version 0: size, a spare word, the mount id, what to report.
    let mut req = [0u8; 24];
    req[..4].copy_from_slice(&24u32.to_ne_bytes());
    req[8..16].copy_from_slice(&id.to_ne_bytes());
    req[16..].copy_from_slice(&wanted.to_ne_bytes());
    let saved = crate::errno();
    // SAFETY: `req` is a version-0 request and `out` a writable buffer of the length passed.
    let r = unsafe { libc::syscall(SYS_STATMOUNT, req.as_ptr(), out.as_mut_ptr(), out.len(), 0) };
    let e = crate::errno();
    crate::set_errno(saved);
    if r == 0 { Ok(()) } else { Err(e) }
}

/// Asks `statmount(2)` what the mount with unique id `id` is, whose files have device `dev`,
/// into `out`; `None` when the kernel does not tell (no `statmount`, or a FUSE mount whose
/// subtype and source it does not report).
fn identify(id: u64, dev: u64, out: &mut [u8; STATMOUNT_BUF]) -> Option<Mount<'_>> {
    const FUSE_SUPER_MAGIC: u64 = 0x6573_5546;
    statmount(id, SB_BASIC | FS_SUBTYPE | SB_SOURCE, out).ok()?;
    let out = &*out;
    // struct statmount: mask at byte 8, sb_dev_major and sb_dev_minor at 16 and 20, sb_magic
    // at 24, the fs_subtype and sb_source string offsets at 120 and 124, the strings from
    // byte 512 on.
    let u32_at = |o: usize| u32::from_ne_bytes(out[o..o + 4].try_into().unwrap_or_default());
    let u64_at = |o: usize| u64::from_ne_bytes(out[o..o + 8].try_into().unwrap_or_default());
    let mask = u64_at(8);
    if mask & SB_BASIC == 0 || libc::makedev(u32_at(16), u32_at(20)) != dev {
        return None;
    }
    if u64_at(24) != FUSE_SUPER_MAGIC {
        return Some(Mount::Other);
    }
    if mask & (FS_SUBTYPE | SB_SOURCE) != FS_SUBTYPE | SB_SOURCE {
        return None;
    }
    let string = |o: usize| {
        let from = 512 + u32_at(o) as usize;
        let s = out.get(from..)?;
        Some(&s[..s.iter().position(|&b| b == 0)?])
    };
    if string(120)? != b"pmfs" {
        return Some(Mount::Other);
    }
    Some(Mount::Pmfs(string(124)?))
}

/// Records pmfs mount `dev` (unique mount id `id`, 0 if unknown), `fill` writing its pool
/// file's path (unescaped, NUL-terminated by what it leaves of the zeroed slot, empty if it
/// does not fit: the mount is then never attached); the caller holds `SCANNING`.
fn record(dev: u64, id: u64, fill: impl FnOnce(&mut [u8])) {
    let n = PMFS_LEN.load(Ordering::Relaxed);
    if n < MAX_PMFS {
        MOUNT_IDS[n].store(id, Ordering::Relaxed);
        // SAFETY: entry `n` is not published yet and this thread holds `SCANNING`: nobody
        // else reads or writes it.
        let slot = unsafe { &mut *POOLS[n].0.get() };
        slot.fill(0);
        fill(&mut slot[..POOL_PATH_MAX - 1]);
    }
    push(&PMFS, &PMFS_LEN, dev);
}

/// The pool file of pmfs mount `m` (as [`pmfs_mount_of`] numbers them).
pub(crate) fn pool_of(m: usize) -> Option<&'static CStr> {
    if m >= PMFS_LEN.load(Ordering::Acquire).min(MAX_PMFS) {
        return None;
    }
    // SAFETY: entry `m` is published, so its path is written and no longer changes.
    let path = unsafe { &*POOLS[m].0.get() };
    CStr::from_bytes_until_nul(path)
        .ok()
        .filter(|p| !p.is_empty())
}

/// Whether the mount `fd` is open on is writable, as the kernel would find it before changing
/// an attribute: neither the mount nor its superblock is read-only. Asked with two system
/// calls that send no FUSE request: `statx` for the mount's unique id, `statmount` (Linux
/// 6.8) for its flags. `false` when the kernel cannot tell.
pub(crate) fn writable(fd: c_int) -> bool {
    const SB_RDONLY: u32 = 1;
    const MOUNT_ATTR_RDONLY: u64 = 1;
    let saved = crate::errno();
    let stx = crate::statx_fd(fd, libc::AT_STATX_DONT_SYNC, libc::STATX_MNT_ID_UNIQUE);
    crate::set_errno(saved);
    let Some(id) = stx.as_ref().and_then(unique_mount_id) else {
        return false;
    };
    let wanted = SB_BASIC | MNT_BASIC;
    let mut out = [0u8; 512];
    if statmount(id, wanted, &mut out).is_err() {
        return false;
    }
    // struct statmount: mask at byte 8, sb_flags at 32, mnt_attr at 64.
    let u64_at = |o: usize| u64::from_ne_bytes(out[o..o + 8].try_into().unwrap_or_default());
    let sb_flags = u32::from_ne_bytes(out[32..36].try_into().unwrap_or_default());
    u64_at(8) & wanted == wanted && sb_flags & SB_RDONLY == 0 && u64_at(64) & MOUNT_ATTR_RDONLY == 0
}

/// After `fork`: a thread of the parent that was reading mountinfo does not exist in the
/// child.
pub(crate) fn after_fork_in_child() {
    SCANNING.store(false, Ordering::Release);
}

/// The slot of `value` among the first `len` of `table`. Slots are loaded with `Acquire`: the
/// facts table stores a mount's facts before its id.
fn find(table: &[AtomicU64], len: &AtomicUsize, value: u64) -> Option<usize> {
    let n = len.load(Ordering::Acquire).min(table.len());
    table[..n]
        .iter()
        .position(|d| d.load(Ordering::Acquire) == value)
}

/// Appends `dev` (the caller holds `SCANNING`); a full table keeps what it has.
fn push(table: &[AtomicU64], len: &AtomicUsize, dev: u64) {
    let n = len.load(Ordering::Relaxed);
    if n < table.len() {
        table[n].store(dev, Ordering::Relaxed);
        len.store(n + 1, Ordering::Release);
    }
}

/// Reads mountinfo with raw system calls and records every pmfs mount not known yet.
fn rescan() {
    each_line(c"/proc/self/mountinfo", |line| {
        if let Some((dev, pool)) = pmfs_mount_of_line(line)
            && find(&PMFS, &PMFS_LEN, dev).is_none()
        {
            record(dev, 0, |slot| unescape_into(pool, slot));
        }
    });
}

/// The device number of pmfs mount `m` (the `st_dev` of its files).
pub(crate) fn dev_of(m: usize) -> u64 {
    PMFS[m].load(Ordering::Relaxed)
}

/// Whether pmfs mount `m` is still in this process's mount table (a lazy unmount takes it
/// out while its files stay open). Asks `statmount` by its unique id where it was learnt so
/// (ids are never reused: `ENOENT` means it is gone), else reads mountinfo afresh, without
/// allocating (so also when `statmount` fails otherwise).
pub(crate) fn still_mounted(m: usize) -> bool {
    if m >= PMFS_LEN.load(Ordering::Acquire).min(MAX_PMFS) {
        return false;
    }
    let id = MOUNT_IDS[m].load(Ordering::Relaxed);
    if id != 0 {
        match statmount(id, SB_BASIC, &mut [0u8; 512]) {
            Ok(()) => return true,
            Err(libc::ENOENT) => return false,
            Err(_) => {}
        }
    }
    let dev = PMFS[m].load(Ordering::Relaxed);
    let mut found = false;
    let read = each_line(c"/proc/self/mountinfo", |line| {
        found |= pmfs_mount_of_line(line).is_some_and(|(d, _)| d == dev);
    });
    found || !read
}

/// Hands every line of the file at `path` to `each`, reading it with raw system calls into a
/// fixed buffer; false if the file could not be opened.
pub(crate) fn each_line(path: &CStr, mut each: impl FnMut(&[u8])) -> bool {
    let Some(fd) = open_read_only(path) else {
        return false;
    };
    let mut lines = Lines::new();
    loop {
        let spare = lines.spare();
        // SAFETY: `spare` is writable memory of the length passed.
        let n = unsafe { libc::syscall(libc::SYS_read, fd, spare.as_mut_ptr(), spare.len()) };
        if n <= 0 {
            break;
        }
        lines.filled(n as usize, &mut each);
    }
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    true
}

/// Opens `path` for reading with a raw system call (`O_CLOEXEC`); the caller closes it.
pub(crate) fn open_read_only(path: &CStr) -> Option<c_int> {
    // SAFETY: a NUL-terminated path; openat has no other precondition.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    } as c_int;
    (fd >= 0).then_some(fd)
}

/// Splits a byte stream read in pieces into lines, in a fixed buffer; a line longer than the
/// buffer is skipped whole (mountinfo lines are far shorter unless a path is huge).
struct Lines {
    buf: [u8; 8192],
    len: usize,
    skipping: bool,
}

impl Lines {
    fn new() -> Lines {
        Lines {
            buf: [0; 8192],
            len: 0,
            skipping: false,
        }
    }

    /// Where the next read goes.
    fn spare(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..]
    }

    /// Accepts `n` more bytes and hands every complete line to `each`.
    fn filled(&mut self, n: usize, mut each: impl FnMut(&[u8])) {
        self.len += n;
        let mut start = 0;
        while let Some(nl) = self.buf[start..self.len].iter().position(|&b| b == b'\n') {
            if !self.skipping {
                each(&self.buf[start..start + nl]);
            }
            self.skipping = false;
            start += nl + 1;
        }
        self.buf.copy_within(start..self.len, 0);
        self.len -= start;
        if self.len == self.buf.len() {
            self.len = 0;
            self.skipping = true;
        }
    }
}

/// The device and the (escaped) source of a mountinfo line if it is a `fuse.pmfs` mount.
///
/// Format (proc(5)): `id parent major:minor root mount-point options [optional...] - fstype
/// source super-options`.
pub(crate) fn pmfs_mount_of_line(line: &[u8]) -> Option<(u64, &[u8])> {
    let mut fields = line.split(|&b| b == b' ');
    let dev = fields.nth(2)?;
    let mut fields = fields.skip(3).skip_while(|f| *f != b"-");
    fields.next()?;
    if fields.next()? != b"fuse.pmfs" {
        return None;
    }
    let source = fields.next().unwrap_or(b"");
    let colon = dev.iter().position(|&b| b == b':')?;
    let major = u32::try_from(number(&dev[..colon], 10)?).ok()?;
    let minor = u32::try_from(number(&dev[colon + 1..], 10)?).ok()?;
    Some((libc::makedev(major, minor), source))
}

/// Copies a mountinfo field into `out`, turning `\ooo` octal escapes back into bytes; a path
/// that does not fit is left empty (its mount is then never attached).
fn unescape_into(field: &[u8], out: &mut [u8]) {
    let mut n = 0;
    let mut i = 0;
    while i < field.len() {
        let b = match field[i..] {
            [b'\\', a, b, c, ..] if [a, b, c].iter().all(|d| (b'0'..=b'7').contains(d)) => {
                i += 4;
                ((a - b'0') << 6) | ((b - b'0') << 3) | (c - b'0')
            }
            [b, ..] => {
                i += 1;
                b
            }
            [] => break,
        };
        if n == out.len() {
            out.fill(0);
            return;
        }
        out[n] = b;
        n += 1;
    }
}

/// The value of `digits` in `radix`; `None` if empty, not all digits, or too large.
pub(crate) fn number(digits: &[u8], radix: u32) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let v = u64::from(char::from(d).to_digit(radix)?);
        n.checked_mul(u64::from(radix))?.checked_add(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mount of `path`: its device and unique id.
    fn mount_of(path: &CStr) -> (u64, u64) {
        let s = crate::statx_at(libc::AT_FDCWD, path, 0, libc::STATX_MNT_ID_UNIQUE)
            .expect("statx of the test's own directory");
        let id = unique_mount_id(&s).expect("a kernel with statmount reports unique mount ids");
        (libc::makedev(s.stx_dev_major, s.stx_dev_minor), id)
    }

    #[test]
    fn statmount_tells_a_mount_that_is_not_pmfs() {
        let mut buf = [0u8; STATMOUNT_BUF];
        for path in [c"/", c"/proc/self"] {
            let (dev, id) = mount_of(path);
            assert!(matches!(identify(id, dev, &mut buf), Some(Mount::Other)));
            // A device that is not the mount's: the kernel's answer is not trusted.
            assert!(identify(id, dev + 1, &mut buf).is_none());
        }
    }

    #[test]
    fn memory_and_kernel_file_systems_answer_exactly_and_unknown_mounts_not_at_all() {
        for path in [c"/proc/self", c"/dev/null"] {
            let id = mount_of(path).1;
            let s = crate::statx_at(libc::AT_FDCWD, path, 0, libc::STATX_MNT_ID)
                .expect("statx of a path every system has");
            let facts = mount_facts(id).expect("statmount tells");
            assert!(facts.exact, "{path:?}");
            assert_eq!(u64::from(facts.old_id), s.stx_mnt_id, "{path:?}");
            // Remembered: the same answer again.
            assert_eq!(mount_facts(id), Some(facts));
        }
        assert_eq!(mount_facts(u64::MAX), None);
    }

    #[test]
    fn a_pmfs_line_gives_its_device() {
        let l = b"77 30 0:52 / /mnt/p rw,nosuid,nodev,relatime shared:40 - fuse.pmfs \
                  /dev/shm/pool rw,user_id=0,group_id=0,default_permissions,allow_other";
        assert_eq!(
            pmfs_mount_of_line(l),
            Some((libc::makedev(0, 52), &b"/dev/shm/pool"[..]))
        );
        let no_optional = b"77 30 0:53 / /m rw - fuse.pmfs /p\\040q rw";
        assert_eq!(
            pmfs_mount_of_line(no_optional),
            Some((libc::makedev(0, 53), &b"/p\\040q"[..]))
        );
    }

    #[test]
    fn other_lines_give_nothing() {
        for l in [
            &b"22 1 0:21 / /proc rw,nosuid - proc proc rw"[..],
            b"90 30 0:60 / /mnt/sshfs rw - fuse.sshfs host: rw",
            b"91 30 0:61 / /mnt/x rw - fuse pmfs rw",
            b"92 30 0:62 / /mnt/fuse.pmfs rw - tmpfs fuse.pmfs rw",
            b"93 30 0:x / /m rw - fuse.pmfs /p rw",
            b"",
            b"garbage",
        ] {
            assert_eq!(
                pmfs_mount_of_line(l),
                None,
                "{}",
                String::from_utf8_lossy(l)
            );
        }
    }

    #[test]
    fn escaped_sources_are_unescaped_and_overlong_ones_dropped() {
        let mut out = [0u8; 16];
        unescape_into(b"/a\\040b\\134c\\12", &mut out);
        assert_eq!(&out[..9], b"/a b\\c\\12");
        assert_eq!(out[9], 0);
        let mut small = [0u8; 4];
        unescape_into(b"/long", &mut small);
        assert_eq!(small, [0; 4]);
    }

    #[test]
    fn lines_are_reassembled_across_reads_and_overlong_ones_skipped() {
        let mut got = Vec::new();
        let mut lines = Lines::new();
        let mut feed = |lines: &mut Lines, bytes: &[u8]| {
            lines.spare()[..bytes.len()].copy_from_slice(bytes);
            lines.filled(bytes.len(), |l| got.push(l.to_vec()));
        };
        feed(&mut lines, b"one\ntw");
        feed(&mut lines, b"o\nthree");
        let long = vec![b'x'; 8192 - 5];
        feed(&mut lines, &long);
        feed(&mut lines, b"yy\nfour\n");
        assert_eq!(
            got,
            vec![b"one".to_vec(), b"two".to_vec(), b"four".to_vec()]
        );
    }
}
