//! Which processes map a pool: the liveness test for the words a process takes by CAS and
//! leaves behind when it is killed (a log's digest cursor, a file's tail).
//!
//! Such a word names its holder by process id, and a waiter takes it over once the holder is
//! dead. "The pid runs" alone misjudges a holder killed long ago whose pid the kernel has
//! since handed to an unrelated program: the word would stay taken until the next mount. A
//! holder works on the pool through its mapping, so "the pid runs *and maps the pool file*"
//! is the sharper test, and it never calls a live holder dead: a process that no longer maps
//! the pool cannot store to it.

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;

/// A file as the kernel names it in `/proc/<pid>/maps`: its device and inode numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DevIno {
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub ino: u64,
}

impl DevIno {
    /// The id of the file `meta` describes.
    pub fn of(meta: &Metadata) -> DevIno {
        DevIno {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// Whether process `pid` runs and maps file `id`: `Some(false)` when no such process exists or
/// none of its mappings is of that file, `None` when its mappings cannot be read (a process of
/// another user, without the privilege to inspect it).
pub fn maps_file(pid: u32, id: DevIno) -> Option<bool> {
    match std::fs::read(format!("/proc/{pid}/maps")) {
        Ok(maps) => Some(lists_file(&maps, id)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Some(false),
        // ESRCH: the process exited while the file was read.
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Some(false),
        Err(_) => None,
    }
}

/// Whether a process other than this one whose mappings this process may read maps file
/// `id` (processes it may not read, such as ones that are not dumpable, are passed over; `true`
/// if `/proc` cannot be listed). Reads the mappings of every process in `/proc` (of this PID
/// namespace): a cost for rare events, not for every call.
pub fn mapped_elsewhere(id: DevIno) -> bool {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .any(|pid| maps_file(pid, id) == Some(true))
}

/// Whether process `pid` exists (a zombie counts): the test where its mappings are unknown.
pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The start time of live process `pid` (`/proc/<pid>/stat` field 22, clock ticks after
/// boot): with the pid, it names one process for good, where a pid alone may be reused. `None`
/// if no such process exists or it is a zombie.
pub fn start_time(pid: u32) -> Option<u64> {
    start_of_stat(&std::fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// Field 22 (start time) of the text of a `/proc/<pid>/stat` file, unless field 3 says the
/// process is a zombie or dead. The name (field 2, in parentheses) may hold spaces and
/// parentheses: the fields are counted after its last `)`. Allocates nothing (a library
/// interposed on a program's calls parses with it inside them).
pub fn start_of_stat(stat: &[u8]) -> Option<u64> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let mut fields = stat[close + 1..]
        .split(|&b| b == b' ')
        .filter(|f| !f.is_empty());
    if matches!(fields.next()?, b"Z" | b"X" | b"x") {
        return None;
    }
    let digits = fields.nth(18)?;
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let v = u64::from(char::from(d).to_digit(10)?);
        n.checked_mul(10)?.checked_add(v)
    })
}

/// Whether the text of a `maps` file has a line mapping file `id`. A line reads
/// `start-end perms offset major:minor inode [path]`, the device numbers in hexadecimal.
fn lists_file(maps: &[u8], id: DevIno) -> bool {
    let (major, minor) = (libc::major(id.dev), libc::minor(id.dev));
    maps.split(|&b| b == b'\n').any(|line| {
        let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty()).skip(3);
        let (Some(dev), Some(ino)) = (fields.next(), fields.next()) else {
            return false;
        };
        let Some((maj, min)) = std::str::from_utf8(dev)
            .ok()
            .and_then(|d| d.split_once(':'))
        else {
            return false;
        };
        u32::from_str_radix(maj, 16) == Ok(major)
            && u32::from_str_radix(min, 16) == Ok(minor)
            && std::str::from_utf8(ino).ok().and_then(|i| i.parse().ok()) == Some(id.ino)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pm::{Media, PmRegion};

    #[test]
    fn a_maps_line_is_matched_on_device_and_inode() {
        let id = DevIno {
            dev: libc::makedev(0, 0x1a),
            ino: 4242,
        };
        let maps = b"7f00-7f10 rw-s 00000000 00:1a 4242   /dev/shm/p (deleted)\n\
                     7f10-7f20 r--p 00000000 00:1a 4243   /dev/shm/q\n";
        assert!(lists_file(maps, id));
        assert!(!lists_file(&maps[maps.len() / 2..], id));
        let other_dev = DevIno {
            dev: libc::makedev(0, 0x1b),
            ino: 4242,
        };
        assert!(!lists_file(maps, other_dev));
        assert!(!lists_file(b"7f00-7f10 rw-p 00000000 00:00 0 [heap]\n", id));
        assert!(!lists_file(b"garbage\n\n", id));
    }

    #[test]
    fn stat_lines_give_the_start_time_of_live_processes_only() {
        let line = |state: &str| {
            format!(
                "42 (a (weird) name) {state} 1 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 1 0 \
                 123456 1000 10"
            )
        };
        assert_eq!(start_of_stat(line("S").as_bytes()), Some(123456));
        assert_eq!(start_of_stat(line("Z").as_bytes()), None);
        assert_eq!(start_of_stat(b"garbage"), None);
    }

    #[test]
    fn this_process_has_one_start_time_and_no_process_has_pid_max() {
        let me = std::process::id();
        let t = start_time(me).expect("this process runs");
        assert_eq!(start_time(me), Some(t));
        assert_eq!(start_time(u32::MAX), None);
    }

    #[test]
    fn this_process_maps_its_region_and_a_child_does_not() {
        let path = std::env::temp_dir().join(format!("pmfs-procs-{}.pool", std::process::id()));
        let region = PmRegion::create(&path, crate::pm::MIN_POOL_SIZE).unwrap();
        let id = region.file_id().expect("a pool file has an id");
        assert_eq!(maps_file(std::process::id(), id), Some(true));
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert_eq!(maps_file(child.id(), id), Some(false));
        assert!(exists(child.id()));
        // Other tests of this process map pool files, never this one.
        assert!(!mapped_elsewhere(id));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(maps_file(child.id(), id), Some(false));
        assert!(!exists(child.id()));
        drop(region);
        std::fs::remove_file(&path).unwrap();
    }
}
