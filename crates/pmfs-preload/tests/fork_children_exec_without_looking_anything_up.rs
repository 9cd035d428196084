//! A `fork` child's `exec` under the library looks nothing up: the library's `fork` prepare
//! handler finds libc's `exec` functions in the parent, once. A child that looked them up
//! itself would run `dlsym`, whose code a `fork` child has to fault in again (it starts with
//! none of its parent's file pages mapped): 35-50 µs of every command a shell runs.
//!
//! The dynamic linker's binding trace (`LD_DEBUG=bindings`, each line headed by the process
//! that wrote it) shows every `dlsym` the library makes: libc's `execve` is bound for it once,
//! in the shell, however many commands the shell forks and execs. The shell is bash, which
//! forks (dash uses `vfork`, whose children share the parent's memory and run no `fork`
//! handlers: its first child's lookup serves them all).

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::process::Command;

use common::{TempDir, library};

#[test]
fn a_shell_looks_execve_up_once_for_all_its_commands() {
    let work = TempDir::new("fork-exec");
    let trace = work.path().join("ld");
    let out = Command::new("bash")
        .args(["-c", "/bin/true; /bin/true; /bin/true; exit 0"])
        .env("LD_PRELOAD", library())
        .env("LD_DEBUG", "bindings")
        .env("LD_DEBUG_OUTPUT", &trace)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let from_library = format!("binding file {} [0] to ", library().display());
    let mut lines = Vec::new();
    for entry in fs::read_dir(work.path()).unwrap() {
        lines.extend(
            fs::read_to_string(entry.unwrap().path())
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        );
    }
    let commands = lines
        .iter()
        .filter(|l| l.contains("binding file /bin/true [0] to "))
        .filter_map(|l| l.split(':').next())
        .collect::<BTreeSet<_>>();
    assert_eq!(commands.len(), 3, "each command is traced");
    let lookups: Vec<&String> = lines
        .iter()
        .filter(|l| {
            l.contains(&from_library) && l.contains("libc.so") && l.ends_with("symbol `execve'")
        })
        .collect();
    assert_eq!(lookups.len(), 1, "{lookups:#?}");
}
