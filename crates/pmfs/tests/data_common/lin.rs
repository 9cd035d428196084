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

/// A maximal run of 8-byte words `[from, to)` (word indexes in the file) holding one tag.
#[derive(Clone, Copy, Debug)]
struct Seg {
    from: u64,
    to: u64,
    tag: u64,
}

fn segments(words: &[u64], first: u64) -> Vec<Seg> {
    let mut out: Vec<Seg> = Vec::new();
    for (i, &t) in words.iter().enumerate() {
        let at = first + i as u64;
        match out.last_mut() {
            Some(s) if s.tag == t && s.to == at => s.to = at + 1,
            _ => out.push(Seg {
                from: at,
                to: at + 1,
                tag: t,
            }),
        }
    }
    out
}

/// Whether `[a, b)` and `[c, d)` overlap.
fn overlap(a: u64, b: u64, c: u64, d: u64) -> bool {
    a < d && c < b
}

/// The 8-byte words of `buf`, read at byte offset `8 * first`.
pub fn words_of(buf: &[u8]) -> Vec<u64> {
    buf.chunks(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

/// [`check_read`] at the granularity of 8-byte words, for writes of any 8-byte-aligned
/// range (`Rec::first`/`len` count words): every word holds the tag of a started write that
/// covers it; no word shows a write that a write of it, returned before the read started,
/// followed; a write seen in some word is seen in all its words of the read except where a
/// later write that does not cover the first word shows.
pub fn check_words(
    words: &[u64],
    first: u64,
    rstart: u64,
    rend: u64,
    writes: &HashMap<u64, Rec>,
) -> Result<(), String> {
    let segs = segments(words, first);
    for s in &segs {
        let w = writes.get(&s.tag).ok_or_else(|| {
            format!(
                "words {}..{} hold {:#x}, which no write wrote",
                s.from, s.to, s.tag
            )
        })?;
        let (w0, w1) = (w.first, w.first + w.len);
        if s.from < w0 || s.to > w1 {
            return Err(format!(
                "words {}..{} hold {:#x}, a write of {w0}..{w1}",
                s.from, s.to, s.tag
            ));
        }
        if w.start > rend {
            return Err(format!(
                "words {}..{} hold {:#x}, which started after the read",
                s.from, s.to, s.tag
            ));
        }
        if let Some((ft, f)) = writes.iter().find(|(_, f)| {
            overlap(f.first, f.first + f.len, s.from, s.to) && f.end < rstart && f.start > w.end
        }) {
            return Err(format!(
                "words {}..{} hold {:#x} {w:?}, undone by {ft:#x} {f:?} before the read",
                s.from, s.to, s.tag
            ));
        }
        for o in &segs {
            if o.tag == s.tag || !overlap(o.from, o.to, w0, w1) {
                continue;
            }
            let v = &writes[&o.tag];
            if overlap(v.first, v.first + v.len, s.from, s.to) || v.end < w.start {
                return Err(format!(
                    "write {:#x} {w:?} is seen in words {}..{} but words {}..{} hold {:#x} {v:?}",
                    s.tag, s.from, s.to, o.from, o.to, o.tag
                ));
            }
        }
    }
    Ok(())
}

/// [`check_final`] at the granularity of 8-byte words.
pub fn check_words_final(
    words: &[u64],
    writes: &HashMap<u64, Rec>,
    now: u64,
) -> Result<(), String> {
    check_words(words, 0, now, now, writes)?;
    for s in segments(words, 0) {
        let w = writes[&s.tag];
        if let Some((ft, f)) = writes
            .iter()
            .find(|(_, f)| overlap(f.first, f.first + f.len, s.from, s.to) && f.start > w.end)
        {
            return Err(format!(
                "final words {}..{} hold {:#x} {w:?}, but {ft:#x} {f:?} followed",
                s.from, s.to, s.tag
            ));
        }
    }
    Ok(())
}
