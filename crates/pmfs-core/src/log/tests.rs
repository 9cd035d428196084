//! Unit tests of the log on a heap region.

use std::sync::Arc;

use super::format::{
    ENTRIES_PER_BLOCK, FIRST_SLOT, HeadWord, MAX_MAP_PINS, SLOTS_PER_BLOCK, slot_off,
};
use super::*;
use crate::layout::BLOCK_SIZE;
use crate::pm::HeapRegion;
use crate::traits::{Run, Runs, SimpleAllocator};

const BLOCKS: u64 = 1024;
const ROOT: PmOff = PmOff(64);

fn setup() -> (Arc<HeapRegion>, Arc<SimpleAllocator>) {
    let r = Arc::new(HeapRegion::new(BLOCKS * BLOCK_SIZE).unwrap());
    let a = Arc::new(SimpleAllocator::new(BlockNo(1), BLOCKS - 1));
    (r, a)
}

type TestLog = Log<Arc<HeapRegion>, SimpleAllocator>;

fn inline(i: u64) -> Entry {
    Entry::write(i % 1000, BlockNo(100 + i % 500), 1 + i % 3, 0)
}

fn extended(i: u64) -> Entry {
    Entry::write(i, BlockNo(7), 2, i * BLOCK_SIZE + 17)
}

fn replay(log: &TestLog) -> Vec<Entry> {
    log.iter().unwrap().map(|r| r.unwrap().1).collect()
}

#[test]
fn appends_replay_in_order_across_blocks() {
    let (r, a) = setup();
    let log = TestLog::create(r.clone(), ROOT, a.clone()).unwrap();
    let n = 2 * ENTRIES_PER_BLOCK + 10;
    let mut want = Vec::new();
    let mut last = None;
    for i in 0..n {
        let e = if i % 7 == 0 { extended(i) } else { inline(i) };
        let p = log.append(&e).unwrap();
        assert!(last.is_none_or(|l| p > l), "positions grow");
        last = Some(p);
        want.push(e);
    }
    assert_eq!(replay(&log), want);
    let tail = log.tail().unwrap();
    assert!(tail > last.unwrap());
    // A second handle (another process) sees the same log and pins it.
    let other = TestLog::open(r.clone(), ROOT, a.clone()).unwrap();
    assert_eq!(HeadWord(r.load_u64(ROOT).unwrap()).pins(), 2);
    assert_eq!(replay(&other), want);
    other.close().unwrap();
    assert_eq!(HeadWord(r.load_u64(ROOT).unwrap()).pins(), 1);
    drop(log);
    assert_eq!(HeadWord(r.load_u64(ROOT).unwrap()).pins(), 0);
    let mut owned = Vec::new();
    owned_blocks(&*r, ROOT, &mut |b| owned.push(b)).unwrap();
    assert!(owned.len() >= 3);
    assert_eq!(
        a.free_blocks() + owned.len() as u64,
        BLOCKS - 1,
        "every allocated block is owned by the log"
    );
}

#[test]
fn multi_segment_entries_round_trip() {
    let (r, a) = setup();
    let log = TestLog::create(r.clone(), ROOT, a).unwrap();
    log.append(&inline(1)).unwrap();
    let runs: Runs = (0..700)
        .map(|i| Run {
            lblk: i * 3,
            pblk: BlockNo(10 + i),
            len: 1 + i % 5,
        })
        .collect();
    let big = Entry::Write {
        runs,
        extend_to: 1 << 40,
    };
    let p = log.prepare(&big).unwrap();
    assert!(!p.is_inline());
    p.commit().unwrap();
    log.append(&Entry::Punch { lblk: 5, len: 6 }).unwrap();
    log.append(&Entry::Truncate { size: 99 }).unwrap();
    let got = replay(&log);
    assert_eq!(got.len(), 4);
    assert_eq!(got[1], big);
    assert_eq!(got[3], Entry::Truncate { size: 99 });
}

