//! A C program (`programs/descriptors.c`) drives every interposed call — read/write at offsets,
//! holes and short reads at EOF, vectored I/O, lseek, dup/dup2/dup3/F_DUPFD(_CLOEXEC) sharing
//! offsets, O_APPEND and F_SETFL, ftruncate, fallocate and punch hole, fstat/statx sizes, isatty
//! and TCGETS, ranges ending past the largest offset, fsync, EBADF after close, a fork child and an
//! exec'd image writing through a shared descriptor, a vfork child closing its copy of a
//! descriptor, threads writing at once (at offsets, and with write/read on one shared offset: each
//! record in a range of its own), a shared mapping against read and write, stdio, buffers at bad
//! addresses (`EFAULT`, or a copy up to the bad one), close_range, a pipe, and file calls from a
//! constructor before `main`, and the numbers new descriptors get (the lowest free one: the library
//! keeps its own out of the way) — and prints a transcript. On a pmfs mount the transcript and the
//! files are the same with and without the library, and the same as on a local directory.
//!
//! A second program (`programs/copies.c`) grows and shrinks a file with calls the library
//! serves, then copies it with calls it forwards (copy_file_range, sendfile, splice) and
//! appends to it with one (pwritev2 with `RWF_APPEND`, and on an `O_APPEND` description): the
//! kernel must copy up to the size the file has, not the one it last saw, and append there,
//! also on a mount that caches attributes (`-o attr_timeout=`). A read-only description
//! stays served after a writable `mmap` of it that the kernel refuses: handed to the kernel, it
//! would read the size the kernel cached on such a mount.
//!
//! Another (`programs/inherited.c`) has a fork child, and its fork child, write through
//! descriptors the parent used before the fork (a duplicate among them, one of a file unlinked
//! before it), and a fork child's threads start at once on four duplicates of one: served in
//! userspace there too, with the same results. And `programs/first_calls.c` has four threads
//! make their first calls on files of their own at once, before the process is attached.
//!
//! A third (`programs/limits.c`) sets a file size limit (`RLIMIT_FSIZE`) and writes, appends,
//! truncates and allocates across it, then has an exec'd image inherit it: short writes,
//! `EFBIG` and `SIGXFSZ` as the kernel gives them.
//!
//! And `programs/random_calls.c` makes random sequences of those calls on three files
//! (`PMFS_RANDOM_CALLS` of them, 9000 by default).

mod common;

use common::{runs_agree, runs_agree_on};

#[test]
fn descriptor_calls_give_the_same_results_with_and_without_the_library() {
    let ((_, files), c, m) = runs_agree("descriptors", str::to_owned);
    assert_eq!(files.len(), 4);
    // The program, its exec'd image and the fork child that writes through an inherited
    // descriptor report; the vfork child's counters are the parent's.
    assert_eq!(c.processes, 3, "{c:?}");
    // Opened with open(): f, f again with O_APPEND and once more (duplicated before its first
    // call), threads, records, stream, bad, f at the end; plus the descriptor the exec'd
    // image inherited, classified on its first read.
    // Duplicates are not new files, fopen opens inside libc, out of the library's sight, and
    // the vfork child's close did not reach the parent's table (else the parent would have
    // classified `f` a second time).
    assert_eq!(c.pmfs_fds, 9, "{c:?}");
    assert!(c.pmfs_calls >= 60, "{c:?}");
    // About 1850 calls, and the program's 1000 `isatty` calls: a served file is no terminal.
    assert!(c.served >= 2000, "{c:?}");
    m.unmount_and_fsck();
}

#[test]
fn fork_children_serve_the_descriptors_they_inherit() {
    let ((transcript, files), c, m) = runs_agree("inherited", str::to_owned);
    assert!(!transcript.contains("errno"), "{transcript}");
    assert!(
        transcript.contains("child status                 = 0\n"),
        "{transcript}"
    );
    assert!(
        transcript.contains("threads child status         = 0\n"),
        "{transcript}"
    );
    assert_eq!(files.len(), 1, "{transcript}");
    // The parent, the children and the grandchild report (the children leave with _exit and
    // classified no descriptor of their own).
    assert_eq!(c.processes, 4, "{c:?}");
    assert_eq!(c.pmfs_fds, 2, "{c:?}");
    // The first child's 100 writes, append and 100 pwrites, the grandchild's 50 writes (half
    // of them through a duplicate it made), the threads' 400 and the parent's few are served
    // in userspace.
    assert!(c.served >= 251 + 400, "{c:?}");
    m.unmount_and_fsck();
}

