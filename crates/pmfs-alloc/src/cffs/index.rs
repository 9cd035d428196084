//! The buddy structure (CFFS Fig. 7): buddy lists of groups keyed by each group's largest free
//! chunk, the extension LRU list, and the buddy lists of split pages (the 4 KiB level).
//!
//! The lists are intrusive doubly-linked lists over dense ids, so moving an entry to another
//! list or to a list's tail is O(1). Everything here sits behind one mutex that is held only
//! for such O(1) list operations (see the locking notes in the parent module).

use super::group::{FRAGMENT_PAGES, NO_BUCKET};

const NIL: u32 = u32::MAX;

/// A family of intrusive lists over ids `0..n`; each id is in at most one list.
#[derive(Debug)]
struct Lists {
    prev: Vec<u32>,
    next: Vec<u32>,
    list_of: Vec<u8>,
    head: Vec<u32>,
    tail: Vec<u32>,
    len: Vec<usize>,
}

impl Lists {
    fn new(ids: usize, lists: usize) -> Self {
        Self {
            prev: vec![NIL; ids],
            next: vec![NIL; ids],
            list_of: vec![NO_BUCKET; ids],
            head: vec![NIL; lists],
            tail: vec![NIL; lists],
            len: vec![0; lists],
        }
    }

    fn clear(&mut self) {
        self.prev.fill(NIL);
        self.next.fill(NIL);
        self.list_of.fill(NO_BUCKET);
        self.head.fill(NIL);
        self.tail.fill(NIL);
        self.len.fill(0);
    }

    fn unlink(&mut self, id: u32) {
        let l = self.list_of[id as usize];
        if l == NO_BUCKET {
            return;
        }
        let (p, n) = (self.prev[id as usize], self.next[id as usize]);
        if p == NIL {
            self.head[l as usize] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail[l as usize] = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[id as usize] = NIL;
        self.next[id as usize] = NIL;
        self.list_of[id as usize] = NO_BUCKET;
        self.len[l as usize] -= 1;
    }

    fn push_back(&mut self, l: u8, id: u32) {
        self.unlink(id);
        let t = self.tail[l as usize];
        self.prev[id as usize] = t;
        if t == NIL {
            self.head[l as usize] = id;
        } else {
            self.next[t as usize] = id;
        }
        self.tail[l as usize] = id;
        self.list_of[id as usize] = l;
        self.len[l as usize] += 1;
    }

    fn front(&self, l: u8) -> Option<u32> {
        let h = self.head[l as usize];
        (h != NIL).then_some(h)
    }

    fn iter(&self, l: u8) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head[l as usize];
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let id = cur;
                cur = self.next[id as usize];
                id
            })
        })
    }
}

/// Buckets of groups (largest chunk of whole free pages: 1, 2, 3-4, ..., 257-511, 512).
pub(super) const GROUP_BUCKETS: u8 = 11;
/// Buckets of split pages (largest free chunk: 1, 2, 3-4, ..., 257-511 blocks), for small
/// pages, followed by as many for fragment pages.
pub(super) const PAGE_BUCKETS: u8 = 2 * FRAGMENT_PAGES;
/// The extension LRU list, next to the group buckets.
const LRU: u8 = GROUP_BUCKETS;

/// The buddy structure.
#[derive(Debug)]
pub(super) struct Index {
    groups: Lists,
    /// The bucket each group belongs in (also while it sits in the LRU list).
    group_bucket: Vec<u8>,
    pages: Lists,
    lru_capacity: usize,
}

impl Index {
    /// An empty structure for `groups` groups and `pages` pages.
    pub(super) fn new(groups: usize, pages: usize, lru_capacity: usize) -> Self {
        Self {
            groups: Lists::new(groups, usize::from(GROUP_BUCKETS) + 1),
            group_bucket: vec![NO_BUCKET; groups],
            pages: Lists::new(pages, usize::from(PAGE_BUCKETS)),
            lru_capacity,
        }
    }

    /// Empties every list (rebuild files everything again).
    pub(super) fn clear(&mut self) {
        self.groups.clear();
        self.group_bucket.fill(NO_BUCKET);
        self.pages.clear();
    }

    /// Files group `g` under bucket `b` (at the list's tail), or nowhere for [`NO_BUCKET`]. A
    /// group in the extension LRU stays there and is filed when it leaves.
    pub(super) fn file_group(&mut self, g: u32, b: u8) {
        self.group_bucket[g as usize] = b;
        if self.groups.list_of[g as usize] == LRU {
            return;
        }
        if b == NO_BUCKET {
            self.groups.unlink(g);
        } else if self.groups.list_of[g as usize] != b {
            self.groups.push_back(b, g);
        }
    }

    /// Files page `p` under bucket `b`, or nowhere.
    pub(super) fn file_page(&mut self, p: u32, b: u8) {
        if b == NO_BUCKET {
            self.pages.unlink(p);
        } else if self.pages.list_of[p as usize] != b {
            self.pages.push_back(b, p);
        }
    }

