//! A program killed under the library (`kill -9`, or any signal whose default action ends it)
//! never gives back the pins it holds on the logs of the files it had open. The daemon frees
//! a deleted file only once no process holds a pin on its log, so such a file stayed
//! allocated until the next mount; and the next program to write the file was never alone
//! with its log, so the log blocks its compactions retired stayed allocated too. Now the
//! daemon takes the pins for dead when no data client is attached (none holds the client lock
//! on the pool, none maps it): when the kernel asks for the file's attributes, as every open
//! does, so that the next writer frees those blocks, and when the file is deleted and the
//! kernel forgot it, which frees it. While another client is attached it cannot tell whose
//! the pins are; it looks again every second, and clears them once the other clients left
//! too.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use common::{Mounted, TempDir, compile, free_blocks, free_blocks_reaching, stepped};

/// Blocks of each file.
const BLOCKS: u64 = 256;

/// Creates `name` (`BLOCKS` blocks) in `dir` and starts `writer` on it under the library,
/// which writes one block of it.
fn client(writer: &Path, work: &TempDir, dir: &Path, name: &str) -> Child {
    std::fs::write(dir.join(name), vec![7u8; (BLOCKS * 4096) as usize]).unwrap();
    let mut c = start(writer, work, &dir.join(name));
    ask(&mut c, "4096 written-under-the-library");
    c
}

/// Starts `writer` on the file at `path` under the library.
fn start(writer: &Path, work: &TempDir, path: &Path) -> Child {
    let mut child = stepped(writer, &work.path().join("stats"))
        .arg(path)
        .spawn()
        .unwrap();
    assert_eq!(answer(&mut child), "ready");
    child
}

/// Sends `line` to the writer and checks that it answered "ok".
fn ask(c: &mut Child, line: &str) {
    writeln!(c.stdin.as_mut().unwrap(), "{line}").unwrap();
    assert_eq!(answer(c), "ok", "{line}");
}

/// The writer's next line of output. (Its output is read a byte at a time, so that nothing
/// is buffered away between calls.)
fn answer(c: &mut Child) -> String {
    let out = c.stdout.as_mut().unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while out.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}

/// A work directory with `programs/writer.c` built in it, and a mount, both named `tag`.
fn setup(tag: &str) -> (TempDir, PathBuf, Mounted) {
    let work = TempDir::new(tag);
    let writer = compile("writer", work.path());
    (work, writer, Mounted::new(tag, "64M", "hashfs"))
}

fn kill(mut c: Child) {
    c.kill().unwrap();
    c.wait().unwrap();
}

#[test]
fn a_deleted_file_a_killed_client_had_open_is_freed() {
    let (work, writer, m) = setup("killed-pins");
    let dir = m.path();

    // No other client: deleting the file frees it, once the kernel forgot the file (it
    // tells the daemon in the background).
    let before = free_blocks(dir);
    kill(client(&writer, &work, dir, "alone"));
    std::fs::remove_file(dir.join("alone")).unwrap();
    let after = free_blocks_reaching(dir, before - 4);
    assert!(
        after + 4 >= before,
        "{before} blocks free before, {after} after"
    );

    // Another client is attached: the pins may be its, and the file stays.
    let mut other = client(&writer, &work, dir, "other");
    let before = free_blocks(dir);
    kill(client(&writer, &work, dir, "beside"));
    std::fs::remove_file(dir.join("beside")).unwrap();
    // Time for the kernel to tell the daemon it forgot the file, as above.
    std::thread::sleep(Duration::from_millis(300));
    let after = free_blocks(dir);
    assert!(
        after + BLOCKS <= before + 4,
        "{before} blocks free before, {after} after"
    );
    drop(other.stdin.take());
    assert!(other.wait().unwrap().success());

    // Once the other client is gone, the daemon's next look frees it.
    let after = free_blocks_reaching(dir, before - 4);
    assert!(
        after + 4 >= before,
        "{before} blocks free before, {after} once the other client left"
    );
    m.unmount_and_fsck();
}

/// The pins a killed client left were all that told the daemon its log held writes nobody
/// had digested yet: taking them for dead must not hide those writes from the kernel's view
/// of the file (its size and bytes), nor from programs that open it later. (A file created
/// empty through the kernel gets its log from its first writer, the client: the daemon has
/// no handle of it that would digest the writes when the kernel forgets it.)
#[test]
fn what_a_killed_client_wrote_stays_once_its_pins_are_taken_for_dead() {
    let (work, writer, m) = setup("killed-pins-data");
    let path = m.path().join("f");
    std::fs::File::create(&path).unwrap();
    let mut c = start(&writer, &work, &path);
    ask(&mut c, "0 at-the-start");
    ask(&mut c, "5000 further-on");
    kill(c);
    let f = std::fs::read(&path).unwrap();
    assert_eq!(f.len(), 5010, "the size the killed client left");
    assert_eq!(&f[..12], b"at-the-start");
    assert_eq!(&f[5000..], b"further-on");
    m.unmount_and_fsck();
}

#[test]
fn the_next_writer_frees_its_retired_log_blocks_after_a_client_was_killed() {
    let (work, writer, m) = setup("killed-pins-log");
    let dir = m.path();
    kill(client(&writer, &work, dir, "f"));
    // The next writer's open has the kernel ask for the file's attributes: the daemon looks.
    overwrite_often(&writer, &work, dir, "f");

    // Killed while another client ran: the pins are cleared once that one left as well (at
    // the next open, as above).
    let mut other = client(&writer, &work, dir, "other");
    kill(client(&writer, &work, dir, "g"));
    drop(other.stdin.take());
    assert!(other.wait().unwrap().success());
    overwrite_often(&writer, &work, dir, "g");
    m.unmount_and_fsck();
}

/// Has a new writer overwrite file `name` 200,000 times and checks that it held few blocks.
fn overwrite_often(writer: &Path, work: &TempDir, dir: &Path, name: &str) {
    let before = free_blocks(dir);
    let mut next = start(writer, work, &dir.join(name));
    ask(&mut next, "again 200000 0 overwritten");
    let held = before.saturating_sub(free_blocks(dir));
    drop(next.stdin.take());
    assert!(next.wait().unwrap().success());
    // About 400 blocks stayed allocated while the dead program's pin counted; the old data
    // blocks waiting for a digest count too (up to 128).
    assert!(held < 200, "{held} blocks held writing {name}");
}
