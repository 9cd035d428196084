//! Two data-only clients (as two processes would) write parts of the same two blocks of one
//! HashFS file and punch them, as fast as they can. A write plans from a view of the file,
//! then stages fresh blocks and copies the old bytes around its own into them; meanwhile the
//! other client may replace or punch a block the view named, and its digest free it, and on
//! HashFS the block staged for the same logical block is most likely that freed one. Such a
//! write must plan again, not fail: it answered `InvalidArgument` ("overlapping copy", EINVAL
//! under the library), having found its own fresh block named as the old one. Without the
//! fix this failed in four runs out of four (release build).
//!
//! The pool is larger than the other client tests' because each client compacts the file's
//! log while the other has it open, and such a compaction's old blocks stay allocated while
//! both have it open (see `pmfs_core::log`): about 3,000 blocks here.

mod common;

use std::sync::{Arc, Barrier};

use common::RW;
use pmfs::{Owner, Volume};

const BS: u64 = 4096;
const WRITERS: u8 = 2;
const OPS: u32 = 300_000;

#[test]
fn unaligned_writers_and_punchers_of_the_same_blocks_never_fail() {
    let (path, owner) = common::client_pool_of("racing-partials", 64 << 20);
    let who = Owner { uid: 0, gid: 0 };
    let (attr, node, _) = owner
        .create_open(owner.root(), b"f", 0o644, who, true, RW)
        .unwrap();
    node.write_at(&[0u8; 2 * BS as usize], 0).unwrap();
    let start = Arc::new(Barrier::new(usize::from(WRITERS)));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let client = Volume::attach(&path).unwrap();
            let start = start.clone();
            std::thread::spawn(move || {
                let f = client.open_ino(attr.ino, RW).unwrap();
                start.wait();
                let mut x = u64::from(w) * 7919 + 1;
                for i in 0..OPS {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let off = (x >> 33) % (2 * BS - 64);
                    // Punches free blocks at once (their digest runs with them).
                    if i % 4 == 3 {
                        f.punch_hole(off / BS * BS, BS)
                            .unwrap_or_else(|e| panic!("writer {w}, punch {i} at {off}: {e}"));
                        continue;
                    }
                    let len = 1 + (x >> 20) % 64;
                    f.write_at(&vec![w + 1; len as usize], off)
                        .unwrap_or_else(|e| panic!("writer {w}, write {i} at {off}+{len}: {e}"));
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let mut back = vec![9u8; 2 * BS as usize];
    node.read_at(&mut back, 0).unwrap();
    assert!(
        back.iter().all(|&b| b <= WRITERS),
        "only the writers' bytes and zeros"
    );
    drop(node);
    owner.close().unwrap();
    let _ = std::fs::remove_file(&path);
}
