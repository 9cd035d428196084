//! Fragment buckets (CFFS §V.B.2): the DRAM index of unused space between directory entries.
//!
//! Fragments are derived from the dentry lists (`distance - length`), so they live in DRAM
//! only and are rebuilt when a directory is loaded. As in CFFS there are four buckets — 40, 48,
//! 56 bytes and longer — matching the entry sizes of names up to 8, 16, 24 bytes and longer
//! ones. The last bucket is ordered by size so the smallest fragment that fits is taken. The
//! free space at the end of a page is the fragment before its tail sentinel and lives in the
//! last bucket too.

use std::collections::BTreeSet;

use super::page::MIN_ENTRY;

/// Where a fragment is: the page and the offset of the entry it follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct FragPos {
    pub page: u32,
    pub after: u16,
}

#[derive(Debug, Default)]
pub(crate) struct Fragments {
    buckets: [BTreeSet<(u16, FragPos)>; 4],
}

fn bucket(len: u16) -> usize {
    usize::from((len - MIN_ENTRY) / 8).min(3)
}

impl Fragments {
    /// Records a fragment of `len` bytes (ignored when too small for any entry).
    pub fn insert(&mut self, pos: FragPos, len: u16) {
        if len >= MIN_ENTRY {
            self.buckets[bucket(len)].insert((len, pos));
        }
    }

    /// Forgets a fragment recorded with `len`.
    pub fn remove(&mut self, pos: FragPos, len: u16) {
        if len >= MIN_ENTRY {
            self.buckets[bucket(len)].remove(&(len, pos));
        }
    }

    /// A fragment of at least `need` bytes: the exact bucket first, then larger ones.
    pub fn find(&self, need: u16) -> Option<(FragPos, u16)> {
        let first = bucket(need.max(MIN_ENTRY));
        for (b, set) in self.buckets.iter().enumerate().skip(first) {
            let hit = if b < 3 {
                set.first()
            } else {
                set.range((need, FragPos { page: 0, after: 0 })..).next()
            };
            if let Some(&(len, pos)) = hit {
                return Some((pos, len));
            }
        }
        None
    }

    /// Total bytes in recorded fragments.
    #[cfg(test)]
    pub fn total(&self) -> u64 {
        self.buckets
            .iter()
            .flat_map(|s| s.iter())
            .map(|&(l, _)| u64::from(l))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(page: u32, after: u16) -> FragPos {
        FragPos { page, after }
    }

    #[test]
    fn exact_bucket_first_then_smallest_larger() {
        let mut f = Fragments::default();
        f.insert(p(0, 64), 32); // too small: ignored
        f.insert(p(0, 100), 48);
        f.insert(p(1, 64), 4000);
        f.insert(p(2, 64), 200);
        assert_eq!(f.find(40), Some((p(0, 100), 48)));
        assert_eq!(f.find(48), Some((p(0, 100), 48)));
        assert_eq!(f.find(56), Some((p(2, 64), 200)));
        assert_eq!(f.find(208), Some((p(1, 64), 4000)));
        assert_eq!(f.find(4008), None);
        f.remove(p(0, 100), 48);
        assert_eq!(f.find(40), Some((p(2, 64), 200)));
        assert_eq!(f.total(), 4200);
    }
}
