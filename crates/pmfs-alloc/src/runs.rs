//! An ordered set of disjoint free runs with a size index: the "ordered map of free extents"
//! of the baseline allocator, and the free-chunk list of a CFFS group at huge-page level.

use std::collections::{BTreeMap, BTreeSet};

/// Disjoint, non-adjacent runs `[start, start + len)` of free units (blocks or huge pages).
///
/// Adjacent runs are merged on insertion. Two indexes are kept in step: by start (address
/// order, neighbour lookups) and by `(len, start)` (largest run, best fit).
#[derive(Clone, Debug, Default)]
pub(crate) struct RunSet {
    by_start: BTreeMap<u64, u64>,
    by_len: BTreeSet<(u64, u64)>,
    total: u64,
}

impl RunSet {
    /// An empty set.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Total units in all runs.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Number of runs.
    pub(crate) fn count(&self) -> usize {
        self.by_start.len()
    }

    /// The runs in address order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.by_start.iter().map(|(&s, &l)| (s, l))
    }

    fn put(&mut self, start: u64, len: u64) {
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
    }

    fn take(&mut self, start: u64) -> Option<u64> {
        let len = self.by_start.remove(&start)?;
        self.by_len.remove(&(len, start));
        Some(len)
    }

    /// Adds `[start, start + len)`, merging with neighbours. Returns false and changes nothing
    /// if any unit is already in the set (or `len` is 0).
    pub(crate) fn insert(&mut self, start: u64, len: u64) -> bool {
        let end = start + len;
        if len == 0 || self.overlaps(start, len) {
            return false;
        }
        let mut s = start;
        let mut l = len;
        if let Some((&ps, &pl)) = self.by_start.range(..start).next_back()
            && ps + pl == start
        {
            self.take(ps);
            s = ps;
            l += pl;
        }
        if let Some(nl) = self.take(end) {
            l += nl;
        }
        self.put(s, l);
        self.total += len;
        true
    }

    /// Whether any unit of `[start, start + len)` is in the set.
    pub(crate) fn overlaps(&self, start: u64, len: u64) -> bool {
        self.by_start
            .range(..start + len)
            .next_back()
            .is_some_and(|(&s, &l)| s + l > start)
    }

    /// Removes `[start, start + len)`, which must lie inside one run. Returns false and changes
    /// nothing otherwise.
    pub(crate) fn remove(&mut self, start: u64, len: u64) -> bool {
        let Some((s, l)) = self.containing(start) else {
            return false;
        };
        if len == 0 || start + len > s + l {
            return false;
        }
        self.take(s);
        if start > s {
            self.put(s, start - s);
        }
        if start + len < s + l {
            self.put(start + len, s + l - start - len);
        }
        self.total -= len;
        true
    }

    /// The run containing unit `u`.
    pub(crate) fn containing(&self, u: u64) -> Option<(u64, u64)> {
        self.by_start
            .range(..=u)
            .next_back()
            .filter(|&(&s, &l)| s + l > u)
            .map(|(&s, &l)| (s, l))
    }

    /// The largest run (the lowest-addressed one among equals).
    pub(crate) fn largest(&self) -> Option<(u64, u64)> {
        let &(len, _) = self.by_len.last()?;
        self.by_len.range((len, 0)..).next().map(|&(l, s)| (s, l))
    }

    /// The smallest run of at least `len` units (the lowest-addressed one among equals).
    pub(crate) fn best_fit(&self, len: u64) -> Option<(u64, u64)> {
        self.by_len.range((len, 0)..).next().map(|&(l, s)| (s, l))
    }

    /// The first run in address order, starting at or after `from` and wrapping around to the
    /// start, that holds at least `len` units.
    pub(crate) fn next_fit(&self, from: u64, len: u64) -> Option<(u64, u64)> {
        // The size index answers "is there any" in O(log n) before the address-order scan.
        self.best_fit(len)?;
        self.by_start
            .range(from..)
            .chain(self.by_start.range(..from))
            .find(|&(_, &l)| l >= len)
            .map(|(&s, &l)| (s, l))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::RunSet;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u64),
        Remove(u64, u64),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                (0..200u64, 1..20u64).prop_map(|(s, l)| Op::Insert(s, l)),
                (0..200u64, 1..20u64).prop_map(|(s, l)| Op::Remove(s, l)),
            ],
            1..80,
        )
    }

    proptest! {
        #[test]
        fn runs_match_a_set_of_units(ops in ops()) {
            let mut set = RunSet::new();
            let mut model: BTreeSet<u64> = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Insert(s, l) => {
                        let clash = (s..s + l).any(|u| model.contains(&u));
                        prop_assert_eq!(set.insert(s, l), !clash);
                        if !clash {
                            model.extend(s..s + l);
                        }
                    }
                    Op::Remove(s, l) => {
                        let inside = set.containing(s).is_some_and(|(rs, rl)| s + l <= rs + rl);
                        prop_assert_eq!(set.remove(s, l), inside);
                        if inside {
                            for u in s..s + l {
                                model.remove(&u);
                            }
                        }
                    }
                }
                // Runs are maximal, disjoint and cover exactly the model.
                let mut prev_end = None;
                let mut covered = 0;
                for (s, l) in set.iter() {
                    prop_assert!(l > 0);
                    prop_assert!(prev_end.is_none_or(|e| e < s), "runs touch or overlap");
                    prop_assert!((s..s + l).all(|u| model.contains(&u)));
                    covered += l;
                    prev_end = Some(s + l);
                }
                prop_assert_eq!(covered, model.len() as u64);
                prop_assert_eq!(set.total(), covered);
                let max = set.iter().map(|(_, l)| l).max();
                prop_assert_eq!(set.largest().map(|(_, l)| l), max);
                let fit3 = set.iter().filter(|&(_, l)| l >= 3).map(|(_, l)| l).min();
                prop_assert_eq!(set.best_fit(3).map(|(_, l)| l), fit3);
                if let Some((s, l)) = set.next_fit(100, 3) {
                    prop_assert!(l >= 3);
                    let first_after = set.iter().find(|&(rs, rl)| rs >= 100 && rl >= 3);
                    let first = set.iter().find(|&(_, rl)| rl >= 3);
                    prop_assert_eq!(Some((s, l)), first_after.or(first));
                }
            }
        }
    }
}
