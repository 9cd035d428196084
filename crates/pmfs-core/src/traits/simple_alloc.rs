//! The simplest correct [`BlockAllocator`]: a volatile ordered map of free extents, first fit.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{AllocHint, BlockAllocator, Extent};
use crate::error::{Error, Result};
use crate::layout::BlockNo;

/// First-fit allocator over a `BTreeMap` of free extents (start -> length), behind one mutex.
///
/// Volatile and unoptimised: it exists so that other parts can be tested before, and
/// independently of, the real allocators.
#[derive(Debug)]
pub struct SimpleAllocator {
    first: BlockNo,
    count: u64,
    free: Mutex<BTreeMap<u64, u64>>,
}

impl SimpleAllocator {
    /// Manages blocks `[first, first + count)`, all free.
    pub fn new(first: BlockNo, count: u64) -> Self {
        let mut free = BTreeMap::new();
        if count > 0 {
            free.insert(first.0, count);
        }
        Self {
            first,
            count,
            free: Mutex::new(free),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, u64>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Inserts `[start, start + len)` into a free map, merging neighbours. Returns false (and
/// changes nothing) if any block is already free.
fn insert_free(free: &mut BTreeMap<u64, u64>, start: u64, len: u64) -> bool {
    let end = start + len;
    if let Some((&s, &l)) = free.range(..end).next_back()
        && s + l > start
    {
        return false;
    }
    let mut new_start = start;
    let mut new_len = len;
    if let Some((&s, &l)) = free.range(..start).next_back()
        && s + l == start
    {
        free.remove(&s);
        new_start = s;
        new_len += l;
    }
    if let Some(l) = free.remove(&end) {
        new_len += l;
    }
    free.insert(new_start, new_len);
    true
}

impl BlockAllocator for SimpleAllocator {
    fn alloc(&self, want: u64, hint: AllocHint) -> Result<Extent> {
        if want == 0 {
            return Err(Error::InvalidArgument("allocation of zero blocks"));
        }
        let mut free = self.lock();
        let goal_hit = hint.goal.and_then(|g| {
            free.range(..=g.0)
                .next_back()
                .filter(|&(&s, &l)| s + l > g.0)
                .map(|(&s, &l)| (s, l))
        });
        let (s, l) = match goal_hit {
            Some(hit) => hit,
            None => free
                .iter()
                .find(|&(_, &l)| l >= want)
                .or_else(|| free.iter().max_by_key(|&(_, &l)| l))
                .map(|(&s, &l)| (s, l))
                .ok_or(Error::NoSpace)?,
        };
        let at = hint.goal.map_or(s, |g| g.0.clamp(s, s + l - 1));
        let take = want.min(s + l - at);
        free.remove(&s);
        if at > s {
            free.insert(s, at - s);
        }
        if at + take < s + l {
            free.insert(at + take, s + l - at - take);
        }
        Ok(Extent::new(BlockNo(at), take))
    }

    fn free(&self, ext: Extent) -> Result<()> {
        if ext.len == 0
            || ext.start < self.first
            || ext.start.0 + ext.len > self.first.0 + self.count
        {
            return Err(Error::InvalidArgument(
                "free of blocks outside the managed range",
            ));
        }
        if insert_free(&mut self.lock(), ext.start.0, ext.len) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(
                "free of blocks that are not allocated",
            ))
        }
    }

    fn free_blocks(&self) -> u64 {
        self.lock().values().sum()
    }

    fn total_blocks(&self) -> u64 {
        self.count
    }

    fn rebuild(&self, used: &mut dyn Iterator<Item = Extent>) -> Result<()> {
        let mut sorted: Vec<Extent> = used.collect();
        sorted.sort();
        let mut free = BTreeMap::new();
        let mut cursor = self.first.0;
        let end = self.first.0 + self.count;
        for e in sorted {
            if e.start.0 < cursor || e.start.0 + e.len > end || e.len == 0 {
                return Err(Error::Corrupt {
                    what: "used extent list",
                    at: e.start.checked_offset().unwrap_or_default(),
                });
            }
            if e.start.0 > cursor {
                free.insert(cursor, e.start.0 - cursor);
            }
            cursor = e.start.0 + e.len;
        }
        if cursor < end {
            free.insert(cursor, end - cursor);
        }
        *self.lock() = free;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goal_extends_and_double_free_is_refused() {
        let a = SimpleAllocator::new(BlockNo(100), 50);
        let e = a.alloc(10, AllocHint::default()).unwrap();
        assert_eq!(e, Extent::new(BlockNo(100), 10));
        let hint = AllocHint {
            goal: Some(e.end()),
            ..AllocHint::default()
        };
        assert_eq!(a.alloc(5, hint).unwrap(), Extent::new(BlockNo(110), 5));
        a.free(e).unwrap();
        assert!(matches!(a.free(e), Err(Error::InvalidArgument(_))));
        assert_eq!(a.free_blocks(), 45);
    }
}