#[test]
fn try_commit_reports_a_moved_tail_and_retries() {
    let (r, a) = setup();
    let log = TestLog::create(r, ROOT, a).unwrap();
    log.append(&inline(0)).unwrap();
    let since = log.tail().unwrap();
    let mine = log.prepare(&extended(5)).unwrap();
    // Another writer commits first.
    log.append(&inline(1)).unwrap();
    let Commit::Moved { prepared, tail } = mine.try_commit(since).unwrap() else {
        panic!("the tail moved")
    };
    let winners: Vec<Entry> = log
        .iter_from(since)
        .unwrap()
        .map(|r| r.unwrap())
        .take_while(|(p, _)| *p < tail)
        .map(|(_, e)| e)
        .collect();
    assert_eq!(winners, vec![inline(1)]);
    let Commit::Done(at) = prepared.try_commit(tail).unwrap() else {
        panic!("nothing moved since")
    };
    assert_eq!(at, tail);
    let mut won = Vec::new();
    log.append_since(&inline(2), since, &mut won).unwrap();
    assert_eq!(
        won.into_iter().map(|(_, e)| e).collect::<Vec<_>>(),
        vec![inline(1), extended(5)]
    );
    assert_eq!(
        replay(&log),
        vec![inline(0), inline(1), extended(5), inline(2)]
    );
}

#[test]
fn compaction_keeps_the_suffix_and_reclaims_old_blocks() {
    let (r, a) = setup();
    let log = TestLog::create(r.clone(), ROOT, a.clone()).unwrap();
    for i in 0..3 * ENTRIES_PER_BLOCK + 5 {
        let e = if i % 5 == 0 { extended(i) } else { inline(i) };
        log.append(&e).unwrap();
    }
    let early = log.start().unwrap();
    let point = log.compaction_point().unwrap().unwrap();
    assert_eq!(point.lsn() % ENTRIES_PER_BLOCK, 0);
    let blocks_before = point.lsn() / ENTRIES_PER_BLOCK;
    assert!(blocks_before >= 3);
    let all: Vec<(Position, Entry)> = log.iter().unwrap().map(|r| r.unwrap()).collect();
    let cut = all.iter().position(|(p, _)| *p >= point).unwrap();
    let (before, after): (Vec<Entry>, Vec<Entry>) = (
        all[..cut].iter().map(|(_, e)| e.clone()).collect(),
        all[cut..].iter().map(|(_, e)| e.clone()).collect(),
    );
    let live: Vec<Entry> = before
        .iter()
        .filter(|e| e.inline_word().is_none())
        .take(20)
        .cloned()
        .collect();
    let free_before = a.free_blocks();
    let c = log.compact(point, &live).unwrap();
    assert_eq!(
        c,
        Compaction::Compacted {
            written: 1,
            retired: blocks_before
        }
    );
    // One block written, the old ones freed at once: nobody else is pinned or open.
    assert_eq!(a.free_blocks(), free_before + blocks_before - 1);
    let mut want = live.clone();
    want.extend_from_slice(&after);
    assert_eq!(replay(&log), want);
    // A position in a reclaimed block is refused; one in the suffix is still good.
    assert!(!log.is_current(early));
    assert!(log.iter_from(early).is_err());
    assert!(log.is_current(point));
    let tail_entries: Vec<Entry> = log
        .iter_from(point)
        .unwrap()
        .map(|r| r.unwrap().1)
        .collect();
    assert_eq!(tail_entries, after);
    // Appends go on; a second compaction point is the same block: nothing to do.
    log.append(&inline(9)).unwrap();
    let p2 = log.compaction_point().unwrap().unwrap();
    assert_eq!(p2, point);
    assert_eq!(log.compact(p2, &live).unwrap(), Compaction::NotSmaller);
    // Recovery of a cleanly closed, compacted log changes nothing.
    drop(log);
    let rec = recover(&*r, ROOT).unwrap();
    assert_eq!(rec.discarded, 0);
    assert_eq!(rec.entries, want.len() as u64 + 1);
}

