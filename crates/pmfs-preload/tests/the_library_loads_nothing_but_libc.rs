//! The preloaded library brings no shared object into a process but the C library (and its
//! dynamic linker): the unwinder Rust's standard library needs is linked in (`build.rs`)
//! rather than loaded as `libgcc_s.so.1`, whose constructor probes the CPU in every program
//! started. That copy stays private: the library defines no `_Unwind_*` symbol a program's
//! own exceptions could be routed through.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::library;

fn readelf(args: &[&str]) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(library())
        .output()
        .unwrap();
    assert!(out.status.success(), "readelf: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn only_libc_is_needed_and_the_unwinder_is_not_exported() {
    let needed: BTreeSet<String> = readelf(&["-d", "-W"])
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split_once('[')?.1.trim_end_matches(']').to_owned()))
        .collect();
    let libc: BTreeSet<String> = ["libc.so.6", "ld-linux-x86-64.so.2"]
        .map(String::from)
        .into();
    assert_eq!(needed, libc);

    let exported: Vec<String> = readelf(&["--dyn-syms", "-W"])
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[6] != "UND").then(|| f[7].to_owned())
        })
        .filter(|name| name.starts_with("_Unwind") || name.starts_with("__gcc"))
        .collect();
    assert!(exported.is_empty(), "{exported:?}");
}
