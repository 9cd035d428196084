//! Replaying the log: entries in commit order from a position to the tail.

use std::collections::VecDeque;
use std::fmt;

use super::chain::Walk;
use super::entry::Entry;
use super::epoch::Guard;
use super::format::slot_off;
use super::{Log, Position};
use crate::error::Result;
use crate::pm::Media;
use crate::traits::BlockAllocator;

/// An iterator over committed entries, in commit order, from a position up to the tail it
/// finds (a prefix of the log: it stops at the first empty slot and does not wait for more).
///
/// It reads one block's worth of slots at a time, makes them durable if nobody has yet (see
/// the [module docs](super#persistence-and-ordering-madfs-46)), then yields them. It keeps the
/// calling thread pinned while it lives, which holds back reclamation of compacted blocks:
/// drop it when done. After an error it yields nothing more.
pub struct Replay<'a, M: Media, A: BlockAllocator + ?Sized> {
    log: &'a Log<M, A>,
    _guard: Guard<'a>,
    era: u64,
    walk: Walk,
    batch: VecDeque<(Position, Entry)>,
    done: bool,
}

impl<M: Media, A: BlockAllocator + ?Sized> fmt::Debug for Replay<'_, M, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("position", &self.position())
            .field("buffered", &self.batch.len())
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<M: Media, A: BlockAllocator + ?Sized> Log<M, A> {
    /// Replays the whole log from its head.
    pub fn iter(&self) -> Result<Replay<'_, M, A>> {
        let (guard, era) = self.pin();
        let walk = self.walk_from_head()?;
        Ok(self.replay(guard, era, walk))
    }

    /// Replays from `pos` (included if it holds an entry).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a position that is no
    /// longer [current](Log::is_current).
    pub fn iter_from(&self, pos: Position) -> Result<Replay<'_, M, A>> {
        let (guard, era) = self.pin();
        let walk = self.walk_from(pos)?;
        Ok(self.replay(guard, era, walk))
    }

    pub(super) fn replay<'a>(&'a self, guard: Guard<'a>, era: u64, walk: Walk) -> Replay<'a, M, A> {
        Replay {
            log: self,
            _guard: guard,
            era,
            walk,
            batch: VecDeque::new(),
            done: false,
        }
    }
}

impl<M: Media, A: BlockAllocator + ?Sized> Replay<'_, M, A> {
    /// Where the replay stands: the next slot it would read; once exhausted, the tail it found.
    pub fn position(&self) -> Position {
        match self.batch.front() {
            Some((p, _)) => *p,
            None => self.log.position(&self.walk, self.era),
        }
    }

    /// Reads the rest of the current block (moving into the next one first if the current is
    /// exhausted), persists it, and buffers its entries.
    fn fill(&mut self) -> Result<()> {
        let chain = self.log.chain();
        if self.walk.at_end() && !self.walk.step(&chain)? {
            self.done = true;
            return Ok(());
        }
        let (log, era, batch) = (self.log, self.era, &mut self.batch);
        let found_tail = chain.scan(&mut self.walk, |w, s| {
            let at = slot_off(w.block, w.slot);
            batch.push_back((log.position(w, era), chain.entry(s, at)?));
            Ok(())
        })?;
        let end = self.walk.slot;
        self.log.make_durable(&mut self.walk, end)?;
        if found_tail {
            self.done = true;
        }
        Ok(())
    }
}

impl<M: Media, A: BlockAllocator + ?Sized> Iterator for Replay<'_, M, A> {
    type Item = Result<(Position, Entry)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(x) = self.batch.pop_front() {
                return Some(Ok(x));
            }
            if self.done {
                return None;
            }
            if let Err(e) = self.fill() {
                self.done = true;
                self.batch.clear();
                return Some(Err(e));
            }
        }
    }
}
