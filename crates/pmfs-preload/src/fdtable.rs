//! What the library knows about each file descriptor: nothing yet, "not a pmfs file", or
//! "a pmfs file on mount m".
//!
//! One atomic word per descriptor below [`TABLE_FDS`]; higher descriptors are never
//! recorded and always take the kernel path. The table is a cache: [`Kind::Unknown`] is
//! always a correct answer (the descriptor is classified again with one `statx`), so every
//! event the library cannot follow (descriptors made by functions it does not interpose:
//! sockets, pipes, stdio's own opens) only costs a classification, as long as every way of
//! *closing* a recorded descriptor resets its entry — those are all interposed (`close`,
//! `close_range`, `closefrom`, `dup2`/`dup3`/`F_DUPFD` onto it, `fclose`, `freopen`).
//!
//! **Closes on other threads.** The kernel may give a closed number to another file while the
//! call that closed it is still returning, and a call on another thread may be classifying
//! the old file at that moment. So a closing call resets the entry both before and after the
//! real call, and each reset also counts up a *close count* kept beside the kind: a
//! classification records its answer only if the entry is still the one it read before its
//! `statx` ([`publish`]), and what a descriptor is given in userspace is checked the same way
//! ([`unchanged`]). A classification that raced with a close is still a right answer for the
//! call that made it (the call and the close overlapped), but it is not recorded. One window
//! stays: a classification that ran its `statx` just before the real close and recorded its
//! answer between the two resets lets calls made in that window serve the old file; the reset
//! after the call ends it.
//!
//! The table is copied with the address space at `fork`, matching the child's inherited
//! descriptors, and starts empty in a new image after `exec`.
//!
//! **Closing ranges** (`close_range`, `closefrom`) resets only the entries up to the highest
//! descriptor ever classified or duplicated onto ([`for_classifying`], [`copy`]): the others
//! were never written, and a classification of one that starts later reads the kernel's
//! answer after the close. Resetting all 65536 would cost a few hundred microseconds, most
//! of it copy-on-write faults in the fork child that closes its inherited descriptors before
//! it execs.

use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// Descriptors below this are recorded.
pub(crate) const TABLE_FDS: usize = 1 << 16;

const UNKNOWN: u8 = 0;
const OTHER: u8 = 1;
const PMFS_BASE: u8 = 2;

/// Per descriptor: its kind in the low byte, its close count (wrapping) above it.
static TABLE: [AtomicU32; TABLE_FDS] = [const { AtomicU32::new(0) }; TABLE_FDS];
/// The highest descriptor ever classified or duplicated onto (see the module docs).
static HIGHEST: AtomicUsize = AtomicUsize::new(0);

const CLOSE: u32 = 1 << 8;

/// What a descriptor is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Not classified since it was last opened or closed.
    Unknown,
    /// Not a regular file on a pmfs mount.
    Other,
    /// A regular file on the pmfs mount with this index (see `mounts`).
    Pmfs(usize),
}

impl Kind {
    fn encode(self) -> u32 {
        u32::from(match self {
            Kind::Unknown => UNKNOWN,
            Kind::Other => OTHER,
            Kind::Pmfs(m) => {
                PMFS_BASE + u8::try_from(m).expect("mount index below MAX_PMFS fits a byte")
            }
        })
    }

    fn decode(w: u32) -> Kind {
        match w as u8 {
            UNKNOWN => Kind::Unknown,
            OTHER => Kind::Other,
            m => Kind::Pmfs(usize::from(m - PMFS_BASE)),
        }
    }
}

const _: () = assert!(crate::mounts::MAX_PMFS + PMFS_BASE as usize <= u8::MAX as usize);

/// A descriptor's entry as read at one moment: its kind, and whether the descriptor was
/// closed since ([`unchanged`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry(u32);

impl Entry {
    /// The kind recorded.
    pub(crate) fn kind(self) -> Kind {
        Kind::decode(self.0)
    }
}

fn slot(fd: i32) -> Option<&'static AtomicU32> {
    usize::try_from(fd).ok().and_then(|i| TABLE.get(i))
}

/// Whether `fd` has an entry (it is in `0..TABLE_FDS`).
pub(crate) fn recorded(fd: i32) -> bool {
    slot(fd).is_some()
}

/// `fd`'s entry now (`Unknown` for descriptors outside the table).
pub(crate) fn entry(fd: i32) -> Entry {
    Entry(slot(fd).map_or(0, |s| s.load(Ordering::SeqCst)))
}

