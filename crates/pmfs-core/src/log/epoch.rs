//! Grace periods inside one process: every log operation runs pinned, and blocks a compaction
//! retired are freed only after every operation that could still hold them has unpinned.
//!
//! Two counters of pinned operations, one per parity of a global epoch. An operation pins by
//! counting itself under the current epoch's parity and re-checking that the epoch did not
//! move meanwhile. The epoch may advance from `e` to `e + 1` only when no operation is counted
//! under the parity of `e - 1`; hence while an operation pinned at epoch `p` is alive the epoch
//! stays at or below `p + 1`, and once the epoch reaches `s + 2` nothing pinned at or before `s`
//! is alive. Retired blocks stamped with the epoch `s` read after their unlinking are therefore
//! unreachable once the epoch is `s + 2`. Pinning and unpinning never wait; only the reclaimer
//! finds out, without waiting either, whether a grace period has passed.

use crate::sync::atomic::{AtomicU64, Ordering::SeqCst, fence, fence_after_rmw};

/// The epoch and its two pin counters.
#[derive(Debug)]
pub(crate) struct Epoch {
    global: AtomicU64,
    active: [AtomicU64; 2],
}

/// An operation pinned in an [`Epoch`]; unpins on drop.
#[derive(Debug)]
pub(crate) struct Guard<'a> {
    counter: &'a AtomicU64,
}

impl Epoch {
    pub(crate) fn new() -> Epoch {
        Epoch {
            global: AtomicU64::new(0),
            active: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Pins the calling operation. Loads it makes afterwards see every store that preceded a
    /// later [`now`](Epoch::now).
    pub(crate) fn pin(&self) -> Guard<'_> {
        loop {
            let e = self.global.load(SeqCst);
            let counter = &self.active[(e & 1) as usize];
            counter.fetch_add(1, SeqCst);
            if self.global.load(SeqCst) == e {
                // Either a reclaimer's `has_passed` sees the count, or the loads after it
                // see every store that preceded the reclaimer's `now`.
                fence_after_rmw();
                return Guard { counter };
            }
            // The epoch moved between the load and the count: undo and count again.
            counter.fetch_sub(1, SeqCst);
        }
    }

    /// The current epoch, read after every earlier store of the caller (the stamp of blocks
    /// retired by those stores).
    pub(crate) fn now(&self) -> u64 {
        fence(SeqCst);
        self.global.load(SeqCst)
    }

    /// Whether every operation pinned at or before epoch `stamp` has unpinned, advancing the
    /// epoch as far as the pinned operations allow. Never waits.
    pub(crate) fn has_passed(&self, stamp: u64) -> bool {
        loop {
            let e = self.global.load(SeqCst);
            if e >= stamp.saturating_add(2) {
                return true;
            }
            // Operations pinned at `e - 1` share the parity of `e + 1`.
            if self.active[((e + 1) & 1) as usize].load(SeqCst) != 0 {
                return false;
            }
            // Losing the race means another reclaimer advanced it: look again.
            let _ = self.global.compare_exchange(e, e + 1, SeqCst, SeqCst);
        }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, SeqCst);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_operation_holds_back_the_grace_period() {
        let ep = Epoch::new();
        let g = ep.pin();
        let stamp = ep.now();
        assert!(!ep.has_passed(stamp));
        // Pinning later does not hold back an earlier stamp forever.
        drop(g);
        let late = ep.pin();
        assert!(ep.has_passed(stamp));
        assert!(!ep.has_passed(ep.now()));
        drop(late);
        assert!(ep.has_passed(ep.now()));
    }
}
