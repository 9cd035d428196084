//! [`CrashFailure`]: the first crash image a checker rejected, and its file format for
//! regression tests.

use std::fmt;
use std::io;
use std::path::Path;

use super::explorer::CrashPoint;
use super::line::LINE;
use crate::error::{Error, Result};

/// First line of a saved failure.
const MAGIC: &str = "pmfs-sim-crash 1";

/// The state a crash image gives one line that was not durable at the crash point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineChoice {
    /// Byte offset of the line in the region.
    pub offset: u64,
    /// The state chosen: 0 is the durable content, `latest` the content the program saw.
    pub choice: u32,
    /// Number of states the line could be in.
    pub choices: u32,
    /// Index of the state the program saw.
    pub latest: u32,
}

/// The first crash image the checker rejected in an [`Explorer::run`](super::Explorer::run).
///
/// [`Display`](fmt::Display) shows where it happened, the seed and the checker's message;
/// [`save`](CrashFailure::save) writes it to a file that [`load`](CrashFailure::load) reads
/// back, so that a regression test can [`replay`](CrashFailure::replay) a checker on it.
///
/// # File format (version 1)
///
/// A UTF-8 text file, one record per line, `key value`:
///
/// ```text
/// pmfs-sim-crash 1
/// seed 7
/// fence 2
/// end false
/// index 1
/// sampled false
/// prefixes false
/// message flag set but data missing\nsecond line
/// size 4096
/// choice 0x40 0 2 1
/// line 0x40 0100000000000000...
/// ```
///
/// `message` escapes `\` as `\\`, newline as `\n` and carriage return as `\r`. Each `choice`
/// record is one line that was not durable at the crash point: its offset, the state chosen,
/// the number of states and the index of the latest state (state 0 is the durable content).
/// The image is stored sparsely: `size` bytes of zeroes, then every 64-byte line with a
/// non-zero byte as a `line` record of its offset and its bytes in hex (the last line of a
/// region whose size is not a multiple of 64 is shorter). Files are small as long as the
/// images are mostly zero, which is what crash tests on fresh regions produce.
#[derive(Clone, PartialEq, Eq)]
pub struct CrashFailure {
    /// Index of the fence the crash preceded (the number of fences at the end of the
    /// workload).
    pub fence: u64,
    /// The crash image.
    pub image: Vec<u8>,
    /// The checker's message.
    pub message: String,
    /// The explorer's seed.
    pub seed: u64,
    /// Whether the crash was after the workload returned.
    pub end: bool,
    /// Number of the image at its crash point ([`CrashPoint::index`]).
    pub index: u64,
    /// Whether the images of the point were sampled.
    pub sampled: bool,
    /// Whether per-line store prefixes were explored.
    pub prefixes: bool,
    /// The state of every line that was not durable at the crash point.
    pub lines: Vec<LineChoice>,
}