/// `fd`'s entry now, read to classify the descriptor and [`publish`] the answer: a close of
/// a range that covers `fd` from here on resets it (see the module docs).
pub(crate) fn for_classifying(fd: i32) -> Entry {
    if recorded(fd) {
        HIGHEST.fetch_max(fd as usize, Ordering::SeqCst);
    }
    entry(fd)
}

/// What is recorded for `fd` (`Unknown` for descriptors outside the table).
pub(crate) fn get(fd: i32) -> Kind {
    entry(fd).kind()
}

/// Records `kind` for `fd` if its entry is still `seen` (read before classifying it);
/// returns the new entry if it did.
pub(crate) fn publish(fd: i32, seen: Entry, kind: Kind) -> Option<Entry> {
    let s = slot(fd)?;
    let new = (seen.0 & !0xff) | kind.encode();
    s.compare_exchange(seen.0, new, Ordering::SeqCst, Ordering::SeqCst)
        .ok()
        .map(|_| Entry(new))
}

/// Whether `fd`'s entry is still `seen`: no close and no new classification since.
pub(crate) fn unchanged(fd: i32, seen: Entry) -> bool {
    entry(fd) == seen
}

/// Counts a close of `s` and records `kind` for what the number names now.
fn reset(s: &AtomicU32, kind: Kind) {
    let _ = s.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
        Some((w & !0xff).wrapping_add(CLOSE) | kind.encode())
    });
}

/// `new` now refers to what `old` refers to (a `dup`).
pub(crate) fn copy(old: i32, new: i32) {
    if let Some(s) = slot(new) {
        HIGHEST.fetch_max(new as usize, Ordering::SeqCst);
        reset(s, get(old));
    }
}

/// Forgets `fds` (closed, or about to be).
pub(crate) fn forget_range(first: usize, last_inclusive: usize) {
    let last = last_inclusive.min(HIGHEST.load(Ordering::SeqCst));
    for s in TABLE.get(first..=last).unwrap_or_default() {
        reset(s, Kind::Unknown);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(fd: i32, kind: Kind) {
        assert!(publish(fd, for_classifying(fd), kind).is_some());
    }

    #[test]
    fn kinds_round_trip_and_dups_share_them() {
        set(100, Kind::Pmfs(3));
        set(101, Kind::Other);
        assert_eq!(get(100), Kind::Pmfs(3));
        assert_eq!(get(101), Kind::Other);
        copy(100, 102);
        assert_eq!(get(102), Kind::Pmfs(3));
        // A duplicate onto a number above every one classified is closed with its range.
        copy(100, 60000);
        forget_range(50000, usize::MAX);
        assert_eq!(get(60000), Kind::Unknown);
        forget_range(100, 101);
        assert_eq!(
            (get(100), get(101), get(102)),
            (Kind::Unknown, Kind::Unknown, Kind::Pmfs(3))
        );
        forget_range(102, usize::MAX);
        assert_eq!(get(102), Kind::Unknown);
    }

    #[test]
    fn a_close_since_an_entry_was_read_keeps_its_classification_out() {
        let seen = for_classifying(200);
        forget_range(200, 200);
        assert_eq!(publish(200, seen, Kind::Pmfs(0)), None);
        assert_eq!(get(200), Kind::Unknown);
        // Also when the range closed is wider than any descriptor classified before.
        let seen = for_classifying(40000);
        forget_range(300, usize::MAX);
        assert_eq!(publish(40000, seen, Kind::Pmfs(0)), None);
        let seen = for_classifying(200);
        let now = publish(200, seen, Kind::Pmfs(1)).unwrap();
        assert!(unchanged(200, now) && !unchanged(200, seen));
        assert_eq!(
            publish(200, seen, Kind::Other),
            None,
            "classified meanwhile"
        );
        copy(201, 200);
        assert!(!unchanged(200, now), "a dup onto it counts as a close");
    }

    #[test]
    fn descriptors_outside_the_table_are_never_recorded() {
        for fd in [-1, TABLE_FDS as i32, i32::MAX] {
            assert_eq!(publish(fd, for_classifying(fd), Kind::Pmfs(0)), None);
            assert_eq!(get(fd), Kind::Unknown);
            assert!(!recorded(fd));
        }
        forget_range(TABLE_FDS, usize::MAX);
    }
}