    /// A fragment of group `g` was extended: `g` becomes the most recent entry of the
    /// extension LRU list, out of reach of the buddy allocators. When the list exceeds its
    /// capacity, its least recently extended group returns to the tail of its buddy list.
    pub(super) fn touch(&mut self, g: u32) {
        if self.lru_capacity == 0 {
            return;
        }
        self.groups.push_back(LRU, g);
        if self.groups.len[LRU as usize] > self.lru_capacity
            && let Some(old) = self.groups.front(LRU)
        {
            self.groups.unlink(old);
            let b = self.group_bucket[old as usize];
            if b != NO_BUCKET {
                self.groups.push_back(b, old);
            }
        }
    }

    /// Groups in the extension LRU list, least recently extended first.
    pub(super) fn lru(&self) -> Vec<u32> {
        self.groups.iter(LRU).collect()
    }

    /// The first group of the highest non-empty buddy list, moved to that list's tail (NMRU).
    pub(super) fn pick_group_highest(&mut self) -> Option<u32> {
        let b = (0..GROUP_BUCKETS)
            .rev()
            .find(|&b| self.groups.len[b as usize] > 0)?;
        let g = self.groups.front(b)?;
        self.groups.push_back(b, g);
        Some(g)
    }

    /// The first group of the lowest non-empty buddy list at or above `min`, moved to that
    /// list's tail (NMRU), with the list's bucket.
    pub(super) fn pick_group_lowest(&mut self, min: u8) -> Option<(u32, u8)> {
        let b = (min..GROUP_BUCKETS).find(|&b| self.groups.len[b as usize] > 0)?;
        let g = self.groups.front(b)?;
        self.groups.push_back(b, g);
        Some((g, b))
    }

    /// The first split page of the highest non-empty page list of a class (small pages or
    /// fragment pages), moved to its tail.
    pub(super) fn pick_page_highest(&mut self, fragment: bool) -> Option<u32> {
        let off = if fragment { FRAGMENT_PAGES } else { 0 };
        let b = (off..off + FRAGMENT_PAGES)
            .rev()
            .find(|&b| self.pages.len[b as usize] > 0)?;
        let p = self.pages.front(b)?;
        self.pages.push_back(b, p);
        Some(p)
    }

    /// The first small page of the lowest non-empty page list at or above bucket `min`, moved
    /// to its tail, with the list's bucket.
    pub(super) fn pick_page_lowest(&mut self, min: u8) -> Option<(u32, u8)> {
        let b = (min..FRAGMENT_PAGES).find(|&b| self.pages.len[b as usize] > 0)?;
        let p = self.pages.front(b)?;
        self.pages.push_back(b, p);
        Some((p, b))
    }

    /// Where group `g` is filed: its bucket (also while in the LRU list) and whether it sits
    /// in the LRU list.
    pub(super) fn group_filing(&self, g: u32) -> (u8, bool) {
        (
            self.group_bucket[g as usize],
            self.groups.list_of[g as usize] == LRU,
        )
    }

    /// Where page `p` is filed.
    pub(super) fn page_filing(&self, p: u32) -> u8 {
        self.pages.list_of[p as usize]
    }

    /// Number of groups in the LRU list.
    pub(super) fn lru_len(&self) -> usize {
        self.groups.len[LRU as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_keep_order_and_nmru_moves_picks_to_the_tail() {
        let mut ix = Index::new(4, 8, 2);
        for g in 0..4 {
            ix.file_group(g, 10);
        }
        assert_eq!(ix.pick_group_highest(), Some(0));
        assert_eq!(ix.pick_group_highest(), Some(1));
        ix.file_group(2, 3);
        assert_eq!(ix.pick_group_lowest(0), Some((2, 3)));
        assert_eq!(ix.pick_group_lowest(4), Some((3, 10)));
        // LRU: touched groups leave the buddy lists; the oldest returns when it overflows.
        ix.touch(3);
        ix.touch(0);
        assert_eq!(ix.lru(), vec![3, 0]);
        assert_eq!(ix.pick_group_highest(), Some(1));
        ix.touch(1);
        assert_eq!(ix.lru(), vec![0, 1]);
        assert_eq!(ix.group_filing(3), (10, false));
        ix.file_group(0, 5);
        assert_eq!(ix.group_filing(0), (5, true));
        ix.file_group(3, NO_BUCKET);
        assert_eq!(ix.pick_group_lowest(0), Some((2, 3)));
        assert_eq!(ix.pick_group_lowest(4), None);
        ix.file_page(7, 2);
        ix.file_page(5, 9);
        assert_eq!(ix.pick_page_highest(false), Some(5));
        assert_eq!(ix.pick_page_highest(true), None);
        assert_eq!(ix.pick_page_lowest(0), Some((7, 2)));
        ix.file_page(5, NO_BUCKET);
        assert_eq!(ix.page_filing(5), NO_BUCKET);
        assert_eq!(ix.lru_len(), 2);
    }
}