impl CrashFailure {
    /// The crash point the checker saw.
    pub fn crash_point(&self) -> CrashPoint<'_> {
        CrashPoint {
            fence: self.fence,
            image: &self.image,
            end: self.end,
            index: self.index,
            sampled: self.sampled,
        }
    }

    /// Calls `check` on the saved crash point, as the run did.
    pub fn replay<C>(&self, mut check: C) -> Result<(), String>
    where
        C: FnMut(&CrashPoint<'_>) -> Result<(), String>,
    {
        check(&self.crash_point())
    }

    /// Writes the failure to `path` (see [`CrashFailure`] for the format).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        std::fs::write(path, self.to_text())?;
        Ok(())
    }

    /// Reads a failure written by [`save`](CrashFailure::save).
    ///
    /// A malformed file is an [`Error::Io`] of kind [`io::ErrorKind::InvalidData`] naming the
    /// line at fault.
    pub fn load(path: impl AsRef<Path>) -> Result<CrashFailure> {
        Self::from_text(&std::fs::read_to_string(path)?)
    }

    /// The failure in the saved text format.
    pub fn to_text(&self) -> String {
        use fmt::Write as _;
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(s, "{MAGIC}");
        let _ = writeln!(s, "seed {}", self.seed);
        let _ = writeln!(s, "fence {}", self.fence);
        let _ = writeln!(s, "end {}", self.end);
        let _ = writeln!(s, "index {}", self.index);
        let _ = writeln!(s, "sampled {}", self.sampled);
        let _ = writeln!(s, "prefixes {}", self.prefixes);
        let _ = writeln!(s, "message {}", escape(&self.message));
        let _ = writeln!(s, "size {}", self.image.len());
        for c in &self.lines {
            let _ = writeln!(
                s,
                "choice {:#x} {} {} {}",
                c.offset, c.choice, c.choices, c.latest
            );
        }
        for (i, chunk) in self.image.chunks(LINE).enumerate() {
            if chunk.iter().any(|&b| b != 0) {
                let _ = write!(s, "line {:#x} ", i * LINE);
                for b in chunk {
                    let _ = write!(s, "{b:02x}");
                }
                s.push('\n');
            }
        }
        s
    }

    /// Parses the saved text format.
    pub fn from_text(text: &str) -> Result<CrashFailure> {
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
        match lines.next() {
            Some((_, MAGIC)) => {}
            _ => return Err(bad(1, "not a pmfs-sim-crash 1 file")),
        }
        let mut f = CrashFailure {
            fence: 0,
            image: Vec::new(),
            message: String::new(),
            seed: 0,
            end: false,
            index: 0,
            sampled: false,
            prefixes: false,
            lines: Vec::new(),
        };
        let mut size = None;
        for (n, l) in lines {
            let (key, val) = l.split_once(' ').unwrap_or((l, ""));
            match key {
                "seed" => f.seed = num(n, val)?,
                "fence" => f.fence = num(n, val)?,
                "end" => f.end = flag(n, val)?,
                "index" => f.index = num(n, val)?,
                "sampled" => f.sampled = flag(n, val)?,
                "prefixes" => f.prefixes = flag(n, val)?,
                "message" => f.message = unescape(n, val)?,
                "size" => {
                    let s: usize = num(n, val)?;
                    f.image = vec![0; s];
                    size = Some(s);
                }
                "choice" => {
                    let mut it = val.split(' ');
                    let mut next = || it.next().ok_or_else(|| bad(n, "short choice record"));
                    let c = LineChoice {
                        offset: hex(n, next()?)?,
                        choice: num(n, next()?)?,
                        choices: num(n, next()?)?,
                        latest: num(n, next()?)?,
                    };
                    if c.choice >= c.choices || c.latest >= c.choices {
                        return Err(bad(n, "choice out of range"));
                    }
                    f.lines.push(c);
                }
                "line" => {
                    let size = size.ok_or_else(|| bad(n, "line record before size"))?;
                    let (off, bytes) = val
                        .split_once(' ')
                        .ok_or_else(|| bad(n, "short line record"))?;
                    let off: usize = hex(n, off)?;
                    if !off.is_multiple_of(LINE) || off >= size {
                        return Err(bad(n, "line offset not a line of the image"));
                    }
                    let len = LINE.min(size - off);
                    if bytes.len() != 2 * len {
                        return Err(bad(n, "line record of the wrong length"));
                    }
                    for (i, pair) in bytes.as_bytes().chunks(2).enumerate() {
                        let pair = std::str::from_utf8(pair).map_err(|_| bad(n, "bad hex"))?;
                        f.image[off + i] =
                            u8::from_str_radix(pair, 16).map_err(|_| bad(n, "bad hex"))?;
                    }
                }
                "" => {}
                _ => return Err(bad(n, "unknown record")),
            }
        }
        if size.is_none() {
            return Err(bad(0, "no size record"));
        }
        Ok(f)
    }
}

fn bad(line: usize, what: &str) -> Error {
    Error::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("crash file line {line}: {what}"),
    ))
}

fn num<T: std::str::FromStr>(line: usize, s: &str) -> Result<T> {
    s.parse().map_err(|_| bad(line, "bad number"))
}

fn hex<T: TryFrom<u64>>(line: usize, s: &str) -> Result<T> {
    let digits = s
        .strip_prefix("0x")
        .ok_or_else(|| bad(line, "offset without 0x"))?;
    u64::from_str_radix(digits, 16)
        .ok()
        .and_then(|v| T::try_from(v).ok())
        .ok_or_else(|| bad(line, "bad offset"))
}