#[test]
fn another_open_handle_defers_reclamation_until_it_closes() {
    let (r, a) = setup();
    let log = TestLog::create(r.clone(), ROOT, a.clone()).unwrap();
    for i in 0..2 * ENTRIES_PER_BLOCK + 1 {
        log.append(&inline(i)).unwrap();
    }
    let other = TestLog::open(r.clone(), ROOT, a.clone()).unwrap();
    let old_start = other.start().unwrap();
    let point = log.compaction_point().unwrap().unwrap();
    let free_before = a.free_blocks();
    assert!(matches!(
        log.compact(point, &[inline(1)]).unwrap(),
        Compaction::Compacted { retired: 2, .. }
    ));
    assert_eq!(a.free_blocks(), free_before - 1, "nothing freed yet");
    // The other handle still reads the old chain from its old position, into the suffix.
    assert!(other.is_current(old_start));
    assert_eq!(
        other.iter_from(old_start).unwrap().count() as u64,
        2 * ENTRIES_PER_BLOCK + 1
    );
    other.close().unwrap();
    assert_eq!(log.reclaim().unwrap(), 2);
    assert_eq!(a.free_blocks(), free_before + 1);
}

/// The allocator of one log alone: reports the blocks it handed out, as HashFS's per-file
/// log-block allocator does.
#[derive(Debug)]
struct OneLog {
    inner: SimpleAllocator,
    out: std::sync::Mutex<std::collections::BTreeSet<BlockNo>>,
}

impl OneLog {
    fn new() -> OneLog {
        OneLog {
            inner: SimpleAllocator::new(BlockNo(1), BLOCKS - 1),
            out: Default::default(),
        }
    }
}

impl BlockAllocator for OneLog {
    fn alloc(&self, want: u64, hint: AllocHint) -> Result<Extent> {
        let e = self.inner.alloc(want, hint)?;
        let mut out = self.out.lock().unwrap();
        out.extend((0..e.len).map(|k| e.start + k));
        Ok(e)
    }
    fn free(&self, ext: Extent) -> Result<()> {
        self.inner.free(ext)?;
        let mut out = self.out.lock().unwrap();
        for k in 0..ext.len {
            out.remove(&(ext.start + k));
        }
        Ok(())
    }
    fn free_blocks(&self) -> u64 {
        self.inner.free_blocks()
    }
    fn total_blocks(&self) -> u64 {
        self.inner.total_blocks()
    }
    fn rebuild(&self, used: &mut dyn Iterator<Item = Extent>) -> Result<()> {
        self.inner.rebuild(used)
    }
    fn outstanding(&self) -> Result<Option<Vec<BlockNo>>> {
        Ok(Some(self.out.lock().unwrap().iter().copied().collect()))
    }
}

