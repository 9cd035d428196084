//! Scenarios where several processes use one pool: the writers are the test binary run again
//! (selecting the same test) with a role in an environment variable, while the test process
//! owns the pool.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use pmfs::{MappingKind, Options, Volume};
use pmfs_core::pm::{Media, PmRegion};

/// Serialises the owners of a test binary's scenarios. A child forked by one test holds a
/// copy of every descriptor of this process until it execs, among them another test's pool
/// owner lock (an `flock`, which lives as long as any copy of its descriptor): that test's
/// remount could then find its own pool still locked.
pub static OWNERS: Mutex<()> = Mutex::new(());

/// A fresh scratch directory for one test's pool and logs.
pub fn scratch(suite: &str, test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pmfs-{suite}-{}-{test}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// Creates a HashFS pool of `size` bytes at `path` (the mapping data-only clients attach to).
pub fn hashfs_pool(path: &Path, size: u64) -> Volume {
    let opts = Options {
        inodes: Some(64),
        journal_slots: 4,
        size,
        ..Options::with_mapping(MappingKind::HashFs)
    };
    Volume::create(path, &opts).unwrap()
}

/// Runs this test binary again as a child for `test`, with `role` in `env`.
pub fn spawn_role(test: &str, env: &str, role: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(env, role)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs `role` with the value of `env` when this process is a child a scenario started (see
/// [`spawn_role`]); true if it was.
pub fn as_child(env: &str, role: impl FnOnce(&str)) -> bool {
    match std::env::var(env) {
        Ok(r) => {
            role(&r);
            true
        }
        Err(_) => false,
    }
}

/// fsck of the pool file at `path` finds nothing to repair.
pub fn fsck_pool_clean(path: &Path) {
    let media: Arc<dyn Media> = Arc::new(PmRegion::open(path).unwrap());
    super::fsck_clean(media).unwrap();
}

/// A running process that never opens the pool (a `sleep`), killed and reaped when dropped,
/// also when the test fails: what a word naming a killed holder points at once the kernel has
/// given the holder's pid to another program.
pub struct Stranger(Child);

impl Stranger {
    pub fn start() -> Stranger {
        Stranger(Command::new("sleep").arg("600").spawn().unwrap())
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