fn flag(line: usize, s: &str) -> Result<bool> {
    match s {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(bad(line, "expected true or false")),
    }
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(line: usize, s: &str) -> Result<String> {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(ch) = it.next() {
        if ch != '\\' {
            out.push(ch);
            continue;
        }
        match it.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            _ => return Err(bad(line, "bad escape in message")),
        }
    }
    Ok(out)
}

impl fmt::Display for CrashFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "crash image {} {} (seed {}, {}{}) rejected: {}",
            self.index,
            if self.end {
                format!("at the end, after {} fences", self.fence)
            } else {
                format!("before fence {}", self.fence)
            },
            self.seed,
            if self.sampled {
                "sampled"
            } else {
                "exhaustive"
            },
            if self.prefixes {
                ", store prefixes"
            } else {
                ""
            },
            self.message
        )?;
        let moved: Vec<String> = self
            .lines
            .iter()
            .filter(|c| c.choice != 0)
            .map(|c| {
                if c.choice == c.latest {
                    format!("{:#x}", c.offset)
                } else {
                    format!("{:#x} (state {} of {})", c.offset, c.choice, c.choices)
                }
            })
            .collect();
        write!(
            f,
            "; of {} lines not durable, written back: [{}]",
            self.lines.len(),
            moved.join(", ")
        )
    }
}

impl fmt::Debug for CrashFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nonzero = self
            .image
            .chunks(LINE)
            .filter(|c| c.iter().any(|&b| b != 0))
            .count();
        f.debug_struct("CrashFailure")
            .field("fence", &self.fence)
            .field("end", &self.end)
            .field("index", &self.index)
            .field("seed", &self.seed)
            .field("sampled", &self.sampled)
            .field("prefixes", &self.prefixes)
            .field("message", &self.message)
            .field(
                "image",
                &format_args!("<{} bytes, {nonzero} non-zero lines>", self.image.len()),
            )
            .field("lines", &self.lines)
            .finish()
    }
}

impl std::error::Error for CrashFailure {}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CrashFailure {
        let mut image = vec![0u8; 200];
        image[64] = 1;
        image[199] = 0xff;
        CrashFailure {
            fence: 3,
            image,
            message: "flag set\nbut data \\ missing".into(),
            seed: u64::MAX,
            end: true,
            index: 17,
            sampled: true,
            prefixes: true,
            lines: vec![LineChoice {
                offset: 64,
                choice: 1,
                choices: 3,
                latest: 2,
            }],
        }
    }

    #[test]
    fn text_round_trip_is_exact_and_sparse() {
        let f = sample();
        let t = f.to_text();
        assert_eq!(t.matches("\nline ").count(), 2, "{t}");
        assert_eq!(CrashFailure::from_text(&t).unwrap(), f);
    }

    #[test]
    fn malformed_files_name_the_line() {
        let t = sample().to_text();
        for (from, to) in [
            ("pmfs-sim-crash 1", "pmfs-sim-crash 2"),
            ("fence 3", "fence x"),
            ("end true", "end maybe"),
            ("line 0x40 01", "line 0x41 01"),
            ("choice 0x40 1 3 2", "choice 0x40 3 3 2"),
            ("size 200", "size 100"),
            ("message flag", "message \\q"),
        ] {
            let broken = t.replacen(from, to, 1);
            assert_ne!(broken, t);
            let e = CrashFailure::from_text(&broken).unwrap_err();
            assert!(
                matches!(&e, Error::Io(io) if io.kind() == io::ErrorKind::InvalidData),
                "{from} -> {to}: {e}"
            );
        }
        assert!(CrashFailure::from_text("").is_err());
    }

    #[test]
    fn display_names_point_seed_message_and_lines() {
        let s = sample().to_string();
        for part in [
            "after 3 fences",
            "seed 18446744073709551615",
            "data",
            "0x40",
        ] {
            assert!(s.contains(part), "{s}");
        }
        assert!(format!("{:?}", sample()).contains("200 bytes, 2 non-zero lines"));
    }
}