#[test]
fn blocks_retired_beside_another_handle_are_swept_once_a_handle_is_alone() {
    type OneLogLog = Log<Arc<HeapRegion>, OneLog>;
    let r = Arc::new(HeapRegion::new(BLOCKS * BLOCK_SIZE).unwrap());
    let a = Arc::new(OneLog::new());
    let head = || HeadWord(r.load_u64(ROOT).unwrap());
    let owned = || {
        let mut v = Vec::new();
        owned_blocks(&*r, ROOT, &mut |b| v.push(b)).unwrap();
        v.sort();
        v
    };
    let log = OneLogLog::create(r.clone(), ROOT, a.clone()).unwrap();
    for i in 0..3 * ENTRIES_PER_BLOCK + 1 {
        log.append(&if i % 9 == 0 { extended(i) } else { inline(i) })
            .unwrap();
    }
    let other = OneLogLog::open(r.clone(), ROOT, a.clone()).unwrap();
    let point = log.compaction_point().unwrap().unwrap();
    let suffix: Vec<Entry> = log
        .iter_from(point)
        .unwrap()
        .map(|r| r.unwrap().1)
        .collect();
    let live = vec![extended(1), inline(2)];
    let Compaction::Compacted { retired, .. } = log.compact(point, &live).unwrap() else {
        panic!("nothing compacted");
    };
    assert!(retired >= 3);
    // The compacting handle cannot free what the other may be reading, and leaves it.
    log.close().unwrap();
    assert!(head().orphans());
    let left = a.outstanding().unwrap().unwrap().len() - owned().len();
    assert_eq!(left as u64, retired);
    // While a third handle is open too, the other is not alone: nothing is swept.
    let third = OneLogLog::open(r.clone(), ROOT, a.clone()).unwrap();
    assert_eq!(other.reclaim().unwrap(), 0);
    assert_eq!(third.reclaim().unwrap(), 0);
    third.close().unwrap();
    assert!(head().orphans());
    // Alone, it sweeps them and clears the flag; the log reads the same.
    assert_eq!(other.reclaim().unwrap(), retired);
    assert!(!head().orphans() && !head().sweeping());
    assert_eq!(a.outstanding().unwrap().unwrap(), owned());
    let mut want = live.clone();
    want.extend(suffix);
    assert_eq!(
        other
            .iter()
            .unwrap()
            .map(|r| r.unwrap().1)
            .collect::<Vec<_>>(),
        want
    );
    other.append(&inline(7)).unwrap();
    other.close().unwrap();
    assert_eq!(head().pins(), 0);
    assert_eq!(a.outstanding().unwrap().unwrap(), owned());
}

#[test]
fn mapping_pins_keep_the_log_but_not_its_retired_blocks() {
    let (r, a) = setup();
    let head = || HeadWord(r.load_u64(ROOT).unwrap());
    let log = TestLog::create(r.clone(), ROOT, a.clone()).unwrap();
    let fill = |n| {
        for i in 0..n {
            log.append(&inline(i)).unwrap();
        }
    };
    let compact = || {
        let point = log.compaction_point().unwrap().unwrap();
        log.compact(point, &[]).unwrap()
    };
    fill(2 * ENTRIES_PER_BLOCK + 1);
    assert_eq!(pin_mapping(&*r, ROOT).unwrap(), MapPinned::Apart);
    assert_eq!(
        (head().opens(), head().map_pins(), head().pins()),
        (1, 1, 2)
    );
    // The mapping reads no log block: the handle is alone and frees at once.
    let free = a.free_blocks();
    assert!(matches!(
        compact(),
        Compaction::Compacted { retired: 2, .. }
    ));
    assert_eq!(a.free_blocks(), free + 2);
    // A full field counts the next mapping as an open handle, which holds reclamation back.
    for _ in 1..MAX_MAP_PINS {
        assert_eq!(pin_mapping(&*r, ROOT).unwrap(), MapPinned::Apart);
    }
    assert_eq!(pin_mapping(&*r, ROOT).unwrap(), MapPinned::AsOpen);
    assert_eq!((head().opens(), head().map_pins()), (2, MAX_MAP_PINS));
    fill(2 * ENTRIES_PER_BLOCK);
    let free = a.free_blocks();
    assert!(matches!(
        compact(),
        Compaction::Compacted { retired: 2, .. }
    ));
    assert_eq!(a.free_blocks(), free);
    unpin_mapping(&*r, ROOT, MapPinned::AsOpen).unwrap();
    assert_eq!(log.reclaim().unwrap(), 2);
    for _ in 0..MAX_MAP_PINS {
        unpin_mapping(&*r, ROOT, MapPinned::Apart).unwrap();
    }
    assert_eq!((head().opens(), head().map_pins()), (1, 0));
    drop(log);
    assert_eq!(head().pins(), 0);
}

