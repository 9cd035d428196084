//! Generates the libpmem bindings from the system's `libpmem.h` (Debian: `libpmem-dev`) with
//! bindgen, and links `libpmem`. Needs libclang at build time; nothing else in the workspace
//! does, which is why this crate is only built when pmfs-core's `libpmem` feature asks for it.

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rustc-link-lib=pmem");

    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("pmem_.*")
        .allowlist_var("PMEM_.*")
        // bindgen 0.71 defaults to Rust 1.82, which predates edition 2024's `unsafe extern`.
        .rust_target(
            bindgen::RustTarget::stable(85, 0)
                .unwrap_or_else(|e| panic!("bindgen does not know Rust 1.85: {e}")),
        )
        .rust_edition(bindgen::RustEdition::Edition2024)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| {
            panic!("bindgen failed on libpmem.h (install libpmem-dev and libclang-dev): {e}")
        });
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing the libpmem bindings to OUT_DIR");
}
