//! The pins this process holds on each log, so that a process that finds a log pinned can
//! tell how many of the pins are its own ([`pins_here`]).
//!
//! [`pin`](super::pin), [`pin_mapping`](super::pin_mapping) and every handle count themselves
//! here before their CAS on the head word, and [`unpin`](super::unpin) and
//! [`unpin_mapping`](super::unpin_mapping) after theirs. So a process that read a head word
//! holding a pin of its own, then asks here, sees that pin counted.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::layout::PmOff;

/// Pins held by this process, by the offset of the log's head word. Logs of different pools
/// at the same offset share an entry: a count may include another pool's pins, which only
/// makes [`pins_here`] answer more than there are.
static HERE: Mutex<BTreeMap<u64, u64>> = Mutex::new(BTreeMap::new());

fn here() -> MutexGuard<'static, BTreeMap<u64, u64>> {
    HERE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts a pin of this process on the log at `root`, before its CAS.
pub(super) fn add(root: PmOff) {
    *here().entry(root.0).or_insert(0) += 1;
}

/// Counts one pin less (never below zero), after its CAS.
pub(super) fn sub(root: PmOff) {
    let mut h = here();
    if let Some(n) = h.get_mut(&root.0) {
        *n -= 1;
        if *n == 0 {
            h.remove(&root.0);
        }
    }
}

/// How many pins (open handles, [`pin`](super::pin)s and
/// [`pin_mapping`](super::pin_mapping)s) this process holds on the log whose head word is at
/// `root`, and on logs of other pools at the same offset. Every pin this process had counted
/// in a head word read before this call is seen, unless it was given back since.
pub fn pins_here(root: PmOff) -> u64 {
    here().get(&root.0).copied().unwrap_or(0)
}