#[test]
fn a_live_replay_holds_back_reclamation() {
    let (r, a) = setup();
    let log = TestLog::create(r, ROOT, a).unwrap();
    for i in 0..2 * ENTRIES_PER_BLOCK + 1 {
        log.append(&inline(i)).unwrap();
    }
    let mut it = log.iter().unwrap();
    assert_eq!(it.next().unwrap().unwrap().1, inline(0));
    let point = log.compaction_point().unwrap().unwrap();
    assert!(matches!(
        log.compact(point, &[]).unwrap(),
        Compaction::Compacted { .. }
    ));
    assert_eq!(
        log.reclaim().unwrap(),
        0,
        "the replay may still be in old blocks"
    );
    // It goes on through the old chain into the shared suffix.
    assert_eq!(it.by_ref().count() as u64, 2 * ENTRIES_PER_BLOCK);
    drop(it);
    assert_eq!(log.reclaim().unwrap(), 2);
    assert_eq!(replay(&log), vec![inline(2 * ENTRIES_PER_BLOCK)]);
}

#[test]
fn recovery_zeroes_words_beyond_a_hole() {
    let (r, a) = setup();
    let log = TestLog::create(r.clone(), ROOT, a).unwrap();
    for i in 0..3 {
        log.append(&inline(i)).unwrap();
    }
    let tail = log.tail().unwrap();
    drop(log);
    // What a crash can leave: a later line written back while the tail slot was not.
    let stray = slot_off(tail.block(), tail.slot() + 9);
    r.store_u64(stray, inline(7).inline_word().unwrap())
        .unwrap();
    let rec = recover(&*r, ROOT).unwrap();
    assert_eq!(rec.discarded, 1);
    assert_eq!(rec.entries, 3);
    assert_eq!(r.load_u64(stray).unwrap(), 0);
}

#[test]
fn damaged_slots_and_segments_are_corrupt_not_panics() {
    let (r, a) = setup();
    let log = TestLog::create(r.clone(), ROOT, a.clone()).unwrap();
    log.append(&extended(3)).unwrap();
    let head = log.start().unwrap().block();
    drop(log);
    // The segment header sits right after the RESERVE word in the first slot.
    let seg = slot_off(head, FIRST_SLOT + 1 + 3);
    let w = r.load_u64(seg).unwrap();
    r.store_u64(seg, w ^ 1).unwrap();
    assert!(matches!(recover(&*r, ROOT), Err(Error::Corrupt { .. })));
    r.store_u64(seg, w).unwrap();
    recover(&*r, ROOT).unwrap();
    // A control word without the reservation constant.
    let log = TestLog::open(r.clone(), ROOT, a).unwrap();
    let t = log.tail().unwrap();
    r.store_u64(slot_off(t.block(), t.slot()), 3).unwrap();
    assert!(matches!(
        log.iter().unwrap().last().unwrap(),
        Err(Error::Corrupt { .. })
    ));
    assert!(log.append(&inline(1)).is_err());
}

