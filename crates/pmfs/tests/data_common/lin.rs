//! Block-granular linearizability checks of concurrent writes and reads: every write
//! writes its tag into every 8-byte word of the whole blocks it covers; a read or a final
//! state is checked against the record of when each write started and returned.

use std::collections::HashMap;

use super::BS;

/// One write: blocks `[first, first + len)` and when it started and returned (`u64::MAX`
/// while running).
#[derive(Clone, Copy, Debug)]
pub struct Rec {
    /// First block.
    pub first: u64,
    /// Blocks.
    pub len: u64,
    /// Clock before the call.
    pub start: u64,
    /// Clock after it returned.
    pub end: u64,
}

impl Rec {
    /// Whether the write covers block `b`.
    pub fn covers(&self, b: u64) -> bool {
        b >= self.first && b < self.first + self.len
    }
}

/// The tag of `writer`'s `seq`th write.
pub fn tag(writer: u64, seq: u64) -> u64 {
    (writer << 32) | seq
}

/// The tag of each block of `buf` (read at block `first`); fails on a torn block.
pub fn tags_of(buf: &[u8], first: u64) -> Result<Vec<u64>, String> {
    buf.chunks(BS as usize)
        .enumerate()
        .map(|(i, blk)| {
            let t = u64::from_le_bytes(blk[..8].try_into().unwrap());
            if blk
                .chunks(8)
                .any(|w| u64::from_le_bytes(w.try_into().unwrap()) != t)
            {
                return Err(format!("block {} is torn", first + i as u64));
            }
            Ok(t)
        })
        .collect()
}

/// Checks a read of blocks `[first, first + tags.len())` that ran from `rstart` to `rend`,
/// against `writes` (taken after the read returned).
pub fn check_read(
    tags: &[u64],
    first: u64,
    rstart: u64,
    rend: u64,
    writes: &HashMap<u64, Rec>,
) -> Result<(), String> {
    for (i, &t) in tags.iter().enumerate() {
        let b = first + i as u64;
        let w = writes
            .get(&t)
            .ok_or_else(|| format!("block {b} holds {t:#x}, which no write wrote"))?;
        if !w.covers(b) {
            return Err(format!(
                "block {b} holds {t:#x}, a write of other blocks {w:?}"
            ));
        }
        if w.start > rend {
            return Err(format!(
                "block {b} holds {t:#x}, which started after the read"
            ));
        }
        // A write of this block that returned before the read started and started after
        // the observed one returned makes the observed value stale.
        if let Some((ft, f)) = writes
            .iter()
            .find(|(_, f)| f.covers(b) && f.end < rstart && f.start > w.end)
        {
            return Err(format!(
                "block {b} holds {t:#x} {w:?}, undone by {ft:#x} {f:?} before the read"
            ));
        }
        // Atomicity across the blocks of one write.
        for (j, &u) in tags.iter().enumerate() {
            let c = first + j as u64;
            if u == t || !w.covers(c) {
                continue;
            }
            let v = &writes[&u];
            if v.covers(b) || v.end < w.start {
                return Err(format!(
                    "write {t:#x} {w:?} is seen in block {b} but block {c} holds {u:#x} {v:?}"
                ));
            }
        }
    }
    Ok(())
}

/// Checks the final state `tags` of the whole file (all writes over): a serial order of the
/// writes, where no write of a block follows, in real time, the one the block shows.
pub fn check_final(tags: &[u64], writes: &HashMap<u64, Rec>, now: u64) -> Result<(), String> {
    check_read(tags, 0, now, now, writes)?;
    for (b, tg) in tags.iter().enumerate() {
        let w = writes[tg];
        if let Some((ft, f)) = writes
            .iter()
            .find(|(_, f)| f.covers(b as u64) && f.start > w.end)
        {
            return Err(format!(
                "final block {b} holds {tg:#x} {w:?}, but {ft:#x} {f:?} followed"
            ));
        }
    }
    Ok(())
}
