//! A tour of the embedding API: create a volume in a pool file, use it like `std::fs`, close
//! it, open it again, and check it.
//!
//! ```sh
//! cargo run -p pmfs --example quickstart [POOL_FILE]
//! ```
//!
//! The pool file defaults to a fresh file in the system's temporary directory (use a path on
//! a DAX or tmpfs mount, such as `/dev/shm/demo.pool`, for persistent-memory speed).
#![allow(clippy::print_stdout)]

use std::io::{Read, Write};

use pmfs::{MappingKind, OpenOptions, Options, RenameFlags, Volume};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pool = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("pmfs-quickstart-{}.pool", std::process::id()))
        });
    let opts = Options {
        size: 64 << 20,
        ..Options::with_mapping(MappingKind::Extent)
    };

    // mkfs + mount. Every call below is atomic and durable when it returns.
    let vol = Volume::create(&pool, &opts)?;
    println!(
        "created {} ({:?} mapping, {:?} allocator)",
        pool.display(),
        vol.mapping(),
        vol.allocator()
    );

    vol.create_dir_all("/projects/pmfs")?;
    vol.write("/projects/pmfs/README", b"persistent memory file system\n")?;
    let mut log = OpenOptions::new()
        .append(true)
        .create(true)
        .open(&vol, "/projects/pmfs/log")?;
    for i in 0..3 {
        writeln!(log, "entry {i}")?;
    }
    drop(log);

    vol.hard_link("/projects/pmfs/README", "/README")?;
    vol.symlink("/projects/pmfs", "/current")?;
    vol.rename("/projects/pmfs/log", "/projects/pmfs/journal")?;
    vol.rename_with(
        "/README",
        "/projects/pmfs/README",
        RenameFlags {
            noreplace: true,
            ..RenameFlags::default()
        },
    )
    .expect_err("the target exists, and noreplace refuses to replace it");

    // An open file stays readable after its last name is gone.
    let scratch = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&vol, "/scratch")?;
    scratch.write_all_at(b"temporary", 0)?;
    vol.remove_file("/scratch")?;
    let mut buf = [0u8; 9];
    scratch
        .read_exact_at(&mut buf, 0)
        .map_err(|_| "short read")?;
    assert_eq!(&buf, b"temporary");
    drop(scratch); // frees it

    for entry in vol.read_dir("/current")? {
        let entry = entry?;
        let md = entry.metadata()?;
        println!(
            "  {:<8} {:>4} bytes, {} link(s)",
            entry.file_name().to_string_lossy(),
            md.len(),
            md.nlink()
        );
    }
    let st = vol.statfs()?;
    println!(
        "{} of {} data blocks free, {} inodes free",
        st.free_blocks, st.total_blocks, st.free_inodes
    );
    vol.close()?;

    // Mount again: the fast path after a clean close.
    let vol = Volume::open(&pool)?;
    println!("reopened; clean close: {}", vol.mount_report().clean);
    let mut text = String::new();
    vol.open_file("/current/journal")?
        .read_to_string(&mut text)?;
    print!("{text}");
    let media = vol.media().clone();
    vol.close()?;

    let report = pmfs::fsck::check(media)?;
    println!(
        "fsck: {} problems, {} live inodes, {} entries",
        report.problems.len(),
        report.live_inodes,
        report.entries
    );
    std::fs::remove_file(&pool)?;
    Ok(())
}
