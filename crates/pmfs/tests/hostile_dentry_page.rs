//! A single directory page parses on its own (`fsck::check_dentry_page`): real pages give
//! their names, damaged or foreign pages are `Corrupt`, never a panic.

mod common;

use pmfs::{Error, MappingKind, fsck};
use pmfs_core::layout::BLOCK_SIZE;

use common::{crash_copy, fresh};

/// The directory pages of an image (blocks starting with the page magic) at or after
/// `from`.
fn pages(image: &[u8], from: u64) -> Vec<&[u8]> {
    image[from as usize..]
        .chunks(BLOCK_SIZE as usize)
        .filter(|b| b.starts_with(b"PMDP"))
        .collect()
}

fn image(media: &std::sync::Arc<dyn pmfs_core::pm::Media>) -> Vec<u8> {
    let copy = crash_copy(media);
    let mut img = vec![0u8; copy.size() as usize];
    copy.read(pmfs_core::layout::PmOff(0), &mut img).unwrap();
    img
}

#[test]
fn real_pages_parse_and_damaged_pages_are_corrupt() {
    let (vol, media) = fresh(MappingKind::Extent);
    for name in ["alpha", "beta", "gamma"] {
        vol.write(&format!("/{name}"), b"x").unwrap();
    }
    vol.remove_file("/beta").unwrap();
    let root = vol.root().raw();
    let data = vol.info().data_offset;
    let img = image(&media);
    let found = pages(&img, data);
    assert_eq!(found.len(), 1, "the root directory has one page");
    let page = found[0];

    let parsed = fsck::check_dentry_page(page, root, 0).unwrap();
    let mut names = parsed.names.clone();
    names.sort();
    assert_eq!(names, [b"alpha".to_vec(), b"gamma".to_vec()]);
    assert!(!parsed.pending);

    // Another directory, another page index, a short buffer.
    assert!(matches!(
        fsck::check_dentry_page(page, root + 1, 0),
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(
        fsck::check_dentry_page(page, root, 1),
        Err(Error::Corrupt { .. })
    ));
    assert!(matches!(
        fsck::check_dentry_page(&page[..100], root, 0),
        Err(Error::InvalidArgument(_))
    ));

    // Every single-bit flip in the list area: parsed or corrupt, never a panic; a flipped
    // name byte is caught by the entry checksum.
    let mut corrupt = 0;
    for i in 56..page.len() {
        let mut p = page.to_vec();
        p[i] ^= 0x10;
        if fsck::check_dentry_page(&p, root, 0).is_err() {
            corrupt += 1;
        }
    }
    assert!(corrupt > 0);
    let at = page.windows(5).position(|w| w == b"alpha").unwrap();
    let mut p = page.to_vec();
    p[at] ^= 1;
    assert!(matches!(
        fsck::check_dentry_page(&p, root, 0),
        Err(Error::Corrupt {
            what: "directory entry checksum",
            ..
        })
    ));
}
