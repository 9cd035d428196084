//! Rename in all its forms is atomic under a crash at any fence: after recovery fsck is clean
//! and the namespace equals the state before or after the rename.

mod common;

use pmfs::{RenameFlags, Volume};

use common::KINDS;
use common::crash::check_op;

fn tree(vol: &Volume) {
    vol.create_dir_all("/s/sub").unwrap();
    vol.create_dir("/t").unwrap();
    vol.write("/s/a", b"aaaa").unwrap();
    vol.write("/s/sub/deep", b"deep").unwrap();
    vol.write("/t/b", b"bb").unwrap();
    vol.create_dir("/t/emptydir").unwrap();
}

const EXCHANGE: RenameFlags = RenameFlags {
    noreplace: false,
    exchange: true,
};
const NOREPLACE: RenameFlags = RenameFlags {
    noreplace: true,
    exchange: false,
};

#[test]
fn rename_within_a_directory() {
    for kind in KINDS {
        check_op(kind, 21, tree, |v, _| v.rename("/s/a", "/s/a-renamed"));
    }
}

#[test]
fn rename_across_directories() {
    for kind in KINDS {
        check_op(kind, 22, tree, |v, _| v.rename("/s/a", "/t/a"));
        check_op(kind, 23, tree, |v, _| {
            v.rename_with("/s/a", "/t/fresh", NOREPLACE)
        });
    }
}

#[test]
fn rename_replacing_a_file() {
    for kind in KINDS {
        check_op(kind, 24, tree, |v, _| v.rename("/s/a", "/t/b"));
    }
}

/// The entry [`exchange_with_an_entry_that_straddles_cache_lines`] exchanges: 80 bytes, at
/// offset 120 of its page after a 56-byte one.
const STRADDLING: &str = "/r/bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

#[test]
fn exchange_with_an_entry_that_straddles_cache_lines() {
    // The directory's first entries sit at 64 and 120. The second one's first word, which
    // holds the kind an exchange of the file with a directory changes, ends a cache line;
    // its handle and creation time start the next, and its last word, which holds the
    // checksum, the one after.
    for kind in KINDS {
        check_op(
            kind,
            30,
            |v| {
                tree(v);
                v.create_dir("/r").unwrap();
                v.write("/r/aaaaaaaaaaaaaaaaaaaaaaaa", b"a").unwrap();
                v.write(STRADDLING, b"b").unwrap();
            },
            |v, _| v.rename_with("/s/sub", STRADDLING, EXCHANGE),
        );
    }
}

#[test]
fn rename_replacing_a_file_that_has_other_links() {
    for kind in KINDS {
        check_op(
            kind,
            25,
            |v| {
                tree(v);
                v.hard_link("/t/b", "/t/b2").unwrap();
            },
            |v, _| v.rename("/s/a", "/t/b"),
        );
    }
}

#[test]
fn rename_of_a_directory_across_parents_and_over_an_empty_one() {
    for kind in KINDS {
        check_op(kind, 26, tree, |v, _| v.rename("/s/sub", "/t/sub"));
        check_op(kind, 27, tree, |v, _| v.rename("/s/sub", "/t/emptydir"));
    }
}

#[test]
fn rename_exchange() {
    for kind in KINDS {
        check_op(kind, 28, tree, |v, _| {
            v.rename_with("/s/a", "/t/b", EXCHANGE)
        });
        check_op(kind, 29, tree, |v, _| {
            v.rename_with("/s/sub", "/t/b", EXCHANGE)
        });
    }
}
