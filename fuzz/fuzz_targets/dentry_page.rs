//! Parsing of a single directory page (`pmfs::fsck::check_dentry_page`, the code mount and
//! fsck use): any 4096 bytes give a list of names or `Corrupt`, never a panic, a hang or an
//! out-of-bounds read. The owner and index the header must name are taken from the page
//! itself; the first input byte asks for the header magic and version to be set (bit 1) and
//! the header checksum to be recomputed (bit 0), so that mutations reach the dentry list
//! behind the header. The seeds are real pages of the base images.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pmfs::{Error, fsck};
use pmfs_core::layout::BLOCK_SIZE;
use pmfs_fuzz::common::{DENTRY_PAGE_MAGIC, reseal_page_header};

const PAGE: usize = BLOCK_SIZE as usize;
/// The page format version in the header.
const PAGE_VERSION: u16 = 1;
/// Size of the smallest entry (a one-byte name).
const MIN_ENTRY: usize = 40;
/// Bytes of a page before the first entry and after the last.
const SENTINELS: usize = 72;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut page = vec![0u8; PAGE];
    let n = rest.len().min(PAGE);
    page[..n].copy_from_slice(&rest[..n]);
    if flags & 2 != 0 {
        page[..4].copy_from_slice(DENTRY_PAGE_MAGIC);
        page[4..6].copy_from_slice(&PAGE_VERSION.to_le_bytes());
    }
    if flags & 1 != 0 {
        reseal_page_header(&mut page);
    }
    let word = |o: usize| u64::from_le_bytes(page[o..o + 8].try_into().unwrap());
    let (owner, index) = (word(8), word(16));
    match fsck::check_dentry_page(&page, owner, index) {
        Ok(parsed) => {
            assert!(parsed.names.len() <= (PAGE - SENTINELS) / MIN_ENTRY);
            assert!(parsed.names.iter().all(|n| (1..=255).contains(&n.len())));
            assert_eq!(
                fsck::check_dentry_page(&page, owner, index).ok(),
                Some(parsed)
            );
        }
        Err(Error::Corrupt { at, .. }) => assert!(at.0 < PAGE as u64),
        Err(e) => panic!("unexpected error for a whole page: {e}"),
    }
});
