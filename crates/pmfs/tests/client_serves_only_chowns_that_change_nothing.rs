//! `Client::chown_unchanged`: a data-only client serves a change of owner itself only when
//! the change would alter nothing but the ctime, and then raises the ctime (and nothing else);
//! every other change is left to the owner, untouched.

mod common;

use pmfs::{AttrChange, Ino, Owner, Volume, XattrSet};

const UID: u32 = 1000;
const GID: u32 = 100;

/// A pool with `/f` (owner `UID`:`GID`, mode 0644) and `/d`, created by the owner; removed at
/// drop.
struct Pool {
    path: std::path::PathBuf,
    owner: Volume,
    file: Ino,
    dir: Ino,
}

impl Pool {
    fn new(name: &str) -> Pool {
        let (path, owner) = common::client_pool(&format!("chown-{name}"));
        let who = Owner { uid: UID, gid: GID };
        let root = owner.root();
        let file = owner
            .create_open(root, b"f", 0o644, who, true, Default::default())
            .unwrap()
            .0
            .ino;
        let dir = owner.mkdir(root, b"d", 0o755, who).unwrap().ino;
        Pool {
            path,
            owner,
            file,
            dir,
        }
    }

    fn set_perm(&self, perm: u32) {
        let change = AttrChange {
            perm: Some(perm),
            ..AttrChange::default()
        };
        self.owner.set_attr(self.file, change, None).unwrap();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn a_chown_to_the_same_owner_raises_only_the_ctime() {
    let p = Pool::new("same");
    let client = Volume::attach(&p.path).unwrap();
    for (uid, gid, caller) in [
        (Some(UID), Some(GID), 0),
        (Some(UID), None, UID),
        (None, Some(GID), UID),
        (None, None, UID),
    ] {
        let before = p.owner.getattr(p.file).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(client.chown_unchanged(p.file, uid, gid, caller).unwrap());
        let after = p.owner.getattr(p.file).unwrap();
        // Neither id: nothing changes, as with the owner's empty change.
        let raised = uid.is_some() || gid.is_some();
        assert_eq!(
            after.ctime > before.ctime,
            raised,
            "{uid:?} {gid:?} {caller}"
        );
        assert_eq!(
            (after.mtime, after.uid, after.gid, after.perm),
            (before.mtime, UID, GID, 0o644)
        );
    }
    let before = p.owner.getattr(p.file).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));
    p.owner
        .set_attr(p.file, AttrChange::default(), None)
        .unwrap();
    assert_eq!(p.owner.getattr(p.file).unwrap(), before);
}

#[test]
fn every_other_chown_is_left_to_the_owner() {
    let p = Pool::new("other");
    let client = Volume::attach(&p.path).unwrap();
    let refused = |what: &str, ino: Ino, uid: Option<u32>, gid: Option<u32>, caller: u32| {
        let before = p.owner.getattr(ino).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(
            !client.chown_unchanged(ino, uid, gid, caller).unwrap(),
            "{what}"
        );
        assert_eq!(p.owner.getattr(ino).unwrap(), before, "{what}");
    };
    refused("another owner", p.file, Some(UID + 1), None, 0);
    refused("another group", p.file, None, Some(GID + 1), 0);
    refused(
        "asked by someone else",
        p.file,
        Some(UID),
        Some(GID),
        UID + 1,
    );
    refused("a directory", p.dir, Some(UID), Some(GID), 0);

    p.set_perm(0o4755);
    refused("set-user-ID", p.file, Some(UID), Some(GID), 0);
    p.set_perm(0o2750);
    refused(
        "set-group-ID with group-execute",
        p.file,
        Some(UID),
        Some(GID),
        0,
    );
    // Without group-execute the bit marks mandatory locking: a chown keeps it.
    p.set_perm(0o2640);
    assert!(
        client
            .chown_unchanged(p.file, Some(UID), Some(GID), 0)
            .unwrap()
    );
    p.set_perm(0o644);

    p.owner
        .set_xattr(
            p.file,
            b"security.capability",
            b"\x01\x00\x00\x02",
            XattrSet::Create,
        )
        .unwrap();
    refused("extended attributes", p.file, Some(UID), Some(GID), 0);
    p.owner
        .remove_xattr(p.file, b"security.capability")
        .unwrap();

    p.owner.unlink_at(p.owner.root(), b"f").unwrap();
    let gone = client.chown_unchanged(p.file, Some(UID), Some(GID), 0);
    assert!(!gone.unwrap(), "an unlinked file");
}
