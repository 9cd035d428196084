//! Links the unwinder into the library (the compiler's `libgcc_eh.a`) instead of loading
//! `libgcc_s.so.1` on GNU/Linux.
//!
//! Rust's standard library links `-lgcc_s` for unwinding. A library preloaded into every
//! process then loads one more shared object into each program, most of which never use it,
//! and runs its constructor, which probes the CPU with `CPUID`: each one traps to the
//! hypervisor in a virtual machine. The library only unwinds for a panic, which aborts the
//! process at the C boundary anyway.
//!
//! A linker script named `libgcc_s.so` in a directory searched before the compiler's own
//! points `-lgcc_s` at the static archive. The cdylib exports only its own symbols (rustc's
//! version script), so that copy stays private: a program keeps its own unwinder. Where the
//! compiler has no `libgcc_eh.a`, the link stays as it was.

use std::env;
use std::fs;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = |key: &str| env::var(key).unwrap_or_default();
    if target("CARGO_CFG_TARGET_OS") != "linux" || target("CARGO_CFG_TARGET_ENV") != "gnu" {
        return;
    }
    let Ok(out) = Command::new("cc")
        .arg("-print-file-name=libgcc_eh.a")
        .output()
    else {
        return;
    };
    let archive = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !archive.is_absolute() || !archive.is_file() {
        return;
    }
    let dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("unwind");
    fs::create_dir_all(&dir).expect("creating a directory in OUT_DIR");
    fs::write(
        dir.join("libgcc_s.so"),
        format!("INPUT({})\n", archive.display()),
    )
    .expect("writing the linker script to OUT_DIR");
    println!("cargo:rustc-link-search=native={}", dir.display());
}
