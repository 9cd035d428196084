//! What the library knows about each file descriptor: nothing yet, "not a pmfs file", or
//! "a pmfs file on mount m".
//!
//! One atomic byte per descriptor below [`TABLE_FDS`]; higher descriptors are never
//! recorded and always take the kernel path. The table is a cache: [`Kind::Unknown`] is
//! always a correct answer (the descriptor is classified again with one `statx`), so every
//! event the library cannot follow (descriptors made by functions it does not interpose:
//! sockets, pipes, stdio's own opens) only costs a classification, as long as every way of
//! *closing* a recorded descriptor resets its entry — those are all interposed (`close`,
//! `close_range`, `closefrom`, `dup2`/`dup3`/`F_DUPFD` onto it, `fclose`, `freopen`).
//!
//! The table is copied with the address space at `fork`, matching the child's inherited
//! descriptors, and starts empty in a new image after `exec`.

use core::sync::atomic::{AtomicU8, Ordering};

/// Descriptors below this are recorded.
pub(crate) const TABLE_FDS: usize = 1 << 16;

const UNKNOWN: u8 = 0;
const OTHER: u8 = 1;
const PMFS_BASE: u8 = 2;

static TABLE: [AtomicU8; TABLE_FDS] = [const { AtomicU8::new(UNKNOWN) }; TABLE_FDS];

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
    fn encode(self) -> u8 {
        match self {
            Kind::Unknown => UNKNOWN,
            Kind::Other => OTHER,
            Kind::Pmfs(m) => {
                PMFS_BASE + u8::try_from(m).expect("mount index below MAX_PMFS fits a byte")
            }
        }
    }

    fn decode(b: u8) -> Kind {
        match b {
            UNKNOWN => Kind::Unknown,
            OTHER => Kind::Other,
            m => Kind::Pmfs(usize::from(m - PMFS_BASE)),
        }
    }
}

const _: () = assert!(crate::mounts::MAX_PMFS + PMFS_BASE as usize <= u8::MAX as usize);

fn slot(fd: i32) -> Option<&'static AtomicU8> {
    usize::try_from(fd).ok().and_then(|i| TABLE.get(i))
}

/// Whether `fd` has an entry (it is in `0..TABLE_FDS`).
pub(crate) fn recorded(fd: i32) -> bool {
    slot(fd).is_some()
}

/// What is recorded for `fd` (`Unknown` for descriptors outside the table).
pub(crate) fn get(fd: i32) -> Kind {
    slot(fd).map_or(Kind::Unknown, |s| Kind::decode(s.load(Ordering::Acquire)))
}

/// Records `kind` for `fd`.
pub(crate) fn set(fd: i32, kind: Kind) {
    if let Some(s) = slot(fd) {
        s.store(kind.encode(), Ordering::Release);
    }
}

/// `new` now refers to what `old` refers to (a `dup`).
pub(crate) fn copy(old: i32, new: i32) {
    set(new, get(old));
}

/// Forgets `fds` (closed).
pub(crate) fn forget_range(first: usize, last_inclusive: usize) {
    if first >= TABLE_FDS {
        return;
    }
    for s in &TABLE[first..=last_inclusive.min(TABLE_FDS - 1)] {
        s.store(UNKNOWN, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_dups_share_them() {
        set(100, Kind::Pmfs(3));
        set(101, Kind::Other);
        assert_eq!(get(100), Kind::Pmfs(3));
        assert_eq!(get(101), Kind::Other);
        copy(100, 102);
        assert_eq!(get(102), Kind::Pmfs(3));
        forget_range(100, 101);
        assert_eq!(
            (get(100), get(101), get(102)),
            (Kind::Unknown, Kind::Unknown, Kind::Pmfs(3))
        );
        forget_range(102, usize::MAX);
        assert_eq!(get(102), Kind::Unknown);
    }

    #[test]
    fn descriptors_outside_the_table_are_never_recorded() {
        for fd in [-1, TABLE_FDS as i32, i32::MAX] {
            set(fd, Kind::Pmfs(0));
            assert_eq!(get(fd), Kind::Unknown);
            assert!(!recorded(fd));
        }
        forget_range(TABLE_FDS, usize::MAX);
    }
}