#[test]
fn threads_making_their_first_calls_at_once_are_all_served() {
    let ((transcript, files), c, m) = runs_agree("first_calls", str::to_owned);
    assert!(!transcript.contains("errno"), "{transcript}");
    assert_eq!(files.len(), 4, "{transcript}");
    // One thread attaches the process to the pool while the others wait for it: every
    // thread's 100 writes are served in userspace, and so is the pread of each file after
    // them (its fstat too, which is not counted).
    assert_eq!(c.pmfs_fds, 4, "{c:?}");
    assert_eq!((c.pmfs_calls, c.served), (408, 404), "{c:?}");
    m.unmount_and_fsck();
}

#[test]
fn forwarded_copies_see_the_size_the_library_gave_the_file() {
    // Also on a mount that caches attributes, where only a forced refresh reaches the daemon.
    for options in [&[][..], &["attr_timeout=60"]] {
        let ((transcript, _), c, m) = runs_agree_on("copies", options, str::to_owned);
        assert!(!transcript.contains("errno"), "{options:?}: {transcript}");
        // The writes, truncations and fstat calls were served; the copies were forwarded.
        assert!(c.served >= 7, "{options:?}: {c:?}");
        m.unmount_and_fsck();
    }
}

#[test]
fn the_file_size_limit_holds_under_the_library() {
    let ((transcript, files), c, m) = runs_agree("limits", str::to_owned);
    assert_eq!(files.len(), 2, "{transcript}");
    for (call, result) in [
        ("write 8000 more", "2000"),
        ("write at the limit", "-1 errno File too large"),
        ("append 100", "10"),
        ("append 1", "-1 errno File too large"),
        ("child write 12000", "10000"),
        ("SIGXFSZ so far", "5"),
    ] {
        let line = format!("{call:<28} = {result}\n");
        assert!(
            transcript.contains(&line),
            "{line:?} missing:\n{transcript}"
        );
    }
    // The writes within the limit were served.
    assert!(c.served >= 6, "{c:?}");
    m.unmount_and_fsck();
}

#[test]
fn random_call_sequences_give_the_same_results_with_and_without_the_library() {
    // Where holes start and how many blocks a file holds are the same through FUSE and the
    // library, and may differ on the local file system: those lines are left out there only.
    let local_answers = |t: &str| {
        t.lines()
            .filter(|l| !l.starts_with('~'))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    };
    let wanted: usize = std::env::var("PMFS_RANDOM_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9000);
    // Also on a mount that caches attributes: calls the library forwards must not meet a size
    // the kernel kept from before served writes.
    for options in [&[][..], &["attr_timeout=60"]] {
        let ((transcript, _), c, m) = runs_agree_on("random_calls", options, local_answers);
        // Sequences of 300 calls; all but a `dup` onto its own slot print a line.
        let sequences = transcript.lines().filter(|l| l.starts_with("sequence "));
        assert_eq!(sequences.count(), wanted.div_ceil(300), "{transcript}");
        let calls = transcript.lines().filter(|l| l.contains(" = ")).count();
        assert!(calls >= wanted * 9 / 10, "{calls} calls:\n{transcript}");
        // Each kind of call succeeded somewhere, and some failed.
        let kinds = "open dup close pwrite write pread read lseek ftruncate fallocate fstat \
            pwritev writev preadv readv setfl fsync fdatasync unlink";
        for call in kinds.split_whitespace().map(|k| format!(" {k} ")) {
            assert!(
                transcript
                    .lines()
                    .any(|l| l.contains(&call) && !l.contains("errno")),
                "no {call:?} succeeded:\n{transcript}"
            );
        }
        assert!(transcript.contains("errno"), "{transcript}");
        // Of the calls on pmfs descriptors, seeks go to the kernel, which keeps the offsets,
        // and so do copies, appends with RWF_APPEND, and reads and writes the descriptor's
        // access mode forbids (for the kernel's errno); about half are served in userspace.
        assert!(c.served * 5 >= c.pmfs_calls * 2, "{options:?}: {c:?}");
        m.unmount_and_fsck();
    }
}