#[test]
fn misuse_is_rejected() {
    let (r, a) = setup();
    assert!(matches!(
        TestLog::open(r.clone(), ROOT, a.clone()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        TestLog::create(r.clone(), PmOff(3), a.clone()),
        Err(Error::Unaligned(_))
    ));
    let log = TestLog::create(r.clone(), ROOT, a.clone()).unwrap();
    assert!(matches!(
        TestLog::create(r.clone(), ROOT, a.clone()),
        Err(Error::InvalidArgument(_))
    ));
    let outside = Entry::write(0, BlockNo(BLOCKS - 1), 2, 0);
    assert!(matches!(
        log.append(&outside),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        log.append(&Entry::Punch { lblk: 1, len: 0 }),
        Err(Error::InvalidArgument(_))
    ));
    let start = log.start().unwrap();
    assert_eq!(start.slot(), FIRST_SLOT);
    assert_eq!(log.compaction_point().unwrap(), None);
    let mid = Position {
        slot: FIRST_SLOT + 1,
        ..start
    };
    assert!(log.compact(mid, &[]).is_err());
    let beyond = Position {
        slot: SLOTS_PER_BLOCK + 1,
        ..start
    };
    assert!(log.iter_from(beyond).is_err());
}

/// A log compacted once, holding a block: a truncate record is reserved in the second block
/// (exactly its span, RESERVE, 3 header and 2 payload words, is left there) and committed into
/// a third, so the compaction up to it frees the first block and holds the second, which
/// still holds the record's segment. Returns the log and the record.
fn compacted_holding_a_block(r: &Arc<HeapRegion>, a: &Arc<SimpleAllocator>) -> (TestLog, Entry) {
    let log = TestLog::create(r.clone(), ROOT, a.clone()).unwrap();
    for i in 0..2 * ENTRIES_PER_BLOCK - 6 {
        log.append(&inline(i)).unwrap();
    }
    let e = Entry::Truncate { size: 5 };
    let p = log.prepare(&e).unwrap();
    let at = p.commit().unwrap();
    assert_eq!(at.lsn(), 2 * ENTRIES_PER_BLOCK);
    let point = log.compaction_point().unwrap().unwrap();
    assert_eq!(point, at);
    let free = a.free_blocks();
    assert!(matches!(
        log.compact(point, &[inline(1)]).unwrap(),
        Compaction::Compacted { retired: 2, .. }
    ));
    assert_eq!(a.free_blocks(), free);
    (log, e)
}

/// Compacts `log` past the record that kept a block held, and closes it: the held block goes,
/// once, and the allocator's free blocks and the log's own make up the region again.
fn compact_past_the_referrer(log: TestLog, r: &Arc<HeapRegion>, a: &Arc<SimpleAllocator>) {
    for i in 0..2 * ENTRIES_PER_BLOCK {
        log.append(&inline(i)).unwrap();
    }
    let point = log.compaction_point().unwrap().unwrap();
    assert!(matches!(
        log.compact(point, &[inline(2)]).unwrap(),
        Compaction::Compacted { .. }
    ));
    log.close().unwrap();
    let mut owned = 0;
    owned_blocks(&**r, ROOT, &mut |_| owned += 1).unwrap();
    assert_eq!(a.free_blocks() + owned, BLOCKS - 1);
}

#[test]
fn a_held_segment_block_is_freed_once_its_referrer_is_compacted() {
    let (r, a) = setup();
    let (log, e) = compacted_holding_a_block(&r, &a);
    assert_eq!(replay(&log), vec![inline(1), e]);
    compact_past_the_referrer(log, &r, &a);
}

/// A handle that closes holding only a block whose segment a live entry still uses leaves no
/// orphans (a sweep reads the allocator's whole account: on HashFS, a scan of the table): the
/// compaction that drops the entry, in a later handle, frees the block.
#[test]
fn a_close_holding_only_a_used_segment_block_orphans_nothing() {
    let (r, a) = setup();
    let (log, _) = compacted_holding_a_block(&r, &a);
    log.close().unwrap();
    assert!(!HeadWord(r.load_u64(ROOT).unwrap()).orphans());
    let log = TestLog::open(r.clone(), ROOT, a.clone()).unwrap();
    compact_past_the_referrer(log, &r, &a);
}

#[test]
fn this_process_knows_the_pins_it_holds() {
    // An offset no other test of this process uses: the count is per process.
    const MINE: PmOff = PmOff(200);
    let (r, a) = setup();
    assert_eq!(pins_here(MINE), 0);
    let log = TestLog::create(r.clone(), MINE, a.clone()).unwrap();
    assert_eq!(pins_here(MINE), 1);
    let other = TestLog::open(r.clone(), MINE, a.clone()).unwrap();
    assert_eq!(pins_here(MINE), 2);
    log.close().unwrap();
    assert_eq!(pins_here(MINE), 1);
    let how = pin_mapping(&*r, MINE).unwrap();
    assert_eq!(pins_here(MINE), 2);
    drop(other);
    assert_eq!(pins_here(MINE), 1);
    unpin_mapping(&*r, MINE, how).unwrap();
    assert_eq!(pins_here(MINE), 0);
    // Creating a log over it fails and counts nothing.
    assert!(TestLog::create(r.clone(), MINE, a.clone()).is_err());
    assert_eq!(pins_here(MINE), 0);
    assert_eq!(HeadWord(r.load_u64(MINE).unwrap()).pins(), 0);
}
