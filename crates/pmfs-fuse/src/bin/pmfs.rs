//! The `pmfs` command: `pmfs mkfs|mount|fsck|info` (see `pmfs --help`).
//!
//! Called through a link named `mount.pmfs` or `mount.fuse.pmfs` it is the mount helper that
//! mount(8) runs for `mount -t fuse.pmfs POOL DIR` and fstab entries (a Cargo binary cannot
//! carry a dot in its name, so the helper is this binary under a second name).
fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let helper = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n.to_string_lossy().starts_with("mount."));
    std::process::exit(if helper {
        pmfs_fuse::cli::mount_helper_main(args)
    } else {
        pmfs_fuse::cli::main(args)
    });
}
